"""The space file's schema: each setting's type, rule and default beside it, and the one
mapping between a searched field and its Optuna distribution.

Sections only a search has (experiment, resources, data.root) are pydantic models: strict
types (the string "1" is not the number 1), unknown keys refused, and every problem said as
`section.key: rule, got value`, where the rule is the field's own (`rule(...)` beside it).
The trial config's fields (the data, training and model sections, and what `space:` may
search) are trainable.config.TrialConfig's; their facts (rule, section, searchable) live
beside those fields.

A searched field is parsed once, straight into an optuna.distributions object:

    {distribution: float, low, high, log: false, step: null}   FloatDistribution
    {distribution: int, low, high, log: false, step: 1}        IntDistribution (both bounds included)
    {distribution: choice, values: [...]}                      CategoricalDistribution

`loguniform`, `uniform` and `randint` are aliases (float with log, float, int). Any of them
may add `when: {KEY: VALUE}` or `when: {KEY: [V1, V2]}`: drawn only when the earlier searched
KEY took one of those values (docs/conditional.md; space.py checks the names and values). `Searched`
carries the distribution; asking a trial, the results column's type, the study's params, the
check before a search and spec.yaml all read it from there. A choice of mappings or lists is
labelled once (`label`: JSON with sorted keys), since Optuna's categories must be scalars.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Collection, Literal, Mapping, Protocol, TypeVar, cast, get_args

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError

from search.definition.objectives import names, parse_constraint
from trainable.config import LOSSES, check_value, coerce, is_integer_field, plain
from trainable.errors import problem
from trainable.metrics import (MEASURED, METRICS, OBJECTIVES, epoch_metrics, metric_name, metric_problems,
                               reports_accuracy)


class _Rule(Protocol):
    """A field's rule as pydantic calls it, with what rule_of and bad_entries read back from it."""

    rule: str
    entries: Callable[[Mapping[str, Any]], list[str]] | None

    def __call__(self, value: Any) -> Any: ...


def rule(text: str, check: Callable[[Any], bool] = lambda value: True,
         entries: Callable[[Mapping[str, Any]], list[str]] | None = None) -> AfterValidator:
    """A field's rule: `check` beyond its type, and `text`, the message for any problem with it.

    `entries`: for a mapping field, the keys of the entries that break the rule, so that each
    is named in its own message (experiment.stop_when.val_loss) rather than the whole mapping.
    """
    def validate(value: Any) -> Any:
        if not check(value):
            raise ValueError(text)
        return value

    checked = cast(_Rule, validate)  # a function takes attributes; mypy types it as a plain callable
    checked.rule, checked.entries = text, entries  # read back by rule_of, bad_entries
    return AfterValidator(validate)


def _rule_function(model: type[BaseModel], name: str) -> _Rule:
    for item in model.model_fields[name].metadata:
        if isinstance(item, AfterValidator) and hasattr(item.func, "rule"):
            return cast(_Rule, item.func)  # made by rule()
    raise TypeError(f"{model.__name__}.{name} has no rule")  # a programming error, not input


def rule_of(model: type[BaseModel], name: str) -> str:
    return _rule_function(model, name).rule


def entry_key(key: str, entry: Any) -> str:
    """An entry of mapping `key` as a message names it: experiment.stop_when.val_acc, or
    experiment.stop_when[''] for an odd key."""
    return f"{key}.{entry}" if isinstance(entry, str) and entry.strip() == entry != "" else f"{key}[{entry!r}]"


def entry_problems(key: str, rule_text: str, value: Any, bad: list[Any]) -> list[str]:
    """One problem per bad entry of mapping `value` (named key.entry), or one for the whole value
    where none is named."""
    return ([problem(entry_key(key, entry), rule_text, value[entry]) for entry in bad]
            or [problem(key, rule_text, value)])


def bad_entries(model: type[BaseModel], name: str, value: Any) -> list[str]:
    """The entries of a mapping `value` that break field `name`'s rule; [] where it names none."""
    entries = _rule_function(model, name).entries
    return entries(value) if entries is not None and isinstance(value, Mapping) else []


NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def is_run_name(value: Any) -> bool:
    """A run's folder name: one path component, no '..', no trailing newline."""
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None and value not in (".", "..")


NAME_RULE = "must be letters, digits, '_', '.' or '-', at most 128, starting with a letter or digit"


