"""The search driver: the short story of a search.

validate (the space is valid when this runs) -> check what the search needs (data, the
model on a tiny batch) -> claim the run folder and write spec.yaml -> start (or join) Ray
-> run Tune -> derive results.parquet and best.yaml from Tune's record.
Everything a user can get wrong fails before Ray starts.
"""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable

import pandas as pd
import ray
import yaml
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

from search import local_ray
from search.capacity import CapacityError, check_capacity, plan_gpus
from search.gpu_probe import resolve_auto
from search.progress import Progress, flush_all
from search.results import INTERRUPTED, config_from_row, ranked, read_record, results_schema, to_frame, trial_rows
from search.report import write_report
from search.run_folder import RunFolder
from search.searcher import make_searcher
from search.snapshot import SnapshotOnTrialEnd
from search.space import MODEL, Space, example_config, is_run_name, max_epochs, to_raw
from search.storage import Storage, check_storage, is_uri
from search.summary import Timing, format_summary
from trainable.data import Data, load_data
from trainable.device import get_default_device
from trainable.errors import ConfigError, problem
from trainable.factories import check_model
from trainable.loop import evaluate_model
from trainable.metrics import METRICS
from trainable.report import CheckpointError, load_checkpoint
from trainable.adapter import DataHandle, run_trial, tune_trial


@dataclass(frozen=True)
class Outcome:
    """What a finished search leaves, for the CLI and for tests."""

    name: str
    path: str  #: the run folder: <storage_path>/<name>
    results: pd.DataFrame
    best: dict[str, Any] | None  #: best.yaml's content
    timing: Timing
    summary: str
    interrupted: bool = False  #: stopped (Ctrl-C, SIGTERM) before every trial finished; --resume continues it


def run_folder_name(space: Space, storage: Storage, name: str | None, resume: bool) -> str:
    """The run's folder name; resuming without --name picks the newest run of this space."""
    if name is not None:
        if not is_run_name(name):
            raise ConfigError([problem("--name", "must be letters, digits, '_', '.' or '-', at most 128, "
                                                 "starting with a letter or digit (it names one folder)", name)])
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


def claim(folder: RunFolder, *, automatic: bool) -> RunFolder:
    """Claim the run folder; an automatic name taken in the same second gets a suffix (-2, -3, ...)."""
    for attempt in range(1, 100 if automatic else 2):
        candidate = folder if attempt == 1 else RunFolder(folder.storage, f"{folder.name}-{attempt}")
        try:
            candidate.claim()
            return candidate
        except ConfigError:
            if not automatic:
                raise
    raise ConfigError([problem("--name", "no free automatic name; pass --name", folder.name)])


def make_scheduler(space: Space) -> TrialScheduler:
    experiment = space.experiment
    if experiment.scheduler == "asha":
        return ASHAScheduler(time_attr="training_iteration", metric=experiment.metric, mode=experiment.mode,
                             max_t=max_epochs(space.searched, space.trial_defaults().epochs),
                             grace_period=experiment.grace_period, reduction_factor=experiment.reduction_factor)
    return FIFOScheduler()


def param_space(space: Space) -> dict[str, Any]:
    """The fixed part of every trial's config; the searcher adds the searched fields and seed."""
    fixed = space.trial_defaults().to_flat()
    for name in [d.name for d in space.searched] + ["seed", "trial_number"]:  # the searcher sets these per trial
        fixed.pop(name, None)
    # torch threads = the trial's CPU share, so concurrent trials don't oversubscribe cores
    return {**fixed, "num_threads": max(1, math.floor(space.resources.cpus))}


def trial_folder_name(trial) -> str:
    """Short trial folders (Tune's default name lists the whole config)."""
    return f"trial_{trial.trial_id}"


def reachable(address: str, timeout_s: float) -> bool:
    """True once a TCP connection to host:port of `address` succeeds within `timeout_s`.

    ray.init retries an unreachable cluster for minutes; this gives up in the bound.
    Addresses without a port (auto, local) are Ray's to resolve.
    """
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, timeout_s))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)  # a retry interval, not a wait for something we control


