"""Every use of Ray's and Tune's private parts, in one place, each with why and what pins it.

Ray 2.60 has no public way to do these; each is pinned by a test (tests/units/execution/test_ray_internals.py) that
fails when Ray changes what it relies on, so an upgrade says where to look instead of misbehaving.

- `quick_stop`: after a Ctrl-C or SIGTERM, Tune saves its state and then waits up to ~15 s for
  running trials to finish their epoch; hpsearch ends fit() right after the save. Tune says both
  steps only in its log (`ray.tune.tune`'s INFO lines, STOP and SAVED below): a public knob,
  TUNE_FORCE_TRIAL_CLEANUP_S, force-kills the trials, but only after that same wait starts and
  not below 1 s, and a callback hears of neither the stop nor the save.
- `autoscaler_status`: whether an autoscaler runs. No public API says it; `ray status` reads the
  GCS key-value record DEBUG_AUTOSCALING_STATUS (autoscaler v1) and the v2 SDK's cluster status.
- `record_file`: the open result.json of a trial in Tune's JSON logger (JsonLoggerCallback._trial_files),
  which search/execution/tuner.py's KeepingJsonLogger writes each report to with json's C encoder: Tune
  writes it with `json.dump` to the file, json's pure-Python encoder, the biggest cost of a report among
  Tune's loggers (docs/performance.md). No public way reaches the handle Tune's logger opened, reopened
  and closed as a trial starts again and ends.
- `event_writers`: the SummaryWriter per trial of Tune's TensorBoard logger (TBXLoggerCallback._trial_writer),
  which search/execution/tuner.py's EventFiles wraps so that a report's scalars go as one event, not one
  each (docs/performance.md). Tune's logger makes each writer as a trial starts; no public way reaches it.
- `no_retry_of_contract_errors`: Tune restarts a failed trial while `trial.should_recover()` holds, that is
  `num_failures <= trial.max_failures`, asked right after the failure is counted and its pickled error
  written; neither FailureConfig nor a callback can say "not this error" (callbacks hear of the failure
  only after the restart is scheduled). The trial's `max_failures` (a plain attribute that Tune reads
  nowhere else but to copy it) becomes an int that answers that comparison as `max_failures` does, unless
  the failure just written is a function's contract error (trainable/function.py ContractError), which is
  the same on every try: then the trial ends ERROR at once.
- `restart_a_trial_whose_reused_actor_died`: Tune keeps the actor of an ended or paused trial to run the
  next trial (reuse_actors, search/execution/tuner.py), and hands it over with a `reset` task while that
  trial is still PENDING. When the kept actor is dead (its node was lost, its process killed), the reset
  fails, and Tune's `_process_trial_failure` ends a PENDING trial ERROR without asking `should_recover()`:
  a worker lost mid-search ended such a trial ERROR with its restarts unused (tests/searches/test_chaos.py). An
  actor that dies while it starts is Tune's own case of this (`_actor_failed`): it marks the trial
  RUNNING first, so the failure is counted and the trial restarts under max_failures. TuneController's
  `_trial_task_failure` now does the same for a failed reset (and ends the reset); the trial's staged
  resources are left as they are, for its next actor's start to take. No public API reaches
  Tune's handling of a task's failure; a callback hears of the ERROR only after it is decided.
- `quick_hand_over`: Tune hands an idle actor (reuse_actors) its next trial in three actor calls, each
  waiting for the one before: in `_maybe_reuse_cached_actor` it asks the actor for the *last* trial's
  metrics (`Trial.set_ray_actor` sends `get_auto_filled_metrics`, and asks again once the reset is in, so
  the first answer is never used), then sends `reset`, and only when the reset's answer is back and the
  trial's start callbacks have run, a `train` call, which starts the trial's function (a function
  trainable's thread starts at its first `train`). On a short-trial ASHA search that chain was most of the
  ~20 ms in which a slot sat empty between two trials (bench/short_trials.py, issue 49; docs/performance.md).
  Now a trial that Tune will not restore from a checkpoint gets one `execute` task that resets the actor and
  starts the function (trainable/adapter.py `reset_and_start`: what the first `train` call would do), and the
  metrics are asked once, after the reset; Tune's `train` call then takes the first report as before. A trial
  with a checkpoint keeps Tune's reset, restore, train, and so does a class trainable (it has no `execute`, and
  its `train` starts nothing). No public API reaches a reused actor's hand-over.
- `batched_results`: Tune asks a trial's actor for one report a call (`train`), and a function trainable's
  thread waits in its `report` until the next call: about 5 ms an epoch on two busy cores (issue 49's fifo
  shape; docs/performance.md). Tune's own batching, `TUNE_RESULT_BUFFER_LENGTH` (`Trainable.train_buffered`,
  which its controller's `_on_training_result` takes as a list), does nothing in Ray 2.60: the controller
  passes its arguments in the wrong order (`(buffer_length, buffer_time_s)` to `train_buffered(buffer_time_s,
  max_buffer_length)`, so a batch is full at its first report). Nor would it do what a search needs: an error
  raised after some reports of a batch loses them all, and a checkpoint after the first report of a batch has
  its save raced by the next `train` (having handled a batch, Tune goes on with its first report's answer;
  tests/searches/test_scale.py lost a trial's last checkpoint so). A trial whose scheduler carries
  `result_batch` (search/searching/fifo.py, `(seconds, most)`) now gets an `execute` task of
  trainable/adapter.py `train_batch` in place of each `train`: the reports of the next `seconds`, in order, a
  report with a checkpoint alone, all returned before a later call raises the trial's error. Environment
  variables would also reach Tune's other schedulers and every search of the process; no public API batches.
- `park_requeued_trial`: Tune starts every PENDING trial it has resources for, whatever the scheduler's
  `choose_trial_to_run` says; only a PAUSED trial waits to be chosen. A reproducible halving scheduler
  (search/searching/halving.py) must keep a trial that Tune requeued after an error (or a resume brought back)
  while it was held or paused at a rung from running on before the rung is decided: restored from the rung's
  checkpoint, its next report is past the rung. Tune calls the scheduler's `on_trial_add` last in
  `_requeue_trial`, the trial PENDING without an actor; the scheduler then sets it PAUSED with the controller's
  `_set_trial_status` (which keeps Tune's sets of trials by status), as a trial paused at the rung is. A public
  `pause_trial` ignores a trial without an actor.
- `keep_idle_actors`: Tune keeps at most one idle actor (reuse_actors) unless a staged trial waits for one:
  its TuneController makes its actor cache as `_ObjectCache(may_keep_one=True)`, a module global there, and
  no knob sets it. When two slots come free while the searcher has nothing to run yet (a trial paused at a
  reproducible rung, a reproducible trial waiting for an earlier result), Tune stops the second actor; the
  next trial then waits for a new one (seconds of imports), takes the first that comes free instead, and
  the search goes on one trial at a time (issue 49: ASHA's short trials). The cache made here keeps every
  idle actor while no trial of other resources is staged: never more than the search ran at once, since
  each was a running trial's; Tune still stops them all when the searcher is done.
- `continue_held_trial`: a reproducible halving scheduler holds a trial at a rung while the trials it waits
  for run (search/searching/halving.py): it answers NOOP, which Tune's controller executes as nothing, so
  the trial keeps its actor with no training task. Once they arrive it goes on: Tune's controller then
  schedules its next `train` task as it does for CONTINUE (`_schedule_trial_train`). The controller reaches
  a scheduler wrapped (TrialRunnerWrapper, its `_tune_controller`), whose public names pause and stop a
  trial but never start its training again. A report that carries a checkpoint makes Tune save it (a `save`
  task after the report) and keep the scheduler's answer until that save is in (`_cached_trial_decisions`);
  a trial released while its NOOP is kept there gets CONTINUE in its place, which Tune executes after the
  save. Started at once instead, its next report could come back before the save, and Tune keeps the first
  answer it kept (NOOP) over a later CONTINUE: that report's CONTINUE was lost and the trial sat RUNNING
  with no task while the controller spun (tests/searches/test_model_based.py's MO-ASHA search hung so; the
  figures are in docs/testing.md).
- `silent_raylet_errors`: Ray's error thread on the driver prints what the raylet publishes ("(raylet) A
  worker died or was killed ...") straight to the terminal with `print_worker_logs`, past any logger and
  whatever log_to_driver says; its one switch is the module flag `_worker_logs_enabled` (Ray's debugger
  turns it off the same way). A trial whose worker died ends ERROR, and hpsearch says so in its own line.
- `light_callback_census`: Tune's `run` counts the callbacks a search passes for Ray's usage statistics
  (`ray.air._internal.usage.tag_callbacks`, whether usage statistics are on or off), and to know the built-in
  ones by class it imports every logger integration Ray has: with mlflow installed (the test extra, or a
  user's environment) that is mlflow, imported at every search's start for a tag. The census made here
  records the same tag from the class names alone; Tune calls it through the module, so replacing the
  function is enough. No knob skips the imports.
- `remembered_trainables`: Tune looks a trial's trainable up in its registry, Ray's GCS key-value store, about
  three times a trial (`validate_trainable` in `Trial.__init__`; `get_trainable_cls`, a `contains` and a `get`,
  for its resources and its actor), each a round trip to the GCS: 64 reads, 53 ms, in a search of 20 short
  trials, most of them in the ~23 ms in which a slot sits empty between two trials (bench/short_trials.py,
  issue 49; docs/performance.md). The registry of this process now keeps what it read of the trainable
  category, and the class it unpickled from it (0.4 ms a trial made), and forgets both whenever this process
  registers, flushes or unregisters a value (Tune registers a search's trainable as the search starts): a key
  is the job's own (its prefix is the job id), so only this process writes it. No knob caches the lookups.
- `lean_local_ray`: `ray.init` of a local instance starts a log monitor, which reads every worker's log files
  ten times a second to send them to a driver that subscribes (log_to_driver; hpsearch does not, nor does its
  quiet mode want them), and an autoscaler monitor, which for a cluster without an autoscaling config only
  reports that nothing scales it (search/execution/capacity.py asks it only of a cluster the search joined, not
  of the local Ray it started). Two Python processes a start, each importing Ray, and the log monitor's polling
  for as long as Ray runs. `ray start` has flags for both (RayParams' include_log_monitor, no_monitor);
  `ray.init` passes neither, so the node it starts is given them. Nor does it prestart workers for its driver
  (Ray's `prestart_worker_first_driver`, a system config): Ray starts one idle worker per CPU when the driver
  registers, each importing Ray (about 0.4 CPU-s), and no trial can use one, since Tune gives every trial's
  actor a runtime_env (`PL_DISABLE_FORK`, tune/execution/class_cache.py) that a prestarted worker lacks; a Ray
  task the search runs (the GPU probe) starts its worker when it is asked for. Nor an API server: with
  include_dashboard=False `ray.init` still starts the dashboard's process in its minimal mode (Ray's job
  submission and state API over HTTP, ~0.8 CPU-s and about a second before `ray.init` returns), which nothing
  asks of a Ray that one search started for itself; `Node.start_api_server` is skipped for that node, which
  Ray then leaves as it leaves a node whose API server failed to start (no web UI URL).
- `token_refusal`: a cluster made with `ray start --head` (Ray 2.60) turns away a client without its token,
  and `ray.init` retries that refusal for about 20 s (its node's connection loop, `Node.get_gcs_client`, takes
  any error for a GCS not up yet, InvalidAuthToken too) and then raises a ConnectionError that does not say
  why. One `ray._raylet.GcsClient`, the client that loop makes, raises Ray's AuthenticationError in a fraction
  of a second. No public API asks a cluster whether it admits this client. Pinned by
  tests/units/execution/test_session.py (a `ray start --head` cluster refuses a client without the token).
- The logger names the quiet mode filters (search/execution/session.py's `quiet`) are Ray's
  module paths, `ray._private.worker` among them: a renamed module only makes a hint visible again.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import threading
from contextlib import contextmanager
from typing import Any, TextIO

import ray
from ray.exceptions import AuthenticationError


class _QuickStop(logging.Filter):
    """Ends Tune's fit() right after its last save once a Ctrl-C or SIGTERM has stopped the search.

    After the stop Tune saves its state, then waits up to ~15 s for running trials to finish
    the epoch they are in (their actors take no stop request mid-step), although the save is
    what a resume continues from and those epochs are thrown away. Tune says each step in its
    log, on the main thread; this filter reads the two lines and raises KeyboardInterrupt after
    the save, as a second Ctrl-C would, so SIGTERM (`timeout`, a batch system) is done in
    seconds. Without the lines (another Ray) the stop only waits, as before.
    """

    STOP = "Stop signal received"
    SAVED = "Wrote the latest version of all result files and experiment state"

    def __init__(self, floor: int):
        super().__init__()
        self.stopping = self.cut = False
        self.floor = floor  # records below the logger's own level are read here, not shown

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(self.STOP):
            self.stopping = True
        elif self.stopping and not self.cut and message.startswith(self.SAVED) \
                and threading.current_thread() is threading.main_thread():
            self.cut = True
            raise KeyboardInterrupt
        return record.levelno >= self.floor


@contextmanager
def quick_stop():
    """While fit() runs: a stopped search ends after Tune's last save (yields the filter; `.cut` says it did)."""
    logger = logging.getLogger("ray.tune.tune")
    cut = _QuickStop(floor=logger.getEffectiveLevel())
    logger.addFilter(cut)
    level = logger.level
    logger.setLevel(logging.INFO)  # the save's line (INFO) must reach the filter, even when quiet
    try:
        yield cut
    finally:
        logger.removeFilter(cut)
        logger.setLevel(level)


