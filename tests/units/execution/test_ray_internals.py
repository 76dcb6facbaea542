"""What search/execution/ray_internals.py (and the quiet mode's logger filters) rely on in Ray, pinned:
each test fails when a Ray upgrade moves it, naming what to look at. No Ray is started."""

from __future__ import annotations

import importlib
import inspect
import os
import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

from search.execution import ray_internals
from tests.conftest import REPO


def test_tune_still_logs_the_stop_and_the_save_that_the_quick_stop_reads():
    import ray.tune.tune as tune_module

    source = inspect.getsource(tune_module)
    assert ray_internals._QuickStop.STOP in source, "Tune's stop line moved: the quick stop would only wait"
    assert ray_internals._QuickStop.SAVED in source, "Tune's save line moved: the quick stop would only wait"
    assert tune_module.logger.name == "ray.tune.tune", "the quick stop's filter sits on this logger"


def test_the_quick_stop_cuts_after_the_save_and_only_then():
    with ray_internals.quick_stop() as cut:
        logger = logging.getLogger("ray.tune.tune")
        logger.info("Wrote the latest version of all result files and experiment state to x")  # no stop yet
        assert not cut.cut
        logger.info(ray_internals._QuickStop.STOP + " (e.g. via SIGINT/Ctrl+C), ending Ray Tune run.")
        with pytest.raises(KeyboardInterrupt):
            logger.info(ray_internals._QuickStop.SAVED + " to /tmp/x")
        assert cut.cut and cut.stopping


def test_the_autoscaler_records_are_still_where_ray_status_reads_them():
    from ray._private import ray_constants
    from ray.autoscaler.v2.sdk import get_cluster_status  # noqa: F401
    from ray.experimental import internal_kv

    assert isinstance(ray_constants.DEBUG_AUTOSCALING_STATUS, str)
    assert callable(internal_kv._internal_kv_get)


def test_autoscaler_records_that_do_not_read_are_no_evidence_of_none(ray_local, monkeypatch, capsys):
    """A failure to read Ray's records (moved in an upgrade, no access) must not refuse a search that an
    autoscaler could serve: has_autoscaler says it cannot tell, and assumes one may add nodes."""
    from search.execution import capacity

    monkeypatch.delenv(capacity.AUTOSCALER_SETTING, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")  # no ~/ray_bootstrap_config.yaml
    assert capacity.has_autoscaler() is False, "the local Ray's records read: none"
    monkeypatch.setattr(capacity, "autoscaler_status", lambda: (None, None))  # what an unreadable record returns
    assert capacity.has_autoscaler() is True
    assert "cannot tell whether an autoscaler" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["ray._private.worker", "ray.tune.analysis.experiment_analysis", "ray.tune.logger.logger",
                                  "ray.tune.utils.util", "ray.tune.execution.tune_controller",
                                  "ray._private.authentication.authentication_token_setup"])
def test_the_loggers_quiet_filters_are_still_ray_modules(name):
    importlib.import_module(name)  # a renamed module would let its hint through again


def test_tunes_loggers_still_keep_a_trials_file_and_writer_where_ours_reach_them():
    """KeepingJsonLogger writes to the result.json Tune's JSON logger opened, EventFiles wraps the SummaryWriter
    of Tune's TensorBoard logger (search/execution/tuner.py): both are reached by the attribute that holds them."""
    from ray.tune.logger import JsonLoggerCallback, TBXLoggerCallback

    assert ray_internals.record_file(JsonLoggerCallback(), object()) is None, "JsonLoggerCallback._trial_files moved"
    assert ray_internals.event_writers(TBXLoggerCallback()) == {}, "TBXLoggerCallback._trial_writer moved"
    source = inspect.getsource(TBXLoggerCallback.log_trial_result)
    assert "self._trial_writer[trial].add_scalar(" in source and "self._trial_writer[trial].flush()" in source, \
        "Tune's TensorBoard logger no longer adds scalars and then flushes: EventFiles' one event per report"


