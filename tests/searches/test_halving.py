"""Early stopping that reproduces: the same trials stop at the same epochs, whatever runs at once.

The searches run a toy training function (`trainable: toy.py:train`, docs/own-training-function.md):
the halving decisions are the scheduler's, made on the reported metric, whichever loop reports it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from search.definition.space import parse_space
from search.driver import run_search
from tests.helpers import SMALL, small_space
from trainable.errors import ConfigError

pytestmark = pytest.mark.slow
TABLE = ["trial_number", "epoch", "status", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc"]

# A training function as a user would write it: val_acc climbs at a rate set by the searched keys, with
# noise seeded by the trial's seed and the epoch; each report checkpoints, so a trial paused at a rung
# resumes where it was. Milliseconds per report: the scheduler's decisions are what the tests time.
TOY = '''
import random


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    acc = checkpoint["acc"] if checkpoint else 0.0
    rate = config["lr"] * config["clip_norm"] * (1 + config["t_max"] / 10) * 64 / config["batch_size"]
    for epoch in range(start, config["epochs"]):
        acc += min(rate, 1.0) * (1 - acc) + random.Random(config["seed"] * 1000 + epoch).gauss(0, 0.02)
        report(val_acc=acc, checkpoint={"acc": acc, "epoch": epoch + 1})
'''


def toy_space(folder: Path, scheduler: str, cpus: float, num_samples: int = 12):
    """`num_samples` trials x 4 epochs of the toy, 4 at once at most, searching SMALL's keys."""
    (folder / "toy.py").write_text(TOY)
    (folder / "space.yaml").write_text("")  # a reference is relative to the space file
    raw = {"trainable": "toy.py:train",
           "experiment": {"name": "test", "metric": "val_acc", "mode": "max", "num_samples": num_samples,
                          "max_concurrent": 4, "seed": 7, "max_failures": 1, "scheduler": scheduler,
                          "storage_path": str(folder), "report": False},
           "resources": {"cpus": cpus},
           "training": {"epochs": 4},
           "space": copy.deepcopy(SMALL["space"])}
    return parse_space(raw, source=str(folder / "space.yaml"))


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trial_number", "epoch"])[TABLE].reset_index(drop=True)


def stopped_early(frame: pd.DataFrame, epochs: int) -> dict[int, int]:
    """trial number -> last epoch, for the trials that ended before `epochs`."""
    last = frame.groupby("trial_number")["epoch"].max()
    return {int(n): int(e) for n, e in last.items() if e < epochs}


