"""The search driver: from a validated Space to results.parquet, best.yaml and a summary.

Order matters: the space is already valid when this runs; Ray starts (or is joined),
the cluster is checked for room for one trial, the data is loaded once and shipped to
trials through the object store, Tune runs, then the outputs are written.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import ray
import torch
import yaml
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from search.capacity import check_capacity
from search.results import (ResultsCallback, config_from_row, rows_from_result_grid, to_frame, trial_config,
                            write_results)
from search.searcher import make_searcher
from search.space import Space
from search.storage import Storage, is_uri
from search.summary import Timing, best_row, format_summary
from trainable.adapter import CHECKPOINT_FILE, tune_trial
from trainable.data import load_dataset, split
from trainable.device import get_default_device
from trainable.errors import ConfigError, problem
from trainable.loop import evaluate_state

BEST_FILE = "best.yaml"


@dataclass(frozen=True)
class Outcome:
    """What a finished search leaves, for the CLI and for tests."""

    name: str
    path: str  #: the run folder: <storage_path>/<name>
    results: pd.DataFrame
    best: dict[str, Any] | None  #: best.yaml's content
    timing: Timing
    summary: str


def run_folder_name(space: Space, storage: Storage, name: str | None, resume: bool) -> str:
    """The run's folder name; resuming without --name picks the newest run of this space."""
    if name is not None:
        exists = storage.exists(name)
        if resume and not exists:
            raise ConfigError([problem("--name", f"no search to resume at {storage.join(name)}", name)])
        if not resume and exists:
            raise ConfigError([problem("--name", f"{storage.join(name)} already holds a search; "
                                                 "pass --resume to continue it or choose another --name", name)])
        return name
    prefix = space.experiment.name + "-"
    if resume:
        runs = sorted(d for d in storage.list_dirs() if d.startswith(prefix))
        if not runs:
            raise ConfigError([problem("--resume", f"no run named {prefix}* under {storage.uri} to resume "
                                                   "(pass --name)", True)])
        return runs[-1]
    return prefix + time.strftime("%Y%m%d-%H%M%S")


def make_scheduler(space: Space) -> TrialScheduler:
    experiment = space.experiment
    if experiment.scheduler == "asha":
        epochs = next((d.high if d.values == () else max(d.values) for d in space.searched if d.name == "epochs"),
                      space.trial_defaults().epochs)
        return ASHAScheduler(time_attr="training_iteration", metric=experiment.metric, mode=experiment.mode,
                             max_t=int(epochs), grace_period=experiment.grace_period,
                             reduction_factor=experiment.reduction_factor)
    return FIFOScheduler()


def param_space(space: Space) -> dict[str, Any]:
    """The fixed part of every trial's config; the searcher adds the searched fields and seed."""
    fixed = {k: list(v) if isinstance(v, tuple) else v for k, v in space.fixed.items()}
    # torch threads = the trial's CPU share, so concurrent trials don't oversubscribe cores
    return {**fixed, "num_threads": max(1, math.floor(space.resources.cpus))}


def trial_folder_name(trial) -> str:
    """Short trial folders (Tune's default name lists the whole config)."""
    return f"trial_{trial.trial_id}"


def start_ray(address: str | None) -> bool:
    """Join the cluster at `address` (or $RAY_ADDRESS), else start a local Ray; True if we started it."""
    if ray.is_initialized():
        return False
    if address is None and "RAY_ADDRESS" not in os.environ:
        # "local" always starts a new instance, never joins one some other process started
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    return True


def measure_test_accuracy(grid, best: pd.Series, test_arrays, metric: str, mode: str) -> tuple[float, float]:
    """Loss and accuracy on the test set of the best trial's checkpoint at its best epoch."""
    result = next(r for r in grid if (r.metrics or {}).get("trial_id") == best["trial_id"])
    checkpoint = next((c for c, m in result.best_checkpoints if m.get("epoch") == best["epoch"]), None)
    checkpoint = checkpoint or result.get_best_checkpoint(metric, mode)
    with checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / CHECKPOINT_FILE, weights_only=True, map_location="cpu")
    return evaluate_state(trial_config(result.config), state["model"], test_arrays, get_default_device())


def best_entry(best: pd.Series, test: tuple[float, float], metric: str, name: str) -> dict[str, Any]:
    return {
        "config": config_from_row(best),
        "result": {
            "trial_id": best["trial_id"],
            "epoch": int(best["epoch"]),
            "metric": metric,
            "val_acc": float(best["val_acc"]),
            "val_loss": float(best["val_loss"]),
            "test_acc": float(test[1]),
            "test_loss": float(test[0]),
            "search": name,
        },
    }


