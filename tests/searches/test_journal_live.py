"""optuna.journal as optuna-dashboard sees it while a search runs: one numbering, trials as they start.

Read through optuna-dashboard's own storage loader (`optuna_dashboard._storage_url.get_storage`,
`optuna_dashboard._storage.get_trials`: what `optuna-dashboard FILE` calls), from the test extra.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest

from search.outputs.journal import Journal, local_journal_path
from search.execution.progress import Progress
from search.store.run_folder import RunFolder
from search.definition.space import parse_space
from search.store.storage import Storage
from search.searching.study import JOURNAL_FILE
from tests.helpers import small_space

dashboard_storage = pytest.importorskip("optuna_dashboard._storage_url")
from optuna_dashboard._inmemory_cache import InMemoryCache  # noqa: E402
from optuna_dashboard._storage import get_trials  # noqa: E402


def dashboard_trials(path: str | Path, name: str) -> list[optuna.trial.FrozenTrial]:
    """The trials optuna-dashboard lists for study `name` of the journal at `path`."""
    storage = dashboard_storage.get_storage(str(path))
    return get_trials(InMemoryCache(), storage, storage.get_study_id_from_name(name))


# ---- an entry's life, through the callback's own steps (no Ray) ----

def journal_space():
    return parse_space({"experiment": {"name": "j"},
                        "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})


def rows(trial_id: str, number: int, lr: float, curve: list[float], status: str = "COMPLETED") -> list[dict]:
    return [{"trial_id": trial_id, "trial_number": number, "seed": 7 + number, "status": status, "epoch": epoch,
             "lr": lr, "val_acc": value} for epoch, value in enumerate(curve, start=1)]


def config(number: int, lr: float) -> dict:
    return {"trial_number": number, "seed": 7 + number, "lr": lr, "epochs": 2}


def test_an_entry_is_running_from_its_start_learns_each_epoch_and_ends_with_its_value(tmp_path):
    space = journal_space()
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101500")
    Path(folder.path).mkdir()
    progress = Progress(folder, space)
    journal = progress.journal
    progress._start_entry("b", config(1, 0.12), journal)  # trial #1 starts before #0 (Tune's choice)
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.number, t.state.name, t.user_attrs["status"]) for t in listed] == [(0, "WAITING", "PENDING"),
                                                                              (1, "RUNNING", "RUNNING")]
    assert listed[1].params == {"lr": 0.12} and listed[1].user_attrs["trial_id"] == "b"
    progress._start_entry("a", config(0, 0.15), journal)
    journal.report(0, 1, 0.5)
    listed = dashboard_trials(journal.path, folder.name)
    assert [t.state.name for t in listed] == ["RUNNING", "RUNNING"]
    assert listed[0].params == {"lr": 0.15} and listed[0].intermediate_values == {1: 0.5}
    progress.add_to_journal(rows("a", 0, 0.15, [0.5, 0.7]))
    listed = dashboard_trials(journal.path, folder.name)
    assert (listed[0].state.name, listed[0].value, listed[0].intermediate_values) == ("COMPLETE", 0.7,
                                                                                      {1: 0.5, 2: 0.7})
    assert listed[0].user_attrs == {"trial_number": 0, "trial_id": "a", "seed": 7, "status": "COMPLETED"}


def test_an_entry_above_a_trial_tune_has_not_started_waits_one_batch_for_it(tmp_path, monkeypatch):
    """Tune starts two trials in the order their actors come up: #1 can start before #0. Written first, #1
    makes #0 a WAITING placeholder that its start, epochs and end then fill in one write each (~15 writes
    where one holds a short trial); kept back one batch, #1 follows #0's own entry. One batch only: a trial
    can wait long for its resources, and the dashboard shows the running ones."""
    from ray.tune.experiment import Trial

    from search.execution import progress as progress_module

    monkeypatch.setattr(progress_module, "JOURNAL_EVERY_S", 0.0)  # a batch at every controller step
    space = journal_space()

    def search(folder_name: str, zero_starts: bool) -> tuple[list, list[str], list[str]]:
        folder = RunFolder(Storage.at(str(tmp_path)), folder_name)
        Path(folder.path).mkdir()
        progress = Progress(folder, space)
        trials = [Trial("noop", config=config(n, 0.1 + n / 100), stub=True) for n in range(2)]
        trials[1].set_status(Trial.RUNNING)
        progress.on_trial_start(iteration=1, trials=trials, trial=trials[1])
        progress.on_step_end(iteration=1, trials=trials)  # #0 is PENDING: #1 waits
        if zero_starts:
            trials[0].set_status(Trial.RUNNING)
            progress.on_trial_start(iteration=2, trials=trials, trial=trials[0])
        progress.on_step_end(iteration=2, trials=trials)
        progress.flush()
        listed = dashboard_trials(progress.journal.path, folder.name)
        lines = Path(progress.journal.path).read_text().splitlines()
        return ([(t.number, t.state.name, t.user_attrs.get("trial_id")) for t in listed], lines,
                [t.trial_id for t in trials])

    listed, lines, ids = search("j-20261130-101500", zero_starts=True)
    assert listed == [(0, "RUNNING", ids[0]), (1, "RUNNING", ids[1])]
    assert len(lines) == 3, "the study and one write per trial: no placeholder filled in later"
    listed, lines, ids = search("j-20261130-101600", zero_starts=False)  # #0 still waits a batch later: #1 goes in
    assert listed == [(0, "WAITING", None), (1, "RUNNING", ids[1])]

    # kept back once, an entry goes at the next batch even if it was replaced meanwhile (a restart: max_failures)
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101700")
    Path(folder.path).mkdir()
    progress = Progress(folder, space)
    trials = [Trial("noop", config=config(n, 0.1 + n / 100), stub=True) for n in range(3)]
    for trial in trials[1:]:
        trial.set_status(Trial.RUNNING)
        progress.on_trial_start(iteration=1, trials=trials, trial=trial)
    progress.on_step_end(iteration=1, trials=trials)  # #0 PENDING: #1 and #2 wait
    progress.on_trial_start(iteration=2, trials=trials, trial=trials[1])  # #1 starts again
    progress.on_step_end(iteration=2, trials=trials)  # #0 still PENDING: both go, in order
    progress.flush()
    listed = dashboard_trials(progress.journal.path, folder.name)
    assert [(t.number, t.state.name, t.user_attrs.get("trial_id")) for t in listed] == [
        (0, "WAITING", None), (1, "RUNNING", trials[1].trial_id), (2, "RUNNING", trials[2].trial_id)]
    assert len(Path(progress.journal.path).read_text().splitlines()) == 4, "the study, #0's placeholder, #1, #2"


def test_a_held_batch_is_one_append_read_as_written_and_seen_by_the_dashboard_when_committed(tmp_path):
    """Journal.hold/commit (HeldAppends): a batch of changes goes to the file in one append, the same lines
    as written one by one; the journal reads its held changes back meanwhile, and a dashboard sees them
    when they are committed. A rewrite in the batch (an ended entry replaced) takes the held changes in."""
    space = journal_space()
    made = {}
    for name, held in (("one-by-one", False), ("held", True)):
        folder = RunFolder(Storage.at(str(tmp_path)), name)
        Path(folder.path).mkdir()
        journal = Journal(folder, space)
        appends = []
        original = journal._backend._file.append_logs
        journal._backend._file.append_logs = lambda logs: (appends.append(len(logs)), original(logs))[1]  # noqa: B023
        if held:
            journal.hold()
        journal.put(journal.trial_of(rows("a", 0, 0.15, [0.5, 0.7])))
        journal.start(journal.trial_of(rows("b", 1, 0.12, [0.6], status="RUNNING")))
        journal.report(1, 2, 0.65)
        journal.put(journal.trial_of(rows("c", 2, 0.11, [0.4, 0.45])))
        assert sorted(journal.entries) == [0, 1, 2] and journal.entries[1].intermediate_values == {1: 0.6, 2: 0.65}
        if held:
            assert len(dashboard_trials(journal.path, folder.name)) == 0, "held: not in the file yet"
            assert appends == []
            journal.commit()
            assert appends == [len(Path(journal.path).read_text().splitlines()) - 1], "one append, the study's line apart"
        else:
            assert appends == [1, 1, 1, 1], "an append per change"
        listed = dashboard_trials(journal.path, folder.name)
        made[name] = [(t.number, t.state.name, t.value, t.params, t.intermediate_values, t.user_attrs) for t in listed]
        # after the commit, changes are written at once again and read back in order
        journal.put(journal.trial_of(rows("b", 1, 0.12, [0.6, 0.65, 0.8])))
        assert dashboard_trials(journal.path, folder.name)[1].state.name == "COMPLETE"
        assert Journal(folder, space).entries[1].value == 0.8, "a new reader of the file"
    assert made["held"] == made["one-by-one"] and len(made["held"]) == 3
    # an ended entry replaced inside a batch (a trial run again after a resume) rewrites the journal whole
    folder = RunFolder(Storage.at(str(tmp_path)), "held")
    journal = Journal(folder, space)
    journal.hold()
    journal.report(2, 3, 0.5)  # #2 ended: no change
    journal.put(journal.trial_of(rows("e", 2, 0.11, [0.3])))
    journal.put(journal.trial_of(rows("f", 3, 0.13, [0.2], status="RUNNING")))
    journal.commit()
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.number, t.user_attrs["trial_id"], t.state.name) for t in listed] == [
        (0, "a", "COMPLETE"), (1, "b", "COMPLETE"), (2, "e", "COMPLETE"), (3, "f", "RUNNING")]
    assert sorted(p.name for p in Path(folder.path).iterdir()) == [JOURNAL_FILE], "no temporary file left"


def a_ended_b_running(tmp_path, name: str) -> tuple[RunFolder, Journal]:
    """A run folder whose journal holds #0 ("a") ended and #1 ("b") running since its epoch 1."""
    folder = RunFolder(Storage.at(str(tmp_path)), name)
    Path(folder.path).mkdir()
    journal = Journal(folder, journal_space())
    journal.put(journal.trial_of(rows("a", 0, 0.15, [0.5, 0.7])))
    journal.start(journal.trial_of(rows("b", 1, 0.12, [0.6], status="RUNNING")))
    return folder, journal