def test_tune_still_asks_a_trials_max_failures_whether_to_restart_it(tmp_path):
    """no_retry_of_contract_errors hands Tune an int whose comparison reads the pickled error Tune has just
    written (tests/searches/test_function_trainable.py runs it end to end): it works only while should_recover compares
    num_failures with max_failures, after handle_error wrote the pickle."""
    import pickle

    from ray.exceptions import RayTaskError
    from ray.tune.experiment import Trial
    from ray.tune.execution.tune_controller import TuneController

    from trainable.function import ReportMisuse

    assert "num_failures <= self.max_failures or self.max_failures < 0" in inspect.getsource(Trial.should_recover)
    failure = inspect.getsource(TuneController._process_trial_failure)
    assert failure.index("trial.handle_error(exception)") < failure.index("trial.should_recover()")
    assert "pickled_error_file" in inspect.getsource(Trial.handle_error)

    class Failed:  # what the int reads of a trial: its pickled error, and the limit Tune set
        max_failures = 2
        pickled_error_file = str(tmp_path / "error.pkl")

    trial = Failed()
    ray_internals.no_retry_of_contract_errors(trial)
    assert 1 <= trial.max_failures and not trial.max_failures < 0, "no error written yet: Tune's own rule"
    crash = RayTaskError("train", "Traceback ...", RuntimeError("out of memory"))
    (tmp_path / "error.pkl").write_bytes(pickle.dumps(crash))
    assert 2 <= trial.max_failures and not 3 <= trial.max_failures, "a crash restarts as before"
    contract = RayTaskError("train", "Traceback ...", ReportMisuse("report(): got a positional float"))
    (tmp_path / "error.pkl").write_bytes(pickle.dumps(contract))
    assert not 1 <= trial.max_failures, "a contract error is not restarted"
    assert pickle.loads(pickle.dumps(trial.max_failures)) == 2, "Tune's records keep the plain number"


