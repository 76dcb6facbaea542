"""The trial config: every setting one training run needs, frozen, typed and validated.

The same field names are used in the YAML files, the CLI flags (`--batch-size` for
`batch_size`), the search space and the columns of results.parquet. Defaults live here only.

Two plain-data forms, one for people and one for tables:
- nested (`to_dict`, best.yaml, `--config`): `model: {factory: mlp, hidden_sizes: [128]}`;
- flat (`to_flat`, Tune's config, results columns): `model.factory`, `model.hidden_sizes`.
`from_mapping` reads both, so `model.<key>` is one name everywhere.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from collections import abc
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from trainable.errors import ConfigError, problem

BUILTIN_DATASETS = ("mnist", "fashion_mnist", "kmnist", "cifar10")
BUILTIN_MODELS = ("mlp", "cnn")
OPTIMIZERS = ("sgd", "adam", "adamw")
LOSSES = ("cross_entropy", "mse", "smooth_l1")  #: training.loss built-ins (trainable/measures.py)
REGRESSION_LOSSES = ("mse", "smooth_l1")  #: float targets, no accuracy
SOURCES = ("memory", "loader")
MODEL = "model"  #: the nested key of the factory and its keyword arguments
FACTORY = "factory"  #: model.factory: the factory reference
FACTORY_KEY = f"{MODEL}.{FACTORY}"  #: its flat name
# A reference to user code: FILE.py:NAME (a path) or package.module:NAME.
REFERENCE = re.compile(r"(?P<module>[^:]+\.py|[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*):(?P<name>[A-Za-z_]\w*)")
KEYWORD = re.compile(r"[A-Za-z_]\w*")
MAX_INT = 2**63 - 1  # Parquet's int64: a larger integer would fail at the first write


def is_reference(value: str) -> bool:
    """True for FILE.py:NAME and package.module:NAME (as opposed to a built-in name)."""
    return REFERENCE.fullmatch(value) is not None


def absolute_reference(reference: Any, base: Path) -> Any:
    """FILE.py:NAME with FILE made absolute against `base`, so spec.yaml and best.yaml run from
    any folder; built-in names, package.module:NAME and non-strings stay as they are."""
    match = REFERENCE.fullmatch(reference) if isinstance(reference, str) else None
    if match is None or not match["module"].endswith(".py"):
        return reference
    try:
        return f"{(base / Path(match['module']).expanduser()).resolve()}:{match['name']}"
    except RuntimeError:  # ~user without a home: resolving the reference will name the key
        return reference


def frozen_mapping(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A plain dict copy: picklable for Ray; the dataclass is frozen, nothing mutates it."""
    return plain(dict(values or {}))


def fact(section: str, check: Callable[[Any], bool] | None = None, rule: str | None = None, *,
         searchable: bool = True) -> dict[str, Any]:
    """A field's facts, kept beside it: its space-file section, its rule beyond its type
    (checked on typed values; distribution bounds and choices are checked with it too, so
    "batch_size must be > 0" reads the same everywhere) and whether `space:` may search it.
    Upper bounds keep values that would only crash later (or overflow Parquet) out."""
    return {"section": section, "rule": (check, rule) if check else None, "searchable": searchable}


def metrics_are_valid(value: Any) -> bool:
    """training.metrics: class names (identifiers) mapped to keyword arguments (a mapping, or null for none)."""
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and KEYWORD.fullmatch(k) is not None and (v is None or isinstance(v, Mapping))
        for k, v in value.items())


def _reference_or(builtins: tuple[str, ...]) -> Callable[[str], bool]:
    return lambda v: v in builtins or is_reference(v)


