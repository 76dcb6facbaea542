"""The Ray Tune adapter: one trial = one `train_and_evaluate` run, reported epoch by epoch.

One of the two modules of `trainable/` that import Ray (function.py, the adapter of a user's
own function, is the other; it imports this one). It turns Tune's (flat) config into a
TrialConfig, restores from Tune's checkpoint when the trial is restarted, and reports
one result (report.epoch_report + a checkpoint in report's format) per epoch.

It also times where a trial's slot time goes (report.Phases): the actor's start or reuse,
the data fetch, and per epoch the report of the epoch before, the checkpoint, training and
validation. `run_trial` is what Tune runs: it fetches the data (once per actor: a reused
actor keeps it) and calls the trainable. A reused actor runs trials one after another in one
process, so run_trial restores the process-wide state a trial may change (isolation.py) when
the trial ends, and turns a `sys.exit()` in the trial into an error that says so.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, cast

import pyarrow.fs as pafs
import ray
from ray import tune

from trainable.config import TrialConfig
from trainable.kept_code import relocated
from trainable.report import (CheckpointError, Phases, Placement, epoch_report, load_checkpoint, packed,
                              save_checkpoint)
from trainable.watchdog import Watchdog

if TYPE_CHECKING:  # the canonical loop's modules (torchvision, torchmetrics: seconds of a trial process's
    # start) are imported by tune_trial when it runs: a function trainable's trials never need them. torch
    # itself is imported where a trial runs: the driver imports this module (Tune is handed run_trial) and a
    # search of a function trainable has no use for torch there (about 1.5 s of its start)
    import torch

    from trainable.data import Data
    from trainable.loop import Run


@dataclass(frozen=True)
class DataHandle:
    """The trials' data in Ray's object store. A reference inside an object is not fetched
    by Tune, so the trial fetches it itself: timed, and once per actor."""

    ref: ray.ObjectRef

    @classmethod
    def put(cls, data: Data | None) -> "DataHandle":  # None: a function trainable's trials get no data of hpsearch's
        return cls(ray.put(data))


@dataclass(frozen=True)
class TrialStart:
    """What run_trial measured before the trainable started, for its reports."""

    ready_at: float  #: when this actor could take the trial: its process started, or its last trial ended
    started_at: float  #: when run_trial began
    fetch_seconds: float  #: the data from the object store (0 for a reused actor that holds it)
    checkpoint_every: int = 1
    data: ray.ObjectRef | None = None  #: the data's reference, for a trial's other workers to fetch
    trial_timeout: float | None = None  #: experiment.trial_timeout: also bounds a wait on another worker


# Per actor process: a reused actor runs trials one after another, never two at once. Tune forces
# module-level state here: it calls the trainable function anew for each trial on a reused actor,
# with nothing but the config, so what outlives a trial (the fetched data, when it ended) or what
# run_trial hands the trial function (its start, its watchdog) has nowhere else to live.
_fetched: dict[str, Data] = {}  # object id -> data: a reused actor keeps what it fetched
_last_end: float | None = None  # when this actor's previous trial made its last report
_start: TrialStart | None = None  # the running trial's, set by run_trial
_watchdog: Watchdog | None = None  # the running trial's, told of each report


def trial_start() -> TrialStart:
    """The running trial's start, as run_trial recorded it (now, where run_trial did not run it)."""
    return _start or TrialStart(time.time(), time.time(), 0.0)


def process_started_at() -> float:
    import psutil  # a dependency of Ray

    return psutil.Process().create_time()


def reset_and_start(trainable: Any, config: dict, storage: Any = None) -> bool:
    """Tune's reset of a reused actor for its next trial, then that trial's function started at once, as Tune's
    first `train` call would start it: search/execution/ray_internals.py quick_hand_over sends this to the actor
    in place of Tune's reset, so the trial trains while Tune's driver learns of the reset. False: Tune's reset
    failed (the last trial's thread did not end), and nothing started."""
    from ray.train._internal.session import get_session

    if not trainable.reset(config, storage=storage):
        return False
    session = get_session()
    if session is not None and not session.training_started:
        session.start()
    return True