class _Retries(int):
    """A trial's max_failures that refuses a restart after a contract error (see the module docstring).

    Python asks the right operand's reflected comparison first when its type subclasses the left's, so
    Tune's `num_failures <= max_failures` and `max_failures < 0` both come here."""

    trial: Any

    def __new__(cls, value: int, trial: Any):
        retries = super().__new__(cls, value)
        retries.trial = trial
        return retries

    def __reduce__(self):  # Tune's records keep the number only
        return int, (int(self),)

    def __ge__(self, failures: object) -> bool:  # num_failures <= max_failures
        return not last_failure_is_contract_error(self.trial) and int(self) >= failures  # type: ignore[operator]

    def __lt__(self, other: object) -> bool:  # max_failures < 0: unlimited restarts
        return not last_failure_is_contract_error(self.trial) and int(self) < other  # type: ignore[operator]


def last_failure_is_contract_error(trial: Any) -> bool:
    """Whether the error Tune has just written for `trial` is a function's ContractError."""
    from trainable.function import ContractError

    path = getattr(trial, "pickled_error_file", None)
    if not path or not os.path.exists(path):
        return False
    try:
        with open(path, "rb") as f:
            error = pickle.load(f)  # cloudpickle writes it; plain pickle reads it back
    except Exception:  # unreadable: a failure like any other, restarted as Tune would
        return False
    return isinstance(getattr(error, "cause", error), ContractError)


