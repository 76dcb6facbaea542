"""The metrics every epoch reports: what a search may optimise (experiment.metric).

Kept apart from loop.py so that validating a space file does not import torch.
"""

from __future__ import annotations

import math
from typing import Any

METRICS = ("train_loss", "train_acc", "val_loss", "val_acc")
# measured beside them (loop.EpochRecord, report.epoch_report): objectives and constraints too
MEASURED = ("params", "latency_ms", "epoch_seconds", "gpu_memory_reserved_mb")
OBJECTIVES = METRICS + MEASURED


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