_KEPT = "_hpsearch_kept"  # on the trainable: (its trial's thread, a report or an error) for its next train_batch


def train_batch(trainable: Any, seconds: float, most: int) -> list[dict]:
    """The trial's reports of the next `seconds` (at least one, at most `most`) in one actor call, as Tune's
    `Trainable.train_buffered` collects them: search/execution/ray_internals.py batched_results sends this in
    place of Tune's `train` under a FIFO scheduler, so a trial's function goes on to its next epoch without
    waiting for the driver's answer to each report (docs/performance.md).

    A report that carries a checkpoint is a batch of its own: Tune asks the actor to save it after it, and
    having handled a batch, Tune goes on with the answer of its first report, so a checkpoint later in a
    batch had its save raced by the next training call (a trial's last checkpoint went unrecorded). It is
    kept for the next call, which returns it at once. The batch also ends at the trial's end.

    Unlike train_buffered, an error raised after some reports loses none of them: they are returned, and
    the error is raised by the trial's next call, once the driver has recorded them."""
    from ray.train._internal.session import get_session
    from ray.tune.result import DONE, RESULT_DUPLICATE, SHOULD_CHECKPOINT

    session = get_session()
    assert session is not None, "train_batch runs on a function trainable's actor, which made its session"
    thread = session.training_thread  # a new one for each trial a reused actor runs
    kept = getattr(trainable, _KEPT, None)
    if kept is not None:
        setattr(trainable, _KEPT, None)
        kept_by, report_or_error = kept
        if kept_by is thread:  # not a reused actor's earlier trial's, which Tune stopped instead
            if isinstance(report_or_error, BaseException):
                raise report_or_error
            return [report_or_error]
    results: list[dict] = []
    until = time.monotonic() + seconds
    while True:
        try:
            result = trainable.train()
        except Exception as error:
            if not results:
                raise
            setattr(trainable, _KEPT, (thread, error))
            return results
        if result.get(SHOULD_CHECKPOINT) and results:
            setattr(trainable, _KEPT, (thread, result))
            return results
        results.append(result)
        if (result.get(DONE) or result.get(SHOULD_CHECKPOINT) or result.get(RESULT_DUPLICATE)
                or len(results) >= most or time.monotonic() >= until):
            return results


def run_trial(config: dict[str, Any], *, data: DataHandle, trial_function: Callable[..., None],
              checkpoint_every: int = 1, trial_timeout: float | None = None,
              code: Mapping[str, str] | None = None) -> None:
    """What Tune runs: fetch the data (timed, once per actor), then run the trainable, watched
    (trial_timeout: seconds an epoch may take, watchdog.py)."""
    global _start, _watchdog
    from trainable.isolation import GlobalState  # torch: see the TYPE_CHECKING imports above
    from trainable.measures import import_torchmetrics

    # Tune gives a reused actor's last trial thread 2 s (TUNE_FUNCTION_THREAD_TIMEOUT_S, read by this
    # process at each reset) to end before the next trial; past it, the reset fails and Tune 2.60 sets
    # the next trial ERROR without telling the searcher or the scheduler, and a reproducible search then
    # waits for that trial forever. On 2 loaded cores a thread's end (restoring the global state) can
    # take longer: a minute, which a thread that truly hangs still ends with (trial_timeout ends it first).
    os.environ.setdefault(THREAD_TIMEOUT, "60")
    started_at = time.time()
    ready_at = _last_end if _last_end is not None else process_started_at()
    key, fetch_seconds = data.ref.hex(), 0.0
    if key not in _fetched:
        _fetched.clear()  # another search's data: drop it
        _fetched[key] = ray.get(data.ref)
        fetch_seconds = time.time() - started_at
    _start = TrialStart(ready_at, started_at, fetch_seconds, checkpoint_every, data.ref, trial_timeout)
    if trial_function is tune_trial:  # the canonical loop's metrics module, before the watchdog times an epoch
        import_torchmetrics()
    if code:  # a file the config names is gone: the run folder's copy (trainable/kept_code.py)
        config = relocated(config, code)
    before = GlobalState.capture()
    try:
        with Watchdog(trial_timeout, f"trial #{config.get('trial_number')}") as _watchdog:
            trial_function(config, data=_fetched[key])
    except SystemExit as error:
        if getattr(error, TUNE_STOP, False):
            raise  # Tune ending a stopped trial's thread: not an error
        # Tune would take sys.exit(0) for its own stop and then fail with "Should not have reached here"
        raise TrialExit(f"the trial called sys.exit({error.code!r}); a trial ends by returning "
                        "(or raising an error)") from None
    finally:
        _start, _watchdog = None, None
        before.restore()  # the next trial on this actor starts from the state this one found