def test_a_note_another_process_writes_while_a_batch_is_held_leaves_the_journal_right(tmp_path):
    """optuna-dashboard writes the file too (a note is a study system attribute). Landed while a batch is held,
    its line comes before the batch's in the file, not where the held lines were read: the commit reads the
    file anew, and the entries after it go where they belong (an ended entry stays ended, a new one is one)."""
    from search.searching.study import journal as journal_storage

    folder, journal = a_ended_b_running(tmp_path, "j-20261205-070000")
    dashboard = journal_storage(journal.path)
    journal.hold()
    journal.start(journal.trial_of(rows("c", 2, 0.11, [0.4], status="RUNNING")))  # #2 enters in the batch
    journal.put(journal.trial_of(rows("b", 1, 0.12, [0.6, 0.8])))  # and #1 ends in it, last
    dashboard.set_study_system_attr(dashboard.get_study_id_from_name(folder.name), "dashboard:note", "a note")
    journal.commit()
    journal.report(2, 2, 0.45)
    journal.put(journal.trial_of(rows("c", 2, 0.11, [0.4, 0.45, 0.5])))
    journal.start(journal.trial_of(rows("d", 3, 0.13, [0.3], status="RUNNING")))
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.number, t.user_attrs["trial_id"], t.state.name, t.value) for t in listed] == [
        (0, "a", "COMPLETE", 0.7), (1, "b", "COMPLETE", 0.8), (2, "c", "COMPLETE", 0.5), (3, "d", "RUNNING", None)]
    assert listed[2].intermediate_values == {1: 0.4, 2: 0.45, 3: 0.5}
    study = dashboard_storage.get_storage(journal.path)
    assert study.get_study_system_attrs(study.get_study_id_from_name(folder.name))["dashboard:note"] == "a note"