def start_ray(address: str | None, connect_timeout: float = 60.0) -> bool:
    """Join the cluster at `address` (or $RAY_ADDRESS), else start a local Ray; True if we started it."""
    if address is None and local_ray.pending():  # begun by the CLI, beside the imports and data loading
        local_ray.take()
        return True
    if ray.is_initialized():
        return False
    if address is None and "RAY_ADDRESS" not in os.environ:
        # "local" always starts a new instance, never joins one some other process started
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
        return True
    target = address or os.environ["RAY_ADDRESS"]
    if not reachable(target, connect_timeout):
        raise ConfigError([problem("--address", f"no Ray cluster answered at {target} within "
                                                f"{connect_timeout:g} s (experiment.connect_timeout); is it up, "
                                                "and is the port open?", target)])
    try:
        ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as error:  # e.g. "auto" with no cluster running
        raise ConfigError([problem("--address", f"cannot join a Ray cluster there ({error})", target)]) from None
    return True


@contextmanager
def sigterm_as_sigint():
    """SIGTERM stops the search as Ctrl-C does: Tune saves its state, trials stay resumable.

    Tune handles SIGINT inside fit() (it ends the run and saves the experiment state);
    SIGTERM would otherwise kill the driver mid-write. Signals are the main thread's only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# tracker -> (module it needs, the pip extra that installs it)
MLFLOW_DB = "mlflow.db"
TRACKER_PACKAGES = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


def tracker_callbacks(space: Space, folder: RunFolder) -> list:
    """Tune's logger callbacks for experiment.loggers (TensorBoard event files Tune writes anyway)."""
    callbacks = []
    if "mlflow" in space.experiment.loggers:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        # a SQLite file in the run folder: MLflow 3 has put its ./mlruns file store in maintenance mode
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder.path}/{MLFLOW_DB}"
        callbacks.append(MLflowLoggerCallback(tracking_uri=uri, experiment_name=folder.name, save_artifact=False))
    if "wandb" in space.experiment.loggers:
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(project=folder.name, mode="offline", dir=folder.path))
    return callbacks