# Sections: data (one split for the whole search; a change would change what every trial is
# judged on, so not searchable), model, training, and driver (set per trial by the search).
@dataclass(frozen=True)
class TrialConfig:
    """One training run. Invalid values raise ConfigError listing every problem."""

    # data: the split is drawn from the training part with its own seed, so every trial
    # with the same data fields is judged on the same validation examples
    dataset: str = field(default="mnist", metadata=fact(
        "data", _reference_or(BUILTIN_DATASETS),
        f"must be one of {', '.join(BUILTIN_DATASETS)} or FILE.py:FUNCTION / package.module:FUNCTION",
        searchable=False))  #: built-in (BUILTIN_DATASETS) or FILE.py:FUNCTION / package.module:FUNCTION
    data_args: Mapping[str, Any] = field(default_factory=frozen_mapping, metadata=fact("data", searchable=False))
    #: keyword arguments of a dataset function (space file: data.args)
    train_size: int | None = field(default=None, metadata=fact(
        "data", lambda v: v is None or 0 < v <= 10**9, "must be in [1, 10**9] (or null for the rest)",
        searchable=False))  #: training examples; null: all that are not validation examples
    val_size: int | None = field(default=None, metadata=fact(
        "data", lambda v: v is None or 0 < v <= 10**9, "must be in [1, 10**9] (or null for a sixth)",
        searchable=False))  #: validation examples split off the training part; null: a sixth of it (or all of a given val part)
    split_seed: int = field(default=0, metadata=fact(
        "data", lambda v: 0 <= v <= MAX_INT, "must be in [0, 2**63)", searchable=False))
    #: seed of the train/validation split, not of the trial
    source: str = field(default="memory", metadata=fact("data", lambda v: v in SOURCES,
                                                        f"must be one of {', '.join(SOURCES)}"))
    #: batches from one tensor on the device ("memory") or a DataLoader ("loader")
    num_workers: int = field(default=0, metadata=fact("data", lambda v: 0 <= v <= 256, "must be in [0, 256]"))
    #: DataLoader worker processes (source "loader")
    pin_memory: bool | None = field(default=None, metadata=fact("data"))
    #: DataLoader pin_memory (source "loader"); null: on when the trial trains on CUDA
    persistent_workers: bool = field(default=False, metadata=fact("data"))
    #: keep DataLoader workers between epochs (needs num_workers > 0)
    drop_last: bool = field(default=False, metadata=fact("data"))  #: drop the last incomplete training batch
    # model: model.factory and the factory's keyword arguments model.<key>
    model: str = field(default="mlp", metadata=fact(
        "model", _reference_or(BUILTIN_MODELS),
        f"must be one of {', '.join(BUILTIN_MODELS)} or FILE.py:CALLABLE / package.module:CALLABLE",
        searchable=False))  #: model.factory: built-in (BUILTIN_MODELS) or FILE.py:CALLABLE / package.module:CALLABLE
    model_args: Mapping[str, Any] = field(default_factory=frozen_mapping, metadata=fact("model"))
    #: model.<key>: keyword arguments of the factory
    # optimisation
    epochs: int = field(default=5, metadata=fact("training", lambda v: 0 < v <= 100_000, "must be in [1, 100000]"))
    #: training epochs
    optimizer: str = field(default="sgd", metadata=fact("training", lambda v: v in OPTIMIZERS,
                                                        f"must be one of {', '.join(OPTIMIZERS)}"))
    lr: float = field(default=0.05, metadata=fact("training", lambda v: math.isfinite(v) and 0 < v <= 1e6,
                                                  "must be > 0 and <= 1e6"))  #: initial learning rate
    momentum: float = field(default=0.9, metadata=fact("training", lambda v: 0 <= v < 1, "must be in [0, 1)"))
    #: SGD momentum (sgd only)
    nesterov: bool = field(default=False, metadata=fact("training"))  #: Nesterov momentum (sgd only)
    beta1: float = field(default=0.9, metadata=fact("training", lambda v: 0 <= v < 1, "must be in [0, 1)"))
    #: first Adam beta (adam, adamw)
    beta2: float = field(default=0.999, metadata=fact("training", lambda v: 0 <= v < 1, "must be in [0, 1)"))
    #: second Adam beta (adam, adamw)
    weight_decay: float = field(default=0.0, metadata=fact(
        "training", lambda v: math.isfinite(v) and 0 <= v <= 10, "must be in [0, 10]"))
    #: L2 penalty (sgd, adam) or decoupled weight decay (adamw)
    batch_size: int = field(default=128, metadata=fact("training", lambda v: 0 < v <= 2**24, "must be in [1, 2**24]"))
    #: training batch size (evaluation uses the same)
    t_max: int | None = field(default=None, metadata=fact("training", lambda v: v is None or 0 < v <= 100_000,
                                                       "must be in [1, 100000] (epochs)"))
    #: cosine schedule period in epochs (lr reaches its minimum after t_max epochs); null: epochs
    clip_norm: float | None = field(default=None, metadata=fact(
        "training", lambda v: v is None or (math.isfinite(v) and v > 0), "must be > 0 (or null to disable)"))
    #: max gradient L2 norm; None disables clipping
    # what a trial minimises and measures: fixed for a search (other losses give other columns and scales)
    loss: str = field(default="cross_entropy", metadata=fact(
        "training", _reference_or(LOSSES),
        f"must be one of {', '.join(LOSSES)} or FILE.py:CALLABLE / package.module:CALLABLE (loss(outputs, targets) "
        "-> scalar tensor)", searchable=False))
    #: cross_entropy (integer class targets), mse or smooth_l1 (float targets), or your own loss(outputs, targets)
    metrics: Mapping[str, Any] = field(default_factory=frozen_mapping, metadata=fact(
        "training", metrics_are_valid, "must map torchmetrics class names to their keyword arguments, e.g. "
        "{MulticlassF1Score: {average: macro}, MeanAbsoluteError: {}}", searchable=False))
    #: extra torchmetrics, reported as train_<name> and val_<name> (trainable/metrics.py metric_column)
    # run: set by the driver for each trial (seed from experiment.seed, threads from resources.cpus, workers
    # from resources.workers)
    seed: int = field(default=0, metadata=fact("driver", lambda v: 0 <= v <= MAX_INT, "must be in [0, 2**63)",
                                               searchable=False))  #: seeds weight init and shuffling
    num_threads: int | None = field(default=None, metadata=fact(
        "driver", lambda v: v is None or 0 < v <= 1024, "must be in [1, 1024] (or null for torch's default)",
        searchable=False))  #: torch CPU threads; None keeps torch's default
    workers: int = field(default=1, metadata=fact(
        "driver", lambda v: 1 <= v <= 1024, "must be in [1, 1024]", searchable=False))
    #: data-parallel processes the run trains on (resources.workers; trainable/distributed.py); 1: one process
    trial_number: int | None = field(default=None, metadata=fact(
        "driver", lambda v: v is None or 0 <= v <= MAX_INT, "must be >= 0 (or null outside a search)",
        searchable=False))  #: the trial's number in its search (Optuna's); the key to compare searches on

    def __post_init__(self) -> None:
        for name in ("data_args", "model_args", "metrics"):  # a non-mapping is left for check_fields to name
            if isinstance(getattr(self, name), Mapping):
                object.__setattr__(self, name, frozen_mapping(getattr(self, name)))
        problems = check_fields(self.to_flat())
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], prefix: str = "") -> "TrialConfig":
        """Build from plain data, nested or flat; unknown keys and bad types are errors."""
        problems: list[str] = []
        flat = flatten(values, prefix, problems)
        coerced = {}
        for name, value in flat.items():
            rule = check_value(name, value)
            if rule:
                problems.append(problem(prefix + name, rule, value))
            else:
                coerced[name] = coerce(name, value)[0]
        if not problems:
            problems = cross_field_problems({**cls().to_flat(), **coerced}, prefix)
        if problems:
            raise ConfigError(problems)
        return cls(**unflatten(coerced))

    def to_flat(self) -> dict[str, Any]:
        """One key per value: `model.factory`, `model.<key>`; tuples become lists."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "model":
                out[FACTORY_KEY] = value
            elif f.name == "model_args":
                if not isinstance(value, Mapping):
                    out["model_args"] = value  # reported by check_fields
                    continue
                # "factory" is model.factory itself; as a keyword it would replace the reference
                out.update({model_key(k if k != FACTORY else 'factory (a keyword)'): plain(v)
                            for k, v in value.items()})
            else:
                out[f.name] = plain(value)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Nested plain data for YAML: `model: {factory: ..., <key>: ...}`."""
        out: dict[str, Any] = {}
        for name, value in self.to_flat().items():
            if keyword_of(name) is not None or name == FACTORY_KEY:
                out.setdefault(MODEL, {})[name[len(MODEL) + 1:]] = value
            else:
                out[name] = value
        return out