def test_an_interrupted_trial_stays_running_and_its_resume_continues_the_same_entry(tmp_path):
    space = journal_space()
    folder, journal = a_ended_b_running(tmp_path, "j-20261130-101500")
    journal.put(journal.trial_of(rows("c", 2, 0.11, [0.4, 0.45])))
    # Ctrl-C: the end of the search makes the journal hold results.parquet, #1 INTERRUPTED after its epoch 1
    stopped = pd.DataFrame(rows("a", 0, 0.15, [0.5, 0.7]) + rows("b", 1, 0.12, [0.6], status="INTERRUPTED")
                           + rows("c", 2, 0.11, [0.4, 0.45]))
    journal.sync(stopped)
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.state.name, t.user_attrs["status"]) for t in listed] == [
        ("COMPLETE", "COMPLETED"), ("RUNNING", "INTERRUPTED"), ("COMPLETE", "COMPLETED")]
    # --resume (a new process): #1 continues in its entry, and #2, which ended after Tune's last
    # snapshot, runs again under a new Tune id: its entry is replaced, never listed twice
    progress = Progress(folder, space)
    resumed = progress.journal
    progress._start_entry("b", config(1, 0.12), resumed)
    progress._start_entry("d", config(2, 0.11), resumed)
    progress.add_to_journal(rows("b", 1, 0.12, [0.6, 0.8]))
    progress.add_to_journal(rows("d", 2, 0.11, [0.4, 0.9]))
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.number, t.user_attrs["trial_id"], t.state.name, t.value) for t in listed] == [
        (0, "a", "COMPLETE", 0.7), (1, "b", "COMPLETE", 0.8), (2, "d", "COMPLETE", 0.9)]
    assert listed[1].intermediate_values == {1: 0.6, 2: 0.8}
    assert sorted(p.name for p in Path(folder.path).iterdir()) == [JOURNAL_FILE], "no temporary file left"


