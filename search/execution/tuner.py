"""The Tuner of a search, new or restored: trainable, searcher, scheduler, callbacks.

A new search gets a Tuner over the trial function with the data in the object store, the
searcher (search/searching/searcher.py) and the scheduler; a resume restores Tune's own record of the
run with the same trainable. `fit` runs it with SIGTERM handled as Ctrl-C.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import pyarrow.fs as pafs
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.utils.util import SafeFallbackEncoder

from search.execution.capacity import trial_resources
from search.execution.collector import trials_begin
from search.execution.disk_guard import DiskGuard
from search.execution.progress import Progress, flush_all
from search.execution.ray_internals import (batched_results, continue_held_trial, event_writers, keep_idle_actors,
                                           light_callback_census,
                                           park_requeued_trial, quick_hand_over, quick_stop, record_file,
                                           remembered_trainables,
                                           restart_a_trial_whose_reused_actor_died)
from search.execution.session import sigterm_as_sigint
from search.execution.writer_thread import WriterThread
from search.outputs.phases import first_trial_started
from search.searching.budget import budgeted, forget_ending
from trainable.kept_code import copies
from search.searching.fifo import fifo_scheduler
from search.searching.halving import RECORD_FILE as HALVING_RECORD
from search.searching.halving import OrderedHalving, bracket_count, flush_records
from search.searching.pbt import make_pbt, population_space
from search.searching.searcher import make_searcher
from search.definition.objectives import HALVING, first, objectives_of, several
from search.definition.space import Space, max_epochs
from search.store.results import RECORD_FILE
from search.store.retention import KeepCheckpoints
from search.store.run_folder import RunFolder
from search.store.snapshot import TuneStateCopy
from search.store.storage import is_uri
from trainable.adapter import DataHandle, run_trial
from trainable.function import METRIC_NAMES
from trainable.report import GPU_MEMORY_COLUMNS, PACKED, PHASE_COLUMNS, PLACEMENT_COLUMNS

if TYPE_CHECKING:  # torch with it: a search of a function trainable has no use for it in the driver
    from trainable.data import Data

MLFLOW_DB = "mlflow.db"


def make_scheduler(space: Space, folder: RunFolder | None = None) -> TrialScheduler:
    """FIFO, or early stopping: reproducible (search/searching/halving.py) unless experiment.reproducible is false."""
    experiment = space.experiment
    if experiment.scheduler == "pbt":
        return make_pbt(space)
    if experiment.scheduler not in HALVING:
        return fifo_scheduler(experiment)  # its reports in batches where nothing stops a trial at one
    # a function may leave epochs unsaid (None): its searched epochs bound the rungs, as schedule_problems found
    max_t = max_epochs(space.searched, space.trial_defaults().epochs or 0)
    # bohb: asynchronous BOHB, ASHA's one bracket with a model fit on the rungs (search/searching/searcher.py)
    brackets = 1 if experiment.scheduler in ("asha", "bohb") else \
        bracket_count(experiment.grace_period, max_t, experiment.reduction_factor)
    # a trial waits at a rung on its actor, unless something else times that wait: an epoch's watchdog
    # (trial_timeout), or a trial of several workers, whose other ranks wait at a collective with a timeout
    holds = experiment.trial_timeout is None and space.resources.workers == 1
    if experiment.reproducible:
        return OrderedHalving(metric=first(experiment.metric), mode=first(experiment.mode), max_t=max_t,
                              grace_period=experiment.grace_period, reduction_factor=experiment.reduction_factor,
                              brackets=brackets, storage=None if folder is None else folder.storage,
                              record=f"{folder.name if folder else ''}/{HALVING_RECORD}",
                              objectives=objectives_of(experiment),
                              hold=continue_held_trial if holds else None, park=park_requeued_trial)
    return ASHAScheduler(time_attr="training_iteration", metric=first(experiment.metric), mode=first(experiment.mode),
                         max_t=max_t, grace_period=experiment.grace_period,
                         reduction_factor=experiment.reduction_factor, brackets=brackets)


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


def tracker_callbacks(space: Space, folder: RunFolder) -> list:
    """Tune's logger callbacks for experiment.loggers (Tune adds its TensorBoard logger unless one is given)."""
    callbacks: list[tune.Callback] = [EventFiles() if "tensorboard" in space.experiment.loggers else NoEventFiles()]
    if "mlflow" in space.experiment.loggers:
        # a SQLite file in the run folder: MLflow 3 has put its ./mlruns file store in maintenance mode
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{folder.path}/{MLFLOW_DB}"
        from search.execution.mlflow_logger import TrialValueLogger  # mlflow: an optional extra, only when asked for

        callbacks.append(TrialValueLogger(first(space.experiment.metric), first(space.experiment.mode), tracking_uri=uri,
                                          experiment_name=folder.name, save_artifact=False))
    if "wandb" in space.experiment.loggers:
        from ray.air.integrations.wandb import WandbLoggerCallback  # wandb: an optional extra, only when asked for

        callbacks.append(WandbLoggerCallback(project=folder.name, mode="offline", dir=folder.path))
    return callbacks