def no_retry_of_contract_errors(trial: Any) -> None:
    """Make Tune end `trial` ERROR without a restart when it fails with a contract error (idempotent)."""
    if not isinstance(trial.max_failures, _Retries):
        trial.max_failures = _Retries(trial.max_failures, trial)


def restart_a_trial_whose_reused_actor_died() -> None:
    """Make Tune restart a trial, under max_failures, whose reused actor failed its reset (idempotent; see the
    module docstring)."""
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    handle = TuneController._trial_task_failure
    if getattr(handle, "restarts_failed_resets", False):
        return

    def _trial_task_failure(self, trial, exception):
        if trial.status == Trial.PENDING and trial in self._resetting_trials:
            self._resetting_trials.discard(trial)
            self._set_trial_status(trial, Trial.RUNNING)  # as Tune's _actor_failed does for an actor's start
        return handle(self, trial, exception)

    _trial_task_failure.restarts_failed_resets = True  # type: ignore[attr-defined]
    TuneController._trial_task_failure = _trial_task_failure  # type: ignore[method-assign]


def continue_held_trial(scheduler_view: Any, trial: Any) -> None:
    """Start the next training step of `trial`, held by its scheduler's NOOP (see the module docstring).
    `scheduler_view`: what Tune hands a scheduler (its controller, wrapped), or a controller itself."""
    from ray.tune.schedulers import TrialScheduler

    controller = _controller(scheduler_view)
    if trial.is_saving:  # its NOOP waits for the save of its last report: CONTINUE waits there instead
        kept = controller._cached_trial_decisions
        if kept.get(trial.trial_id) in (None, TrialScheduler.NOOP):
            kept[trial.trial_id] = TrialScheduler.CONTINUE
        return
    controller._schedule_trial_train(trial)