def test_a_journal_numbered_in_finishing_order_is_renumbered_when_opened(tmp_path):
    space = journal_space()
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101500")
    Path(folder.path).mkdir()
    old = Journal(folder, space)
    for trial_id, number in [("b", 1), ("a", 0)]:  # as hpsearch 0.1 wrote it: #1 ended first
        old._create(old.trial_of(rows(trial_id, number, 0.15, [0.5])))
    Journal(folder, space)
    listed = dashboard_trials(old.path, folder.name)
    assert [(t.number, t.user_attrs["trial_id"]) for t in listed] == [(0, "a"), (1, "b")]


def test_on_uri_storage_the_journal_is_on_the_drivers_disk_and_copied_to_the_run_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    space = journal_space()
    folder = RunFolder(Storage.at(f"file://{tmp_path}/runs"), "j-20261130-101500")
    journal = Journal(folder, space)
    local = tmp_path / "cache" / "hpsearch" / "journals" / "file" / str(tmp_path / "runs").strip("/") / \
        folder.name / JOURNAL_FILE
    assert journal.path == local_journal_path(folder.path) == str(local) and local.exists()
    copied = tmp_path / "runs" / folder.name / JOURNAL_FILE
    assert copied.exists(), "the run folder has a journal from the start"
    journal.sync(pd.DataFrame(rows("a", 0, 0.15, [0.5, 0.7])))
    assert [t.value for t in dashboard_trials(copied, folder.name)] == [0.7]
    # a resume on another machine (no local copy) continues from the run folder's
    local.unlink()
    again = Journal(folder, space)
    assert [t.user_attrs["trial_id"] for t in dashboard_trials(again.path, folder.name)] == ["a"]
    # a rewrite inside a held batch (an ended entry replaced: a trial run again) is copied when the batch commits,
    # whatever the ~5% rule says (here it would wait an hour)
    again._upload_seconds, again._uploaded_at = 180.0, time.monotonic()
    again.hold()
    again.put(again.trial_of(rows("b", 0, 0.15, [0.6])))
    again.commit()
    assert [t.user_attrs["trial_id"] for t in dashboard_trials(copied, folder.name)] == ["b"]


