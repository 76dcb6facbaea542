"""The canonical training loop as a kind of trial (trainable/loop.py; search/definition/kind.py says what a kind answers).

What this kind owns: its keys are the trial config's fields (trainable/config.py), in the model, data and
training sections (fixed) and `space` (searched, a factory keyword as `model.<key>`); experiment.metric
names a column the loop reports for training.loss and training.metrics; its config is a TrialConfig; pbt
may change its lr, momentum, weight_decay and clip_norm mid-run; Tune runs trainable/adapter.py's
tune_trial (or the trainable a caller gives); its checkpoint holds the model's weights and config, so its
export is the model itself, as a graph or a state dict (trainable/model_export.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from optuna.distributions import IntDistribution

from search.definition.objectives import objectives_of
from search.definition.objectives import problems as objective_problems
from search.definition.schema import (DataRoot, Experiment, Resources, Searched, field_value, parse_searched,
                                      section_of, training_metric_problems, validated)
from trainable.config import (FACTORY_KEY, FIELDS, MODEL, MOVED, MUTABLE, TrialConfig, absolute_reference,
                              cross_field_problems, field_of, fields_in, keyword_of, kind, model_key, plain,
                              searchable, section)
from trainable.errors import ConfigError, problem
from trainable.function import TRAINABLE_KEY
from trainable.metrics import OBJECTIVES, epoch_metrics
from trainable.report import REPORT_COLUMNS, load_checkpoint
from trainable.report import report_columns as epoch_report_columns

if TYPE_CHECKING:
    from search.definition.space import Space

SECTIONS = ("experiment", "resources", "model", "data", "training", "space")
DATA_KEYS = {"args": "data_args"}  # data section key -> trial config field, where they differ
MOVED_KEYS = {key: f"{to} (in the model section, or space: {to})" for key, to in MOVED.items()}


class CanonicalLoop:
    """A search of the canonical loop: model, data and training fields."""

    name = "loop"
    reference = None
    default_format = "torchscript"  #: its checkpoint rebuilds the model: a TorchScript file of it
    load_checkpoint: Callable[[str | Path], Any] = staticmethod(load_checkpoint)
    checkpoints_kept_by = "experiment.checkpoint_every, num_to_keep"  #: what decides its checkpoints
    without_checkpoint = "no test metrics and export (its config replays without one)"  #: what that epoch loses
    no_checkpoint_why = "experiment.checkpoint_every skipped that epoch"  #: besides num_to_keep

    # ---- the space file -------------------------------------------------------------------

    @staticmethod
    def section_problems(raw: Mapping[str, Any]) -> list[str]:
        return [problem(str(key), f"unknown section (known: {', '.join(SECTIONS)}; and {TRAINABLE_KEY}: "
                                  "FILE.py:FUNCTION, your own training function)", raw[key])
                for key in raw if key not in ("run", TRAINABLE_KEY) and key not in SECTIONS]  # run: spec.yaml's

    @staticmethod
    def experiment(raw: Mapping[str, Any], problems: list[str]) -> Experiment:
        experiment = validated(Experiment, "experiment", section_of(raw, "experiment", problems), problems)
        problems += objective_problems(experiment)
        return experiment

    @staticmethod
    def resource_problems(resources: Resources) -> list[str]:
        return []

    @staticmethod
    def keys(raw: Mapping[str, Any], base: Path, problems: list[str]
             ) -> tuple[dict[str, Any], list[Searched], str | None]:
        """The trial config: model, data and training fields fixed, space fields searched; and data.root."""
        fixed: dict[str, Any] = {}
        for key, value in section_of(raw, MODEL, problems).items():
            name = model_key(key)
            fixed[name] = field_value(name, name, absolute_reference(value, base) if key == "factory" else value,
                                      problems)

        data = dict(section_of(raw, "data", problems))
        data_root = validated(DataRoot, "data", {"root": data.pop("root")} if "root" in data else {}, problems).root
        for sec, values in (("data", data), ("training", section_of(raw, "training", problems))):
            for key, value in values.items():
                name = DATA_KEYS.get(key, key) if sec == "data" else key
                if name not in fields_in(sec) or (sec == "data" and key in DATA_KEYS.values()):
                    problems.append(_key_problem(sec, key, value))
                else:
                    fixed[name] = field_value(f"{sec}.{key}", name, absolute_reference(value, base)
                                              if name in ("dataset", "loss") else value, problems)

        searched = []
        for key, value in section_of(raw, "space", problems).items():
            wrong = _space_key_problem(key, value, fixed)
            if wrong:
                problems.append(wrong)
            # a model keyword may itself be a mapping: searched only with a distribution key
            elif isinstance(value, dict) and (keyword_of(key) is None or "distribution" in value):
                found = parse_searched(key, value, problems)
                if found:
                    searched.append(found)
            else:
                fixed[key] = field_value(f"space.{key}", key, value, problems)
        return fixed, searched, data_root

    @staticmethod
    def default_batch_size(fixed: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """The fixed batch_size, or the trial config's default."""
        return [("training.batch_size", fixed.get("batch_size", FIELDS["batch_size"].default))]

    @staticmethod
    def metric_problems(experiment: Experiment, fixed: Mapping[str, Any], searched: list[Searched],
                        problems: list[str]) -> tuple[Experiment, list[str]]:
        """experiment.metric against the columns training.loss and training.metrics make; then, where nothing
        else is wrong, the fields' rules across each other."""
        experiment, found = training_metric_problems(experiment, fixed)
        if not problems and not found:
            found += cross_field_problems(fixed, "data.")
        return experiment, found

    @staticmethod
    def default_epochs(fixed: Mapping[str, Any]) -> tuple[bool, int | None]:
        """(False, None) where the fixed keys make no valid trial config (their own problems are said, not the
        schedule's); else (True, training.epochs)."""
        try:
            epochs = TrialConfig.from_mapping(fixed).epochs
        except (ConfigError, TypeError, ValueError):
            return False, None
        valid = isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0
        return valid, epochs if valid else None

    @staticmethod
    def pbt(experiment: Experiment, searched: tuple[Searched, ...], epochs: int | None
            ) -> tuple[Experiment, list[str]]:
        found = pbt_problems(experiment, searched, epochs or 0)
        # every checkpoint kept: an exploit restores one the copied trial has moved past
        return experiment.model_copy(update={"num_to_keep": None}), found

    @staticmethod
    def typed_key(key: str) -> str:
        """A key's value checks as its trial config field's (experiment.enqueue's values)."""
        return key

    @staticmethod
    def config(values: Mapping[str, Any], workers: int = 1) -> TrialConfig:
        # workers is the driver's (resources.workers), a config field so that best.yaml replays with as many
        return TrialConfig.from_mapping({**values, "workers": workers})

    def to_raw(self, space: Space) -> dict[str, Any]:
        defaults = CanonicalLoop.config(space.fixed, space.resources.workers).to_dict()
        model = defaults.pop(MODEL)
        data_section = {"root": space.data_root}
        for name in fields_in("data"):
            data_section[{v: k for k, v in DATA_KEYS.items()}.get(name, name)] = defaults.pop(name)
        searched = {d.name for d in space.searched}
        training = {k: v for k, v in defaults.items() if k in fields_in("training") and k not in searched}
        model = {k: v for k, v in model.items() if model_key(k) not in searched}
        return {
            "experiment": plain(space.experiment.model_dump()),
            "resources": space.resources.model_dump(),
            MODEL: model,
            "data": data_section,
            "training": training,
            "space": {d.name: d.to_raw() for d in space.searched},
        }

    # ---- its columns and metrics ----------------------------------------------------------

    @staticmethod
    def config_columns(space: Space) -> list[str]:
        """Every field of the trial config, and model.<key> for its factory's keywords."""
        flat = CanonicalLoop.config(space.fixed, space.resources.workers).to_flat()
        model_keys = sorted({k for k in [*flat, *(d.name for d in space.searched)] if keyword_of(k) is not None})
        ordered = []
        for name in FIELDS:
            if name == "model":
                ordered += [FACTORY_KEY, *model_keys]
            elif name != "model_args":
                ordered.append(name)
        return ordered

    @staticmethod
    def report_columns(space: Space) -> list[str]:
        # training.loss and training.metrics decide the metric columns
        defaults = CanonicalLoop.config(space.fixed, space.resources.workers)
        return epoch_report_columns(epoch_metrics(defaults.loss, defaults.metrics))

    @staticmethod
    def column_type(name: str, searched: Searched | None, defaults: Mapping[str, Any]) -> str | list[Any]:
        """A config column's type (int, float, bool, str, json), or the values it may hold (a choice, a keyword's
        fixed value), whose one type results.parquet finds."""
        if searched is not None and searched.is_choice:
            return list(searched.values)
        if keyword_of(name) is not None:
            if searched is None:
                return [defaults.get(name)]
            return "int" if isinstance(searched.distribution, IntDistribution) else "float"
        return "json" if kind(field_of(name)) == "mapping" else kind(field_of(name))

    @staticmethod
    def config_names(names: list[str]) -> list[str]:
        """Of results.parquet's columns, the trial config's."""
        return [n for n in names if n in FIELDS or n == FACTORY_KEY or keyword_of(n) is not None]

    @staticmethod
    def report_row(report: Mapping[str, Any], config: Mapping[str, Any], first: Mapping[str, Any]
                   ) -> dict[str, Any]:
        """A results row's report columns: the fixed ones and training.metrics' (train_<name>, val_<name>, as the
        trial's first report has them), and the config its epoch ran with where PBT changed it."""
        own = report.get("config")  # Tune records the config of each report: PBT changes it between epochs
        changed = TrialConfig.from_mapping(own).to_flat() if isinstance(own, Mapping) and own != config else {}
        metric_columns = [c for c in first if c.startswith(("train_", "val_"))]
        return {**changed, **{c: report.get(c) for c in [*REPORT_COLUMNS, *metric_columns]}}

    @staticmethod
    def reported_columns(names: list[str], rows: Iterable[Mapping[str, Any]]) -> list[str]:
        """None beyond the schema's: training.loss and training.metrics decide every column before a trial runs."""
        return []

    @staticmethod
    def best_metrics(space: Space, columns: list[str], schema_names: list[str]) -> tuple[str, ...]:
        """best.yaml's metrics: the columns training.loss and training.metrics make."""
        defaults = CanonicalLoop.config(space.fixed, space.resources.workers)
        return epoch_metrics(defaults.loss, defaults.metrics)

    @staticmethod
    def front_metrics(space: Space, columns: list[str], schema_names: list[str]) -> list[str]:
        """pareto.yaml's metrics: the loop's objectives, then the search's."""
        return list(dict.fromkeys([*OBJECTIVES, *objectives_of(space.experiment).metrics]))

    @staticmethod
    def tested(row: Any, saved: Any, data: Any, notes: list[str]) -> tuple[Any, dict[str, float] | None, str]:
        """The best row with its lineage (where its weights come from: best.yaml replays it), and the metrics of
        its checkpoint (`saved`) on the dataset's test part (`data`, trainable.data.Data), if it has one."""
        from trainable.device import get_default_device  # torch: only once a search ends
        from trainable.loop import metrics_on

        row = row.copy()
        row.attrs["lineage"] = saved.state.get("lineage")
        if data.test is None:
            return row, None, "; ".join(["the dataset has no test part", *notes])
        score = metrics_on(saved.config, saved.state["model"], saved.input_shape, saved.num_classes,
                           data.test, data.standardize, get_default_device())
        return row, score, "; ".join(notes)

    @staticmethod
    def test_metrics(test: Mapping[str, float] | None) -> dict[str, Any]:
        """best.yaml's metrics of the best epoch's checkpoint on the test part; test_acc null where accuracy is
        not reported (regression), all null where the dataset has no test part."""
        return {"test_acc": None if test is None else test.get("test_acc"),
                "test_loss": None if test is None else test["test_loss"], **(test or {})}

    @staticmethod
    def replay_note(result: Mapping[str, Any]) -> str:
        """best.yaml's lines on what its replay prints."""
        shown = result["metric"] if isinstance(result["metric"], str) and result["metric"] in result else "val_loss"
        return (f"# It prints {shown} {result[shown]:.4f} on epoch {result['epoch']} (same machine).\n"
                "# test_*: the checkpoint of that epoch on the dataset's test part (null if it has none).\n")

    @staticmethod
    def rerun_instead(space: Space, path: str) -> str | None:
        """python -m trainable replays any of its configs, on as many workers as it ran."""
        return None

    # ---- the trainable and its code -------------------------------------------------------

    @staticmethod
    def trainable(space: Space, given: Callable) -> Callable:
        """The trainable the caller gives (trainable/adapter.py tune_trial, unless a test gives another)."""
        return given

    @staticmethod
    def runs_user_code(defaults: Any) -> bool:
        """Whether a trial runs the user's code: a model factory or dataset function of theirs."""
        return ":" in defaults.model or ":" in defaults.dataset

    # ---- its checkpoint and export ---------------------------------------------------------

    @staticmethod
    def model_problem(where: str) -> str | None:
        """Why hpsearch cannot rebuild the model of a checkpoint: it can, from the config beside the weights."""
        return None

    @staticmethod
    def format_problem(fmt: str) -> str | None:
        return None

    @staticmethod
    def chosen(report: Mapping[str, Any], saved: Any) -> tuple[list[str], dict[str, Any] | None]:
        """The metrics an export names (the loop's for its loss and metrics) and the config it writes beside
        the weights (None: the checkpoint's own)."""
        return list(epoch_metrics(saved.config.loss, saved.config.metrics)), None

    @staticmethod
    def facts(saved: Any, config: dict[str, Any] | None) -> dict[str, Any]:
        from trainable.model_export import model_facts  # torch: only for an export

        return model_facts(saved)

    @staticmethod
    def write(saved: Any, meta: dict[str, Any], fmt: str, output: str) -> None:
        from trainable.model_export import model_of, write  # torch: only for an export

        write(model_of(saved), meta, fmt, output)

    @staticmethod
    def contents(meta: dict[str, Any]) -> str:
        from trainable.model_export import contents

        return contents(meta)