def test_the_quiet_mode_keeps_the_raylets_worker_died_line_off_the_terminal(capfd, monkeypatch):
    # Ray's error thread prints what the raylet publishes with print_to_stdstream, past any logger
    import ray._private.worker as worker

    from search.execution.session import quiet

    line = {"lines": ["A worker died or was killed while executing a task by an unexpected system error."],
            "pid": "raylet", "is_err": False}
    for name in ("RAY_AIR_NEW_OUTPUT", "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S",
                 "TUNE_PRINT_ALL_TRIAL_ERRORS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # quiet() sets them: back as they were after
    was = worker._worker_logs_enabled
    worker._worker_logs_enabled = True  # as a new process has it: another test file may have run quiet() here
    try:
        worker.print_to_stdstream(dict(line), ignore_prefix=False)
        assert "A worker died" in capfd.readouterr().out  # what a search printed before
        quiet()
        worker.print_to_stdstream(dict(line, lines=["A worker died again, elsewhere"]), ignore_prefix=False)
        assert "A worker died" not in capfd.readouterr().out
    finally:
        worker._worker_logs_enabled = was


def test_a_reused_actor_that_failed_its_reset_restarts_its_trial():
    """Tune ends a PENDING trial ERROR on a task's failure without asking should_recover(); a reused actor's
    reset fails while its trial is PENDING (ray_internals.restart_a_trial_whose_reused_actor_died)."""

    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    failure = inspect.getsource(TuneController._process_trial_failure)
    assert "trial.status == Trial.RUNNING and trial.should_recover()" in failure, "Tune's restart rule moved"
    reset = inspect.getsource(TuneController._schedule_trial_reset)
    assert "self._resetting_trials.add(trial)" in reset and "on_error=self._trial_task_failure" in reset
    assert "self._set_trial_status(trial, Trial.RUNNING)" in inspect.getsource(TuneController._actor_failed)

    ray_internals.restart_a_trial_whose_reused_actor_died()
    ray_internals.restart_a_trial_whose_reused_actor_died()  # twice: patched once
    seen = []
    class Fake(SimpleNamespace):
        __hash__ = object.__hash__  # a set holds it, as Tune's sets hold trials

    resetting, pending, running = (Fake(status=s) for s in (Trial.PENDING, Trial.PENDING, Trial.RUNNING))
    controller = SimpleNamespace(
        RAISE=TuneController.RAISE, _fail_fast=False, _print_trial_errors=False, _resetting_trials={resetting},
        _set_trial_status=lambda trial, status: setattr(trial, "status", status),
        _process_trial_failure=lambda trial, exception: seen.append(trial.status))
    for trial in (resetting, pending, running):
        TuneController._trial_task_failure(controller, trial, RuntimeError("actor died"))
    assert seen == [Trial.RUNNING, Trial.PENDING, Trial.RUNNING], "only the failed reset is marked RUNNING"
    assert controller._resetting_trials == set(), "its reset ended"


def test_idle_actors_of_a_search_are_all_kept_for_its_next_trials():
    """Tune kept one idle actor: two slots free at once while the searcher had nothing yet (a trial paused at
    a reproducible rung) lost the second, and the search went on one trial at a time (ray_internals.keep_idle_actors)."""
    from ray.tune.execution import tune_controller
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.utils.object_cache import _ObjectCache

    assert "self._actor_cache = _ObjectCache(may_keep_one=True)" in inspect.getsource(TuneController.__init__), \
        "Tune makes its actor cache elsewhere now: keep_idle_actors replaces a name Tune no longer reads"
    tunes = _ObjectCache(may_keep_one=True)
    assert [tunes.cache_object("1 cpu", a) for a in ("a", "b")] == [True, False], "Tune's own rule: one idle actor"

    ray_internals.keep_idle_actors()
    ray_internals.keep_idle_actors()  # twice: patched once
    assert tune_controller._ObjectCache.__mro__[1] is _ObjectCache
    cache = tune_controller._ObjectCache(may_keep_one=True)  # as TuneController makes it
    assert [cache.cache_object("1 cpu", a) for a in ("a", "b")] == [True, True], "both slots' actors kept"
    assert list(cache.flush_cached_objects()) == [] and cache.num_cached_objects == 2, "kept between steps"
    assert cache.pop_cached_object("1 cpu") == "a" and cache.num_cached_objects == 1

    cache.increase_max("1 gpu")  # a trial of other resources is staged: Tune's rule frees what it may need
    assert not cache.cache_object("1 cpu", "c"), "not kept while another shape waits for resources"
    assert list(cache.flush_cached_objects()) == ["b"]
    cache.decrease_max("1 gpu")
    cache.cache_object("1 cpu", "d")
    assert list(cache.flush_cached_objects(force_all=True)) == ["d"], "the search's end frees them all"


def test_tune_still_leaves_a_trial_held_by_noop_alone_and_trains_it_as_continue_does():
    """OrderedHalving holds a trial at a rung with NOOP and starts its next step with continue_held_trial."""
    from ray.tune.execution.tune_controller import TrialRunnerWrapper, TuneController

    action = inspect.getsource(TuneController._execute_action)
    assert "decision == TrialScheduler.CONTINUE:\n            self._schedule_trial_train(trial)" in action
    assert "elif decision == TrialScheduler.NOOP:\n            pass" in action, "NOOP no longer leaves the trial alone"
    assert "self._tune_controller = tune_controller" in inspect.getsource(TrialRunnerWrapper.__init__)

    trained = []
    controller = type("Controller", (), {"_schedule_trial_train": lambda self, trial: trained.append(trial)})()
    wrapper = TrialRunnerWrapper(controller, trial_executor=None)
    idle = [SimpleNamespace(is_saving=False, name=name) for name in ("trial", "other")]
    ray_internals.continue_held_trial(wrapper, idle[0])
    ray_internals.continue_held_trial(controller, idle[1])  # the simulator's controller, unwrapped
    assert trained == idle


def test_a_trial_released_while_tune_saves_its_held_report_trains_once_the_save_is_in(tmp_path, monkeypatch):
    """A report with a checkpoint makes Tune save it and keep the scheduler's NOOP until the save is in. Released
    then, the trial must not start at once: its next report could come back before that save, and Tune keeps the
    first answer it kept (the NOOP) over that report's CONTINUE, leaving the trial RUNNING with no task (the
    MO-ASHA search of tests/searches/test_model_based.py hung so). It trains when Tune has the save."""
    from ray.train._internal.session import _FutureTrainingResult, _TrainingResult
    from ray.train._internal.storage import StorageContext
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import TrialScheduler

    kept = inspect.getsource(TuneController._process_trial_result)
    assert "if not self._cached_trial_decisions.get(trial.trial_id) or decision in {" in kept, \
        "Tune no longer keeps the first answer given while a trial saves: is continue_held_trial's care still needed?"

    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "1")  # else the controller asks a running Ray for its CPUs
    controller = TuneController(storage=StorageContext(storage_path=str(tmp_path), experiment_dir_name="held"))
    trained = []
    monkeypatch.setattr(controller, "_schedule_trial_train", trained.append)  # the actor call itself, recorded
    trial = Trial("__fake", config={"trial_number": 3}, stub=True)
    # where Tune left it: its report answered NOOP while a save of that report's checkpoint was in flight
    trial.temporary_state.saving_to = _FutureTrainingResult(None)
    controller._cached_trial_decisions[trial.trial_id] = TrialScheduler.NOOP

    ray_internals.continue_held_trial(controller._wrapped(), trial)
    assert trained == [], "no training task while its save is in flight"
    controller._on_saving_result(trial, _TrainingResult(checkpoint=None, metrics={}))  # Tune has the save
    assert trained == [trial] and not trial.is_saving