def two_runs(tmp_path, scheduler: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The same 12 trials x 4 epochs at 4 trials at once (0.5 CPU each) and one at a time (2 CPUs each, all
    of ray_local's): the order the trials reach a rung in varies run to run at 4 at once; one at a time it is
    trial-number order. A trial at once costs its own actor (a process importing torch and Tune, seconds of
    CPU), so the run one at a time is the cheapest reference."""
    runs = [run_search(toy_space(tmp_path, scheduler, cpus), name=f"{scheduler}-{cpus}") for cpus in (0.5, 2)]
    return runs[0].results, runs[1].results, runs[1].summary


def test_reproducible_asha_stops_the_same_trials_at_the_same_epochs(ray_local, tmp_path):
    first, second, summary = two_runs(tmp_path, "asha")
    assert stopped_early(first, 4), "some trials stopped early"
    assert stopped_early(first, 4) == stopped_early(second, 4)
    pd.testing.assert_frame_equal(table(first), table(second))
    assert "asha: reproducible" in summary

    # a trial stopped while it waited at a rung can stay PAUSED in Tune's record: Tune re-snapshots a
    # trial only when it has an actor. A resume with one trial more must not run it on from its rung.
    import json

    state = sorted((tmp_path / "asha-2").glob("experiment_state-*.json"))[-1]
    record = json.loads(state.read_text())
    for entry in record["trial_data"]:
        trial = json.loads(entry[0])
        if trial["config"]["trial_number"] in stopped_early(second, 4):
            entry[0] = json.dumps({**trial, "status": "PAUSED"})
    state.write_text(json.dumps(record))
    resumed = run_search(toy_space(tmp_path, "asha", 2, num_samples=13), name="asha-2", resume=True).results
    assert sorted(resumed["trial_number"].unique()) == list(range(13))
    pd.testing.assert_frame_equal(table(resumed[resumed["trial_number"] < 12]), table(second))


def test_reproducible_hyperband_stops_the_same_trials_at_the_same_epochs(ray_local, tmp_path):
    first, second, summary = two_runs(tmp_path, "hyperband")
    assert stopped_early(first, 4), "some trials stopped early"
    assert stopped_early(first, 4) == stopped_early(second, 4)
    pd.testing.assert_frame_equal(table(first), table(second))
    assert "hyperband: reproducible" in summary


def test_a_rung_without_its_checkpoint_is_refused_before_the_search(tmp_path, data_root):
    with pytest.raises(ConfigError) as error:
        small_space(tmp_path, data_root, experiment={"scheduler": "asha", "grace_period": 3, "checkpoint_every": 2},
                    training={"epochs": 6})
    assert "experiment.checkpoint_every: must divide grace_period (3) for a reproducible asha" in str(error.value)


def test_rung_decisions_reach_halving_json_at_most_once_a_second_and_all_when_the_search_ends(tmp_path, monkeypatch):
    """halving.json was replaced and synced at every decision (~9 ms of Tune's turn per one-epoch trial, an
    upload per decision on a URI run); now a running trial's decisions go at most once a second, and
    flush_records (after Tune returns) writes what is held back."""
    import json
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from search.searching import halving
    from search.store.storage import Storage

    writes: list[str] = []
    write = Storage.write
    monkeypatch.setattr(Storage, "write", lambda self, relative, data: writes.append(relative) or write(self, relative, data))
    scheduler = halving.OrderedHalving(metric="val_acc", mode="max", max_t=8, grace_period=1, reduction_factor=2,
                                       storage=Storage(str(tmp_path)), record="run/halving.json")
    trials = [SimpleNamespace(config={"trial_number": n, "epochs": 8}, status="RUNNING", is_saving=False) for n in range(6)]
    for trial in trials:
        scheduler.on_trial_add(None, trial)
    decisions = [scheduler.on_trial_result(None, trial, {"epoch": 1, "val_acc": 0.1 * (n % 3)})
                 for n, trial in enumerate(trials)]  # in trial-number order: each is decided at once
    assert TrialScheduler.STOP in decisions and TrialScheduler.CONTINUE in decisions
    assert len(writes) == 1, "the first decision is written, the next five within its second are held back"
    assert len(json.loads((tmp_path / "run" / "halving.json").read_text())["decided"]) == 1

    halving.flush_records()
    assert len(writes) == 2
    record = halving.read_record(Storage(str(tmp_path)), "run/halving.json")
    assert record["decided"] == {n: {1: d} for n, d in enumerate(decisions)}, "every decision, once the search ends"
    halving.flush_records()
    assert len(writes) == 2, "nothing held back: nothing written"


class _Controller:
    """What OrderedHalving asks of Tune's controller wrapper: stop, pause, and (through continue_held_trial) train."""

    def __init__(self, scheduler, trials=()):
        self.scheduler, self.log, self.trials = scheduler, [], list(trials)

    def get_trials(self):
        return self.trials

    def _set_trial_status(self, trial, status):  # what ray_internals.park_requeued_trial calls
        trial.status = status

    def stop_trial(self, trial):
        self.log.append(("stop", trial.config["trial_number"]))
        self.scheduler.on_trial_complete(self, trial, {})
        trial.status = "TERMINATED"

    def pause_trial(self, trial, should_checkpoint=True):
        self.log.append(("pause", trial.config["trial_number"]))
        trial.status = "PAUSED"

    def _schedule_trial_train(self, trial):
        self.log.append(("train", trial.config["trial_number"]))


def test_a_trial_that_waits_for_running_trials_is_held_on_its_actor_not_paused():
    """A trial at a rung before the lower-numbered trials it is judged against: held (NOOP) while they run, then
    trained on or stopped the moment they arrive; paused once one of them stops running; always paused
    without `hold` (the next test: what the search gives it)."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from search.execution.ray_internals import continue_held_trial
    from search.searching.halving import OrderedHalving

    def scheduler_with(hold):
        scheduler = OrderedHalving(metric="val_acc", mode="max", max_t=8, grace_period=1, reduction_factor=2, hold=hold)
        trials = [SimpleNamespace(config={"trial_number": n, "epochs": 8}, status="RUNNING", is_saving=False) for n in range(4)]
        for trial in trials:
            scheduler.on_trial_add(None, trial)
        return scheduler, trials, _Controller(scheduler)

    scheduler, (t0, t1, t2, t3), tune = scheduler_with(continue_held_trial)
    assert scheduler.on_trial_result(tune, t1, {"epoch": 1, "val_acc": 0.9}) == TrialScheduler.NOOP, "t0 runs: held"
    assert scheduler.on_trial_result(tune, t2, {"epoch": 1, "val_acc": 0.1}) == TrialScheduler.NOOP
    assert tune.log == []
    assert scheduler.on_trial_result(tune, t0, {"epoch": 1, "val_acc": 0.5}) == TrialScheduler.CONTINUE
    assert tune.log == [("train", 1), ("stop", 2)], "each held trial goes on or stops as t0 arrives, lowest first"
    assert scheduler.decided == {0: {1: "CONTINUE"}, 1: {1: "CONTINUE"}, 2: {1: "STOP"}}
    assert set(scheduler.waits) == {1, 2}, "a hold is a wait the summary counts"

    assert scheduler.on_trial_result(tune, t3, {"epoch": 2, "val_acc": 0.9}) == TrialScheduler.NOOP, "t0, t1 run"
    t1.status = "PAUSED"  # Tune paused t1 (say, held at rung 4 behind a paused trial): t3 must not keep its slot
    scheduler._settle(tune)
    assert tune.log[-1] == ("pause", 3) and scheduler._held == {} and 3 in scheduler._waiting

    scheduler, (t0, t1, _, _), tune = scheduler_with(None)
    assert scheduler.on_trial_result(tune, t1, {"epoch": 1, "val_acc": 0.9}) == TrialScheduler.PAUSE, "no hold"
    scheduler, (t0, t1, _, _), tune = scheduler_with(continue_held_trial)
    t0.status = "PAUSED"  # the trial t1 waits for holds no slot: holding t1's could leave t0 none
    assert scheduler.on_trial_result(tune, t1, {"epoch": 1, "val_acc": 0.9}) == TrialScheduler.PAUSE


def test_a_trial_held_for_one_that_ends_short_of_the_rung_goes_on_when_that_one_ends():
    """A held trial waits for a lower-numbered running one; that one then ends before the rung (its function
    returned, as a trial with fewer epochs does). Its end judges the held trial, whatever the caller does next:
    Tune asks choose_trial_to_run (which judges them too) at every step, bench/schedules.py's simulator only for a
    free slot, and a held trial keeps its slot there."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from search.execution.ray_internals import continue_held_trial
    from search.searching.halving import OrderedHalving

    scheduler = OrderedHalving(metric="val_acc", mode="max", max_t=8, grace_period=1, reduction_factor=2,
                               hold=continue_held_trial)
    t0, t1 = (SimpleNamespace(config={"trial_number": n, "epochs": 8}, status="RUNNING", is_saving=False) for n in range(2))
    for trial in (t0, t1):
        scheduler.on_trial_add(None, trial)
    tune = _Controller(scheduler)
    assert scheduler.on_trial_result(tune, t1, {"epoch": 1, "val_acc": 0.9}) == TrialScheduler.NOOP, "t0 runs"
    t0.status = "TERMINATED"  # Tune ends t0 (its function returned after epoch 0) and tells the scheduler
    scheduler.on_trial_complete(tune, t0, {})
    assert tune.log == [("train", 1)], "t1 goes on: nothing it is judged against reached the rung"
    assert scheduler._held == {} and scheduler.decided == {1: {1: "CONTINUE"}}


def test_a_trial_that_fails_while_held_at_a_rung_is_judged_there_before_it_runs_again():
    """tests/searches/test_chaos.py's ASHA case once ended with a trial two epochs long that the undisturbed run
    stopped at the first rung: the trial was killed while held there, and Tune requeued it to restart from that
    rung's checkpoint, so its next report was past the rung and nothing judged it there. Now a trial requeued with a
    rung undecided waits PAUSED (Tune starts any PENDING trial it has room for) until the rung is decided: then it
    is stopped there, or chosen to run on."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from search.execution.ray_internals import continue_held_trial, park_requeued_trial
    from search.searching.halving import OrderedHalving

    for t0_value, expected in ((0.95, TrialScheduler.STOP), (0.5, TrialScheduler.CONTINUE)):
        scheduler = OrderedHalving(metric="val_acc", mode="max", max_t=8, grace_period=1, reduction_factor=2,
                                   hold=continue_held_trial, park=park_requeued_trial)
        t0, t1 = (SimpleNamespace(config={"trial_number": n, "epochs": 8}, status="RUNNING", is_saving=False,
                                  last_result={}) for n in range(2))
        for trial in (t0, t1):
            scheduler.on_trial_add(None, trial)
        tune = _Controller(scheduler, trials=[t0, t1])
        assert scheduler.on_trial_result(tune, t1, {"epoch": 1, "val_acc": 0.9}) == TrialScheduler.NOOP, "t0 runs"
        scheduler.on_trial_error(tune, t1)  # its process killed while held: Tune requeues it
        t1.status = "PENDING"
        scheduler.on_trial_add(tune, t1)
        assert t1.status == "PAUSED", "it waits to be chosen, as a trial paused at the rung does"
        assert scheduler.choose_trial_to_run(tune) is None, "not run while t0 is short of the rung"
        assert scheduler.on_trial_result(tune, t0, {"epoch": 1, "val_acc": t0_value}) == TrialScheduler.CONTINUE
        chosen = scheduler.choose_trial_to_run(tune)
        assert scheduler.decided[1] == {1: expected}, "judged at the rung it left undecided"
        if expected == TrialScheduler.STOP:
            assert chosen is None and tune.log == [("stop", 1)] and scheduler.stopped == {1: 1}
        else:
            assert chosen is t1 and tune.log == []


@pytest.mark.parametrize("sections, held", [
    ({}, True),
    ({"experiment": {"trial_timeout": 3600}}, False),  # the epoch's watchdog would take a long hold for a hang
    ({"resources": {"workers": 2}}, False),  # its other ranks wait at a collective with a timeout
], ids=["plain", "trial_timeout", "workers"])
def test_a_search_holds_a_waiting_trial_unless_something_else_times_the_wait(tmp_path, data_root, sections, held):
    """The scheduler the search makes (make_scheduler): a trial that reaches the rung before a running lower one
    is held, except with experiment.trial_timeout or with several workers, where it is paused."""
    from types import SimpleNamespace

    from ray.tune.schedulers import TrialScheduler

    from search.execution.tuner import make_scheduler

    space = small_space(tmp_path, data_root, **{**sections, "experiment": {"scheduler": "asha",
                                                                            **sections.get("experiment", {})}})
    scheduler = make_scheduler(space)
    t0, t1 = (SimpleNamespace(config={"trial_number": n, "epochs": 2}, status="RUNNING", is_saving=False) for n in range(2))
    for trial in (t0, t1):
        scheduler.on_trial_add(None, trial)
    decision = scheduler.on_trial_result(_Controller(scheduler), t1, {"epoch": 1, "val_acc": 0.9})
    assert decision == (TrialScheduler.NOOP if held else TrialScheduler.PAUSE)


# A function that saves no checkpoint, as many users write one: a trial paused at a rung starts over. Trial 1
# reports its first epoch once trial 0 runs (their actors may start seconds apart); trial 0 reports its own only
# once the driver has taken trial 1's (its value 0.6 is in the live journal, written after the scheduler's
# decision), so trial 1 reaches the rung first and waits for a running trial 0 (2 slots). Each call of train()
# is counted in MARKS/starts-<trial number>.
UNSAVED = '''
import pathlib
import re
import time

MARKS = pathlib.Path({marks!r})
JOURNAL = pathlib.Path({journal!r})


def wait_until(seen):
    while not seen():
        time.sleep(0.01)


def train(config, report, checkpoint=None):
    n = config["trial_number"]
    with open(MARKS / f"starts-{{n}}", "a") as starts:
        starts.write("started\\n")
    (MARKS / f"{{n}}-running").touch()
    for epoch in range(config["epochs"]):
        if n == 0 and epoch == 0:  # trial 1's first report, taken by the driver
            wait_until(lambda: JOURNAL.exists() and re.search(r"[:,{{]0\\.6[,}}]", JOURNAL.read_text()))
        if n == 1 and epoch == 0:
            wait_until((MARKS / "0-running").exists)
        report(val_acc=0.5 + 0.1 * n + 0.01 * epoch)
'''


def test_a_function_without_checkpoints_waits_at_a_rung_without_starting_over(ray_local, tmp_path):
    """Paused, such a trial started again from epoch 0 (its first epochs trained twice); held, it starts once."""
    import json

    marks = tmp_path / "marks"
    marks.mkdir()
    journal = tmp_path / "runs" / "held" / "optuna.journal"
    (tmp_path / "unsaved.py").write_text(UNSAVED.format(marks=str(marks), journal=str(journal)))
    (tmp_path / "space.yaml").write_text("")
    space = parse_space({"trainable": "unsaved.py:train",
                         "experiment": {"name": "held", "metric": "val_acc", "mode": "max", "num_samples": 3,
                                        "max_concurrent": 2, "seed": 3, "scheduler": "asha",
                                        "storage_path": str(tmp_path / "runs"), "report": False},
                         "resources": {"cpus": 1}, "training": {"epochs": 2},
                         "space": {"lr": {"distribution": "float", "low": 0.01, "high": 0.1}}},
                        source=str(tmp_path / "space.yaml"))
    results = run_search(space, name="held").results
    halving = json.loads((tmp_path / "runs" / "held" / "halving.json").read_text())
    assert "1" in halving["waits"], "trial 1 waited at the rung for trial 0"
    assert halving["decided"]["1"] == {"1": "CONTINUE"}, "trial 1 beat trial 0 at the rung"
    assert {n: (marks / f"starts-{n}").read_text().count("started") for n in range(3)} == {0: 1, 1: 1, 2: 1}
    assert results.groupby("trial_number")["epoch"].apply(list).to_dict() == {0: [1, 2], 1: [1, 2], 2: [1, 2]}