def run_name_problem(name: Any) -> str | None:
    """Why --name cannot name a run folder, or None: said by the CLI before Ray starts, and by the driver."""
    if is_run_name(name):
        return None
    return problem("--name", f"{NAME_RULE} (it names one folder)", name)


def _finite(v: float) -> bool:
    return math.isfinite(v)


DURATION = re.compile(r"\s*(\d+(?:\.\d*)?)\s*([smh]?)\s*")
SECONDS_PER = {"": 1, "s": 1, "m": 60, "h": 3600}


def budget_seconds(value: Any) -> float | None:
    """experiment.time_budget in seconds: a number, or `90s`, `30m`, `2h`; None if it is neither or
    not in (0, 10 years]."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (match := DURATION.fullmatch(value)):
        seconds = float(match[1]) * SECONDS_PER[match[2]]
    else:
        return None
    return seconds if _finite(seconds) and 0 < seconds <= 10 * 365 * 86400 else None


# ---- experiment.stop_when: {METRIC: 0.99} or {METRIC: '<= 0.05'} ----------------------------

STOP_WHEN_RULE = ("must be null or a mapping of {metrics} to a target: a finite number (reached in the "
                  "objective's direction) or '<= NUMBER' / '>= NUMBER', e.g. {{val_acc: 0.99}} or "
                  "{{val_loss: '<= 0.1'}}")
TARGET = re.compile(r"\s*(<=|>=)\s*(\S+)\s*")


def stop_target(value: Any) -> tuple[str | None, float] | None:
    """A stop_when target as (op, number): 0.99 -> (None, 0.99), '<= 0.05' -> ('<=', 0.05); None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        op, number = None, float(value)
    elif isinstance(value, str) and (match := TARGET.fullmatch(value)):
        try:
            op, number = match[1], float(match[2])
        except ValueError:
            return None
    else:
        return None
    return (op, number) if _finite(number) else None


def stop_when_valid(value: Any, metrics: Collection[str] | None) -> bool:
    """experiment.stop_when's rule; `metrics` None: any name (a function trainable's own metrics)."""
    return value is None or (isinstance(value, Mapping) and len(value) > 0 and all(
        isinstance(k, str) and k != "" and (metrics is None or k in metrics) and stop_target(t) is not None
        for k, t in value.items()))


def bad_targets(value: Mapping[str, Any], any_name: bool = False) -> list[str]:
    """The stop_when entries that are no target on a metric name (any name: a function's), each said on its own."""
    return [k for k, t in value.items() if not (stop_when_valid({k: t}, None) and (any_name or metric_name(k)))]


T = TypeVar("T")
Mode = Literal["max", "min"]
# search/searching/ordered.py builds them; auto is resolved to one of the others before a search starts
# (search/searching/choice.py), and spec.yaml holds the sampler it chose
Sampler = Literal["auto", "tpe", "random", "qmc", "cmaes", "gp", "nsga2"]
Scheduler = Literal["fifo", "asha", "hyperband", "bohb", "pbt"]
Logger = Literal["tensorboard", "mlflow", "wandb"]
SAMPLERS, SCHEDULERS, LOGGERS = get_args(Sampler), get_args(Scheduler), get_args(Logger)
OPTUNA_SAMPLERS = tuple(name for name in SAMPLERS if name != "auto")  #: those make_sampler builds
AUTO = "auto"  #: resources.gpus: auto, trials per GPU measured by a probe before the search


AList = Annotated[tuple[T, ...], Strict(False)]  # a YAML list (a list arrives; the tuple is the frozen form)
ONE = AfterValidator(lambda v: v[0] if isinstance(v, tuple) and len(v) == 1 else v)  # [val_acc] is val_acc