# What every report carries for results.parquet alone: where the trial ran and where its slot time went
# (trainable/report.py's PACKED, JSON text; the columns one by one in an earlier release's record), and a
# function trainable's list of its metric names (lists, which Tune's logger would try as a histogram and
# warn about once per search). Not curves to look at.
BOOKKEEPING = frozenset([METRIC_NAMES, PACKED, *PLACEMENT_COLUMNS, *GPU_MEMORY_COLUMNS, *PHASE_COLUMNS, "finished_at"])


class EventFiles(TBXLoggerCallback):
    """experiment.loggers with tensorboard: Tune's TensorBoard logger, given the metrics only (not
    BOOKKEEPING, about half of a report's values), and writing a report's scalars as one event.

    With the bookkeeping, bench/per_report.py measured this logger at 2.5x the wall time per report
    of plain Tune's on the driver's controller thread; without, 1.4x. Tune writes each scalar as an
    event of its own (tensorboardX's add_scalar: a Summary, an Event, its serialising, the writer's
    queue); one event holding them all took half the CPU time for eight values
    (docs/performance.md). TensorBoard reads the same curves from it. The bookkeeping stays in
    results.parquet."""

    def __init__(self) -> None:
        tensorboardx_without_torch()
        super().__init__()
        self._disk = event_files_thread()

    def log_trial_start(self, trial) -> None:
        super().log_trial_start(trial)
        writers = event_writers(self)
        writers[trial] = OneEventPerReport(writers[trial], later=self._disk.submit)

    def log_trial_result(self, iteration, trial, result) -> None:
        super().log_trial_result(iteration, trial, {k: v for k, v in result.items() if k not in BOOKKEEPING})

    def get_state(self) -> dict | None:
        # Tune takes each callback's state as it snapshots, then uploads the run folder (the last time as the
        # search ends, before on_experiment_end): an ended trial's event file is whole by then
        self._disk.wait()
        return super().get_state()

    def on_experiment_end(self, trials, **info) -> None:
        super().on_experiment_end(trials, **info)
        self._disk.wait()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a resumed Tuner brings back the callbacks pickled with the run: one made before its writer thread (8444678) has none
        self.__dict__.update(state)
        self.__dict__.setdefault("_disk", event_files_thread())


def event_files_thread() -> WriterThread:
    """Where the trials' event files are flushed and closed: each is an os.fsync, and on the controller's thread a
    trial's close took 1.1-3 ms of the ~15 ms between a short trial's last report and the next trial's start, a
    flush ~3 ms of a report's turn (docs/performance.md). A lost event file does not end the search: results.parquet
    holds the same values."""
    return WriterThread("hpsearch-event-files", "writing a TensorBoard event file")


def tensorboardx_without_torch() -> None:
    """Import tensorboardX as it imports where torch is not installed, unless this process holds torch already.

    tensorboardX imports torch (about 1.5 s) only to take its tensors as values, and Tune's logger gives it
    numbers; the driver of a search of a function trainable has no other use for torch. A later `import torch`
    is unaffected: only tensorboardX's own check saw it missing."""
    if "torch" in sys.modules or "tensorboardX" in sys.modules:
        return
    # Python's mark of a module that cannot be imported, for this import only: no thread of the driver imports
    # torch meanwhile (Tune's callbacks are made before any trial starts)
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tensorboardX  # noqa: F401
    finally:
        del sys.modules["torch"]