# ---- a real search, watched by the dashboard's loader while its first trials wait at a gate ----

def gated_trial(gate: Path, started: Path):
    """The real trainable behind a gate the test opens; a closure, so Ray pickles it by value."""

    def trial(config, **data):
        from trainable.adapter import tune_trial

        (started / str(config["trial_number"])).touch()
        deadline = time.monotonic() + 300
        while not gate.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # polling the test's gate file: the gate itself
        tune_trial(config, **data)

    return trial


@pytest.mark.slow
def test_while_a_search_runs_the_dashboard_lists_its_running_trials_numbered_as_in_results(
        ray_local, tmp_path, data_root):
    from search.driver import run_search

    space = small_space(tmp_path / "runs", data_root, data={"train_size": 500, "val_size": 200},
                        training={"epochs": 1}, experiment={"max_concurrent": 2})
    gate, started = tmp_path / "gate", tmp_path / "started"
    started.mkdir()
    outcome = {}
    search = threading.Thread(target=lambda: outcome.update(done=run_search(
        space, name="live", trainable=gated_trial(gate, started))))
    search.start()
    journal = tmp_path / "runs" / "live" / JOURNAL_FILE
    try:
        deadline = time.monotonic() + 300
        running = []
        while len(running) < 2 and time.monotonic() < deadline and search.is_alive():
            if journal.exists() and len(list(started.iterdir())) == 2:  # both slots' trials hold at the gate
                running = [t for t in dashboard_trials(journal, "live") if t.state.name == "RUNNING"]
            time.sleep(0.1)  # polling the journal a dashboard reads: what is being tested
        assert sorted(t.number for t in running) == [0, 1], "the dashboard lists both running trials"
        assert all(t.params and t.value is None for t in running)
    finally:
        gate.touch()
        search.join(timeout=600)
    frame = outcome["done"].results
    listed = dashboard_trials(journal, "live")
    assert [t.number for t in listed] == sorted(frame["trial_number"].unique()) == [0, 1, 2, 3]
    for t in listed:  # trial k in the dashboard is trial_number k in results.parquet
        trial = frame[frame["trial_number"] == t.number]
        assert t.state.name == "COMPLETE" and t.value == trial["val_acc"].max()
        assert t.params["lr"] == trial["lr"].iloc[0] and t.user_attrs["trial_id"] == trial["trial_id"].iloc[0]
    assert [t.params["lr"] for t in running] == [listed[t.number].params["lr"] for t in running]


# ---- pruned is pruned: a real search whose scheduler stops trials ----

# A training function whose large learning rates peak at their first epoch and then fall, so that
# successive halving stops one after its best epoch: the run's best value is a stopped trial's.
PEAKING = """
def train(config, report, checkpoint=None):
    lr = config["lr"]
    for epoch in range((checkpoint or {}).get("epoch", 0) + 1, config["epochs"] + 1):
        report(val_acc=2 * lr if epoch == 1 else 0.5 - lr + 0.01 * epoch, checkpoint={"epoch": epoch})
"""


def entry(t: optuna.trial.FrozenTrial) -> tuple:
    return t.number, t.state.name, t.values, t.params, t.intermediate_values, t.user_attrs