class Section(BaseModel):
    """A section of the space file: frozen, strictly typed, no unknown keys."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Experiment(Section):
    """How the search runs."""

    name: Annotated[str, rule(f"{NAME_RULE} (it names a folder)", is_run_name)] = "search"
    #: run folder prefix; a run is <storage_path>/<name>-<time> unless --name is given
    metric: Annotated[str | AList[str], rule(
        f"must be a metric the trainable reports, or a list of distinct ones: {', '.join(OBJECTIVES)}, or "
        "train_/val_<name> of training.metrics", lambda v: all(metric_name(m) for m in names(v))
        and 0 < len(names(v)) == len(set(names(v)))), ONE] = "val_acc"
    #: the reported metric to optimise; a list: several objectives (search/definition/objectives.py, pareto.yaml);
    #: checked against training.loss and training.metrics by training_metric_problems
    mode: Annotated[Mode | AList[Mode], rule("must be max or min, or a list of them"), ONE] = "max"
    #: one per metric
    constraints: Annotated[AList[Any], rule(
        "must be a list of 'METRIC <= NUMBER' or 'METRIC >= NUMBER' (each checked in search/definition/objectives.py)")] = ()
    #: each checked by search/definition/objectives.py; a trial that breaks one is infeasible: kept, marked, never best
    num_samples: Annotated[int, rule("must be an integer in [1, 1000000]", lambda v: 0 < v <= 1_000_000)] = 16
    #: trials in total
    max_concurrent: Annotated[int, rule("must be an integer in [1, 10000]", lambda v: 0 < v <= 10_000)] = 2
    #: trials running at once (ConcurrencyLimiter)
    seed: Annotated[int, rule("must be an integer in [0, 2**32)", lambda v: 0 <= v < 2**32)] = 0
    #: seeds the sampler and, with the trial number, every trial's seed
    sampler: Annotated[Sampler, rule(f"must be one of {', '.join(SAMPLERS)}")] = "auto"
    #: Optuna's samplers; their settings are pinned in search/searching/ordered.py. auto: gp for a space of
    #: numbers, tpe where a key is a choice or conditional, and cheaper ones past 200 trials (search/searching/choice.py)
    reproducible: Annotated[bool, rule("must be true or false")] = True
    #: trial n's config depends only on seed and n, whatever finishes first (search/searching/ordered.py)
    lag: Annotated[int | None, rule("must be null (max_concurrent - 1) or an integer in [0, 10000]",
                                    lambda v: v is None or 0 <= v <= 10_000)] = None
    #: reproducible: trial n is asked on the results of trials 0 .. n-lag-1; a fixed lag gives the same
    #: trials at any max_concurrent; below max_concurrent - 1 free slots wait longer for results (search/searching/searcher.py lag_of)
    scheduler: Annotated[Scheduler, rule(f"must be one of {', '.join(SCHEDULERS)}")] = "fifo"
    #: fifo (every trial runs all epochs), asha (stops poor trials early) or hyperband (asha in brackets
    #: that start at different epochs); reproducible with experiment.reproducible (search/searching/halving.py);
    #: pbt (population based training: poor trials copy better ones' weights and perturb lr, momentum,
    #: weight_decay, clip_norm; search/searching/pbt.py)
    grace_period: Annotated[int, rule("must be an integer in [1, 100000] (epochs)",
                                      lambda v: 0 < v <= 100_000)] = 1  #: asha, hyperband: epochs before a stop
    reduction_factor: Annotated[int, rule("must be an integer in [2, 1000]", lambda v: 1 < v <= 1000)] = 2
    #: asha, hyperband: keep the top 1/reduction_factor at each rung
    perturbation_interval: Annotated[int, rule("must be an integer in [1, 100000] (epochs)",
                                               lambda v: 0 < v <= 100_000)] = 1
    #: pbt: every this many epochs the population is ranked, and the bottom copies the top
    quantile_fraction: Annotated[float, rule("must be a number in (0, 0.5]", lambda v: _finite(v) and 0 < v <= 0.5)] \
        = 0.25  #: pbt: the fraction of trials that copy (bottom) and are copied (top) at a perturbation
    max_failures: Annotated[int, rule("must be an integer in [0, 1000]", lambda v: 0 <= v <= 1000)] = 2
    #: restarts of a crashed trial, from its last checkpoint
    checkpoint_every: Annotated[int, rule("must be an integer in [1, 100000] (epochs)",
                                          lambda v: 0 < v <= 100_000)] = 1
    #: a trial checkpoints every N epochs; its last epoch always
    num_to_keep: Annotated[int | None, rule("must be null (keep all) or an integer in [1, 100000]",
                                            lambda v: v is None or 0 < v <= 100_000)] = 1
    #: checkpoints kept per trial: the best num_to_keep by metric, and always the latest; null: all
    storage_path: Annotated[str, rule("must be a folder or URI", lambda v: v != "")] = "./runs"
    #: local folder or pyarrow.fs URI (s3://..., gs://..., file://...)
    trial_timeout: Annotated[float | None, rule("must be null (no limit) or a number of seconds in [1, 10000000]",
                                                lambda v: v is None or (_finite(v) and 1 <= v <= 1e7))] = None
    #: seconds one epoch of a trial may take; past it the trial ends as ERROR (trainable/watchdog.py)
    min_free_mb: Annotated[float, rule("must be a number of MB in [0, 1000000]",
                                       lambda v: _finite(v) and 0 <= v <= 1_000_000)] = 100.0
    #: below this much free space at a local storage path the search stops as Ctrl-C does (search/execution/disk_guard.py)
    connect_timeout: Annotated[float, rule("must be a number of seconds in (0, 86400]",
                                           lambda v: _finite(v) and 0 < v <= 86_400)] = 60.0
    #: seconds to wait for the cluster at --address before giving up
    time_budget: Annotated[float | str | None, rule(
        "must be null (no limit), a number of seconds or a duration like 90s, 30m, 2h, in (0, 10 years]",
        lambda v: v is None or budget_seconds(v) is not None)] = None
    #: once spent (from the search's start), no new trial starts; running ones stop at their next epoch end
    stop_when: Annotated[dict[str, float | str] | None, Field(strict=False), rule(
        STOP_WHEN_RULE.format(metrics=f"a reported metric ({', '.join(METRICS)}, or train_/val_<name> of "
                                      "training.metrics)"),
        lambda v: stop_when_valid(v, None) and all(metric_name(k) for k in v or {}), entries=bad_targets)] = None
    #: the search ends as with time_budget once a trial reaches a target: a number, in the objective's
    #: direction, or '<= NUMBER' / '>= NUMBER' (search/searching/budget.py targets_of, docs/budgets.md)
    # a YAML list arrives as a list: the tuple is the frozen form
    loggers: Annotated[tuple[Logger, ...], Field(strict=False), rule(f"must be a list of {', '.join(LOGGERS)}")] \
        = ("tensorboard",)  #: trackers: tensorboard (event files; [] for none), mlflow, wandb (offline)
    report: Annotated[bool, rule("must be true or false")] = True
    #: report.html and its figures at the search's end; false: none (seconds of matplotlib a search), and
    #: `python -m search report RUN` draws it from the run folder whenever wanted (search/outputs/report.py)
    enqueue: Annotated[tuple[dict[str, Any], ...], Field(strict=False),
                       rule("must be a list of mappings of searched keys to values")] = ()
    #: partial configs run first, as trials 0..k-1; their values are checked in search/searching/warm_start.py
    warm_start: Annotated[str | None, rule("must be null or an earlier run folder (runs/<name>, or a URI)",
                                           lambda v: v is None or v != "")] = None
    #: an earlier run whose finished trials the new study is told before trial 0 (search/searching/warm_start.py)




def own_metric_names(metric: Any) -> bool:
    """experiment.metric of a function: one identifier, or a list of distinct ones."""
    listed = [metric] if isinstance(metric, str) else metric if isinstance(metric, (list, tuple)) else None
    if not listed:
        return False
    return all(isinstance(m, str) and m.isidentifier() for m in listed) and \
        len(set(listed)) == len(listed)


class FunctionExperiment(Experiment):
    """The experiment of a function trainable: metric, constraints and stop_when name what the function
    reports (any identifier; each checked on its first report), the rest as for the canonical loop."""

    metric: Annotated[str | AList[str], rule(
        "must name a metric the function reports (a Python identifier), or a list of distinct ones",
        own_metric_names), ONE] = "val_acc"
    constraints: Annotated[AList[Any], rule("must be a list of 'METRIC <= NUMBER' or 'METRIC >= NUMBER'")] = ()
    stop_when: Annotated[dict[str, float | str] | None, Field(strict=False), rule(
        STOP_WHEN_RULE.format(metrics="a metric the function reports"), lambda v: stop_when_valid(v, None),
        entries=lambda v: bad_targets(v, any_name=True))] = None


def training_metric_problems(experiment: Experiment, fixed: Mapping[str, Any]) -> tuple[Experiment, list[str]]:
    """experiment.metric against the columns the canonical loop reports for training.loss and training.metrics.

    Without an experiment.metric, a loss other than cross_entropy (no accuracy) optimises val_loss, mode min.
    """
    loss, metrics = fixed.get("loss", LOSSES[0]), fixed.get("metrics", {})
    if not isinstance(loss, str) or not isinstance(metrics, Mapping):  # their own problems are said already
        return experiment, []
    problems = [problem(*p) for p in metric_problems(loss, metrics)]
    if "metric" not in experiment.model_fields_set and not reports_accuracy(loss):
        experiment = experiment.model_copy(update={"metric": "val_loss", **(
            {} if "mode" in experiment.model_fields_set else {"mode": "min"})})
    reported = (*epoch_metrics(loss, metrics), *MEASURED)
    why = "" if reports_accuracy(loss) else " (accuracy is reported with training.loss cross_entropy only)"
    rule = f"must be a metric the canonical loop reports with training.loss {loss}{why}: {', '.join(reported)}"
    if any(m not in reported for m in names(experiment.metric)):
        problems.append(problem("experiment.metric", rule, experiment.metric))
    problems += [problem(f"experiment.stop_when.{m}", rule, target)
                 for m, target in (experiment.stop_when or {}).items() if m not in reported]
    problems += [problem("experiment.constraints", rule, text) for text in experiment.constraints
                 if (c := parse_constraint(text)) is not None and c.metric not in reported]
    return experiment, problems


class Resources(Section):
    """What one trial reserves from Ray: `workers` times (cpus, gpus), placed as one unit."""

    # Ray counts resources in units of 1/10000; below 0.01 CPU a trial is a rounding error
    cpus: Annotated[float, rule("must be a number in [0.01, 1024]", lambda v: _finite(v) and 0.01 <= v <= 1024)] = 1.0
    #: CPUs per worker (also its torch thread count, at least 1); a trial of N workers holds N times this
    # a worker trains on one device, so more than one GPU per worker would idle
    gpus: Annotated[float | Literal["auto"], rule(
        "must be 0, a fraction in [0.01, 1] (0.25 packs four trials per GPU; a trial uses one GPU at most) "
        "or auto (measured)", lambda v: v == AUTO or (_finite(v) and (v == 0 or 0.01 <= v <= 1)))] = 0.0
    #: GPUs per worker: 0, a fraction <= 1, or auto (search/execution/gpu_probe.py)
    spread: Annotated[bool, rule("must be true or false")] = True
    #: raise the fraction when the trials at once would leave GPUs idle (search/execution/capacity.py)
    workers: Annotated[int, rule("must be an integer in [1, 1024]", lambda v: 1 <= v <= 1024)] = 1
    #: processes per trial, data-parallel (torch DistributedDataParallel: gloo on CPU, nccl on GPU); each
    #: worker holds cpus and gpus; a trial's workers are placed as one unit (trainable/distributed.py)
    placement: Annotated[Literal["pack", "spread"], rule("must be pack or spread")] = "pack"
    #: how a trial's workers are placed: pack (as few nodes as fit them) or spread (one per node where it can)


def worker_problems(resources: Resources, batch_sizes: Collection[tuple[str, Any]]) -> list[str]:
    """resources.workers against the rest: a global batch split evenly (each worker takes batch_size / workers
    of every batch), and whole GPUs (NCCL takes one GPU per process; two workers cannot share one)."""
    workers = resources.workers
    if workers == 1:
        return []
    problems = [problem(key, f"must be divisible by resources.workers ({workers}): each worker takes "
                             f"batch_size / workers examples of every batch", value)
                for key, value in batch_sizes
                if isinstance(value, int) and not isinstance(value, bool) and value % workers]
    if resources.gpus == AUTO:
        problems.append(problem("resources.gpus", f"auto is not measured for more than one worker "
                                                  f"(resources.workers {workers}); give 0 or 1", AUTO))
    elif not isinstance(resources.gpus, str) and 0 < resources.gpus < 1:  # a str is auto, said above
        problems.append(problem("resources.gpus", f"must be 0 or 1 with resources.workers {workers}: NCCL "
                                                  "needs a GPU of its own for each worker", resources.gpus))
    return problems


class DataRoot(Section):
    """data.root: the one key of the data section that is not the trial config's."""

    root: Annotated[str | None, rule("must be a folder (or null for the default)",
                                     lambda v: v is None or v != "")] = None