def test_tunes_registry_reads_a_trainable_from_the_gcs_once_until_this_process_registers_again(ray_local,
                                                                                                 monkeypatch):
    """Tune read a trial's trainable from the GCS three times per trial it made; now once, and again after this
    process registers anything (ray_internals.remembered_trainables)."""
    from ray import tune
    from ray.tune import registry
    from ray.tune.error import TuneError
    from ray.tune.experiment import Trial

    for method in (registry._Registry.contains, registry._Registry.get):
        assert "_internal_kv_get(_make_key(self.prefix, category, key))" in inspect.getsource(method), \
            "Tune reads its registry otherwise now: remembered_trainables reads it as it did"
    assert registry._internal_kv_initialized(), "this process's Ray has no key-value client (tests/helpers.py shut_down)"
    ray_internals.remembered_trainables()
    ray_internals.remembered_trainables()  # twice: patched once
    reads = []
    kv_get = registry._internal_kv_get
    monkeypatch.setattr(registry, "_internal_kv_get", lambda key, *a, **k: reads.append(key) or kv_get(key, *a, **k))
    unpickled = []
    cloudpickle = registry.pickle

    class Counting:
        """The registry's own name for cloudpickle, counting what it unpickles (no other module's calls)."""

        def __getattr__(self, name):
            return getattr(cloudpickle, name)

        def loads(self, value, *args, **kwargs):
            unpickled.append(value)
            return cloudpickle.loads(value, *args, **kwargs)

    monkeypatch.setattr(registry, "pickle", Counting())

    def first(config):
        pass

    class Second(tune.Trainable):  # a class is kept as it is; a function is wrapped in Tune's ImplicitFunc
        pass

    tune.register_trainable("hpsearch_registry_probe", first)
    trials = [Trial("hpsearch_registry_probe", config={"n": n}) for n in range(3)]  # each asks once as it is made
    assert len(reads) == 1, "one read of the trainable for three trials"
    assert trials[2].get_trainable_cls() is not None and len(reads) == 1, "and twice for its class: no read"
    assert len(unpickled) == 1, "and unpickled once"
    tune.register_trainable("hpsearch_registry_probe", Second)  # a later search of this process, same name
    assert registry.get_trainable_cls("hpsearch_registry_probe").__name__ == "Second", "not the first one"
    assert len(reads) == 2 and len(unpickled) == 2, "read and unpickled again after the registry changed"
    with pytest.raises(TuneError, match="Unknown trainable"):
        Trial("hpsearch_registry_probe_never_registered")
    registry._global_registry.unregister(registry.TRAINABLE_CLASS, "hpsearch_registry_probe")
    assert not registry._has_trainable("hpsearch_registry_probe"), "an unregistered trainable is gone"


