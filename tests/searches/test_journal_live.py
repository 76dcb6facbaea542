"""optuna.journal as optuna-dashboard sees it while a search runs: one numbering, trials as they start (the
rows on their own, without a search: tests/units/outputs/test_journal_rows.py).

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

from search.outputs.journal import Journal
from search.execution.progress import Progress
from search.store.run_folder import RunFolder
from search.store.storage import Storage
from search.searching.study import JOURNAL_FILE
from tests.helpers import small_space

from tests.units.outputs.test_journal_rows import a_ended_b_running, config, dashboard_storage, dashboard_trials, journal_space, rows


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
