"""The user's own training function as a kind of trial (`trainable: FILE.py:FUNCTION`, trainable/function.py).

What this kind owns (search/definition/kind.py says what each kind answers): its keys are free names in
`training` (fixed) and `space` (searched), checked as plain data; `model` and `data` do not apply;
experiment.metric, constraints and stop_when name what the function reports (any identifier, checked on
its first report); its config is a FunctionConfig; its columns are its free names and the metrics it
reports; Tune runs it through trainable/function.py; its checkpoint is the dict it reported, exported as
that dict with the trial's config (no model graph: hpsearch has not its model's code).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from optuna.distributions import IntDistribution

from search.definition.objectives import names, objectives_of
from search.definition.objectives import problems as objective_problems
from search.definition.reserved import COLUMNS, metric_names_taken, result_columns, why_taken
from search.definition.schema import Experiment, FunctionExperiment, Resources, Searched, parse_searched, section_of, \
    validated
from trainable.config import absolute_reference, is_plain_data, is_reference, model_key, plain
from trainable.errors import ConfigError, problem
from trainable.function import (DRIVER_KEYS, FUNCTION_REPORT_COLUMNS, METRIC_NAMES, RESERVED, TRAINABLE_KEY,
                                FunctionConfig, function_trial, load_state)
from trainable.report import EPOCH_COLUMNS, REPORT_COLUMNS

if TYPE_CHECKING:
    from search.definition.space import Space

SECTIONS = ("experiment", "resources", "training", "space")
NOT_FOR_FUNCTIONS = "does not apply with a function trainable: the function loads its own model and data"


class OwnFunction:
    """A search of the user's function: `reference` is its absolute FILE.py:FUNCTION (or package.module:FUNCTION)."""

    name = "function"
    default_format = "state_dict"  #: its checkpoint is a dict: written as that dict, with the trial's config
    load_checkpoint: Callable[[str | Path], Any] = staticmethod(load_state)
    checkpoints_kept_by = "its function's report(checkpoint=...), num_to_keep"  #: what decides its checkpoints
    without_checkpoint = "its config replays without one"  #: what a best epoch without a checkpoint loses
    #: why best.yaml's epoch kept no checkpoint, besides num_to_keep
    no_checkpoint_why = "the function reported none at that epoch (report(checkpoint=...))"

    def __init__(self, reference: str | None) -> None:
        self.reference = reference

    # ---- the space file -------------------------------------------------------------------

    @staticmethod
    def reference_of(raw: Mapping[str, Any], base: Path, problems: list[str]) -> str | None:
        """`trainable: FILE.py:FUNCTION` (or package.module:FUNCTION), made absolute from the space file's folder."""
        reference = raw[TRAINABLE_KEY]
        if not isinstance(reference, str) or not is_reference(reference):
            problems.append(problem(TRAINABLE_KEY, "must be FILE.py:FUNCTION or package.module:FUNCTION", reference))
            return reference
        return absolute_reference(reference, base)

    @staticmethod
    def section_problems(raw: Mapping[str, Any]) -> list[str]:
        """model and data do not apply: the function loads its own."""
        problems = []
        for key in raw:
            if key in ("run", TRAINABLE_KEY):  # run: spec.yaml's record of where the run lives
                continue
            if key in ("model", "data"):
                problems.append(problem(key, NOT_FOR_FUNCTIONS, raw[key]))
            elif key not in SECTIONS:
                problems.append(problem(str(key), f"unknown section (known with a function trainable: "
                                                  f"{', '.join(SECTIONS)}, {TRAINABLE_KEY})", raw[key]))
        return problems

    @staticmethod
    def experiment(raw: Mapping[str, Any], problems: list[str]) -> Experiment:
        """experiment.metric, constraints and stop_when name what the function reports: any name, checked on its
        first report (FunctionExperiment's rules); the rest as for the canonical loop (objective_problems too)."""
        experiment = validated(FunctionExperiment, "experiment", section_of(raw, "experiment", problems), problems)
        problems += objective_problems(experiment, any_name=True)
        return experiment

    @staticmethod
    def resource_problems(resources: Resources) -> list[str]:
        if resources.gpus == "auto":
            return [problem("resources.gpus", "auto measures the canonical loop's model; give a number with a "
                                              "function trainable", "auto")]
        return []

    @staticmethod
    def keys(raw: Mapping[str, Any], base: Path, problems: list[str]
             ) -> tuple[dict[str, Any], list[Searched], str | None]:
        """Free names in training (fixed) and space (searched), checked as plain data; no data root."""
        fixed: dict[str, Any] = {}
        searched: list[Searched] = []
        for sec in ("training", "space"):
            for key, value in section_of(raw, sec, problems).items():
                path = f"{sec}.{key}"
                if not isinstance(key, str) or not key.isidentifier() or key in RESERVED or key in COLUMNS:
                    rule = "is set by the driver per trial" if key in RESERVED else \
                        f"must not be {why_taken(key)} (search/definition/reserved.py)" if key in COLUMNS else \
                        "must be a Python identifier"
                    problems.append(problem(path, rule, value))
                elif key in fixed or key in {d.name for d in searched}:
                    problems.append(problem(path, "is set twice; set it in one place", value))
                elif sec == "space" and isinstance(value, dict) and "distribution" in value:
                    # a free name checks as a model keyword does (plain data, no type): parse it as one
                    before = len(problems)
                    found = parse_searched(model_key(key), value, problems)
                    problems[before:] = [p.replace(f"space.{model_key(key)}", path) for p in problems[before:]]
                    if found:
                        searched.append(replace(found, name=key))
                elif not is_plain_data(value):
                    problems.append(problem(path, "must be plain data (numbers, strings, lists, mappings)", value))
                else:
                    fixed[key] = plain(value)
        return fixed, searched, None

    @staticmethod
    def default_batch_size(fixed: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """A function has a batch_size only if it names one."""
        return [("training.batch_size", fixed["batch_size"])] if "batch_size" in fixed else []

    @staticmethod
    def metric_problems(experiment: Experiment, fixed: Mapping[str, Any], searched: list[Searched],
                        problems: list[str]) -> tuple[Experiment, list[str]]:
        """A metric named like a config key, or like a name the run folder uses for itself
        (search/definition/reserved.py), would overwrite it in results.parquet and best.yaml (the trial refuses
        such a report too: trainable/function.py)."""
        free_names = [*fixed, *(d.name for d in searched)]
        named = [("experiment.metric", m) for m in names(experiment.metric)] + \
            [("experiment.constraints", c.metric) for c in objectives_of(experiment).constraints if c] + \
            [("experiment.stop_when", k) for k in experiment.stop_when or {}]
        from trainable.report import PACKED, PACKED_COLUMNS  # here: the spec is read without torch

        # where a trial ran and where its slot time went reach Tune packed in one value (trainable/report.py), so
        # the search cannot read them from a report; gpu_memory_reserved_mb is a number of its own
        bookkeeping = {PACKED, *PACKED_COLUMNS}
        taken = (set(free_names) | metric_names_taken()) - bookkeeping
        return experiment, [
            problem(key, "must name a metric of the function, not a config key or a column of hpsearch's own "
                         f"({'a config key of this space' if name in free_names else why_taken(name)})", name)
            for key, name in named if name in taken] + [
            problem(key, "must name a metric of the function, not where a trial ran or when (results.parquet's "
                         f"{', '.join(PACKED_COLUMNS)}: not read during a search; gpu_memory_reserved_mb is)", name)
            for key, name in named if name in bookkeeping]

    def default_epochs(self, fixed: Mapping[str, Any]) -> tuple[bool, int | None]:
        """(True, its `epochs` key if it has a valid one, else None): a function may leave epochs unsaid, and
        the schedule's checks then say what needs them."""
        try:
            epochs = FunctionConfig(self.reference or "", fixed).epochs
        except (ConfigError, TypeError, ValueError):
            epochs = None
        return True, epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else None

    @staticmethod
    def pbt(experiment: Experiment, searched: tuple[Searched, ...], epochs: int | None
            ) -> tuple[Experiment, list[str]]:
        return experiment, [problem("experiment.scheduler", "pbt changes the canonical loop's lr, momentum, "
                                    "weight_decay and clip_norm mid-run; it does not apply to a function trainable",
                                    "pbt")]

    @staticmethod
    def typed_key(key: str) -> str:
        """A free name's value checks as a model keyword's does (plain data): experiment.enqueue's values."""
        return model_key(key)

    def config(self, values: Mapping[str, Any], workers: int = 1) -> FunctionConfig:
        return FunctionConfig(self.reference or "", dict(values), workers=workers)

    def to_raw(self, space: Space) -> dict[str, Any]:
        return {TRAINABLE_KEY: self.reference, "experiment": plain(space.experiment.model_dump()),
                "resources": space.resources.model_dump(), "training": dict(space.fixed),
                "space": {d.name: d.to_raw() for d in space.searched}}

    # ---- its columns and metrics ----------------------------------------------------------

    @staticmethod
    def config_columns(space: Space) -> list[str]:
        """Its reference, its free names, and the driver's per-trial keys."""
        free = [*space.fixed, *(d.name for d in space.searched if d.name not in space.fixed)]
        return [TRAINABLE_KEY, *free, *DRIVER_KEYS]

    @staticmethod
    def report_columns(space: Space) -> list[str]:
        """Those every trial has: the epoch and its time, the metrics the search reads, the wrapper's own
        (its other metrics join them as reported)."""
        return [*FUNCTION_REPORT_COLUMNS, *objectives_of(space.experiment).measured,
                *REPORT_COLUMNS[len(EPOCH_COLUMNS) + 1:]]

    @staticmethod
    def column_type(name: str, searched: Searched | None, defaults: Mapping[str, Any]) -> str | list[Any]:
        """A config column's type: the driver's counts are ints; a free name's, that of its value(s), found by
        results.parquet (int or float for a searched range)."""
        if name in ("seed", "num_threads", "trial_number"):
            return "int"
        if searched is None or searched.is_choice:
            return [defaults.get(name)] if searched is None else list(searched.values)
        return "int" if isinstance(searched.distribution, IntDistribution) else "float"

    @staticmethod
    def config_names(names: list[str]) -> list[str]:
        """Of results.parquet's columns, the trial config's: those before its reports (from `epoch` on)."""
        config = names[:names.index("epoch")] if "epoch" in names else names
        return [n for n in config if n not in ("trial_id", "status")]

    @staticmethod
    def report_row(report: Mapping[str, Any], config: Mapping[str, Any], first: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """A results row's report columns: the wrapper's own, and the function's metrics as each report names them."""
        return {c: report.get(c) for c in [*REPORT_COLUMNS[len(EPOCH_COLUMNS):], *FUNCTION_REPORT_COLUMNS,
                                           *report.get(METRIC_NAMES, [])]}

    @staticmethod
    def reported_columns(names: list[str], rows: Iterable[Mapping[str, Any]]) -> list[str]:
        """The metrics these rows report that results.parquet's schema lacks (a function names its own)."""
        return sorted({k for row in rows for k in row} - set(names))

    @staticmethod
    def best_metrics(space: Space, columns: list[str], schema_names: list[str]) -> tuple[str, ...]:
        """best.yaml's metrics: every column the function reported beyond the results' schema, and those the
        search reads."""
        measured = objectives_of(space.experiment).measured
        return tuple(c for c in columns if c not in schema_names or c in measured)

    @staticmethod
    def front_metrics(space: Space, columns: list[str], schema_names: list[str]) -> list[str]:
        """pareto.yaml's metrics: the names the search reads, then the function's other metrics."""
        measured = objectives_of(space.experiment).measured
        return list(dict.fromkeys([*measured, *(c for c in columns if c not in schema_names)]))

    @staticmethod
    def tested(row: Any, saved: Any, data: Any, notes: list[str]) -> tuple[Any, dict[str, float] | None, str]:
        """The best row as it is: the function's data, and any test split, are its own."""
        return row, None, "; ".join(notes)

    @staticmethod
    def test_metrics(test: Mapping[str, float] | None) -> dict[str, Any]:
        """best.yaml's test metrics: none of hpsearch's (a function's own are among its metrics)."""
        return {}

    @staticmethod
    def replay_note(result: Mapping[str, Any]) -> str:
        """best.yaml's line on what its replay prints."""
        return (f"# It prints {result['metric']} {result[result['metric']]:.4f} on epoch {result['epoch']} if the "
                "function is deterministic (no test metrics: the function has no test split).\n")

    @staticmethod
    def rerun_instead(space: Space, path: str) -> str | None:
        """A function on several workers does not replay on one process (python -m trainable refuses it):
        a search of its one config does."""
        if space.resources.workers <= 1:
            return None
        return (f"python -m search --space {space.source} --num-samples 1 with the config of {path} fixed "
                f"(python -m trainable replays a function on one process, and this one ran on "
                f"{space.resources.workers} workers)")

    # ---- the trainable and its code -------------------------------------------------------

    @staticmethod
    def reserved_names(space: Space) -> frozenset[str]:
        """The names its metrics cannot take: every column results.parquet holds for itself (its config keys,
        status, trial_id, where and when it ran, ...) and best.yaml's own keys. `epoch` among them: the
        function may report it only as the count of reports (trainable/function.py)."""
        measured = set(objectives_of(space.experiment).measured)
        columns = result_columns(OwnFunction.config_columns(space), OwnFunction.report_columns(space))
        return frozenset(c for c in [*columns, *metric_names_taken()] if c not in measured)

    @staticmethod
    def trainable(space: Space, given: Callable) -> Callable:
        """trainable/function.py's wrapper of the function, told the metrics the search reads and the names
        it may not report."""
        objectives = objectives_of(space.experiment)
        return function_trial(objectives.measured, len(objectives.metrics), OwnFunction.reserved_names(space))

    @staticmethod
    def runs_user_code(defaults: Any) -> bool:
        return True

    # ---- its checkpoint and export ---------------------------------------------------------

    def model_problem(self, where: str) -> str | None:
        """hpsearch cannot rebuild the function's model: it has not its code."""
        return (f"is a search of your own training function ({self.reference}): hpsearch cannot rebuild its "
                "model; its checkpoints hold the dict your function reported, which `python -m search export RUN "
                "--format state_dict` writes with the trial's config")

    def format_problem(self, fmt: str) -> str | None:
        """A model graph needs the model's code, which a function's run does not have: its checkpoint is a dict."""
        if fmt == "state_dict":
            return None
        return (f"{fmt} needs the model's code, and a search of your own training function ({self.reference}) "
                "keeps only the dict it checkpointed; --format state_dict writes that dict with the trial's config")

    @staticmethod
    def chosen(report: Mapping[str, Any], saved: Any) -> tuple[list[str], dict[str, Any] | None]:
        """The metrics an export names (those the function reported at that epoch) and the trial's config, as
        best.yaml holds it."""
        config = report.get("config") or {}
        return list(report.get(METRIC_NAMES, ())), FunctionConfig.from_mapping(config).to_flat() if config else None

    def facts(self, saved: Any, config: dict[str, Any] | None) -> dict[str, Any]:
        """A function's model and inputs are its own: its config says what it built."""
        return {"trainable": self.reference, "config": config}

    @staticmethod
    def write(saved: Any, meta: dict[str, Any], fmt: str, output: str) -> None:
        """The dict it reported at that epoch (as `checkpoint` gives it back), under `state`."""
        import torch  # only for an export

        from trainable.model_export import EXPORT_FORMAT

        torch.save({"format": EXPORT_FORMAT, **meta, "state": saved["state"]}, output)

    @staticmethod
    def contents(meta: dict[str, Any]) -> str:
        return ("It holds the dict your function reported at that epoch (report(checkpoint=...)) under 'state', "
                "the trial's config (best.yaml's keys) under 'config', and its metrics. ")