def test_a_searchs_own_local_ray_starts_only_what_a_search_uses_and_the_sessions_keeps_the_autoscalers(ray_local):
    """A search's local Ray (session.start_ray, in a process of its own) runs no log monitor, no autoscaler
    monitor and no dashboard (its API server), and prestarts no worker for its driver; the tests' session Ray
    (conftest.py) keeps the autoscaler monitor, whose records the capacity check reads of a Ray the search did
    not start. Raylet and GCS named: the process kinds are Ray's keys. The workers: once an actor made as Tune
    makes a trial's (with a runtime_env, which a prestarted worker cannot take) runs, the raylet's processes are
    its two agents and that actor's; Ray 2.60 by default has also prestarted an idle worker per CPU by then."""
    import ast

    kept = set(ray_local._private.worker._global_node.all_processes)
    assert {"raylet", "gcs_server", "monitor"} <= kept and "log_monitor" not in kept, kept
    probe = ("import os\nimport ray\nimport psutil  # Ray's own copy (ray/thirdparty_files), on the path once ray is imported\n"
             "from search.execution.session import start_ray\n"
             "assert start_ray(None) == 'private'\n"
             "@ray.remote(num_cpus=1, runtime_env={'env_vars': {'PL_DISABLE_FORK': '1'}})  # tune/execution/class_cache.py\n"
             "class Trial:\n"
             "    def pid(self):\n"
             "        return os.getpid()\n"
             "trial = ray.get(Trial.remote().pid.remote())\n"
             "raylet = ray._private.worker._global_node.all_processes['raylet'][0].process.pid\n"
             "print([' '.join(p.cmdline()) for p in psutil.Process(raylet).children(recursive=True)\n"
             "       if p.pid != trial and 'Agent' not in ' '.join(p.cmdline())])\n"
             "print(sorted(ray._private.worker._global_node.all_processes))\n"
             "ray.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=180,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    started = set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    assert {"raylet", "gcs_server"} <= started and not started & {"log_monitor", "monitor", "dashboard"}, started
    assert ast.literal_eval(done.stdout.strip().splitlines()[-2]) == [], "workers besides the trial's"


def test_tunes_usage_census_of_the_callbacks_counts_as_ray_does_without_importing_mlflow():
    """Tune's run calls the census through its module; ours gives Ray's counts, and a search's callbacks cost
    it no import of mlflow where mlflow is installed, as in the test extra."""
    import ray.tune.tune
    from ray.air._internal import usage
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune import Callback
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, LoggerCallback

    assert "air_usage.tag_callbacks(callbacks)" in inspect.getsource(ray.tune.tune.run)

    class Own(Callback):
        pass

    class OwnLogger(LoggerCallback):
        pass

    class KeepingJson(JsonLoggerCallback):
        pass

    callbacks = [CSVLoggerCallback(), Own(), Own(), OwnLogger(), KeepingJson(), MLflowLoggerCallback(), "not one"]
    before = usage.tag_callbacks
    try:
        ray_internals.light_callback_census()
        assert usage.tag_callbacks.counts(callbacks) == dict(usage._count_callbacks(callbacks))
    finally:
        usage.tag_callbacks = before
    probe = ("import sys\n"
             "from search.execution.ray_internals import light_callback_census\n"
             "from ray.air._internal import usage\n"
             "from ray.tune.logger import CSVLoggerCallback\n"
             "light_callback_census()\n"
             "usage.tag_callbacks([CSVLoggerCallback()])\n"
             "print('mlflow' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


def test_a_reused_actor_gets_its_next_trial_in_one_task_that_starts_it_and_is_asked_nothing_before(tmp_path,
                                                                                                    monkeypatch):
    """Tune handed a reused actor its next trial with a `reset`, then, once that came back, a `train` that started
    the trial's function, and asked the actor for the last trial's metrics before the reset: three actor calls in
    turn while the slot sat empty (ray_internals.quick_hand_over). Now one `execute` resets and starts; a trial
    that Tune restores from a checkpoint, or a class trainable's, still gets Tune's reset."""
    from ray.train._internal.storage import StorageContext
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    assert "trial.set_ray_actor(ray_actor)\n\n        self._schedule_trial_reset(" in inspect.getsource(
        TuneController._maybe_reuse_cached_actor), "Tune hands a cached actor over otherwise now"
    assert "ray_actor.get_auto_filled_metrics.remote(" in inspect.getsource(Trial.set_ray_actor)
    assert "if not self._schedule_trial_restore(trial):\n            self._schedule_trial_train(trial)" in \
        inspect.getsource(TuneController._actor_started), "Tune starts a trial otherwise now"
    ray_internals.quick_hand_over()
    ray_internals.quick_hand_over()  # twice: patched once
    from trainable.adapter import reset_and_start

    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "1")  # else the controller asks a running Ray for its CPUs
    experiment = StorageContext(storage_path=str(tmp_path), experiment_dir_name="handover")
    controller = TuneController(storage=experiment)
    tasks, asked = [], []
    monkeypatch.setattr(controller._actor_manager, "schedule_actor_task",
                        lambda tracked_actor, method_name, args, kwargs, **_: tasks.append((method_name, args, kwargs)))
    metrics = SimpleNamespace(remote=lambda **kw: asked.append(kw))
    function_actor = SimpleNamespace(get_auto_filled_metrics=metrics, execute="a method")  # as Ray's handles are
    class_actor = SimpleNamespace(get_auto_filled_metrics=metrics)  # a class trainable's: no execute
    fresh, restored, of_class = (Trial("__fake", config={"trial_number": n}, stub=True, storage=experiment)
                                 for n in (4, 5, 6))
    for n, (trial, ray_actor) in enumerate(((fresh, function_actor), (restored, function_actor),
                                            (of_class, class_actor))):
        kept = f"actor {n}"
        controller._actor_cache.cache_object(trial.placement_group_factory, kept)
        controller._actor_manager._live_actors_to_ray_actors_resources[kept] = (ray_actor, None)
        if trial is restored:  # Tune restores it from this checkpoint after the reset
            monkeypatch.setattr(Trial, "latest_checkpoint_result", property(lambda self: self is restored))
        assert controller._maybe_reuse_cached_actor(trial)

    assert asked == [], "no actor call ahead of the hand-over: its answer was the last trial's"
    (method, (call,), kwargs), (tunes, (config,), storage), (class_tunes, (class_config,), _) = tasks
    assert method == "execute" and call.func is reset_and_start and kwargs == {}
    assert call.keywords["config"]["trial_number"] == 4 and call.keywords["storage"] is fresh.storage
    assert tunes == "reset" and config["trial_number"] == 5 and storage == {"storage": restored.storage}
    assert class_tunes == "reset" and class_config["trial_number"] == 6, "a class trainable keeps Tune's reset"
    assert fresh.temporary_state.ray_actor is function_actor, "the trial knows its actor"


def test_a_trainables_next_trial_starts_in_the_reset_task_and_its_train_call_takes_the_first_report(ray_local,
                                                                                                      tmp_path):
    """The actor's half of quick_hand_over: trainable/adapter.py reset_and_start resets a reused actor for its
    next trial and starts the trial's function there, so its first epoch runs while Tune's driver learns of the
    reset; Tune's next `train` call takes that epoch's report."""
    import functools

    import ray
    from ray import tune
    from ray.train._internal.storage import StorageContext
    from ray.tune.trainable.function_trainable import wrap_function

    from trainable.adapter import reset_and_start

    def probe(config):
        (tmp_path / f"started-{config['n']}").touch()
        tune.report({"n": config["n"]})

    def first_report_waiting(trainable) -> bool:
        """On the actor: whether its trial's function has put a report in Tune's session queue (waits up to 30 s)."""
        from ray.train._internal.session import get_session

        session = get_session()
        if not session.training_started:
            return False
        waited = session.result_queue.get(timeout=30)  # the queue holds one: put it back for the train call
        session.result_queue.put(waited)
        return True

    def storage(n):
        return StorageContext(storage_path=str(tmp_path), experiment_dir_name="e", trial_dir_name=f"t{n}")

    actor = ray.remote(num_cpus=0)(wrap_function(probe)).remote(config={"n": 1}, storage=storage(1))
    try:
        assert hasattr(actor, "execute"), "quick_hand_over tells a function trainable's actor by its execute method"
        assert ray.get(actor.train.remote(), timeout=60)["n"] == 1
        assert ray.get(actor.execute.remote(functools.partial(reset_and_start, config={"n": 2}, storage=storage(2))),
                       timeout=60) is True
        assert ray.get(actor.execute.remote(first_report_waiting), timeout=60), \
            "the next trial's function ran to its first report before any train call"
        assert (tmp_path / "started-2").exists()
        assert ray.get(actor.train.remote(), timeout=60)["n"] == 2, "Tune's train call takes that report"
    finally:
        ray.kill(actor)




def test_a_fifo_trial_is_asked_for_its_reports_in_batches_and_other_trials_one_a_call(tmp_path, monkeypatch):
    """Tune asked a trial's actor for one report a call, and its own batching (TUNE_RESULT_BUFFER_LENGTH) is
    inert in Ray 2.60 (ray_internals.batched_results): a trial of search/searching/fifo.py's BatchingFIFO now
    gets trainable/adapter.py train_batch, each other scheduler's trial (and a class trainable's) Tune's `train`."""
    from ray.train._internal.storage import StorageContext
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial
    from ray.tune.schedulers import FIFOScheduler

    from search.searching.fifo import BATCH_MOST, BATCH_SECONDS, BatchingFIFO
    from trainable.adapter import train_batch

    assert "if not isinstance(result, list):" in inspect.getsource(TuneController._on_training_result), \
        "Tune's handling of a training task no longer takes a batch of reports"
    ray_internals.batched_results()
    ray_internals.batched_results()  # twice: patched once
    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "1")  # else the controller asks a running Ray for its CPUs
    experiment = StorageContext(storage_path=str(tmp_path), experiment_dir_name="batches")
    tasks = []
    asked = []
    for scheduler, has_execute in ((BatchingFIFO(), True), (FIFOScheduler(), True), (BatchingFIFO(), False)):
        controller = TuneController(storage=experiment, scheduler=scheduler)
        monkeypatch.setattr(controller._actor_manager, "schedule_actor_task",
                            lambda tracked_actor, method_name, args, kwargs, **_: tasks.append((method_name, args)))
        trial = Trial("__fake", config={}, stub=True, storage=experiment)
        trial.temporary_state.ray_actor = SimpleNamespace(execute="a method") if has_execute else SimpleNamespace()
        controller._trial_to_actor[trial] = f"actor of {trial}"
        controller._schedule_trial_train(trial)
        asked.append(trial)
    (batched, (call,)), (plain, plain_args), (of_class, _) = tasks
    assert batched == "execute" and call.func is train_batch
    assert call.keywords == {"seconds": BATCH_SECONDS, "most": BATCH_MOST}
    assert (plain, plain_args) == ("train", ()), "another scheduler's trial: one report a call"
    assert of_class == "train", "a class trainable (no execute) keeps Tune's train"


