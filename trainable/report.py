"""The trial contract's two records: what a trial reports after each epoch, and its checkpoint.

- The epoch report: the EpochRecord's metrics, where the trial ran and when the epoch
  ended. Its keys are results.parquet's columns (beside the trial config's).
- The checkpoint: a format version, the trial config and what the data told the model
  (input shape, classes) beside the state, so a checkpoint alone rebuilds its model
  (as nanoGPT keeps `model_args` and `config` beside the weights). Plain data and
  tensors only, so `torch.load(weights_only=True)` reads it. The state holds every RNG the trial
  draws from (its generator and the global ones, `rng`); a format-2 checkpoint written before
  `rng` was added still loads, and the resume says it is not bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from trainable.config import TrialConfig

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EpochRecord:
    """What one epoch produced. Field names are the metric names Tune and results use.

    train_acc and val_acc are None where accuracy means nothing (training.loss other than
    cross_entropy): the report leaves them out. `extra` holds training.metrics' values under their
    columns (train_f1_score, val_f1_score, ...), reported beside the fields.
    """

    epoch: int
    train_loss: float
    train_acc: float | None
    val_loss: float
    val_acc: float | None
    epoch_lr: float  #: learning rate used during this epoch (the config field lr is the initial one)
    epoch_seconds: float  #: wall time of training + validation in this epoch
    train_seconds: float  #: of which training
    evaluate_seconds: float  #: of which validation
    params: int | None = None  #: the model's parameter count
    latency_ms: float | None = None  #: median forward pass of one batch_size batch, after the run's first epoch (forward_latency_ms)
    extra: Mapping[str, float] = field(default_factory=dict)  #: training.metrics: column -> value

    @property
    def metrics(self) -> dict[str, float]:
        """Every metric column of this epoch and its value: train_loss, [train_acc,] ..., val_loss, ..."""
        own = {"train_loss": self.train_loss, "train_acc": self.train_acc,
               "val_loss": self.val_loss, "val_acc": self.val_acc}
        return {**{k: v for k, v in own.items() if v is not None}, **self.extra}

    @property
    def diverged(self) -> bool:
        return not math.isfinite(self.train_loss)


CHECKPOINT_FILE = "state.pt"
CHECKPOINT_FORMAT = 2  # 1: the first release's bare state dict (no config); not readable


@dataclass(frozen=True)
class Placement:
    """Where a trial ran."""

    node: str  #: Ray node id (first 12 characters)
    hostname: str
    device: str  #: torch device, e.g. cpu or cuda:0
    accelerator_ids: str  #: GPU ids Ray assigned, "0,1"; "" for none (rank 0's, where a trial has several workers)
    world_size: int = 1  #: the workers the trial trained on (resources.workers; trainable/distributed.py)


@dataclass(frozen=True)
class Phases:
    """Where a row's slot time went besides training and validation (EpochRecord has those).

    A row accounts for the time since the trial's previous report was made (the first row:
    since the trial began in its actor), so a trial's rows add up to its time in the slot.
    """

    ready_at: float | None  #: unix time the actor could take the trial: its process started, or its last trial reported
    started_at: float | None  #: unix time the trial (or its restart) began in its actor; both on that run's first row only
    fetch_seconds: float  #: the data from Ray's object store (first row; 0 on an actor that already held it)
    setup_seconds: float  #: model, optimizer, batches and a restored checkpoint (first row)
    report_seconds: float  #: the previous epoch's tune.report: its checkpoint's upload and Tune taking it
    checkpoint_seconds: float  #: writing this epoch's checkpoint (0 when checkpoint_every skips it)


# the record's fields as columns; `extra` (training.metrics) joins them under each metric's own column
EPOCH_COLUMNS = [f.name for f in dataclasses.fields(EpochRecord) if f.name != "extra"]
PLACEMENT_COLUMNS = [f.name for f in dataclasses.fields(Placement)]
PHASE_COLUMNS = [f.name for f in dataclasses.fields(Phases)]
GPU_MEMORY_COLUMNS = ["gpu_memory_allocated_mb", "gpu_memory_reserved_mb"]
REPORT_COLUMNS = [*EPOCH_COLUMNS, "diverged", *PLACEMENT_COLUMNS, *GPU_MEMORY_COLUMNS, *PHASE_COLUMNS, "finished_at"]

# Where a trial ran and where its slot time went: results.parquet's columns, which nothing of Tune's
# reads, so a report hands them to Tune as one value, [column, value] pairs as JSON text (`packed`).
# Tune keeps, for the whole search, running statistics of every number in every trial's reports (max,
# min, mean and two moving means, about 1.5 KB per number per trial) and redoes them, and their JSON,
# with each report; nine of these columns are numbers (docs/performance.md has what they cost at
# 10,000 trials). The metrics, epoch, diverged and gpu_memory_reserved_mb (a constraint may name it)
# stay numbers of their own. Text rather than a list: Tune's JSON logger writes a result through json's
# pure-Python encoder (json.dump to a file), for which a list of 13 pairs cost as much as the rest of
# the report (one report dumped as Tune's logger does: 0.044 ms, 0.024 with the text; bench/per_report.py
# measured Tune's JSON logger at 0.149 then 0.090 ms of CPU per report), and a string is one object to
# Tune's CSV logger and its snapshots where the list was 27.
PACKED = "placement_and_phases"
PACKED_COLUMNS = [*PLACEMENT_COLUMNS, "gpu_memory_allocated_mb", *PHASE_COLUMNS, "finished_at"]
_PACKED = frozenset(PACKED_COLUMNS)


def packed(report: Mapping[str, Any]) -> dict[str, Any]:
    """A report as it goes to Tune: PACKED_COLUMNS as one PACKED value (JSON text, which Tune keeps as it is)."""
    pairs = [[column, report[column]] for column in PACKED_COLUMNS if column in report]
    return {**{k: v for k, v in report.items() if k not in _PACKED}, **({PACKED: json.dumps(pairs)} if pairs else {})}


def unpacked(report: Mapping[str, Any]) -> Mapping[str, Any]:
    """A report as Tune recorded it, with PACKED_COLUMNS as columns again (a record without PACKED, an
    earlier release's, has them as columns already; one whose PACKED is a list, the first packing's)."""
    if PACKED not in report:
        return report
    pairs = report[PACKED]
    return {**{k: v for k, v in report.items() if k != PACKED}, **dict(json.loads(pairs) if isinstance(pairs, str) else pairs)}


def report_columns(metric_columns: tuple[str, ...]) -> list[str]:
    """REPORT_COLUMNS for a canonical loop that reports `metric_columns` (metrics.epoch_metrics): without
    train_acc and val_acc where they are not reported, training.metrics' columns after val_acc's place."""
    own = [c for c in REPORT_COLUMNS if c not in ("train_acc", "val_acc") or c in metric_columns]
    extra = [c for c in metric_columns if c not in own]
    at = own.index("val_loss") + (2 if "val_acc" in own else 1)
    return [*own[:at], *extra, *own[at:]]


def epoch_report(record: EpochRecord, placement: Placement, device: torch.device,
                 phases: Phases | None = None) -> dict[str, Any]:
    """One epoch's report: metrics (the names experiment.metric may use), placement, timing."""
    import torch  # here and below, not at the top: `python -m search` reads this module's columns, and its
    # refusals of bad input need no torch (1.5 s of the 2.1 s they took to import)

    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name not in ("extra", "train_acc",
                                                                                                   "val_acc")}
    return {
        **fields,
        **record.metrics,  # train_acc and val_acc only where they mean something, training.metrics' columns
        "diverged": record.diverged,
        **dataclasses.asdict(placement),
        **(dataclasses.asdict(phases) if phases is not None else {c: None for c in PHASE_COLUMNS}),
        # peaks since the trial started (reset then): allocated is what its tensors held; reserved
        # is what the caching allocator took from the GPU for them (allocated + cached blocks), the
        # figure that decides how many trials fit one GPU (without the ~0.5 GB CUDA context); 0 on the CPU,
        # so a constraint such as "gpu_memory_reserved_mb <= 2000" reads a number everywhere
        "gpu_memory_allocated_mb": torch.accelerator.max_memory_allocated(device) / 2**20 if device.type != "cpu" else 0.0,
        "gpu_memory_reserved_mb": torch.accelerator.max_memory_reserved(device) / 2**20 if device.type != "cpu" else 0.0,
        "finished_at": time.time(),
    }


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back: enough to rebuild the model and continue or evaluate it."""

    config: TrialConfig
    input_shape: tuple[int, ...]
    num_classes: int
    state: dict[str, Any]  #: Run.state_dict(): model, optimizer, scheduler, generator, rng (absent before), epoch


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or of another format."""


def save_checkpoint(folder: str | Path, config: TrialConfig, input_shape: tuple[int, ...], num_classes: int,
                    state: dict[str, Any]) -> Path:
    import torch

    path = Path(folder) / CHECKPOINT_FILE
    torch.save({"format": CHECKPOINT_FORMAT, "config": config.to_dict(), "input_shape": list(input_shape),
                "num_classes": num_classes, "state": state}, path)
    return path


def load_checkpoint(folder: str | Path) -> Checkpoint:
    """Read a checkpoint folder; anything unreadable is a CheckpointError saying which file and why."""
    import torch

    path = Path(folder) / CHECKPOINT_FILE
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:
        raise CheckpointError(f"{path}: cannot be read ({type(error).__name__}: {error})") from None
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        found = saved.get("format") if isinstance(saved, dict) else type(saved).__name__
        raise CheckpointError(f"{path}: checkpoint format {found!r}, this version reads {CHECKPOINT_FORMAT}")
    try:
        return Checkpoint(TrialConfig.from_mapping(saved["config"]), tuple(saved["input_shape"]),
                          int(saved["num_classes"]), saved["state"])
    except Exception as error:
        raise CheckpointError(f"{path}: {type(error).__name__}: {error}") from None