def plain(value: Any) -> Any:
    """Tuples and mapping proxies as lists and dicts, recursively (YAML, JSON, Parquet)."""
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    return value


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrialConfig)}
_HINTS = typing.get_type_hints(TrialConfig)
MOVED = {"hidden_sizes": "model.hidden_sizes"}  # keys of the first release that now live elsewhere


def flatten(values: Mapping[str, Any], prefix: str, problems: list[str]) -> dict[str, Any]:
    """Nested or flat plain data as flat field names (`model.factory`, `model.hidden_sizes`, `lr`)."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key == MODEL and isinstance(value, Mapping):
            for k, v in value.items():
                flat[model_key(k)] = v
        elif key == MODEL:  # a bare reference: model: mlp
            flat[FACTORY_KEY] = value
        elif not isinstance(key, str) or (key not in FIELDS and key != FACTORY_KEY and keyword_of(key) is None) \
                or key in ("model_args",):
            hint = f"moved to {MOVED[key]}" if key in MOVED else "unknown field of the trial config"
            problems.append(problem(prefix + str(key), hint, value))
        else:
            flat[key] = value
    return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Flat field names back to dataclass keyword arguments."""
    kwargs: dict[str, Any] = {"model_args": {}}
    for name, value in flat.items():
        if name == FACTORY_KEY:
            kwargs["model"] = value
        elif keyword_of(name) is not None:
            kwargs["model_args"][keyword_of(name)] = value
        else:
            kwargs[name] = value
    return kwargs