def _function_actor(trial: Any) -> bool:
    """Whether the trial's actor runs a function trainable: its `execute` runs what quick_hand_over and
    batched_results send (a class trainable has none, and its `train` starts nothing)."""
    return hasattr(trial.temporary_state.ray_actor, "execute")


def quick_hand_over() -> None:
    """Make Tune hand a reused actor its next trial in one task that also starts the trial's function, without
    asking the actor first for the last trial's metrics (idempotent; see the module docstring)."""
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    schedule, reuse, set_actor = (TuneController._schedule_trial_task, TuneController._maybe_reuse_cached_actor,
                                  Trial.set_ray_actor)
    if getattr(schedule, "hands_over_quickly", False):
        return
    from trainable.adapter import reset_and_start

    @functools.wraps(schedule)
    def _schedule_trial_task(self, trial, method_name, args=None, kwargs=None, *rest, **options):
        if method_name == "reset" and not trial.latest_checkpoint_result and _function_actor(trial):
            config, = args
            method_name, args, kwargs = "execute", (functools.partial(reset_and_start, config=config, **(kwargs or {})),), {}
        return schedule(self, trial, method_name, args, kwargs, *rest, **options)

    handing_over = threading.local()

    @functools.wraps(reuse)
    def _maybe_reuse_cached_actor(self, trial):
        handing_over.now = True
        try:
            return reuse(self, trial)
        finally:
            handing_over.now = False

    @functools.wraps(set_actor)
    def set_ray_actor(self, ray_actor):
        if ray_actor is not None and getattr(handing_over, "now", False):
            self.temporary_state.ray_actor = ray_actor  # its metrics are asked once the reset is in
            return
        set_actor(self, ray_actor)

    _schedule_trial_task.hands_over_quickly = True  # type: ignore[attr-defined]
    TuneController._schedule_trial_task = _schedule_trial_task  # type: ignore[method-assign]
    TuneController._maybe_reuse_cached_actor = _maybe_reuse_cached_actor  # type: ignore[method-assign]
    Trial.set_ray_actor = set_ray_actor  # type: ignore[method-assign]