def _key_problem(sec: str, key: Any, value: Any) -> str:
    """Why `key` is not a key of the data or training section: moved, elsewhere, the driver's, unknown."""
    name = DATA_KEYS.get(key, key) if sec == "data" else key
    elsewhere = section(name) if name in FIELDS and name not in ("model", "model_args") else None
    rule = (f"moved to {MOVED_KEYS[key]}" if key in MOVED_KEYS else
            "is set by resources.workers" if name == "workers" else
            "is set by the driver per trial" if elsewhere == "driver" else
            f"belongs in the {elsewhere} section" if elsewhere and elsewhere != sec else
            f"unknown key (known: {', '.join(_section_keys(sec))})")
    return problem(f"{sec}.{key}", rule, value)


def _section_keys(sec: str) -> list[str]:
    if sec == "data":
        return ["root", *[{v: k for k, v in DATA_KEYS.items()}.get(f, f) for f in fields_in("data")]]
    return list(fields_in("training"))


def _space_key_problem(key: Any, value: Any, fixed: Mapping[str, Any]) -> str | None:
    """Why `space.<key>` cannot be searched or fixed there, or None."""
    path = f"space.{key}"
    if not isinstance(key, str) or (key not in FIELDS and key != FACTORY_KEY and keyword_of(key) is None) \
            or key in ("model", "model_args"):
        rule = f"moved to {MOVED_KEYS[key]}" if key in MOVED_KEYS else "unknown field of the trial config"
        return problem(path, rule, value)
    where = {"data": "the data section", "model": "the model section", "driver": "the driver",
             "training": "the training section, the same for every trial (training.loss and training.metrics "
                         "decide the reported columns and their scale)"}
    if not searchable(key):
        return problem(path, f"cannot be searched: it is set by {where[section(key)]}", value)
    if key in fixed:
        return problem(path, f"is also fixed in the {section(key)} section; set it in one place", value)
    return None