def is_plain_data(value: Any, depth: int = 0) -> bool:
    """YAML-able data: null, bool, int64, finite-or-not float, str, lists and string-keyed maps."""
    if depth > 20:
        return False
    if value is None or isinstance(value, (bool, str, float)):
        return True
    if isinstance(value, int):
        return -MAX_INT - 1 <= value <= MAX_INT
    if isinstance(value, (list, tuple)):
        return all(is_plain_data(v, depth + 1) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and is_plain_data(v, depth + 1) for k, v in value.items())
    return False


def model_key(keyword: str) -> str:
    """The flat name of a factory keyword: model.<keyword>."""
    return f"{MODEL}.{keyword}"


def keyword_of(name: Any) -> str | None:
    """The factory keyword a flat name holds (model.<keyword>), None for model.factory and other fields."""
    if not isinstance(name, str) or not name.startswith(MODEL + ".") or name == FACTORY_KEY:
        return None
    return name[len(MODEL) + 1:]


def field_of(name: str) -> str:
    """The dataclass field a flat name lives in: model.factory -> model, model.<key> -> model_args."""
    if name == FACTORY_KEY:
        return "model"
    return "model_args" if keyword_of(name) is not None else name


def kind(name: str) -> str:
    """A field's type, read once from its annotation: bool, int, float, str or mapping."""
    hint = _HINTS[name]
    base = next(a for a in typing.get_args(hint) if a is not type(None)) if optional(name) else hint
    if typing.get_origin(base) is abc.Mapping:
        return "mapping"
    return base.__name__


def optional(name: str) -> bool:
    return type(None) in typing.get_args(_HINTS[name])


def section(name: str) -> str:
    """The space-file section of a field (flat name): data, model, training or driver."""
    return FIELDS[field_of(name)].metadata["section"]


def searchable(name: str) -> bool:
    """Whether `space:` may search the field (flat name); model.factory it may not."""
    return name != FACTORY_KEY and FIELDS[field_of(name)].metadata["searchable"]


def fields_in(sec: str) -> tuple[str, ...]:
    """The trial config fields of a section, in declaration order."""
    return tuple(name for name, f in FIELDS.items() if f.metadata["section"] == sec)


def coerce(name: str, value: Any) -> tuple[Any, str | None]:
    """Check a raw value's type for field `name` (flat); return (value, None) or (None, rule)."""
    if name == FACTORY_KEY:
        return (value, None) if isinstance(value, str) else (None, "must be a string")
    keyword = keyword_of(name)
    if keyword is not None:
        return _coerce_model(keyword, value)
    if value is None:
        return (None, None) if optional(name) else (None, "must not be empty")
    base = kind(name)
    if base == "bool":
        return (value, None) if isinstance(value, bool) else (None, "must be true or false")
    if base == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return None, "must be an integer"
        return value, None
    if base == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, "must be a number"
        return float(value), None
    if base == "str":
        return (value, None) if isinstance(value, str) else (None, "must be a string")
    if not isinstance(value, Mapping) or not is_plain_data(value):
        return None, "must be a mapping of keyword arguments to plain values"
    return frozen_mapping(value), None


def _coerce_model(key: str, value: Any) -> tuple[Any, str | None]:
    if not KEYWORD.fullmatch(key):
        return None, "must name a keyword argument of the factory (a Python identifier)"
    if not is_plain_data(value):
        return None, "must be plain data (numbers within int64, strings, lists, mappings)"
    return plain(value), None