def batched_results() -> None:
    """Make Tune ask a trial for its reports in batches where its scheduler says so (idempotent; see the module
    docstring)."""
    from ray.tune.execution.tune_controller import TuneController

    schedule = TuneController._schedule_trial_train
    if getattr(schedule, "batches", False):
        return
    from trainable.adapter import train_batch

    @functools.wraps(schedule)
    def _schedule_trial_train(self, trial):
        batch = getattr(self._scheduler_alg, "result_batch", None)
        if batch is None or not _function_actor(trial):
            return schedule(self, trial)
        seconds, most = batch
        self._schedule_trial_task(trial=trial, method_name="execute",
                                  args=(functools.partial(train_batch, seconds=seconds, most=most),),
                                  on_result=self._on_training_result, on_error=self._trial_task_failure)

    _schedule_trial_train.batches = True  # type: ignore[attr-defined]
    TuneController._schedule_trial_train = _schedule_trial_train  # type: ignore[method-assign]


def park_requeued_trial(scheduler_view: Any, trial: Any) -> None:
    """Make a trial that Tune has just requeued (PENDING, no actor) PAUSED, so that it starts only when its
    scheduler chooses it (see the module docstring). `scheduler_view`: what Tune hands a scheduler."""
    from ray.tune.experiment import Trial

    _controller(scheduler_view)._set_trial_status(trial, Trial.PAUSED)


def _controller(scheduler_view: Any) -> Any:
    """Tune's controller behind what it hands a scheduler (TrialRunnerWrapper), or a controller itself."""
    return getattr(scheduler_view, "_tune_controller", scheduler_view)


def keep_idle_actors() -> None:
    """Make Tune keep every idle actor of a search's trials for the next ones, not one (idempotent; see the
    module docstring)."""
    from ray.tune.execution import tune_controller
    from ray.tune.utils.object_cache import _ObjectCache

    if tune_controller._ObjectCache is not _ObjectCache:
        return

    class _KeepIdle(_ObjectCache):
        """Tune's cache of idle actors by resources, keeping them all while no trial of other resources waits."""

        def _others_wanted(self, key) -> bool:
            return any(wanted > len(self._cached_objects[k]) for k, wanted in self._max_num_objects.items() if k != key)

        def cache_object(self, key, obj) -> bool:
            if not self._max_num_objects[key] > len(self._cached_objects[key]) and self._others_wanted(key):
                return super().cache_object(key, obj)  # Tune's rule: another shape needs the resources
            self._cached_objects[key].append(obj)
            self._num_cached_objects += 1
            return True

        def flush_cached_objects(self, force_all: bool = False):
            if force_all or any(self._others_wanted(key) for key, objs in self._cached_objects.items() if objs):
                yield from super().flush_cached_objects(force_all=force_all)

    tune_controller._ObjectCache = _KeepIdle  # type: ignore[misc]


