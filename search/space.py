"""The space file: what to tune, validated at the edge into frozen, typed objects.

A space file has six sections, all optional (defaults below):

    experiment: name, metric, mode, num_samples, max_concurrent, seed, scheduler, ...
    resources:  cpus, gpus, spread     (per trial; gpus may be fractional, e.g. 0.25, or auto)
    model:      factory (mlp, cnn, FILE.py:CALLABLE, package.module:CALLABLE) + its keyword arguments
    data:       root, dataset (built-in or FILE.py:FUNCTION), args + the trial config's data fields
    training:   fixed trial config fields (epochs, optimizer, lr, ...)
    space:      searched fields: {distribution: loguniform|uniform|randint|choice, ...}
                or plain values (fixed); a factory keyword is `model.<key>`

Every problem is collected and reported at once as `path.to.key: rule, got value`.
Nothing here touches Ray, data or user code, so a bad file fails in a second, not after
start-up (search/driver.check_search then imports the references and tries the model once).
`to_raw` writes a Space back as a space file: the run folder's spec.yaml.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from trainable.config import (FIELDS, MODEL, MOVED, TrialConfig, absolute_reference, check_value, coerce,
                              cross_field_problems, is_integer_field, plain)
from trainable.errors import ConfigError, problem
from trainable.metrics import METRICS

SCHEDULERS = ("fifo", "asha")
LOGGERS = ("tensorboard", "mlflow", "wandb")
SAMPLERS = ("tpe", "random", "qmc", "cmaes", "gp")  # search/ordered.py builds them; kept here so validation imports no Optuna
MODES = ("max", "min")
DISTRIBUTIONS = ("loguniform", "uniform", "randint", "choice")
# Trial config fields of the data section: one split for the whole search, never searched.
# (data.args in the file is the trial config's data_args.)
DATA_FIELDS = ("dataset", "data_args", "train_size", "val_size", "split_seed", "source", "num_workers",
               "pin_memory", "persistent_workers", "drop_last")
DATA_KEYS = {"args": "data_args"}  # data section key -> trial config field, where they differ
# Set by the driver for each trial (seed from experiment.seed, threads from resources.cpus).
DRIVER_FIELDS = ("seed", "num_threads", "trial_number")
# Fields whose change would change the data every trial is judged on.
NOT_SEARCHABLE = ("dataset", "data_args", "train_size", "val_size", "split_seed") + DRIVER_FIELDS
TRAINING_FIELDS = tuple(n for n in FIELDS if n not in DATA_FIELDS and n not in DRIVER_FIELDS
                        and n not in ("model", "model_args"))
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


@dataclass(frozen=True)
class Experiment:
    """How the search runs."""

    name: str = "search"  #: run folder prefix; a run is <storage_path>/<name>-<time> unless --name is given
    metric: str = "val_acc"  #: the reported metric to optimise (one of trainable.metrics.METRICS)
    mode: str = "max"  #: max or min
    num_samples: int = 16  #: trials in total
    max_concurrent: int = 2  #: trials running at once (ConcurrencyLimiter)
    seed: int = 0  #: seeds the sampler and, with the trial number, every trial's seed
    sampler: str = "tpe"  #: tpe, random, qmc, cmaes or gp (Optuna's samplers; settings pinned in search/ordered.py)
    reproducible: bool = True  #: trial n's config depends only on seed and n, whatever finishes first (search/ordered.py)
    scheduler: str = "fifo"  #: fifo (every trial runs all epochs) or asha (stops poor trials early)
    grace_period: int = 1  #: asha: epochs every trial gets before it can be stopped
    reduction_factor: int = 2  #: asha: keep the top 1/reduction_factor at each rung
    max_failures: int = 2  #: restarts of a crashed trial, from its last checkpoint
    checkpoint_every: int = 1  #: a trial checkpoints every N epochs; its last epoch always
    num_to_keep: int | None = None  #: checkpoints kept per trial (the best by metric, and always the latest); null: all
    storage_path: str = "./runs"  #: local folder or pyarrow.fs URI (s3://..., gs://...)
    connect_timeout: float = 60.0  #: seconds to wait for the cluster at --address before giving up
    loggers: tuple[str, ...] = ("tensorboard",)  #: trackers: tensorboard (always written), mlflow, wandb (offline)


@dataclass(frozen=True)
class Resources:
    """What one trial reserves from Ray."""

    cpus: float = 1.0  #: CPUs per trial (also its torch thread count, at least 1)
    gpus: float | str = 0.0  #: GPUs per trial: 0, a fraction <= 1 (0.25 packs four trials on a GPU), or auto (search/gpu_probe.py)
    spread: bool = True  #: raise the fraction when the trials at once would leave GPUs idle (search/capacity.py)


AUTO = "auto"  #: resources.gpus: auto, trials per GPU measured by a probe before the search


@dataclass(frozen=True)
class Distribution:
    """One searched field."""

    name: str
    distribution: str
    low: float | int | None = None
    high: float | int | None = None
    values: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Space:
    """A validated space file."""

    experiment: Experiment
    resources: Resources
    data_root: str | None
    fixed: Mapping[str, Any]  #: every fixed trial config field (data, training, plain space values)
    searched: tuple[Distribution, ...]
    source: str = "<memory>"  #: the file it came from, for messages

    def trial_defaults(self) -> TrialConfig:
        """The trial config with the fixed fields set and searched ones at their defaults."""
        return TrialConfig.from_mapping(self.fixed)


_RULES = {
    # key: (type check, rule)
    "experiment.name": (lambda v: is_run_name(v),
                        "must be letters, digits, '_', '.' or '-' (it names a folder)"),
    "experiment.metric": (lambda v: v in METRICS, f"must be a metric the trainable reports: {', '.join(METRICS)}"),
    "experiment.mode": (lambda v: v in MODES, "must be max or min"),
    "experiment.num_samples": (lambda v: _is_int(v) and 0 < v <= 1_000_000, "must be an integer in [1, 1000000]"),
    "experiment.max_concurrent": (lambda v: _is_int(v) and 0 < v <= 10_000, "must be an integer in [1, 10000]"),
    "experiment.seed": (lambda v: _is_int(v) and 0 <= v < 2**32, "must be an integer in [0, 2**32)"),
    "experiment.sampler": (lambda v: v in SAMPLERS, f"must be one of {', '.join(SAMPLERS)}"),
    "experiment.reproducible": (lambda v: isinstance(v, bool), "must be true or false"),
    "experiment.scheduler": (lambda v: v in SCHEDULERS, f"must be one of {', '.join(SCHEDULERS)}"),
    "experiment.grace_period": (lambda v: _is_int(v) and 0 < v <= 100_000, "must be an integer in [1, 100000] (epochs)"),
    "experiment.reduction_factor": (lambda v: _is_int(v) and 1 < v <= 1000, "must be an integer in [2, 1000]"),
    "experiment.max_failures": (lambda v: _is_int(v) and 0 <= v <= 1000, "must be an integer in [0, 1000]"),
    "experiment.checkpoint_every": (lambda v: _is_int(v) and 0 < v <= 100_000, "must be an integer in [1, 100000] (epochs)"),
    "experiment.num_to_keep": (lambda v: v is None or (_is_int(v) and 0 < v <= 100_000),
                               "must be null (keep all) or an integer in [1, 100000]"),
    "experiment.loggers": (lambda v: isinstance(v, (list, tuple)) and all(x in LOGGERS for x in v),
                           f"must be a list of {', '.join(LOGGERS)}"),
    "experiment.connect_timeout": (lambda v: _is_number(v) and 0 < v <= 86_400, "must be a number of seconds in (0, 86400]"),
    "experiment.storage_path": (lambda v: isinstance(v, str) and v != "", "must be a folder or URI"),
    # Ray counts resources in units of 1/10000; below 0.01 CPU a trial is a rounding error
    "resources.cpus": (lambda v: _is_number(v) and 0.01 <= v <= 1024, "must be a number in [0.01, 1024]"),
    # a trial trains on one device (the loop has no data parallelism), so more than one GPU would idle
    "resources.gpus": (lambda v: v == AUTO or (_is_number(v) and (v == 0 or 0.01 <= v <= 1)),
                       "must be 0, a fraction in [0.01, 1] (0.25 packs four trials per GPU; a trial uses "
                       "one GPU at most) or auto (measured)"),
    "resources.spread": (lambda v: isinstance(v, bool), "must be true or false"),
    "data.root": (lambda v: v is None or (isinstance(v, str) and v != ""), "must be a folder (or null for the default)"),
}


def is_run_name(value: Any) -> bool:
    """A run's folder name: one path component, no '..', no trailing newline."""
    return isinstance(value, str) and NAME_PATTERN.fullmatch(value) is not None and value not in (".", "..")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _section(raw: Mapping[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(problem(name, "must be a mapping of keys to values", value))
        return {}
    return value


def _settings(cls: type, section: str, values: Mapping[str, Any], problems: list[str]):
    known = {f.name for f in fields(cls)}
    kept = {}
    for key, value in values.items():
        path = f"{section}.{key}"
        if key not in known:
            problems.append(problem(path, f"unknown key (known: {', '.join(sorted(known))})", value))
        elif not _RULES[path][0](value):
            problems.append(problem(path, _RULES[path][1], value))
        else:
            kept[key] = tuple(value) if isinstance(value, list) else value
    return cls(**kept)


def _fixed_field(path: str, name: str, value: Any, problems: list[str]) -> Any:
    rule = check_value(name, value)
    if rule:
        problems.append(problem(path, rule, value))
        return None
    return coerce(name, value)[0]


def _distribution(name: str, spec: Mapping[str, Any], problems: list[str]) -> Distribution | None:
    path = f"space.{name}"
    kind = spec.get("distribution")
    if kind not in DISTRIBUTIONS:
        known = {"distribution", "low", "high", "values"}
        for key in spec:
            if key not in known:
                problems.append(problem(f"{path}.{key}", f"unknown key (known: {', '.join(sorted(known))})", spec[key]))
        if "distribution" in spec:
            problems.append(problem(f"{path}.distribution", f"must be one of {', '.join(DISTRIBUTIONS)}", kind))
        else:
            problems.append(f"{path}: needs a distribution key ({', '.join(DISTRIBUTIONS)}), got keys {sorted(spec)}")
        return None
    allowed = {"distribution", "values"} if kind == "choice" else {"distribution", "low", "high"}
    before = len(problems)
    for key in spec:
        if key not in allowed:
            problems.append(problem(f"{path}.{key}", f"unknown key for {kind} (known: {', '.join(sorted(allowed))})", spec[key]))
    if kind == "choice":
        values = spec.get("values")
        if not isinstance(values, list) or not values:
            problems.append(problem(f"{path}.values", "must be a non-empty list", values))
            return None
        for i, v in enumerate(values):
            _fixed_field(f"{path}.values[{i}]", name, v, problems)
        if len(problems) > before:
            return None
        return Distribution(name, kind, values=tuple(coerce(name, v)[0] for v in values))
    low, high = spec.get("low"), spec.get("high")
    for key, bound in (("low", low), ("high", high)):
        if not _is_number(bound):
            problems.append(problem(f"{path}.{key}", f"must be a number for {kind}", bound))
        elif kind == "randint" and not _is_int(bound):
            problems.append(problem(f"{path}.{key}", "must be an integer for randint", bound))
        elif kind == "loguniform" and bound <= 0:
            problems.append(problem(f"{path}.{key}", "must be > 0 for loguniform", bound))
        elif is_integer_field(name) and not _is_int(bound):
            problems.append(problem(f"{path}.{key}", f"must be an integer ({name} is an integer field)", bound))
        else:
            _fixed_field(f"{path}.{key}", name, bound, problems)
    if len(problems) > before:
        return None
    if low >= high:
        problems.append(problem(f"{path}.low", f"must be < high ({high})", low))
        return None
    return Distribution(name, kind, low=low, high=high)



def max_epochs(searched: tuple[Distribution, ...] | list[Distribution], fixed_epochs: int) -> int:
    """The most epochs any trial of the search runs (epochs may be searched)."""
    for d in searched:
        if d.name == "epochs":
            return int(max(d.values) if d.distribution == "choice" else d.high)
    return fixed_epochs


def _base_folder(source: str) -> Path:
    """Where a relative FILE.py reference points from: the space file's folder."""
    path = Path(source)
    return path.parent.resolve() if path.is_file() else Path.cwd()


def parse_space(raw: Mapping[str, Any], source: str = "<memory>") -> Space:
    """Validate a whole space mapping; raise one ConfigError listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        raise ConfigError([problem("(top level)", "must be a mapping of sections", raw)], source)
    for key in raw:
        if key == "run":  # spec.yaml's record of where the run lives: not part of the space
            continue
        if key not in SECTIONS:
            problems.append(problem(str(key), f"unknown section (known: {', '.join(SECTIONS)})", raw[key]))
    base = _base_folder(source)
    experiment = _settings(Experiment, "experiment", _section(raw, "experiment", problems), problems)
    resources = _settings(Resources, "resources", _section(raw, "resources", problems), problems)

    fixed: dict[str, Any] = {}
    for key, value in _section(raw, MODEL, problems).items():
        name = f"{MODEL}.{key}"
        fixed[name] = _fixed_field(name, name, absolute_reference(value, base) if key == "factory" else value, problems)

    data = dict(_section(raw, "data", problems))
    data_root = data.pop("root", None)
    if not _RULES["data.root"][0](data_root):
        problems.append(problem("data.root", _RULES["data.root"][1], data_root))
    for section, allowed, values in (("data", DATA_FIELDS, data),
                                     ("training", TRAINING_FIELDS, _section(raw, "training", problems))):
        for key, value in values.items():
            path = f"{section}.{key}"
            field_name = DATA_KEYS.get(key, key) if section == "data" else key
            if field_name not in allowed or (section == "data" and key in DATA_KEYS.values()):
                elsewhere = next((s for s, a in (("data", DATA_FIELDS), ("training", TRAINING_FIELDS))
                                  if key in a), None)
                rule = (f"moved to {MOVED_KEYS[key]}" if key in MOVED_KEYS else
                        f"belongs in the {elsewhere} section" if elsewhere and elsewhere != section else
                        "is set by the driver per trial" if key in DRIVER_FIELDS else
                        f"unknown key (known: {', '.join(_section_keys(section))})")
                problems.append(problem(path, rule, value))
            else:
                fixed[field_name] = _fixed_field(path, field_name, absolute_reference(value, base)
                                                 if field_name == "dataset" else value, problems)

    searched = []
    for key, value in _section(raw, "space", problems).items():
        path = f"space.{key}"
        if not isinstance(key, str) or (key not in FIELDS and not key.startswith(MODEL + ".")) \
                or key in ("model", "model_args"):
            rule = f"moved to {MOVED_KEYS[key]}" if key in MOVED_KEYS else "unknown field of the trial config"
            problems.append(problem(path, rule, value))
        elif key in NOT_SEARCHABLE or key == f"{MODEL}.factory":
            where = "the data section" if key in DATA_FIELDS else "the model section" if key.startswith(MODEL) \
                else "the driver"
            problems.append(problem(path, f"cannot be searched: it is set by {where}", value))
        elif key in fixed:
            where = "model" if key.startswith(MODEL + ".") else "data" if key in DATA_FIELDS else "training"
            problems.append(problem(path, f"is also fixed in the {where} section; set it in one place", value))
        elif isinstance(value, dict) and not key.startswith(MODEL + "."):
            dist = _distribution(key, value, problems)
            if dist:
                searched.append(dist)
        elif isinstance(value, dict) and "distribution" in value:  # a model keyword may itself be a mapping
            dist = _distribution(key, value, problems)
            if dist:
                searched.append(dist)
        else:
            fixed[key] = _fixed_field(path, key, value, problems)
    if not problems:
        problems += cross_field_problems(fixed, "data.")
    if not problems and experiment.scheduler == "asha":
        epochs = max_epochs(searched, TrialConfig.from_mapping(fixed).epochs)
        if experiment.grace_period > epochs:
            problems.append(problem("experiment.grace_period", f"must be <= the epochs a trial runs ({epochs}) "
                                                               "for asha", experiment.grace_period))
    if not problems and not searched:
        problems.append(problem("space", "must search at least one field (e.g. lr: {distribution: loguniform, "
                                         "low: 0.01, high: 0.3})", raw.get("space")))
    if problems:
        raise ConfigError(problems, source)
    return Space(experiment, resources, data_root, fixed, tuple(searched), source)


SECTIONS = ("experiment", "resources", "model", "data", "training", "space")
MOVED_KEYS = {key: f"{to} (in the model section, or space: {to})" for key, to in MOVED.items()}


def _section_keys(section: str) -> list[str]:
    if section == "data":
        return ["root", *[{v: k for k, v in DATA_KEYS.items()}.get(f, f) for f in DATA_FIELDS]]
    return list(TRAINING_FIELDS)


def to_raw(space: Space) -> dict[str, Any]:
    """A space file that parses back to an equivalent space (the same trials), defaults written out.

    The run folder's spec.yaml: what a resumed search runs, whatever the space file says now.
    """
    defaults = space.trial_defaults().to_dict()
    model = defaults.pop(MODEL)
    data_section = {"root": space.data_root}
    for name in DATA_FIELDS:
        data_section[{v: k for k, v in DATA_KEYS.items()}.get(name, name)] = defaults.pop(name)
    searched = {d.name for d in space.searched}
    training = {k: v for k, v in defaults.items() if k in TRAINING_FIELDS and k not in searched}
    model = {k: v for k, v in model.items() if f"{MODEL}.{k}" not in searched}
    return {
        "experiment": plain(asdict(space.experiment)),
        "resources": asdict(space.resources),
        MODEL: model,
        "data": data_section,
        "training": training,
        "space": {d.name: _distribution_raw(d) for d in space.searched},
    }


def _distribution_raw(d: Distribution) -> dict[str, Any]:
    if d.distribution == "choice":
        return {"distribution": d.distribution, "values": plain(list(d.values))}
    return {"distribution": d.distribution, "low": d.low, "high": d.high}


def example_config(space: Space) -> TrialConfig:
    """A trial config the search could produce: fixed fields plus each searched field's first value.

    Used to try the model once before Ray starts.
    """
    values = dict(space.fixed)
    for d in space.searched:
        values[d.name] = d.values[0] if d.distribution == "choice" else d.low
    return TrialConfig.from_mapping(values)