def check_value(name: str, value: Any) -> str | None:
    """The rule `value` breaks for field `name`, or None. Type first, then the field's rule."""
    typed, rule = coerce(name, value)
    if rule:
        return rule
    check = None if keyword_of(name) is not None else FIELDS[field_of(name)].metadata["rule"]
    if check and typed is not None and not check[0](typed):
        return check[1]
    return None


def check_fields(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every problem in a full set of flat field values, including rules across fields."""
    problems = []
    for name, value in values.items():
        rule = check_value(name, value)
        if rule:
            problems.append(problem(prefix + name, rule, value))
    return problems + cross_field_problems(values, prefix)


def cross_field_problems(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Rules that involve more than one field (defaults count for missing ones).

    Sizes against the dataset are checked when it is loaded (a user's dataset has no
    size known before).
    """
    problems = []
    if values.get("persistent_workers") and not values.get("num_workers", FIELDS["num_workers"].default):
        problems.append(problem(prefix + "persistent_workers", "needs num_workers > 0", True))
    dataset = values.get("dataset", FIELDS["dataset"].default)
    if values.get("data_args") and dataset in BUILTIN_DATASETS:  # else the arguments would go unused, unsaid
        problems.append(problem(prefix + ("args" if prefix == "data." else "data_args"),
                                f"is for a dataset function (FILE.py:FUNCTION); the built-in {dataset} takes no "
                                "arguments", plain(values["data_args"])))
    return problems


def schedule_period(config: TrialConfig) -> int:
    """The cosine schedule's period in epochs: t_max, or epochs when t_max is not set."""
    return config.t_max if config.t_max is not None else config.epochs


def schedule_note(config: TrialConfig) -> str | None:
    """A note when t_max < epochs: the learning rate reaches its minimum, then climbs back.

    Worth saying once before a search (or a run); not an error, a warm restart can be meant.
    """
    if config.t_max is None or config.t_max >= config.epochs:
        return None
    return (f"t_max ({config.t_max}) < epochs ({config.epochs}): the cosine schedule reaches its minimum "
            f"learning rate after epoch {config.t_max} and climbs back for the remaining "
            f"{config.epochs - config.t_max} epoch(s); leave t_max unset to follow epochs")


def is_integer_field(name: str) -> bool:
    """True for fields that take whole numbers only (batch_size, t_max, epochs, ...); model keywords have no type."""
    return keyword_of(name) is None and kind(name) == "int"


def json_text(value: Any) -> str:
    """A nested value as one JSON string (for a Parquet cell that must keep one type)."""
    return json.dumps(plain(value), sort_keys=True)


# ---- a schedule of hyperparameters (PBT's, replayed from best.yaml) ------------------------

MUTABLE = ("lr", "momentum", "weight_decay", "clip_norm")  #: the fields a run can change between epochs
SCHEDULE_KEY = "schedule"  #: best.yaml's list of {epoch, trial_number, lr, momentum, weight_decay, clip_norm}


def parse_schedule(value: Any, key: str = SCHEDULE_KEY) -> dict[int, dict[str, Any]]:
    """`schedule:` as epoch -> the MUTABLE values that epoch and later ones train with.

    Each entry is `{epoch: N, lr: ..., momentum: ..., weight_decay: ..., clip_norm: ...}` (any of
    the four; the others keep their values), epochs increasing; `trial_number` says which trial of
    the search trained from that epoch on and changes nothing. Every problem raises at once.
    """
    if not isinstance(value, list):
        raise ConfigError([problem(key, "must be a list of {epoch: N, lr: ..., ...} entries", value)])
    problems: list[str] = []
    out: dict[int, dict[str, Any]] = {}
    last = 0
    for i, entry in enumerate(value):
        path = f"{key}[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(problem(path, "must be a mapping {epoch: N, lr: ..., ...}", entry))
            continue
        epoch = entry.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch <= last:
            problems.append(problem(f"{path}.epoch", f"must be an integer > {last} (entries in epoch order)", epoch))
        else:
            last = epoch
        values = {}
        for name, v in entry.items():
            if name in ("epoch", "trial_number"):
                continue
            rule = check_value(name, v) if name in MUTABLE else f"unknown key (known: epoch, trial_number, " \
                                                                f"{', '.join(MUTABLE)})"
            if rule:
                problems.append(problem(f"{path}.{name}", rule, v))
            else:
                values[name] = coerce(name, v)[0]
        out[typing.cast(int, epoch)] = values  # a bad epoch is among the problems, raised before out is returned
    if problems:
        raise ConfigError(problems)
    return out