def pbt_problems(experiment: Experiment, searched: tuple[Searched, ...], epochs: int) -> list[str]:
    """What scheduler pbt needs: a searched key it can change mid-run, epochs it can perturb between,
    and a checkpoint at every perturbation (a copied trial continues from it)."""
    problems = []
    names = {d.name for d in searched}
    if not names & set(MUTABLE):
        problems.append(problem("space", f"must search at least one of {', '.join(MUTABLE)} for scheduler pbt "
                                         "(the values it changes between epochs)", sorted(names)))
    if "epochs" in names:
        problems.append(problem("space.epochs", "cannot be searched with scheduler pbt: the population trains "
                                                "in step, every trial the same epochs", "searched"))
    elif experiment.perturbation_interval >= epochs:
        problems.append(problem("experiment.perturbation_interval", f"must be < the epochs a trial runs ({epochs}) "
                                "for pbt: no perturbation happens at or after the last epoch",
                                experiment.perturbation_interval))
    if "num_to_keep" in experiment.model_fields_set and experiment.num_to_keep is not None:
        problems.append(problem("experiment.num_to_keep", "must be null (keep all) for pbt: a trial that copies "
                                "another restores a checkpoint the other may since have replaced (Ray warns of "
                                "the same)", experiment.num_to_keep))
    for d in searched:
        if d.when:  # Ray's PBT gives every trial every key, and perturbs and copies whole configs
            problems.append(problem(f"space.{d.name}.when", "is not supported with scheduler pbt: its trials copy "
                                    "and perturb whole configs, so every searched key must be drawn in every trial",
                                    {k: list(v) if len(v) > 1 else v[0] for k, v in d.when}))
    for key in ("time_budget", "stop_when", "enqueue", "warm_start"):  # they act through the searcher pbt lacks
        if getattr(experiment, key):
            problems.append(problem(f"experiment.{key}", "is not supported with scheduler pbt: Ray's PBT takes no "
                                    "searcher, and the population is drawn up front", getattr(experiment, key)))
    if experiment.perturbation_interval % experiment.checkpoint_every:
        problems.append(problem("experiment.checkpoint_every", f"must divide perturbation_interval "
                                f"({experiment.perturbation_interval}) for pbt: a copied trial continues from "
                                "that epoch's checkpoint", experiment.checkpoint_every))
    return problems