class OneEventPerReport:
    """A trial's tensorboardX SummaryWriter, whose scalars wait for its next flush and go as one event.

    Tune's logger adds a report's scalars one by one (all at the report's step) and flushes after each
    report; everything else (histograms, the hparams at the trial's end, close) goes to the writer.
    tensorboardX's flush syncs the event file to disk (os.fsync), ~3 ms of the controller's turn per
    report here: a trial's writer is flushed at most every FLUSH_EVERY_S and when the trial ends. TensorBoard
    then sees a report within a second while reports come; the last before a pause in them waits for the
    next, for tensorboardX's own flush (every 30 s, as Tune makes the writer) or for the trial's end."""

    FLUSH_EVERY_S = 1.0

    def __init__(self, writer, later: Callable[[Callable[[], Any]], None] = lambda call: call()) -> None:
        """`later`: how the writer's flushes and close are run (EventFiles: its WriterThread's submit); at once by default."""
        self._writer, self._step, self._later = writer, None, later
        self._values: list[Any] = []  # tensorboardX's Summary.Value
        self._flushed_at = 0.0  # time.monotonic() of the writer's last flush

    def add_scalar(self, tag: str, scalar_value, global_step=None, walltime=None, **kwargs) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        # Tune gives only ints and floats (numpy's too), which tensorboardX also makes a float
        self._values.append(Summary.Value(tag=event_tag(tag), simple_value=float(scalar_value)))
        self._step = global_step

    def flush(self) -> None:
        self._add_event()
        if time.monotonic() - self._flushed_at >= self.FLUSH_EVERY_S:
            self._later(self._writer.flush)
            self._flushed_at = time.monotonic()

    def _add_event(self) -> None:
        if self._values:
            from tensorboardX.proto.summary_pb2 import Summary

            self._writer.file_writer.add_summary(Summary(value=self._values), self._step)
            self._values = []

    def close(self) -> None:
        self._add_event()
        self._later(self._writer.close)  # flushes the file to disk

    def __getattr__(self, name: str):
        return getattr(self._writer, name)


@functools.lru_cache(maxsize=4096)
def event_tag(tag: str) -> str:
    """The tag tensorboardX's add_scalar writes for `tag` (cleaned: acc@1 -> acc_1). Made by tensorboardX itself,
    once per tag: a trial's reports repeat their tags, and making its whole value per report cost as much as
    the one event saved."""
    from tensorboardX.summary import scalar

    return scalar(tag, 0.0).value[0].tag


class WritesNothing:
    """A logger that writes nothing, for a kind Tune adds by itself unless the callbacks hold one."""

    def log_trial_start(self, trial) -> None:
        pass

    def log_trial_result(self, iteration, trial, result) -> None:
        pass

    def log_trial_end(self, trial, failed: bool = False) -> None:
        pass


class NoEventFiles(WritesNothing, TBXLoggerCallback):
    """experiment.loggers without tensorboard: no TensorBoard event files. Tune adds its TensorBoard
    logger unless the callbacks hold one, so they hold this one, which writes nothing. It saves the
    driver a writer (and its thread) per trial and ~40 scalars per report, which counts in a search
    of many short trials (docs/performance.md)."""

    def __init__(self) -> None:
        super(TBXLoggerCallback, self).__init__()  # not Tune's: it writes nothing, so it needs no tensorboardX


class NoProgressCsv(WritesNothing, CSVLoggerCallback):
    """No progress.csv in the trial folders. Tune adds its CSV logger unless the callbacks hold one, so
    they hold this one, which writes nothing. The CSV repeats result.json (the record) line for line, and
    results.parquet is the table; nothing of hpsearch's or Tune's reads it while a result.json is there.
    It cost the driver as much per report as Tune's JSON logger (bench/per_report.py, docs/performance.md)."""


class FirstTrialStart(tune.Callback):
    """Tells search/outputs/phases.py when the first trial starts. It holds nothing: a resumed Tuner brings
    back the callbacks pickled with the run."""

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        first_trial_started()