@pytest.mark.slow
def test_trials_a_scheduler_stopped_are_pruned_and_the_studys_best_is_best_yamls(ray_local, tmp_path):
    import yaml

    from search.cli import load_space
    from search.driver import run_search
    from tests.helpers import assert_outputs_agree

    (tmp_path / "peaking.py").write_text(PEAKING)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({
        "trainable": "peaking.py:train",
        # rungs at epochs 1 and 2; #0 runs all 4 epochs, #1 (0.6 at epoch 1, then 0.22) stops at epoch 2,
        # #2 (0.04) at epoch 1
        "experiment": {"name": "pruned", "metric": "val_acc", "mode": "max", "num_samples": 3, "max_concurrent": 2,
                       "seed": 3, "scheduler": "asha", "grace_period": 1, "reduction_factor": 2,
                       "enqueue": [{"lr": 0.05}, {"lr": 0.3}, {"lr": 0.02}], "storage_path": str(tmp_path / "runs"),
                       "report": False},
        "training": {"epochs": 4},
        "space": {"lr": {"distribution": "float", "low": 0.01, "high": 0.4}}}))
    space = load_space(str(tmp_path / "space.yaml"), [])
    outcome = run_search(space, name="pruned")
    run = Path(outcome.path)
    frame = outcome.results
    statuses = frame.groupby("trial_number")["status"].first().to_dict()
    assert statuses == {0: "COMPLETED", 1: "STOPPED", 2: "STOPPED"}, frame[["trial_number", "epoch", "val_acc"]]
    listed = dashboard_trials(run / JOURNAL_FILE, "pruned")
    # #1 holds the run's best (its epoch 1): COMPLETE so that the study's best is best.yaml's; #2 is pruned
    assert [(t.number, t.state.name, t.user_attrs["status"]) for t in listed] == [
        (0, "COMPLETE", "COMPLETED"), (1, "COMPLETE", "STOPPED"), (2, "PRUNED", "STOPPED")]
    for t in listed:  # each reported epoch kept as an intermediate value, step = epoch
        rows = frame[frame["trial_number"] == t.number]
        assert t.intermediate_values == dict(zip(rows["epoch"], rows["val_acc"]))
        assert t.value == rows["val_acc"].max()
    best = yaml.safe_load((run / "best.yaml").read_text())["result"]
    assert best["trial_number"] == 1
    assert_outputs_agree(run)
    # the journal rebuilt from results.parquet alone (a lost journal, a --resume) is the same
    rebuilt = RunFolder(Storage.at(str(tmp_path / "rebuilt")), "pruned")
    Path(rebuilt.path).mkdir(parents=True)
    Journal(rebuilt, space).sync(pd.read_parquet(run / "results.parquet"))
    assert [entry(t) for t in dashboard_trials(Path(rebuilt.path) / JOURNAL_FILE, "pruned")] == \
        [entry(t) for t in listed]


def test_what_a_progress_holds_is_written_when_tune_returns_without_ending_it(tmp_path):
    """After a quick stop or a second Ctrl-C Tune returns without on_experiment_end; the driver's flush_all
    still writes the batch a Progress holds, not only what its writer thread was handed."""
    from ray.tune.experiment import Trial

    from search.execution.progress import flush_all

    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101800")
    Path(folder.path).mkdir()
    progress = Progress(folder, journal_space())
    progress.setup()  # the journal exists from the start: the writer thread is up
    trial = Trial("noop", config=config(0, 0.15), stub=True)
    trial.set_status(Trial.RUNNING)
    progress.on_trial_start(iteration=1, trials=[trial], trial=trial)
    progress.on_trial_result(iteration=1, trials=[trial], trial=trial, result={"val_acc": 0.5, "epoch": 1})
    flush_all()  # no controller step came after the start: its batch was not handed on
    [listed] = dashboard_trials(progress.journal.path, folder.name)
    assert (listed.state.name, listed.user_attrs["trial_id"], listed.intermediate_values) == (
        "RUNNING", trial.trial_id, {1: 0.5})


OTHER_PROCESS = """
import sys

import optuna
from optuna.storages.journal import JournalFileBackend
from optuna_dashboard import save_note

storage = optuna.storages.JournalStorage(JournalFileBackend(sys.argv[1]))
study = optuna.load_study(study_name=sys.argv[2], storage=storage)
study.set_user_attr("owner", "me")
for k in range(3):
    study.set_user_attr(f"remark_{k}", k)
first, second = study.get_trials(deepcopy=False)[:2]
save_note(optuna.Trial(study, first._trial_id), "a note on #0")  # as the dashboard's note editor writes it
storage.set_trial_user_attr(second._trial_id, "label", "baseline")  # a running trial's, then it is ended
storage.set_trial_state_values(second._trial_id, optuna.trial.TrialState.FAIL)  # "Mark as Fail", #1 running
"""


