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
SOURCES = ("memory", "loader")
MODEL = "model"  #: the nested key of the factory and its keyword arguments
FACTORY = "factory"  #: model.factory: the factory reference
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
    return f"{(base / Path(match['module']).expanduser()).resolve()}:{match['name']}"


def frozen_mapping(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A plain dict copy: picklable for Ray; the dataclass is frozen, nothing mutates it."""
    return plain(dict(values or {}))


@dataclass(frozen=True)
class TrialConfig:
    """One training run. Invalid values raise ConfigError listing every problem."""

    # data: the split is drawn from the training part with its own seed, so every trial
    # with the same data fields is judged on the same validation examples
    dataset: str = "mnist"  #: built-in (BUILTIN_DATASETS) or FILE.py:FUNCTION / package.module:FUNCTION
    data_args: Mapping[str, Any] = field(default_factory=frozen_mapping)  #: keyword arguments of a dataset function (space file: data.args)
    train_size: int | None = None  #: training examples; null: all that are not validation examples
    val_size: int | None = None  #: validation examples split off the training part; null: a sixth of it (or all of a given val part)
    split_seed: int = 0  #: seed of the train/validation split, not of the trial
    source: str = "memory"  #: batches from one tensor on the device ("memory") or a DataLoader ("loader")
    num_workers: int = 0  #: DataLoader worker processes (source "loader")
    pin_memory: bool | None = None  #: DataLoader pin_memory (source "loader"); null: on when the trial trains on CUDA
    persistent_workers: bool = False  #: keep DataLoader workers between epochs (needs num_workers > 0)
    drop_last: bool = False  #: drop the last incomplete training batch
    # model: model.factory and the factory's keyword arguments model.<key>
    model: str = "mlp"  #: model.factory: built-in (BUILTIN_MODELS) or FILE.py:CALLABLE / package.module:CALLABLE
    model_args: Mapping[str, Any] = field(default_factory=frozen_mapping)  #: model.<key>: keyword arguments of the factory
    # optimisation
    epochs: int = 5  #: training epochs
    optimizer: str = "sgd"  #: one of OPTIMIZERS
    lr: float = 0.05  #: initial learning rate
    momentum: float = 0.9  #: SGD momentum (sgd only)
    nesterov: bool = False  #: Nesterov momentum (sgd only)
    beta1: float = 0.9  #: first Adam beta (adam, adamw)
    beta2: float = 0.999  #: second Adam beta (adam, adamw)
    weight_decay: float = 0.0  #: L2 penalty (sgd, adam) or decoupled weight decay (adamw)
    batch_size: int = 128  #: training batch size (evaluation uses the same)
    t_max: int = 5  #: cosine schedule period in epochs (lr reaches its minimum after t_max epochs)
    clip_norm: float | None = None  #: max gradient L2 norm; None disables clipping
    # run
    seed: int = 0  #: seeds weight init and shuffling
    num_threads: int | None = None  #: torch CPU threads; None keeps torch's default
    trial_number: int | None = None  #: the trial's number in its search (Optuna's); the key to compare searches on

    def __post_init__(self) -> None:
        for name in ("data_args", "model_args"):  # a non-mapping is left for check_fields to name
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
                out[f"{MODEL}.{FACTORY}"] = value
            elif f.name == "model_args":
                if not isinstance(value, Mapping):
                    out["model_args"] = value  # reported by check_fields
                    continue
                # "factory" is model.factory itself; as a keyword it would replace the reference
                out.update({f"{MODEL}.{k if k != FACTORY else 'factory (a keyword)'}": plain(v)
                            for k, v in value.items()})
            else:
                out[f.name] = plain(value)
        return out

    def to_dict(self) -> dict[str, Any]:
        """Nested plain data for YAML: `model: {factory: ..., <key>: ...}`."""
        out = {}
        for name, value in self.to_flat().items():
            if name.startswith(MODEL + "."):
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
                flat[f"{MODEL}.{k}"] = v
        elif key == MODEL:  # a bare reference: model: mlp
            flat[f"{MODEL}.{FACTORY}"] = value
        elif not isinstance(key, str) or (key not in FIELDS and not key.startswith(MODEL + ".")) \
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
        if name == f"{MODEL}.{FACTORY}":
            kwargs["model"] = value
        elif name.startswith(MODEL + "."):
            kwargs["model_args"][name[len(MODEL) + 1:]] = value
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


def coerce(name: str, value: Any) -> tuple[Any, str | None]:
    """Check a raw value's type for field `name`; return (value, None) or (None, rule)."""
    if name.startswith(MODEL + "."):
        return _coerce_model(name[len(MODEL) + 1:], value)
    hint = _HINTS[name]
    optional = type(None) in typing.get_args(hint)
    if value is None:
        return (None, None) if optional else (None, "must not be empty")
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    if base is bool:
        return (value, None) if isinstance(value, bool) else (None, "must be true or false")
    if base is int:
        if isinstance(value, bool) or not isinstance(value, int):
            return None, "must be an integer"
        return value, None
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, "must be a number"
        return float(value), None
    if base is str:
        return (value, None) if isinstance(value, str) else (None, "must be a string")
    if typing.get_origin(base) is abc.Mapping:
        if not isinstance(value, Mapping) or not is_plain_data(value):
            return None, "must be a mapping of keyword arguments to plain values"
        return frozen_mapping(value), None
    raise TypeError(f"no coercion for {name}: {hint}")  # a programming error, not input


def _coerce_model(key: str, value: Any) -> tuple[Any, str | None]:
    if key == FACTORY:
        return (value, None) if isinstance(value, str) else (None, "must be a string")
    if not KEYWORD.fullmatch(key):
        return None, "must name a keyword argument of the factory (a Python identifier)"
    if not is_plain_data(value):
        return None, "must be plain data (numbers within int64, strings, lists, mappings)"
    return plain(value), None


def _positive(v: Any) -> bool:
    return v > 0


def _reference_or(builtins: tuple[str, ...]) -> Callable[[str], bool]:
    return lambda v: v in builtins or is_reference(v)


# One rule per field, checked on already-typed values. The search space reuses these to
# check distribution bounds and choices, so "batch_size must be > 0" reads the same everywhere.
# Upper bounds keep values that would only crash later (or overflow Parquet) out.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dataset": (_reference_or(BUILTIN_DATASETS),
                f"must be one of {', '.join(BUILTIN_DATASETS)} or FILE.py:FUNCTION / package.module:FUNCTION"),
    "train_size": (lambda v: v is None or 0 < v <= 10**9, "must be in [1, 10**9] (or null for the rest)"),
    "val_size": (lambda v: v is None or 0 < v <= 10**9, "must be in [1, 10**9] (or null for a sixth)"),
    "split_seed": (lambda v: 0 <= v <= MAX_INT, "must be in [0, 2**63)"),
    "source": (lambda v: v in SOURCES, f"must be one of {', '.join(SOURCES)}"),
    "num_workers": (lambda v: 0 <= v <= 256, "must be in [0, 256]"),
    "model.factory": (_reference_or(BUILTIN_MODELS),
                      f"must be one of {', '.join(BUILTIN_MODELS)} or FILE.py:CALLABLE / package.module:CALLABLE"),
    "epochs": (lambda v: 0 < v <= 100_000, "must be in [1, 100000]"),
    "optimizer": (lambda v: v in OPTIMIZERS, f"must be one of {', '.join(OPTIMIZERS)}"),
    "lr": (lambda v: math.isfinite(v) and 0 < v <= 1e6, "must be > 0 and <= 1e6"),
    "momentum": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "beta1": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "beta2": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "weight_decay": (lambda v: math.isfinite(v) and 0 <= v <= 10, "must be in [0, 10]"),
    "batch_size": (lambda v: 0 < v <= 2**24, "must be in [1, 2**24]"),
    "t_max": (lambda v: 0 < v <= 100_000, "must be in [1, 100000] (epochs)"),
    "clip_norm": (lambda v: v is None or (math.isfinite(v) and v > 0), "must be > 0 (or null to disable)"),
    "seed": (lambda v: 0 <= v <= MAX_INT, "must be in [0, 2**63)"),
    "num_threads": (lambda v: v is None or 0 < v <= 1024, "must be in [1, 1024] (or null for torch's default)"),
    "trial_number": (lambda v: v is None or 0 <= v <= MAX_INT, "must be >= 0 (or null outside a search)"),
}


def check_value(name: str, value: Any) -> str | None:
    """The rule `value` breaks for field `name`, or None. Type first, then the field's rule."""
    typed, rule = coerce(name, value)
    if rule:
        return rule
    check = RULES.get(name)
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
    return problems


def is_integer_field(name: str) -> bool:
    """True for fields that take whole numbers only (batch_size, t_max, epochs, ...)."""
    if name.startswith(MODEL + "."):
        return False
    return coerce(name, 1)[1] is None and coerce(name, 1.5)[1] is not None


def json_text(value: Any) -> str:
    """A nested value as one JSON string (for a Parquet cell that must keep one type)."""
    return json.dumps(plain(value), sort_keys=True)