class KeepingJsonLogger(JsonLoggerCallback):
    """Tune's JSON logger (every trial's result.json, our record), keeping what this driver wrote.

    When a trial starts again (after a pause at a rung or a PBT perturbation, or a restart after
    an error), Tune's logger copies result.json back from the run folder over the driver's copy.
    The run folder's copy is uploaded in the background, and under load an upload that began
    before the trial's last report can land after it: the copy back then drops that report, and
    the row is gone from results.parquet (a reproducible search's table lost a row). Where this
    driver has written a trial's record, that copy holds every report the run folder's does and
    more, so it stays; the run folder's copy is taken only by a driver that has none (a resume).
    Tune adds its own JSON logger only when none is given, so this one replaces it.

    Each report is written as Tune's logger writes it, one line of the same JSON, but made by json's C
    encoder: Tune's `json.dump` to the file runs json's pure-Python one, and took more of the driver per
    report than any other logger (bench/per_report.py; docs/performance.md).
    """

    def log_trial_start(self, trial) -> None:
        local = os.path.join(trial.local_path, RECORD_FILE)
        kept = _read_bytes(local)
        super().log_trial_start(trial)  # copies the run folder's result.json over `local`
        if kept and _read_bytes(local) != kept:
            with open(local, "wb") as f:  # the logger's handle appends (O_APPEND): its next line follows these
                f.write(kept)

    def log_trial_result(self, iteration, trial, result) -> None:
        if record_file(self, trial) is None:
            self.log_trial_start(trial)
        record = record_file(self, trial)
        assert record is not None  # Tune's log_trial_start opens it, and ran above when it was not open
        # json.dumps, unlike json.dump, takes the C encoder; SafeFallbackEncoder's fallbacks are the same
        record.write(json.dumps(result, cls=SafeFallbackEncoder) + "\n")
        record.flush()


class KeepRecords(tune.Callback):
    """What runs made before KeepingJsonLogger have pickled instead (Tune unpickles a resumed run's
    callbacks, so the class stays for them): before a trial starts again, the driver's result.json
    is copied to the run folder, for Tune's logger to copy back. A background upload landing in
    between can still drop a report there; new runs have KeepingJsonLogger, which keeps it."""

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        local = os.path.join(trial.local_path, RECORD_FILE)
        if os.path.exists(local) and os.path.abspath(trial.local_path) != os.path.abspath(trial.path):
            pafs.copy_files(local, f"{trial.path}/{RECORD_FILE}",
                            destination_filesystem=trial.storage.storage_filesystem)


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def disk_guard(space: Space, folder: RunFolder) -> list[DiskGuard]:
    """A full local disk stops the search as Ctrl-C does (search/execution/disk_guard.py); object stores do not fill."""
    return [] if is_uri(folder.path) else [DiskGuard(folder.path, space.experiment.min_free_mb)]


def snapshot_copy(folder: RunFolder) -> list[TuneStateCopy]:
    """On URI storage, each of Tune's snapshots as one object in the run folder (search/store/snapshot.py)."""
    return [TuneStateCopy(folder)] if is_uri(folder.path) else []


def keep_checkpoints(space: Space) -> list[KeepCheckpoints]:
    """experiment.num_to_keep, kept by the driver (search/store/retention.py), not by Tune, on every storage: on
    URI storage Tune deleted a checkpoint while the state there still named it (search/store/snapshot.py)."""
    experiment = space.experiment
    if experiment.num_to_keep is None:
        return []
    return [KeepCheckpoints(experiment.num_to_keep, None if several(experiment) else first(experiment.metric),
                            None if several(experiment) else first(experiment.mode))]


