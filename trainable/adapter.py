"""The Ray Tune adapter: one trial = one `train_and_evaluate` run, reported epoch by epoch.

The only module of `trainable/` that imports Ray. It turns Tune's (flat) config into a
TrialConfig, restores from Tune's checkpoint when the trial is restarted, and reports
one result (report.epoch_report + a checkpoint in report's format) per epoch.
"""

from __future__ import annotations

import socket
import sys
import tempfile
from typing import Any

import pyarrow.fs as pafs
import ray
import torch
from ray import tune

from trainable.config import TrialConfig
from trainable.data import Data
from trainable.device import get_default_device
from trainable.loop import build_run, train_and_evaluate
from trainable.report import CheckpointError, Placement, epoch_report, load_checkpoint, save_checkpoint


def assigned_accelerators() -> str:
    """The GPU ids Ray gave this trial, e.g. "0" or "0,1"; "" for none.

    Ray sets CUDA_VISIBLE_DEVICES to these, so inside the trial they appear as cuda:0...
    """
    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return ",".join(str(i) for i in ids)


def trial_device() -> torch.device:
    """The trial's accelerator if Ray assigned it one, else the CPU.

    Ray no longer hides GPUs from trials that reserved none, so a `gpus: 0` trial on a
    GPU node would otherwise use a GPU nobody reserved.
    """
    return get_default_device() if assigned_accelerators() else torch.device("cpu")


def newest_readable_state(latest: tune.Checkpoint) -> dict[str, Any] | None:
    """The state of `latest`, or of the newest earlier checkpoint of the trial that reads.

    A checkpoint cut short (a full disk, a killed node) would otherwise fail the trial on
    every restart. None: no checkpoint reads, and the trial starts over from epoch 0.
    """
    folder, _, _ = latest.path.rstrip("/").rpartition("/")
    siblings = [i.path for i in latest.filesystem.get_file_info(pafs.FileSelector(folder))
                if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")]
    # only earlier ones: a newer folder (left by a driver killed after it was written) is not in Tune's record
    candidates = [latest.path] + sorted((p for p in siblings if p < latest.path), reverse=True)
    for path in candidates:
        try:
            with tune.Checkpoint(path, filesystem=latest.filesystem).as_directory() as where:
                state = load_checkpoint(where).state
        except CheckpointError as error:
            print(f"hpsearch: skipping an unreadable checkpoint: {error}", file=sys.stderr, flush=True)
            continue
        if path != latest.path:
            print(f"hpsearch: resuming from the earlier checkpoint {path}", file=sys.stderr, flush=True)
        return state
    print("hpsearch: no readable checkpoint; the trial starts over", file=sys.stderr, flush=True)
    return None


def tune_trial(config: dict[str, Any], *, data: Data) -> None:
    """A Tune function trainable. `data` arrives once through Ray's object store."""
    trial = TrialConfig.from_mapping(config)
    device = trial_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)  # a reused actor: this trial's peak only
    run = build_run(trial, data, device)
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:  # Tune restarted this trial (failure or resume)
        state = newest_readable_state(checkpoint)
        if state is not None:
            run.load_state_dict(state)
    placement = Placement(node=ray.get_runtime_context().get_node_id()[:12], hostname=socket.gethostname(),
                          device=str(device), accelerator_ids=assigned_accelerators())
    for record in train_and_evaluate(run):
        with tempfile.TemporaryDirectory() as folder:
            save_checkpoint(folder, trial, run.input_shape, run.num_classes, run.state_dict())
            tune.report(epoch_report(record, placement, device), checkpoint=tune.Checkpoint.from_directory(folder))