def remembered_trainables() -> None:
    """Make Tune's registry keep the trainables it read from the GCS until this process writes the registry
    again (idempotent; see the module docstring)."""
    from ray.tune import registry

    if getattr(registry._Registry, "remembers", False):
        return
    read: dict[tuple[str, str, str], bytes | None] = {}
    loaded: dict[tuple[str, str, str], Any] = {}

    def _get(self, category: str, key: str) -> bytes | None:
        """The stored value of a trainable (None: not registered), read from the GCS once."""
        where = (self.prefix, category, key)
        if where not in read:
            read[where] = registry._internal_kv_get(registry._make_key(self.prefix, category, key))
        return read[where]

    contains, get = registry._Registry.contains, registry._Registry.get

    @functools.wraps(contains)  # __wrapped__: Tune's own, which the pinning test reads
    def remembered_contains(self, category, key):
        if category != registry.TRAINABLE_CLASS or not registry._internal_kv_initialized():
            return contains(self, category, key)
        return _get(self, category, key) is not None

    @functools.wraps(get)
    def remembered_get(self, category, key):
        if category != registry.TRAINABLE_CLASS or not registry._internal_kv_initialized():
            return get(self, category, key)
        value = _get(self, category, key)
        if value is None:
            return get(self, category, key)  # Tune's own error
        where = (self.prefix, category, key)
        if where not in loaded:  # unpickled once too, not for each trial made (docs/performance.md)
            loaded[where] = registry.pickle.loads(value)
        return loaded[where]

    def forgetting(write):
        def written(self, *args, **kwargs):
            read.clear()
            loaded.clear()
            return write(self, *args, **kwargs)
        return written

    registry._Registry.contains = remembered_contains  # type: ignore[method-assign]
    registry._Registry.get = remembered_get  # type: ignore[method-assign]
    # register too, not only the writes: without a Ray it only keeps the value, and ray.init's hook then writes it
    # with Tune's own flush_values (bound before this patch), which would not forget a value read from an earlier Ray
    for name in ("register", "flush_values", "unregister"):
        setattr(registry._Registry, name, forgetting(getattr(registry._Registry, name)))
    registry._Registry.remembers = True  # type: ignore[attr-defined]


def light_callback_census() -> None:
    """Make Tune's usage census of a search's callbacks count them by class name, importing no logger
    integration (idempotent; see the module docstring)."""
    from ray.air._internal import usage

    if getattr(usage.tag_callbacks, "by_name", False):
        return

    def counts(callbacks) -> dict[str, int]:
        """usage._count_callbacks's counts, with the integrations' classes known by name."""
        from ray.tune import Callback
        from ray.tune.logger import LoggerCallback
        from ray.tune.utils.callback import DEFAULT_CALLBACK_CLASSES

        names = {"WandbLoggerCallback", "MLflowLoggerCallback", "CometLoggerCallback", "AimLoggerCallback",
                 *(cls.__name__ for cls in DEFAULT_CALLBACK_CLASSES)}
        found: dict[str, int] = {}
        for callback in callbacks or []:
            if not isinstance(callback, Callback):
                continue
            name = type(callback).__name__
            key = name if name in names else "CustomLoggerCallback" if isinstance(callback, LoggerCallback) \
                else "CustomCallback"
            found[key] = found.get(key, 0) + 1
        return found

    def tag_callbacks(callbacks) -> bool:
        found = counts(callbacks) if callbacks else {}
        if found:
            usage.record_extra_usage_tag(usage.TagKey.AIR_CALLBACKS, json.dumps(found))
        return bool(callbacks)

    tag_callbacks.by_name = True  # type: ignore[attr-defined]
    tag_callbacks.counts = counts  # type: ignore[attr-defined]  # for the test against Ray's own count
    usage.tag_callbacks = tag_callbacks


