"""The metrics every epoch reports: what a search may optimise (experiment.metric).

Kept apart from loop.py so that validating a space file does not import torch.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from trainable.config import LOSSES

METRICS = ("train_loss", "train_acc", "val_loss", "val_acc")  #: the canonical loop's with cross_entropy
# measured beside them (loop.EpochRecord, report.epoch_report): objectives and constraints too
MEASURED = ("params", "latency_ms", "epoch_seconds", "gpu_memory_reserved_mb")
OBJECTIVES = METRICS + MEASURED
EPOCH_METRIC = re.compile(r"(train|val)_[a-z0-9_]+")  #: the form of a canonical-loop metric column


def metric_name(name: str) -> bool:
    """A name the canonical loop may report: one of OBJECTIVES, or train_/val_<column> of training.metrics
    (checked against training.loss and training.metrics by search/definition/schema.py training_metric_problems)."""
    return name in OBJECTIVES or EPOCH_METRIC.fullmatch(name) is not None
# the class-name prefixes a column name drops: MulticlassF1Score and BinaryF1Score are both f1_score
TASK_PREFIX = re.compile(r"^(Multiclass|Multilabel|Binary)(?=[A-Z0-9])")
WORD_BREAK = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def metric_column(class_name: str) -> str:
    """The column name of a torchmetrics class, without train_/val_: snake_case, task prefix dropped.

    MulticlassF1Score -> f1_score, MeanAbsoluteError -> mean_absolute_error, MulticlassAUROC -> auroc,
    R2Score -> r2_score, MulticlassAccuracy -> accuracy (not acc: that is the loop's own plain accuracy).
    """
    return WORD_BREAK.sub("_", TASK_PREFIX.sub("", class_name)).lower()


def reports_accuracy(loss: str) -> bool:
    """train_acc and val_acc mean something only for class targets: the cross_entropy loss.
    With mse, smooth_l1 or a loss of your own, add the torchmetrics you want (training.metrics)."""
    return loss == LOSSES[0]


def epoch_metrics(loss: str, metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The metric columns a canonical-loop epoch reports for training.loss and training.metrics, in order."""
    extra = [metric_column(name) for name in metrics]
    own = ("loss", "acc") if reports_accuracy(loss) else ("loss",)
    return tuple(f"{part}_{name}" for part in ("train", "val") for name in (*own, *extra))


def metric_problems(loss: str, metrics: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(key, rule, value) for training.metrics whose columns would collide (MulticlassF1Score and BinaryF1Score)."""
    seen: dict[str, str] = {}
    out = []
    for name in metrics:
        column = metric_column(name)
        if column in ("loss", "acc") or column in seen:
            other = seen.get(column, "the loop's own " + column)
            out.append((f"training.metrics.{name}", f"must give a column of its own: it reports as train_{column} "
                                                    f"and val_{column}, as {other} does", name))
        seen[column] = name
    return out


def score(value: Any) -> float | None:
    """A metric as a score: a finite float, or None (NaN, inf and missing values are no score).

    The one rule of what counts as a result: the searcher, the results, best.yaml and the
    trial's choice of which checkpoints to keep all read metrics through it.
    """
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None