def check_search(space: Space) -> Data:
    """Load the data (test part included) and try the model once; ConfigError/DataError on failure.

    All of it runs before Ray starts, so a bad reference, keyword or dataset costs seconds.
    """
    for tracker in space.experiment.loggers:
        module, extra = TRACKER_PACKAGES.get(tracker, (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError([problem("experiment.loggers", f"{tracker} needs its package: "
                                                             f"pip install -e '.[{extra}]'", list(space.experiment.loggers))])
    if ("mlflow" in space.experiment.loggers and is_uri(space.experiment.storage_path)
            and not os.environ.get("MLFLOW_TRACKING_URI")):
        raise ConfigError([problem("experiment.loggers", "mlflow with a storage URI needs MLFLOW_TRACKING_URI "
                                                         "(its default is a SQLite file in a local run folder)",
                                   list(space.experiment.loggers))])
    data = load_data(space.trial_defaults(), space.data_root, key="data.dataset")
    searched_keys = tuple(d.name[len(MODEL) + 1:] for d in space.searched if d.name.startswith(MODEL + "."))
    check_model(example_config(space), data.sample(), data.num_classes, searched_keys)
    return data


def differing_keys(now: dict[str, Any], then: dict[str, Any], ignore: tuple[str, ...]) -> list[str]:
    """`section.key` of every value two space files (as to_raw writes them) disagree on."""
    changed = []
    for section in then:
        for key in sorted(set(then[section]) | set(now.get(section, {}))):
            path = f"{section}.{key}"
            if path not in ignore and then[section].get(key) != now.get(section, {}).get(key):
                changed.append(path)
    return changed


def trial_id_of(result) -> str:
    """The Tune trial id of a Result, from its folder (trial_<id>, see trial_folder_name)."""
    return result.path.rstrip("/").rsplit("/", 1)[-1].removeprefix("trial_")


def spec_for_resume(space: Space, folder: RunFolder) -> Space:
    """The stored spec of `folder`; a space file that now says otherwise gets a note, not a say."""
    stored, run = folder.read_spec()
    if run.get("path") not in (None, folder.path):
        raise ConfigError([problem("--resume", f"this run was started at {run['path']}; Tune's records in it "
                                               "point there, so resuming the copy would write into the original. "
                                               "Resume it where it was started", folder.path)])
    if space.data_root is not None and space.data_root != stored.data_root:
        stored = replace(stored, data_root=space.data_root)  # where the files are, not what they are
    changed = differing_keys(to_raw(space), to_raw(stored), ignore=("experiment.name", "data.root"))
    if changed:
        print(f"note: {space.source} differs from the stored spec of this run in {', '.join(changed)}; "
              f"--resume runs the stored spec ({folder.path}/spec.yaml)", file=sys.stderr, flush=True)
    return stored


def derive(folder: RunFolder, space: Space, grid) -> pd.DataFrame:
    """results.parquet from Tune's record of every trial, this run's and earlier runs'.

    Status comes from the saved experiment state (after Ctrl-C the live trial objects read
    TERMINATED, the saved state RUNNING); a trial that never started has no row.
    """
    rows = []
    schema = results_schema(space)
    saved = folder.saved_trials()
    suggested = folder.searcher_state().get("suggested", {})  # trial number -> (when, seconds); OrderedSearch's
    for result in grid:
        trial_id = trial_id_of(result)
        status, config = saved.get(trial_id, ("TERMINATED", None))
        reports = read_record(result.filesystem, result.path)
        if not reports and result.error is None and status == "PENDING":
            continue
        ended = status in ("TERMINATED", "ERROR")
        trial_config = result.config or config
        trial = trial_rows(trial_id, trial_config, reports, done=ended, error=result.error is not None,
                           suggested=suggested.get((trial_config or {}).get("trial_number")))
        folder.write_part(space, trial_id, trial, schema)
        rows += trial
    return to_frame(rows, schema)


def test_score(grid, rows: pd.DataFrame, data: Data) -> tuple[pd.Series | None, tuple[float, float] | None, str]:
    """The best row whose checkpoint reads, its test (loss, acc), and a note on any skipped.

    A corrupt checkpoint at the best epoch falls back to the next best row, said in the note.
    """
    checkpoints = {}
    for result in grid:
        trial_id = trial_id_of(result)
        for checkpoint, metrics in result.best_checkpoints:
            checkpoints[(trial_id, metrics.get("epoch"))] = checkpoint
    skipped, unsaved = [], 0
    for _, row in rows.iterrows():
        checkpoint = checkpoints.get((row["trial_id"], int(row["epoch"])))
        if checkpoint is None:  # checkpoint_every skipped that epoch, or num_to_keep removed it
            unsaved += 1
            continue
        try:
            with checkpoint.as_directory() as where:
                saved = load_checkpoint(where)
        except CheckpointError as error:
            skipped.append(str(error))
            continue
        notes = ([f"the best epoch with a checkpoint: {unsaved} better one(s) had none kept "
                  "(experiment.checkpoint_every, num_to_keep)"] if unsaved else [])
        notes += [f"skipped {s}" for s in skipped]
        if data.test is None:
            return row, None, "; ".join(["the dataset has no test part", *notes])
        score = evaluate_model(saved.config, saved.state["model"], saved.input_shape, saved.num_classes,
                               data.test, data.standardize, get_default_device())
        return row, score, "; ".join(notes)
    return ((rows.iloc[0] if len(rows) else None), None,
            "no readable checkpoint" + (f" ({unsaved} epoch(s) had none kept)" if unsaved else "")
            + "".join(f"; {s}" for s in skipped))


def best_entry(best: pd.Series, test: tuple[float, float] | None, note: str, metric: str, name: str,
               schema) -> dict[str, Any]:
    return {
        "config": config_from_row(best, schema),
        "result": {
            "trial_number": None if pd.isna(best["trial_number"]) else int(best["trial_number"]),
            "trial_id": best["trial_id"],
            "epoch": int(best["epoch"]),
            "metric": metric,
            **{m: float(best[m]) for m in METRICS},
            "test_acc": None if test is None else float(test[1]),
            "test_loss": None if test is None else float(test[0]),
            **({"note": note} if note else {}),
            "search": name,
        },
    }


def best_yaml(entry: dict[str, Any], path: str, space: Space) -> str:
    result = entry["result"]
    header = (f"# Best trial of search {result['search']} ({space.source}), by {result['metric']} "
              f"at epoch {result['epoch']}.\n"
              f"# Re-run it: {rerun_command(path, space)}{' (download it first)' if is_uri(path) else ''}\n"
              f"# It prints val_acc {result['val_acc']:.4f} on epoch {result['epoch']} (same machine).\n"
              f"# test_acc: the checkpoint of that epoch on the dataset's test part (null if it has none).\n")
    return header + yaml.safe_dump({**entry["config"], "result": result}, sort_keys=False)


def resume_command(space: Space, folder: RunFolder) -> str:
    """The exact command that continues this run (the Python API's call for a space given as a dict)."""
    if not space.source.endswith((".yaml", ".yml")):
        return f"search.run(..., name={folder.name!r}, resume=True)  (storage_path {folder.storage.uri})"
    return (f"python -m search --space {space.source} --storage-path {folder.storage.uri} "
            f"--resume --name {folder.name}")


def rerun_command(path: str, space: Space) -> str:
    """The command that replays best.yaml, with the data root the search used."""
    where = path if not is_uri(path) else "best.yaml"
    return f"python -m trainable --config {where}" + (f" --data-root {space.data_root}" if space.data_root else "")


def search_notes(space: Space, folder: RunFolder, timing: Timing) -> str:
    """How reproducible the search was, and what reproducibility cost in waiting slots."""
    experiment = space.experiment
    if not experiment.reproducible:
        return ("Search: asynchronous (experiment.reproducible: false): Optuna saw results in arrival order, "
                "so a rerun with the same seed can pick other configs" if experiment.max_concurrent > 1 else
                "Search: one trial at a time, reproducible")
    waits = folder.searcher_state().get("waits", {})
    slot_seconds = timing.wall_seconds * timing.slots
    line = (f"Search: reproducible ({experiment.sampler}, seed {experiment.seed}): trial n's config depends only "
            f"on the seed and n; {len(waits)} trial(s) waited for earlier results, {sum(waits.values()):.1f} s "
            f"in all ({100 * sum(waits.values()) / slot_seconds if slot_seconds else 0:.0f}% of slot time)")
    if experiment.scheduler == "asha":
        line += ("\n      note: ASHA stops trials by the order results arrive, so which trials stop early "
                 "(and what TPE then sees) is not reproducible; use scheduler: fifo for that")
    return line


def run_search(space: Space, *, name: str | None = None, address: str | None = None, resume: bool = False,
               trainable: Callable = tune_trial) -> Outcome:
    """Run (or resume) a search. Raises ConfigError, DataError or CapacityError before any trial starts."""
    start_wall, start_time = time.perf_counter(), time.time()
    storage = Storage.at(space.experiment.storage_path)
    check_storage(storage)
    folder = RunFolder(storage, run_folder_name(space, storage, name, resume))
    if resume:
        space = spec_for_resume(space, folder)
    experiment = space.experiment
    data = check_search(space)
    if resume:
        folder.check_record()
        rerun = folder.drop_unrecorded_parts()
        if rerun:
            print(f"note: {len(rerun)} trial(s) ended after Tune's last snapshot of this run; they run again "
                  f"with the same trial numbers, configs and seeds", file=sys.stderr, flush=True)
    else:
        folder = claim(folder, automatic=name is None)
        folder.write_spec(space)
    try:
        started = start_ray(address, experiment.connect_timeout)
    except BaseException:  # an unreachable cluster, Ctrl-C: nothing ran, so no run folder either
        if not resume:
            folder.release()
        raise
    try:
        try:
            resources, auto_note = resolve_auto(space, data, folder, resume=resume)  # gpus: auto, measured
            capacity = check_capacity(resources)  # 0 only where an autoscaler will add nodes
        except BaseException:  # no capacity, a failed probe, Ctrl-C during it: no trial ran
            if not resume:
                folder.release()
            raise
        slots = min(experiment.max_concurrent, capacity) if capacity else experiment.max_concurrent
        gpu_plan = plan_gpus(resources, min(slots, experiment.num_samples))  # spread over every GPU
        # the arrays go into the object store once; every trial reads them from there
        wrapped = tune.with_resources(
            tune.with_parameters(run_trial, data=DataHandle.put(data.for_trials()), trial_function=trainable,
                                 checkpoint_every=experiment.checkpoint_every),
            {"cpu": resources.cpus, "gpu": gpu_plan.gpus})
        if resume:
            tuner = tune.Tuner.restore(folder.path, trainable=wrapped,
                                       resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                wrapped,
                param_space=param_space(space),
                tune_config=tune.TuneConfig(search_alg=make_searcher(space), scheduler=make_scheduler(space),
                                            num_samples=experiment.num_samples, reuse_actors=True,
                                            trial_dirname_creator=trial_folder_name),
                run_config=tune.RunConfig(
                    name=folder.name,
                    storage_path=storage.uri,
                    # num_to_keep keeps the best by metric and always the latest; a driver killed
                    # after Tune deleted a checkpoint its last snapshot names resumes that trial
                    # from an earlier one that reads, or from the start (adapter.newest_readable_state)
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=experiment.num_to_keep,
                                                            checkpoint_score_attribute=experiment.metric,
                                                            checkpoint_score_order=experiment.mode),
                    failure_config=tune.FailureConfig(max_failures=experiment.max_failures),
                    # Tune's state saved when trials end (coalesced), then their parts of results.parquet
                    callbacks=[SnapshotOnTrialEnd(every_trial=not experiment.reproducible), Progress(folder, space),
                               *tracker_callbacks(space, folder)],
                    verbose=0,
                ),
            )
        with sigterm_as_sigint():
            try:
                grid = tuner.fit()
            except KeyboardInterrupt:  # a second Ctrl-C: Tune stopped saving; its last state stands
                print(f"interrupted; continue with:\n  {resume_command(space, folder)}", file=sys.stderr)
                raise
        flush_all()  # the live parts first: derive writes every part again, from Tune's whole record
        frame = derive(folder, space, grid)
        interrupted = (frame["status"] == INTERRUPTED).any() or frame["trial_id"].nunique() < experiment.num_samples
        wall = time.perf_counter() - start_wall
        this_run = frame[frame["finished_at"] >= start_time]
        timing = Timing(wall, float(this_run["epoch_seconds"].sum()), slots)

        best, test, note = test_score(grid, ranked(frame, experiment.metric, experiment.mode), data)
        entry = None
        best_path = folder.storage.join(folder.name, "best.yaml")
        if best is not None:
            entry = best_entry(best, test, note, experiment.metric, folder.name, results_schema(space))
            folder.write_best(best_yaml(entry, best_path, space))
        searched = [d.name for d in space.searched]
        summary = format_summary(frame, entry, timing, metric=experiment.metric, mode=experiment.mode,
                                 searched=searched, gpus_per_trial=gpu_plan.gpus,
                                 gpu_notes=(auto_note, gpu_plan.note),
                                 rerun=rerun_command(best_path, space))
        for result in grid:
            if result.error is not None:  # after max_failures restarts; Tune keeps the traceback
                first_line = str(result.error).strip().splitlines()[-1][:200]
                summary += f"\nFailed: {result.path}: {first_line} (traceback in error.txt there)"
        summary += "\n" + search_notes(space, folder, timing)
        try:
            report = write_report(folder, space, frame, None if entry is None else entry["result"]["trial_id"],
                                  summary)
            summary += f"\nReport: {report} (figures in {folder.path}/report/; the study: {folder.path}/optuna.journal)"
        except Exception as error:  # the results are written; a figure must not turn them into a crash
            summary += (f"\nReport: not written ({type(error).__name__}: {error}); "
                        f"try again with: python -m search report {folder.path}")
        if interrupted:
            unfinished = frame.loc[frame["status"] == INTERRUPTED, "trial_id"].nunique()
            summary += (f"\nInterrupted: {unfinished} trial(s) unfinished, "
                        f"{experiment.num_samples - frame['trial_id'].nunique()} not started. Continue with:\n"
                        f"  {resume_command(space, folder)}")
        return Outcome(folder.name, folder.path, frame, entry, timing, summary, bool(interrupted))
    finally:
        if started:
            ray.shutdown()