def test_what_other_processes_write_during_a_search_is_still_there_at_its_end(tmp_path, capsys):
    """Issue 49 item 7: the end rewrote optuna.journal from results.parquet and every note and attribute
    other clients wrote was gone (135 of 135); after "Mark as Fail" the live journal stopped for good."""
    import subprocess
    import sys

    from optuna_dashboard import get_note

    space = journal_space()
    folder, journal = a_ended_b_running(tmp_path, "j-20261205-190000")
    (tmp_path / "other.py").write_text(OTHER_PROCESS)
    subprocess.run([sys.executable, str(tmp_path / "other.py"), journal.path, folder.name], check=True)
    progress = Progress(folder, space)  # the search goes on: #1 reports, #2 starts and ends, #1 ends
    live = progress.journal
    progress._start_entry("c", config(2, 0.11), live)
    live.report(1, 2, 0.65)  # refused by Optuna for a FAIL entry: the journal goes on
    progress.add_to_journal(rows("c", 2, 0.11, [0.4, 0.9]))
    progress.add_to_journal(rows("b", 1, 0.12, [0.6, 0.65, 0.8]))
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.number, t.state.name, t.value) for t in listed] == [(0, "COMPLETE", 0.7), (1, "COMPLETE", 0.8),
                                                                  (2, "COMPLETE", 0.9)], "still live after it"
    said = capsys.readouterr().err
    assert "trial #1: another process set its entry in optuna.journal to FAIL; results.parquet says COMPLETED" in said
    # the end of the search (finish.sync_journal) with results.parquet's view of it
    Journal(folder, space).sync(pd.DataFrame(rows("a", 0, 0.15, [0.5, 0.7]) + rows("b", 1, 0.12, [0.6, 0.65, 0.8])
                                             + rows("c", 2, 0.11, [0.4, 0.9])))
    storage = dashboard_storage.get_storage(journal.path)
    study = optuna.load_study(study_name=folder.name, storage=storage)
    assert study.user_attrs == {"owner": "me", "remark_0": 0, "remark_1": 1, "remark_2": 2}
    first, second = study.get_trials()[:2]
    assert second.user_attrs["label"] == "baseline" and second.user_attrs["trial_id"] == "b"
    assert get_note(optuna.Trial(study, first._trial_id)) == "a note on #0"


def test_a_trial_another_process_asks_for_is_left_out_saying_so_and_the_numbering_holds(tmp_path, capsys):
    """Issue 49 item 10: an outside study.ask() on the live journal showed as "TypeError: '>' not supported"."""
    import subprocess
    import sys

    space = journal_space()
    folder, journal = a_ended_b_running(tmp_path, "j-20261205-191500")
    subprocess.run([sys.executable, "-c", "import sys, optuna; from optuna.storages.journal import JournalFileBackend;"
                    "optuna.load_study(study_name=sys.argv[2], storage=optuna.storages.JournalStorage("
                    "JournalFileBackend(sys.argv[1]))).ask()", journal.path, folder.name], check=True)
    progress = Progress(folder, space)  # the search goes on: #2 starts in a held batch, #1 ends
    live = progress.journal
    live.hold()
    progress._start_entry("c", config(2, 0.11), live)
    live.commit()
    progress.add_to_journal(rows("b", 1, 0.12, [0.6, 0.8]))
    progress.add_to_journal(rows("c", 2, 0.11, [0.4, 0.9]))
    listed = dashboard_trials(journal.path, folder.name)
    assert [(t.number, t.user_attrs.get("trial_number"), t.state.name) for t in listed] == [
        (0, 0, "COMPLETE"), (1, 1, "COMPLETE"), (2, 2, "COMPLETE")]
    said = capsys.readouterr().err
    assert "optuna.journal: 1 trial(s) another process added to the study (Optuna number 2, no trial_number" in said
    assert "TypeError" not in said and "not kept up to date" not in said
