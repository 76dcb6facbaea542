"""The trial config: every setting one training run needs, frozen, typed and validated.

The same field names are used in the YAML files, the CLI flags (`--batch-size` for
`batch_size`), the search space and the columns of results.parquet. Defaults live here only.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from trainable.errors import ConfigError, problem

DATASETS = ("mnist", "fashion_mnist", "kmnist")
OPTIMIZERS = ("sgd", "adam")
SOURCES = ("memory", "loader")
TRAINING_SET_SIZE = 60_000  # images in the training set of every dataset in DATASETS


@dataclass(frozen=True)
class TrialConfig:
    """One training run. Invalid values raise ConfigError listing every problem."""

    # data: the split is drawn from the training set with its own seed, so every trial
    # with the same data fields is judged on the same validation images
    dataset: str = "mnist"  #: one of DATASETS (28x28 grayscale, 10 classes)
    train_size: int = 50_000  #: training images, taken from the official training set
    val_size: int = 10_000  #: validation images, disjoint from the training images
    split_seed: int = 0  #: seed of the train/validation split, not of the trial
    source: str = "memory"  #: batches from one tensor on the device ("memory") or a DataLoader ("loader")
    num_workers: int = 0  #: DataLoader worker processes (source "loader")
    pin_memory: bool = False  #: DataLoader pin_memory (source "loader")
    persistent_workers: bool = False  #: keep DataLoader workers between epochs (needs num_workers > 0)
    drop_last: bool = False  #: drop the last incomplete training batch
    # model
    hidden_sizes: tuple[int, ...] = (128,)  #: widths of the MLP's hidden layers (the template: one of 128)
    # optimisation
    epochs: int = 5  #: training epochs
    optimizer: str = "sgd"  #: one of OPTIMIZERS
    lr: float = 0.05  #: initial learning rate
    momentum: float = 0.9  #: SGD momentum (ignored by Adam)
    weight_decay: float = 0.0  #: L2 penalty
    batch_size: int = 128  #: training batch size (evaluation uses the same)
    t_max: int = 5  #: cosine schedule period in epochs (lr reaches its minimum after t_max epochs)
    clip_norm: float | None = None  #: max gradient L2 norm; None disables clipping
    # run
    seed: int = 0  #: seeds weight init and shuffling
    num_threads: int | None = None  #: torch CPU threads; None keeps torch's default

    def __post_init__(self) -> None:
        problems = check_fields(dataclasses.asdict(self))
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], prefix: str = "") -> "TrialConfig":
        """Build from plain data (YAML, CLI); unknown keys and bad types are errors."""
        problems = [problem(prefix + k, "unknown field of the trial config", values[k])
                    for k in values if k not in FIELDS]
        coerced = {}
        for name, value in values.items():
            if name in FIELDS:
                converted, rule = coerce(name, value)
                if rule:
                    problems.append(problem(prefix + name, rule, value))
                else:
                    coerced[name] = converted
        for name, value in coerced.items():  # rules of the well-typed fields, in the same pass
            rule = check_value(name, value)
            if rule:
                problems.append(problem(prefix + name, rule, values[name]))
        if not problems:
            problems = cross_field_problems({**dataclasses.asdict(cls()), **coerced}, prefix)
        if problems:
            raise ConfigError(problems)
        return cls(**coerced)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for YAML and Parquet (tuples become lists)."""
        out = dataclasses.asdict(self)
        out["hidden_sizes"] = list(self.hidden_sizes)
        return out


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrialConfig)}
_HINTS = typing.get_type_hints(TrialConfig)


def coerce(name: str, value: Any) -> tuple[Any, str | None]:
    """Check a raw value's type for field `name`; return (value, None) or (None, rule)."""
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
    if typing.get_origin(base) is tuple:
        if not isinstance(value, (list, tuple)) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value
        ):
            return None, "must be a list of integers"
        return tuple(value), None
    raise TypeError(f"no coercion for {name}: {hint}")  # a programming error, not input


def _positive(v: Any) -> bool:
    return v > 0


# One rule per field, checked on already-typed values. The search space reuses these to
# check distribution bounds and choices, so "batch_size must be > 0" reads the same everywhere.
RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "dataset": (lambda v: v in DATASETS, f"must be one of {', '.join(DATASETS)}"),
    "train_size": (_positive, "must be > 0"),
    "val_size": (_positive, "must be > 0"),
    "split_seed": (lambda v: v >= 0, "must be >= 0"),
    "source": (lambda v: v in SOURCES, f"must be one of {', '.join(SOURCES)}"),
    "num_workers": (lambda v: v >= 0, "must be >= 0"),
    "hidden_sizes": (lambda v: len(v) > 0 and all(h > 0 for h in v), "must be a non-empty list of positive integers"),
    "epochs": (_positive, "must be > 0"),
    "optimizer": (lambda v: v in OPTIMIZERS, f"must be one of {', '.join(OPTIMIZERS)}"),
    "lr": (lambda v: math.isfinite(v) and v > 0, "must be > 0"),
    "momentum": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "weight_decay": (lambda v: math.isfinite(v) and v >= 0, "must be >= 0"),
    "batch_size": (_positive, "must be > 0"),
    "t_max": (_positive, "must be > 0 (epochs)"),
    "clip_norm": (lambda v: v is None or (math.isfinite(v) and v > 0), "must be > 0 (or null to disable)"),
    "seed": (lambda v: 0 <= v < 2**63, "must be in [0, 2**63)"),
    "num_threads": (lambda v: v is None or v > 0, "must be > 0 (or null for torch's default)"),
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
    """Every problem in a full set of typed field values, including rules across fields."""
    problems = []
    for name, value in values.items():
        rule = check_value(name, value)
        if rule:
            problems.append(problem(prefix + name, rule, value))
    return problems + cross_field_problems(values, prefix)


def cross_field_problems(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Rules that involve more than one field (defaults count for missing ones)."""
    problems = []
    if values.get("persistent_workers") and not values.get("num_workers", FIELDS["num_workers"].default):
        problems.append(problem(prefix + "persistent_workers", "needs num_workers > 0", True))
    train = values.get("train_size", FIELDS["train_size"].default)
    val = values.get("val_size", FIELDS["val_size"].default)
    if train + val > TRAINING_SET_SIZE:
        problems.append(f"{prefix}train_size: train_size + val_size must be <= {TRAINING_SET_SIZE} "
                        f"(the official training set), got {train} + {val}")
    return problems


def is_integer_field(name: str) -> bool:
    """True for fields that take whole numbers only (batch_size, t_max, epochs, ...)."""
    return coerce(name, 1)[1] is None and coerce(name, 1.5)[1] is not None