@contextmanager
def lean_local_ray(autoscaler_monitor: bool = False):
    """A local Ray that `ray.init` starts within this block runs no log monitor, no API server and no autoscaler
    monitor unless `autoscaler_monitor` (a Ray that is not the search's own, whose capacity is read from it), and
    prestarts no worker for its driver (the module docstring says why each)."""
    import ray._private.node as node

    start, serve = node.Node.__init__, node.Node.start_api_server

    def lean(self, ray_params, *args, **kwargs):
        if kwargs.get("head") and kwargs.get("ray_init_cluster"):  # ray.init's own node, not a joined one
            ray_params.include_log_monitor = False
            ray_params.no_monitor = not autoscaler_monitor
            # the module docstring: workers prestarted for this driver that no trial can use
            ray_params._system_config = {**(ray_params._system_config or {}), "prestart_worker_first_driver": False}
            self._hpsearch_lean = True  # read by no_api_server, which the constructor calls
        start(self, ray_params, *args, **kwargs)

    def no_api_server(self, *, include_dashboard, raise_on_failure):
        if getattr(self, "_hpsearch_lean", False) and not include_dashboard:
            self._webui_url = None  # as Ray leaves it where the API server fails to start
            return
        serve(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)

    node.Node.__init__ = lean  # type: ignore[method-assign]
    node.Node.start_api_server = no_api_server  # type: ignore[method-assign]
    try:
        yield
    finally:
        node.Node.__init__ = start  # type: ignore[method-assign]
        node.Node.start_api_server = serve  # type: ignore[method-assign]


def silent_raylet_errors() -> None:
    """The raylet's error lines ("A worker died ...") are not printed on this driver (quiet mode)."""
    import ray._private.worker as worker

    worker._worker_logs_enabled = False


def record_file(logger, trial) -> TextIO | None:
    """The result.json Tune's JSON logger `logger` has open for `trial` (None if none is open)."""
    return logger._trial_files.get(trial)


def event_writers(logger) -> dict:
    """Trial -> the tensorboardX SummaryWriter that Tune's TensorBoard logger `logger` writes its event file with."""
    return logger._trial_writer


def autoscaler_status() -> tuple[set[str] | None, str | None]:
    """The node types the cluster's autoscaler reports, and the version an autoscaler v2 reports.

    The one place hpsearch reads Ray's private state, on purpose: Ray 2.60 has no public API that
    says whether an autoscaler runs. ray.autoscaler.sdk launches clusters and requests resources;
    ray.nodes(), ray.cluster_resources() and ray.util.state list what runs now, not what may be
    added; `ray status` itself reads these two records. Autoscaler v1 (`ray up`, KubeRay's
    autoscaler container, the fake provider) writes its report under DEBUG_AUTOSCALING_STATUS in
    the GCS's key-value store; v2 answers get_cluster_status. HPSEARCH_AUTOSCALER is the public
    way around both. Types are None where the v1 record could not be read (an older GCS, a client
    without access): no evidence either way, which has_autoscaler does not take for "none".
    """
    types: set[str] | None = None
    try:
        # Ray's private modules: imported in the try, so a Ray that moved them gives "unknown", not a crash
        from ray._private import ray_constants
        from ray.experimental import internal_kv

        status = internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        report = (json.loads(status) if status else {}).get("autoscaler_report") or {}
        types = {*(report.get("active_nodes") or {}), *(report.get("idle_nodes") or {}),
                 *(report.get("pending_launches") or {})}
    except Exception:  # Ray's private record moved or is out of reach: unknown, not "none"
        types = None
    try:
        from ray.autoscaler.v2.sdk import get_cluster_status  # in the try: an older Ray lacks autoscaler v2

        version = get_cluster_status(ray.get_runtime_context().gcs_address).stats.autoscaler_version
    except Exception:
        version = None
    return types, version


def token_refusal(address: str, timeout_s: float = 5.0) -> str | None:
    """Ray's reason where the GCS at `address` (host:port) refuses this client for its token, else None.

    Anything else (the GCS admits the client, another error, no answer within `timeout_s`) is None and left to
    ray.init, as before. The client is made on a daemon thread: at an address that accepts connections and
    answers nothing it blocks for about 40 s in Ray's C++ (the GIL released), past the bound."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # a compiled module without stubs

    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():  # ray://, "auto", "local": Ray's to resolve
        return None
    refused: list[str] = []

    def probe() -> None:
        try:
            GcsClient(address=address)
        except AuthenticationError as error:  # Ray's first sentence names it: "RPC error: InvalidAuthToken: ..."
            refused.append(str(error).split(". ", 1)[0])
        except Exception:  # noqa: BLE001  (any other failure is ray.init's to report)
            pass

    thread = threading.Thread(target=probe, name="hpsearch-token-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return refused[0] if refused else None
