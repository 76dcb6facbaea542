"""optuna.journal's rows on their own: the numbering, trials as they start, running and end, as optuna-dashboard
reads them, without a search (the live journal of a running search: tests/searches/test_journal_live.py)."""

from __future__ import annotations

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

from optuna_dashboard._inmemory_cache import InMemoryCache  # noqa: E402
from optuna_dashboard._storage import get_trials  # noqa: E402


dashboard_storage = pytest.importorskip("optuna_dashboard._storage_url")


def dashboard_trials(path: str | Path, name: str) -> list[optuna.trial.FrozenTrial]:
    """The trials optuna-dashboard lists for study `name` of the journal at `path`."""
    storage = dashboard_storage.get_storage(str(path))
    return get_trials(InMemoryCache(), storage, storage.get_study_id_from_name(name))


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