def section_of(raw: Mapping[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    """A section of the space file as a mapping ({} where it is absent); a problem where it is not a mapping."""
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(problem(name, "must be a mapping of keys to values", value))
        return {}
    return value


S = TypeVar("S", bound=Section)


def validated(model: type[S], section: str, values: Mapping[Any, Any], problems: list[str]) -> S:
    """`values` as `model`, or its defaults with every problem added to `problems`. `values`: the section as
    read, whose keys may be any YAML key (`1: 2` gives the int 1)."""
    try:
        return model.model_validate(dict(values))
    except ValidationError as error:
        seen = set()
        for e in error.errors():
            key = e["loc"][0] if e["loc"] else "(section)"
            if key in seen:  # a union says it once per member
                continue
            seen.add(key)
            value = values.get(key)
            if e["type"] in ("extra_forbidden", "invalid_key"):  # invalid_key: a key that is no string
                problems.append(problem(f"{section}.{key}", f"unknown key (known: {', '.join(sorted(model.model_fields))})",
                                        value))
                continue
            name = cast(str, key)  # any other error is a field's, located at its name
            rule_text = rule_of(model, name)
            problems += entry_problems(f"{section}.{key}", rule_text, value, bad_entries(model, name, value))
        try:  # the valid keys as given, so that the checks across keys say their problems in the same pass
            return model.model_validate({k: v for k, v in values.items() if k not in seen})
        except ValidationError:  # a rule across fields broke: the defaults
            return model()


# ---- searched fields ---------------------------------------------------------------------

KINDS = ("float", "int", "choice")
ALIASES = {"loguniform": ("float", True), "uniform": ("float", False), "randint": ("int", False)}
DISTRIBUTIONS = (*KINDS, *ALIASES)


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def label(value: Any) -> Any:
    """A choice's value as Optuna's category: scalars as they are, others as JSON with sorted keys."""
    return value if _scalar(value) else json.dumps(plain(value), sort_keys=True)


Range = FloatDistribution | IntDistribution  #: a searched range's distribution: a Searched's where it is no choice
When = tuple[tuple[str, tuple[Any, ...]], ...]  #: a `when:`: (earlier searched key, the values it must take), ...


def holds(when: When, drawn: Mapping[str, Any]) -> bool:
    """Whether a key with this `when:` is drawn, given the keys drawn before it (a key not drawn is absent)."""
    def as_label(value: Any) -> Any:
        value = value.tolist() if hasattr(value, "tolist") else value  # numpy scalars from a results frame
        if isinstance(value, float) and math.isnan(value):  # a null choice reads back from a results frame as NaN
            value = None
        return label(value)

    def among(value: Any, allowed: tuple[Any, ...]) -> bool:
        value = as_label(value)
        if value in {label(v) for v in allowed}:
            return True
        # a float with a step is drawn as low + k * step in floating point (0.01 + 6 * 0.01 is
        # 0.06999999999999999): the condition's 0.07 names that step; two steps are never this close
        return isinstance(value, float) and any(
            _is_number(v) and math.isclose(value, v, rel_tol=1e-9, abs_tol=1e-12) for v in allowed)

    return all(key in drawn and among(drawn[key], allowed) for key, allowed in when)


def not_drawn(conditions: list[tuple[str, When]], values: Mapping[str, Any]) -> set[str]:
    """The conditional keys a trial with these config values did not draw; `conditions`: (key, when) in the
    space section's order. A key whose condition names a key not drawn is not drawn either."""
    names = {name for name, _ in conditions}
    drawn = {key: value for key, value in values.items() if key not in names}
    for name, when in conditions:
        if holds(when, drawn):
            drawn[name] = values.get(name)
    return names - drawn.keys()


def conditions(searched: tuple[Searched, ...]) -> list[tuple[str, When]]:
    """The conditional keys of a space and their `when:`, in the space section's order (not_drawn's input)."""
    return [(d.name, d.when) for d in searched if d.when]


@dataclass(frozen=True)
class Searched:
    """One searched field of the trial config and its Optuna distribution."""

    name: str  #: the trial config's flat name: lr, batch_size, model.<key>
    distribution: CategoricalDistribution | Range  #: a choice's categories are the labels of `values`
    values: tuple[Any, ...] = ()  #: a choice's values, in the order of its categories
    when: When = ()  #: drawn only where every (earlier searched key, its allowed values) holds; (): always

    def holds(self, drawn: Mapping[str, Any]) -> bool:
        """Whether this key is drawn, given the values of the keys drawn before it (search/searcher.suggest)."""
        return holds(self.when, drawn)

    @property
    def is_choice(self) -> bool:
        return isinstance(self.distribution, CategoricalDistribution)

    @property
    def low(self) -> Any:
        return None if isinstance(self.distribution, CategoricalDistribution) else self.distribution.low

    @property
    def high(self) -> Any:
        return None if isinstance(self.distribution, CategoricalDistribution) else self.distribution.high

    def ask(self, trial: optuna.Trial) -> Any:
        """Draw this field in `trial`; the value the trial config gets (a choice's value, not its label)."""
        d = self.distribution
        if isinstance(d, CategoricalDistribution):
            return self.values[d.choices.index(trial.suggest_categorical(self.name, d.choices))]
        if isinstance(d, IntDistribution):
            return trial.suggest_int(self.name, d.low, d.high, step=d.step, log=d.log)
        return trial.suggest_float(self.name, d.low, d.high, step=d.step, log=d.log)

    def param(self, value: Any) -> Any:
        """A trial config's value as Optuna's param (a choice's label; a plain int or float)."""
        if hasattr(value, "tolist"):  # numpy scalars from a results frame
            value = value.tolist()
        if self.is_choice:
            if isinstance(value, float) and math.isnan(value) and None in self.values:
                value = None  # a null choice in a float column reads back as NaN
            return label(value)
        return int(value) if isinstance(self.distribution, IntDistribution) else float(value)

    def example(self) -> Any:
        """A value the search can draw: a choice's first value, a range's low end (of the drawn type)."""
        return self.values[0] if self.is_choice else self.low

    def largest(self) -> Any:
        """The largest value it can draw (a choice's largest, where they compare)."""
        return max(self.values) if self.is_choice else self.high

    def to_raw(self) -> dict[str, Any]:
        """The canonical space-file form (spec.yaml)."""
        d = self.distribution
        if isinstance(d, CategoricalDistribution):
            raw = {"distribution": "choice", "values": plain(list(self.values))}
        else:
            kind = "int" if isinstance(d, IntDistribution) else "float"
            raw = {"distribution": kind, "low": d.low, "high": d.high, "log": d.log}
            if d.step is not None and not (kind == "int" and d.step == 1):
                raw["step"] = d.step
        if self.when:
            raw["when"] = {key: plain(list(allowed)) for key, allowed in self.when}
        return raw


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _on_grid(span: float, step: float) -> bool:
    steps = span / step
    return math.isclose(steps, round(steps), rel_tol=0, abs_tol=1e-8)


def field_value(path: str, name: str, value: Any, problems: list[str]) -> Any:
    """`value` checked against field `name`'s own type and rule (a bound, a choice)."""
    broken = check_value(name, value)
    if broken:
        problems.append(problem(path, broken, value))
        return None
    return coerce(name, value)[0]


def parse_searched(name: str, spec: Mapping[str, Any], problems: list[str]) -> Searched | None:
    """`space.<name>: {distribution: ...}` as a Searched, or None with every problem added."""
    path = f"space.{name}"
    before = len(problems)
    when = parse_when(path, spec["when"], problems) if "when" in spec else ()
    spec = {key: value for key, value in spec.items() if key != "when"}
    written = spec.get("distribution")
    if written not in DISTRIBUTIONS:
        known = {"distribution", "low", "high", "log", "step", "values", "when"}
        for key in spec:
            if key not in known:
                problems.append(problem(f"{path}.{key}", f"unknown key (known: {', '.join(sorted(known))})", spec[key]))
        if "distribution" in spec:
            problems.append(problem(f"{path}.distribution", f"must be one of {', '.join(DISTRIBUTIONS)}", written))
        else:
            problems.append(f"{path}: needs a distribution key ({', '.join(DISTRIBUTIONS)}), got keys {sorted(spec)}")
        return None
    kind, alias_log = ALIASES.get(written, (written, None))
    allowed = {"distribution", "values"} if kind == "choice" else \
        {"distribution", "low", "high"} | ({"log", "step"} if alias_log is None else set())
    for key in spec:
        if key not in allowed:
            known_keys = ", ".join(sorted(allowed | {"when"}))
            problems.append(problem(f"{path}.{key}", f"unknown key for {written} (known: {known_keys})", spec[key]))
    if kind == "choice":
        found = _choice(name, path, spec.get("values"), problems, before)
        return found and dataclasses.replace(found, when=when)
    integer_field = is_integer_field(name)
    if kind == "float" and integer_field:
        if written == "float":
            problems.append(problem(f"{path}.distribution", f"must be int or choice ({name} is an integer field)",
                                    written))
            return None
        kind = "int"  # loguniform/uniform on an integer field always drew integers: the alias keeps that
    log = alias_log if alias_log is not None else spec.get("log", False)
    step = spec.get("step")
    if not isinstance(log, bool):
        problems.append(problem(f"{path}.log", "must be true or false", log))
    # as written: each is checked to be a number below, before any arithmetic on it
    low: Any = spec.get("low")
    high: Any = spec.get("high")
    for key, bound in (("low", low), ("high", high)):
        if not _is_number(bound):
            problems.append(problem(f"{path}.{key}", f"must be a number for {written}", bound))
        elif kind == "int" and not _is_int(bound):
            problems.append(problem(f"{path}.{key}", f"must be an integer for {written}" if written in ("int", "randint")
                                    else f"must be an integer ({name} is an integer field)", bound))
        elif log is True and bound <= 0:
            problems.append(problem(f"{path}.{key}", f"must be > 0 for {written}" + (" with log" if written in KINDS
                                                                                      else ""), bound))
        else:
            field_value(f"{path}.{key}", name, bound, problems)
    if step is not None:
        if not (_is_int(step) if kind == "int" else _is_number(step)) or step <= 0:
            problems.append(problem(f"{path}.step", f"must be a positive {'integer' if kind == 'int' else 'number'}",
                                    step))
        elif log is True:
            problems.append(problem(f"{path}.step", "cannot be combined with log: true (Optuna's rule)", step))
    if len(problems) > before:
        return None
    if step is not None and not _on_grid(high - low, step):  # Optuna would move high without a word
        problems.append(problem(f"{path}.step", f"must divide high - low ({high} - {low})", step))
        return None
    if low > high or (low == high and written in ALIASES):  # the aliases always asked for a range
        problems.append(problem(f"{path}.low", f"must be < high ({high})" if written in ALIASES
                                else f"must be <= high ({high})", low))
        return None
    if kind == "int":
        return Searched(name, IntDistribution(low, high, log=log, step=1 if step is None else step), when=when)
    return Searched(name, FloatDistribution(float(low), float(high), log=log,
                                            step=None if step is None else float(step)), when=when)


def parse_when(path: str, when: Any, problems: list[str]) -> When:
    """`when: {KEY: VALUE}` or `{KEY: [V1, V2]}` as ((KEY, (V1, V2)), ...); its form only (space.py checks
    that each KEY is an earlier searched key and each value one it can take). A list is always a list of
    values: a value that is itself a list is written inside one, `[[64, 32]]`."""
    if not isinstance(when, dict) or not when:
        problems.append(problem(f"{path}.when", "must be a mapping of an earlier searched key to a value or a "
                                                "list of values, e.g. {optimizer: sgd}", when))
        return ()
    out = []
    for key, allowed in when.items():
        if not isinstance(key, str):
            problems.append(problem(f"{path}.when", "must name keys of the space section", key))
        elif isinstance(allowed, list) and not allowed:
            problems.append(problem(f"{path}.when.{key}", "must be a value or a non-empty list of values", allowed))
        else:
            out.append((key, tuple(allowed) if isinstance(allowed, list) else (allowed,)))
    return tuple(out)


def _choice(name: str, path: str, values: Any, problems: list[str], before: int) -> Searched | None:
    if not isinstance(values, list) or not values:
        problems.append(problem(f"{path}.values", "must be a non-empty list", values))
        return None
    typed = [field_value(f"{path}.values[{i}]", name, v, problems) for i, v in enumerate(values)]
    if len(problems) > before:
        return None
    labels = [label(v) for v in typed]
    if len(set(map(json.dumps, labels))) < len(labels):
        problems.append(problem(f"{path}.values", "must not repeat a value", values))
        return None
    scalars = [v for v in labels if not isinstance(v, str)]
    if len(set(scalars)) < len(scalars):  # Optuna finds a drawn value by ==: true would be recorded as 1
        problems.append(problem(f"{path}.values", "must not hold two values that compare equal (1, 1.0 and true, "
                                "0 and false: Optuna would record one as the other)", values))
        return None
    return Searched(name, CategoricalDistribution(labels), tuple(typed))