def test_a_batch_holds_a_trials_reports_to_its_checkpoint_and_keeps_them_when_the_trial_then_fails(ray_local,
                                                                                                   tmp_path):
    """The actor's half of batched_results: trainable/adapter.py train_batch returns the reports of one call, a
    report with a checkpoint in a batch of its own (Tune saves it after it, and after a batch goes on with the
    answer of its first report: tests/searches/test_scale.py's last checkpoint went unrecorded), and to the
    trial's end. Tune's train_buffered raised an error that came
    after some reports of a batch and lost them; train_batch returns them and raises the error at the next call,
    unless the actor was reset for another trial in between."""
    import functools

    import ray
    from ray import tune
    from ray.train._internal.storage import StorageContext
    from ray.tune.result import RESULT_DUPLICATE, SHOULD_CHECKPOINT
    from ray.tune.trainable.function_trainable import wrap_function

    from trainable.adapter import reset_and_start, train_batch

    def epochs(config):
        for epoch in range(1, 7):
            checkpoint = None
            if epoch == 3:
                (tmp_path / "kept").mkdir(exist_ok=True)
                checkpoint = tune.Checkpoint.from_directory(str(tmp_path / "kept"))
            tune.report({"epoch": epoch}, checkpoint=checkpoint)
            if epoch == 5 and config["fails"]:
                raise ValueError("the trial's own error")

    def storage(n):
        return StorageContext(storage_path=str(tmp_path), experiment_dir_name="e", trial_dir_name=f"t{n}")

    def batch(actor, most=100):
        reports = ray.get(actor.execute.remote(functools.partial(train_batch, seconds=60.0, most=most)), timeout=60)
        return [r.get("epoch") if not r.get(RESULT_DUPLICATE) else "end" for r in reports], reports

    actor = ray.remote(num_cpus=0)(wrap_function(epochs)).remote(config={"fails": False}, storage=storage(1))
    try:
        assert batch(actor, most=1)[0] == [1]
        assert batch(actor)[0] == [2], "cut before the report with a checkpoint"
        numbers, reports = batch(actor)
        assert numbers == [3] and reports[0][SHOULD_CHECKPOINT], "which is a batch of its own, at once"
        assert batch(actor)[0] == [4, 5, 6, "end"], "the rest, to the function's end"

        assert ray.get(actor.execute.remote(functools.partial(reset_and_start, config={"fails": True},
                                                              storage=storage(2))), timeout=60)
        assert batch(actor)[0] == [1, 2] and batch(actor)[0] == [3]
        assert batch(actor)[0] == [4, 5], "the reports before the error, all returned"
        with pytest.raises(ray.exceptions.RayTaskError, match="the trial's own error"):
            batch(actor)  # the error, at the next call

        # a trial that fails in a batch, then is reset for another trial (Tune stopped it instead): the kept
        # error is that trial's, not the next one's
        assert ray.get(actor.execute.remote(functools.partial(reset_and_start, config={"fails": True},
                                                              storage=storage(3))), timeout=60)
        assert batch(actor)[0] == [1, 2] and batch(actor)[0] == [3] and batch(actor)[0] == [4, 5]
        assert ray.get(actor.execute.remote(functools.partial(reset_and_start, config={"fails": False},
                                                              storage=storage(4))), timeout=60)
        assert batch(actor)[0] == [1, 2] and batch(actor)[0] == [3] and batch(actor)[0] == [4, 5, 6, "end"]
    finally:
        ray.kill(actor)