THREAD_TIMEOUT = "TUNE_FUNCTION_THREAD_TIMEOUT_S"  #: Tune's wait for a trial's thread before an actor's reuse


class TrialExit(RuntimeError):
    """The trial's code called sys.exit() (or raised SystemExit): the trial ends as an error."""


# Tune stops a trial's thread by raising SystemExit(0) inside tune.report; report() marks it so
# run_trial can tell it from a sys.exit() in the trial's own code
TUNE_STOP = "hpsearch_stopped_by_tune"


def report(metrics: dict[str, Any], checkpoint: tune.Checkpoint | None = None) -> None:
    """tune.report (its bookkeeping columns packed: trainable/report.py `packed`), with Tune's stop (a
    SystemExit) marked as Tune's."""
    try:
        tune.report(packed(metrics), checkpoint=checkpoint)
        if _watchdog is not None:
            _watchdog.progress()  # the next epoch's time starts now
    except SystemExit as stop:
        setattr(stop, TUNE_STOP, True)
        raise


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
    import torch

    from trainable.device import get_default_device

    return get_default_device() if assigned_accelerators() else torch.device("cpu")


def newest_readable_state(latest: tune.Checkpoint,
                          load: Callable[[str], Any] = lambda where: load_checkpoint(where).state) -> Any:
    """The state of `latest`, or of the newest earlier checkpoint of the trial that reads.

    A checkpoint cut short (a full disk, a killed node) would otherwise fail the trial on
    every restart. None: no checkpoint reads, and the trial starts over from epoch 0.
    """
    folder, _, _ = latest.path.rstrip("/").rpartition("/")
    assert latest.filesystem is not None  # a Checkpoint given none infers it from its path, which Tune's have
    siblings = [i.path for i in latest.filesystem.get_file_info(pafs.FileSelector(folder))
                if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_")]
    # only earlier ones: a newer folder (left by a driver killed after it was written) is not in Tune's record
    candidates = [latest.path] + sorted((p for p in siblings if p < latest.path), reverse=True)
    for path in candidates:
        try:
            with tune.Checkpoint(path, filesystem=latest.filesystem).as_directory() as where:
                state = load(where)  # a function trainable's own format: trainable/function.py
        except (CheckpointError, OSError) as error:  # OSError: gone from remote storage (num_to_keep)
            print(f"hpsearch: skipping an unreadable checkpoint: {error}", file=sys.stderr, flush=True)
            continue
        if path != latest.path:
            print(f"hpsearch: resuming from the earlier checkpoint {path}", file=sys.stderr, flush=True)
        return state
    print("hpsearch: no readable checkpoint; the trial starts over", file=sys.stderr, flush=True)
    return None


def mark_report() -> None:
    """A report is about to be made: it may be the trial's last, and the next trial on this actor counts from here."""
    global _last_end
    _last_end = time.time()


def tune_trial(config: dict[str, Any], *, data: Data) -> None:
    """A Tune function trainable: one trial, a report and (every checkpoint_every epochs) a checkpoint per epoch."""
    import torch

    from trainable.loop import build_run  # here: see the TYPE_CHECKING import above

    start = trial_start()
    trial = TrialConfig.from_mapping(config)
    device = trial_device()
    if device.type == "cuda":  # a reused actor: this trial's peaks only, without the last one's cached blocks
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    checkpoint = tune.get_checkpoint()
    # Tune restarted this trial (failure or resume): every worker continues from this state
    state = newest_readable_state(checkpoint) if checkpoint is not None else None
    with Workers(trial.workers, config, state, device, start) as world:
        run = build_run(trial, data, device, world)
        note = run.load_state_dict(state) if state is not None else None
        if note:
            print(f"hpsearch: {note}", file=sys.stderr, flush=True)
        report_epochs(trial, run, device, start)


def report_epochs(trial: TrialConfig, run: Run, device: torch.device, start: TrialStart) -> None:
    """Train `run` to its end, reporting each epoch (and a checkpoint every checkpoint_every) to Tune."""
    global _last_end
    from trainable.loop import train_and_evaluate

    placement = Placement(node=ray.get_runtime_context().get_node_id()[:12], hostname=socket.gethostname(),
                          device=str(device), accelerator_ids=assigned_accelerators(), world_size=trial.workers)
    # Each row accounts for the slot time since the previous row's report was made (the first,
    # since run_trial began), so a trial's rows add up to its time in the slot.
    fetch_seconds, setup_seconds = start.fetch_seconds, time.time() - start.started_at - start.fetch_seconds
    report_seconds = 0.0  # the previous epoch's tune.report: its cost is known only once it returns
    run_first_epoch = run.epoch + 1
    for record in train_and_evaluate(run):
        # every checkpoint_every epochs, and the last: a resume and best.yaml's test score read it
        last = record.epoch >= trial.epochs or record.diverged
        keep = last or record.epoch % start.checkpoint_every == 0
        with tempfile.TemporaryDirectory() as folder:
            saving = time.time()
            if keep:
                save_checkpoint(folder, trial, run.input_shape, run.num_classes, run.state_dict())
            first = record.epoch == run_first_epoch
            phases = Phases(ready_at=start.ready_at if first else None,
                            started_at=start.started_at if first else None, fetch_seconds=fetch_seconds,
                            setup_seconds=setup_seconds, report_seconds=report_seconds,
                            checkpoint_seconds=time.time() - saving)
            reporting = time.time()
            # any report may be the trial's last (a scheduler stops trials early); the next
            # trial on this actor counts its start from here, so no time falls between trials
            _last_end = reporting
            # from_directory builds its own class; Ray annotates the result as ray.train's Checkpoint
            report(epoch_report(record, placement, device, phases),
                   checkpoint=cast(tune.Checkpoint, tune.Checkpoint.from_directory(folder)) if keep else None)
            report_seconds = time.time() - reporting
            fetch_seconds = setup_seconds = 0.0  # once per trial, on its first row


# ---- a trial of several workers (resources.workers; trainable/distributed.py) ------------------

class Workers:
    """A trial's other workers (ranks 1..N-1) as Ray actors in the trial's placement group, one per bundle
    (this trial's actor, rank 0, holds bundle 0), joined with rank 0 in one process group.

    Entered: the workers started, given the state to continue from, and the group joined; the World of rank 0
    comes back. Left: the group left and the workers ended, whatever happened (a stop by Tune, an error); a
    worker's error is raised as the trial's. A killed trial actor takes its workers with it (Ray ends the
    actors a process owns when it dies), and Tune's restart starts new ones from the last checkpoint.
    One worker: nothing is started, no process group (SINGLE), as a trial always ran.
    """

    def __init__(self, workers: int, config: dict[str, Any], state: Any, device: torch.device,
                 start: TrialStart, run: Callable[..., None] | None = None):
        """`run(config, data, state, world, device)`: what each other worker runs once it joined the group: the
        canonical loop (loop_rank, the default), or a function trainable's (trainable/function.py run_rank)."""
        self.workers, self.config, self.state, self.device, self.start = workers, config, state, device, start
        self.run = run or loop_rank
        self.actors: list[Any] = []
        self.running: list[ray.ObjectRef] = []

    def __enter__(self):
        from trainable.distributed import LOOPBACK, SINGLE, World, join, rendezvous_socket

        if self.workers == 1:
            return SINGLE
        group = ray.util.get_current_placement_group()
        if group is None or len(group.bundle_specs) < self.workers:
            raise RuntimeError(f"workers: this trial has {self.workers} workers but its actor holds "
                               f"{0 if group is None else len(group.bundle_specs)} placement group bundle(s); "
                               "run it through the search (python -m search), which reserves one per worker")
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # every worker on this node (a laptop's search): the group's sockets on the loopback address only
        local = set(ray.util.placement_group_table(group)["bundles_to_node_id"].values()) == {
            ray.get_runtime_context().get_node_id()}
        address = LOOPBACK if local else ray.util.get_node_ip_address()
        listener = rendezvous_socket(address)  # bound now: the workers may connect before rank 0 joins
        port = listener.getsockname()[1]
        timeout = self.start.trial_timeout or 1800.0
        try:
            state = ray.put(self.state)
            for rank in range(1, self.workers):
                bundle = group.bundle_specs[rank]
                actor = RankWorker.options(
                    num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0), max_restarts=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=rank),
                ).remote()
                self.actors.append(actor)
                self.running.append(actor.run.remote(self.run, self.config, self.start.data, state, address, port,
                                                     rank, timeout))
            join(World(0, self.workers), address, port, self.device, timeout, listener)
        finally:
            listener.close()  # the group's store took it over (join detached it); if join was not reached, closed
        return World(0, self.workers)

    def __exit__(self, kind, error, trace) -> None:
        from trainable.distributed import leave

        if not self.actors:
            return
        try:
            if kind is None:  # rank 0 ended well: so do the others (their error is the trial's) or they are moot
                done, left = ray.wait(self.running, num_returns=len(self.running), timeout=60)
                ray.get(done)
                if left:  # a function whose ranks disagree on when to stop: rank 0 made every report
                    print(f"hpsearch: {len(left)} worker(s) still ran a minute after rank 0 ended; ended them",
                          file=sys.stderr, flush=True)
            elif isinstance(error, Exception):  # a lost peer shows in rank 0 as a gloo error: say the worker's own
                done, _ = ray.wait(self.running, num_returns=len(self.running), timeout=5)
                for finished in done:
                    ray.get(finished)
        finally:
            for actor in self.actors:
                ray.kill(actor)
            leave()


@ray.remote
class RankWorker:
    """One worker of a trial besides rank 0: the canonical loop on its share of each batch, reporting nothing."""

    def run(self, what: Callable[..., None], config: dict[str, Any], data: Data, state: Any, address: str,
            port: int, rank: int, timeout: float) -> None:
        from trainable.distributed import World, join, leave

        device = trial_device()
        world = World(rank, int(config["workers"]))
        join(world, address, port, device, timeout)
        try:
            what(config, data, state, world, device)
        finally:
            leave()  # closes this worker's connections: rank 0 gets an error at once, not a hang


def loop_rank(config: dict[str, Any], data: Data, state: Any, world: Any, device: torch.device) -> None:
    """The canonical loop on a worker of rank > 0: its share of each batch, reporting nothing."""
    from trainable.loop import build_run, train_and_evaluate

    trial = TrialConfig.from_mapping(config)
    run = build_run(trial, data, device, world)
    if state is not None:  # the checkpoint rank 0 read: every worker continues from it
        run.load_state_dict(state)
    for _ in train_and_evaluate(run):
        pass