def best_yaml(entry: dict[str, Any], path: str, space: Space) -> str:
    result = entry["result"]
    header = (f"# Best trial of search {result['search']} ({space.source}), by {result['metric']} "
              f"at epoch {result['epoch']}.\n"
              f"# Re-run it: python -m trainable --config {path if not is_uri(path) else 'best.yaml'}"
              f"{' (download it first)' if is_uri(path) else ''}\n"
              f"# It prints val_acc {result['val_acc']:.4f} on epoch {result['epoch']} (same machine).\n"
              f"# test_acc: the checkpoint of that epoch on the 10,000 test images.\n")
    return header + yaml.safe_dump({**entry["config"], "result": result}, sort_keys=False)


def run_search(space: Space, *, name: str | None = None, address: str | None = None, resume: bool = False,
               trainable: Callable = tune_trial) -> Outcome:
    """Run (or resume) a search. Raises ConfigError or CapacityError before any trial starts."""
    start_wall, start_time = time.perf_counter(), time.time()
    experiment = space.experiment
    storage = Storage.at(experiment.storage_path)
    name = run_folder_name(space, storage, name, resume)
    # Tune snapshots its experiment state every ~10 s by default; a driver killed in between
    # would resume without the trials finished since. Snapshots of a search this size take ms.
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "0")
    started = start_ray(address)
    try:
        capacity = check_capacity(space.resources)  # 0 only where an autoscaler will add nodes
        slots = min(experiment.max_concurrent, capacity) if capacity else experiment.max_concurrent
        defaults = space.trial_defaults()
        train, val = split(load_dataset(defaults.dataset, space.data_root, train=True),
                           defaults.train_size, defaults.val_size, defaults.split_seed)
        # the arrays go into the object store once; every trial reads them from there
        wrapped = tune.with_resources(tune.with_parameters(trainable, train=train, val=val),
                                      {"cpu": space.resources.cpus, "gpu": space.resources.gpus})
        if resume:
            tuner = tune.Tuner.restore(storage.join(name), trainable=wrapped,
                                       resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                wrapped,
                param_space=param_space(space),
                tune_config=tune.TuneConfig(search_alg=make_searcher(space), scheduler=make_scheduler(space),
                                            num_samples=experiment.num_samples, reuse_actors=True,
                                            trial_dirname_creator=trial_folder_name),
                run_config=tune.RunConfig(
                    name=name,
                    storage_path=storage.uri,
                    # every checkpoint is kept: with num_to_keep, a driver killed between Tune
                    # deleting an old checkpoint and saving its state resumes a trial from the
                    # deleted one and fails it (seen in tests/test_resume.py)
                    checkpoint_config=tune.CheckpointConfig(checkpoint_score_attribute=experiment.metric,
                                                            checkpoint_score_order=experiment.mode),
                    failure_config=tune.FailureConfig(max_failures=experiment.max_failures),
                    callbacks=[ResultsCallback(storage, name, experiment.metric, experiment.mode,
                                               experiment.num_samples)],
                    verbose=0,
                ),
            )
        grid = tuner.fit()
        frame = to_frame(rows_from_result_grid(grid))
        write_results(storage, name, frame.to_dict("records"))
        wall = time.perf_counter() - start_wall
        this_run = frame[frame["finished_at"] >= start_time]
        timing = Timing(wall, float(this_run["epoch_seconds"].sum()), slots)

        best = best_row(frame, experiment.metric, experiment.mode)
        entry = None
        best_path = storage.join(name, "best.yaml")
        if best is not None:
            test_arrays = load_dataset(defaults.dataset, space.data_root, train=False)
            entry = best_entry(best, measure_test_accuracy(grid, best, test_arrays, experiment.metric, experiment.mode),
                               experiment.metric, name)
            storage.write(f"{name}/{BEST_FILE}", best_yaml(entry, best_path, space).encode())
        searched = [d.name for d in space.searched]
        summary = format_summary(frame, entry, timing, metric=experiment.metric, mode=experiment.mode,
                                 searched=searched, gpus_per_trial=space.resources.gpus, best_yaml=best_path)
        for result in grid:
            if result.error is not None:  # after max_failures restarts; Tune keeps the traceback
                first_line = str(result.error).strip().splitlines()[-1][:200]
                summary += f"\nFailed: {result.path}: {first_line} (traceback in error.txt there)"
        return Outcome(name, storage.join(name), frame, entry, timing, summary)
    finally:
        if started:
            ray.shutdown()