def build_tuner(space: Space, folder: RunFolder, data: Data | None, trial_function: Callable, *, gpus: float,
                resume: bool) -> tune.Tuner:
    """The search's Tuner; the data goes into the object store once, and every trial reads it there."""
    experiment = space.experiment
    # bound to run_trial here, not passed with tune.with_parameters, which fetches each one from the object store
    # at every trial's start: five round trips in the hand-over of an actor to its next trial (docs/performance.md).
    # The data goes into the object store once as before; its handle is a reference that a trial fetches once per actor.
    bound = functools.partial(run_trial, data=DataHandle.put(None if data is None else data.for_trials()),
                              trial_function=trial_function,
                              checkpoint_every=experiment.checkpoint_every, trial_timeout=experiment.trial_timeout,
                              # a trial restored from Tune's record names its files as the run began: where one
                              # is gone, the run folder's copy (trainable/kept_code.py)
                              code={} if is_uri(folder.path) else copies(folder.path))
    bound.__name__ = bound.__qualname__ = run_trial.__name__  # type: ignore[attr-defined]  # Tune's name for the trainable (its actors; what a resume matches)
    trainable = tune.with_resources(bound, trial_resources(space.resources, gpus))
    if resume:  # the searcher and the stopper come back from Tune's record (search/searching/budget.py)
        return tune.Tuner.restore(folder.path, trainable=trainable, resume_unfinished=True, resume_errored=True)
    pbt = experiment.scheduler == "pbt"  # Ray's PBT takes no searcher: the population is drawn up front (search/searching/pbt.py)
    search, stop = (None, None) if pbt else budgeted(make_searcher(space, folder), folder, space)  # time_budget, stop_when
    return tune.Tuner(
        trainable,
        param_space=population_space(space, param_space(space)) if pbt else param_space(space),
        tune_config=tune.TuneConfig(search_alg=search, scheduler=make_scheduler(space, folder),
                                    num_samples=1 if pbt else experiment.num_samples,
                                    max_concurrent_trials=experiment.max_concurrent if pbt else None,
                                    reuse_actors=True, trial_dirname_creator=trial_folder_name),
        run_config=tune.RunConfig(
            name=folder.name,
            storage_path=folder.storage.uri,
            stop=stop,
            # Tune keeps every checkpoint: KeepCheckpoints deletes those beyond num_to_keep, but none that
            # Tune's last saves name as a trial's latest (Tune's num_to_keep also saves its whole state after
            # every num_to_keep-th checkpoint of a trial; search/store/retention.py)
            checkpoint_config=tune.CheckpointConfig(num_to_keep=None,
                                                    # several objectives: a trial's point is its last epoch
                                                    checkpoint_score_attribute=None if several(experiment)
                                                    else first(experiment.metric), checkpoint_score_order=first(experiment.mode)),
            failure_config=tune.FailureConfig(max_failures=experiment.max_failures),
            # Tune snapshots its state by its own rule, at most ~5% of the driver's time (max(10 s,
            # 19x a snapshot's cost)). A SIGKILLed driver loses the trials that ended since: a
            # reproducible search reruns them identically, and their parts written before the kill
            # are dropped on resume (ResultParts.drop_unrecorded; docs/stops-and-resume.md); on
            # URI storage the snapshot a resume reads is tune_state.zip (search/store/snapshot.py), copied
            # before KeepCheckpoints deletes what the snapshot before named
            callbacks=[Progress(folder, space), *disk_guard(space, folder), *tracker_callbacks(space, folder),
                       *snapshot_copy(folder), *keep_checkpoints(space), FirstTrialStart(),
                       KeepingJsonLogger(), NoProgressCsv()],
            verbose=0,
        ),
    )


def fit(tuner: tune.Tuner, folder: RunFolder, resume_hint: str):
    """Run the trials; SIGTERM stops them as Ctrl-C does. Every live results part is written on return.
    Returns the results and whether Tune ran to its end (no stop): then every trial ended.

    A stopped search returns as soon as Tune has saved its state (session.quick_stop): the
    results are then Tune's saved record, exactly what fit() would have returned after its wait.
    """
    forget_ending(folder)  # an earlier search of this run in this process ended early: this one has not
    restart_a_trial_whose_reused_actor_died()  # a lost node's kept actors: their next trials restart
    keep_idle_actors()  # two slots free at once: both actors kept for the next trials, not one
    light_callback_census()  # Ray's usage census of our callbacks, without importing mlflow
    remembered_trainables()  # one GCS read of the trainable, not three per trial made
    quick_hand_over()  # a reused actor's next trial starts in the reset's task
    batched_results()  # a FIFO search's trials: their reports in batches (search/searching/fifo.py)
    trials_begin()  # the start's objects frozen, the collector on again (search/execution/collector.py)
    with sigterm_as_sigint(), quick_stop() as stop:
        try:
            grid = tuner.fit()
        except KeyboardInterrupt:
            if not stop.cut:  # a second Ctrl-C: Tune stopped saving; its last state stands
                print(f"interrupted; continue with:\n  {resume_hint}", file=sys.stderr)
                raise
            grid = tune.ResultGrid(folder.record.analysis())
        finally:
            flush_records()  # halving.json: the rung decisions held back (search/searching/halving.py)
    flush_all()  # the live parts first: the end of the search writes every part again, from Tune's record
    return grid, not stop.stopping