def test_a_requeued_trial_parked_by_its_scheduler_waits_paused_in_tunes_own_books(tmp_path, monkeypatch):
    """Tune starts every PENDING trial it has room for; a reproducible halving scheduler parks a trial requeued with
    a rung undecided as PAUSED (ray_internals.park_requeued_trial), from its on_trial_add, the last call of Tune's
    requeue, so that Tune starts it only when the scheduler chooses it."""
    from ray.train._internal.storage import StorageContext
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.experiment import Trial

    requeue = inspect.getsource(TuneController._requeue_trial)
    assert "self._set_trial_status(trial, status=Trial.PENDING)" in requeue
    assert requeue.rstrip().endswith("self._scheduler_alg.on_trial_add(self._wrapped(), trial)"), \
        "Tune tells the scheduler of a requeued trial otherwise now: is it still PENDING without an actor then?"
    assert "self._pending_trials_list = _maybe_add_actors(self._pending_trials_list)" in inspect.getsource(
        TuneController._maybe_add_actors), "Tune no longer starts every pending trial: is parking still needed?"

    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", "1")  # else the controller asks a running Ray for its CPUs
    experiment = StorageContext(storage_path=str(tmp_path), experiment_dir_name="parked")
    controller = TuneController(storage=experiment)
    trial = Trial("__fake", config={"trial_number": 1}, stub=True, storage=experiment)
    controller.add_trial(trial)
    assert trial.status == Trial.PENDING and trial in controller._pending_trials
    ray_internals.park_requeued_trial(controller._wrapped(), trial)
    assert trial.status == Trial.PAUSED and trial in controller._paused_trials and trial not in controller._pending_trials
