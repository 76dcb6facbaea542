"""The search as an Optuna study, from results rows (the journal's and the report's source), and the journal."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import optuna
import pandas as pd

from search.outputs.journal import Journal
from search.execution.progress import Progress
from search.store.run_folder import RunFolder
from search.definition.space import parse_space
from search.store.storage import Storage
from search.searching.study import JOURNAL_FILE, frozen_trial, journal, make_study


def rows(**columns) -> list[dict]:
    """A trial's rows as read back from results.parquet (a frame's records: a null there is NaN)."""
    base = {"trial_id": "a", "trial_number": 0, "seed": 7, "status": "COMPLETED", "epoch": [1, 2],
            "val_acc": [0.5, 0.7]}
    return pd.DataFrame({**base, **columns}).to_dict("records")


def test_a_null_choice_read_back_as_nan_is_the_null_choice():
    space = parse_space({"space": {"clip_norm": {"distribution": "choice", "values": [None, 1.0]}}})
    trial = frozen_trial(rows(clip_norm=[math.nan, math.nan]), space)
    assert trial.params == {"clip_norm": None}


def test_a_key_drawn_when_a_choice_is_null_stays_drawn_when_the_null_reads_back_as_nan():
    space = parse_space({"space": {"clip_norm": {"distribution": "choice", "values": [None, 1.0]},
                                   "t_max": {"distribution": "int", "low": 2, "high": 9, "when": {"clip_norm": [None]}}}})
    from_frame = frozen_trial(rows(clip_norm=[math.nan, math.nan], t_max=[3, 3]), space)
    live = frozen_trial([{**row, "clip_norm": None} for row in rows(t_max=[3, 3])], space)  # results.records: None
    assert from_frame.params == live.params == {"clip_norm": None, "t_max": 3}


def test_a_trials_value_is_its_best_epoch_and_nan_epochs_are_no_score():
    space = parse_space({"experiment": {"metric": "val_loss", "mode": "min"},
                         "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})
    trial = frozen_trial(rows(lr=[0.15, 0.15], val_loss=[0.4, math.nan]), space)
    assert trial.value == 0.4 and trial.intermediate_values == {1: 0.4}
    failed = frozen_trial(rows(lr=[0.15, 0.15], val_loss=[math.nan, math.nan]), space)
    assert failed.state.name == "FAIL"


def test_the_study_lists_trials_in_trial_number_order():
    space = parse_space({"space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})
    frame = pd.DataFrame(rows(trial_id="late", trial_number=1, lr=0.12) + rows(trial_id="early", trial_number=0, lr=0.18))
    study = make_study(frame, space)
    assert [t.user_attrs["trial_id"] for t in study.trials] == ["early", "late"]


# ---- optuna.journal: one entry per trial number, as results.parquet holds it ----

def trial(trial_id: str, number: int, lr: float, curve: list[float]) -> list[dict]:
    return [{"trial_id": trial_id, "trial_number": number, "seed": 7 + number, "status": "COMPLETED",
             "epoch": epoch, "lr": lr, "val_acc": value} for epoch, value in enumerate(curve, start=1)]


def journal_space():
    return parse_space({"experiment": {"name": "j"},
                        "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})


def read_journal(folder: RunFolder) -> optuna.Study:
    return optuna.load_study(study_name=folder.name, storage=journal(str(Path(folder.path) / JOURNAL_FILE)))


def test_a_trial_run_again_after_a_resume_has_one_journal_entry_holding_its_new_values(tmp_path):
    space = journal_space()
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101500")
    Path(folder.path).mkdir()
    before = Progress(folder, space)
    before.add_to_journal(trial("a", 0, 0.15, [0.5, 0.7]))
    before.add_to_journal(trial("b", 1, 0.12, [0.6, 0.8]))
    # the driver is killed after trial #1 ended but before Tune's snapshot held it: the resumed
    # search (its callback unpickled from that snapshot) runs #1 again under a new Tune id
    after = pickle.loads(pickle.dumps(before))
    after.add_to_journal(trial("c", 1, 0.12, [0.6, 0.9]))
    after.add_to_journal(trial("c", 1, 0.12, [0.6, 0.9]))  # and the end of the search writes it again
    study = read_journal(folder)
    assert [(t.user_attrs["trial_number"], t.user_attrs["trial_id"]) for t in study.trials] == [(0, "a"), (1, "c")]
    results = pd.DataFrame(trial("a", 0, 0.15, [0.5, 0.7]) + trial("c", 1, 0.12, [0.6, 0.9]))
    assert study.best_value == results["val_acc"].max() == 0.9, "the journal's best is results.parquet's"
    # appends after the rewrite go to the new file
    after.add_to_journal(trial("d", 2, 0.18, [0.4, 0.95]))
    assert [t.user_attrs["trial_id"] for t in read_journal(folder).trials] == ["a", "c", "d"]


def test_the_journal_made_to_match_results_drops_stale_entries_and_adds_missing_ones(tmp_path):
    space = journal_space()
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101500")
    Path(folder.path).mkdir()
    # a journal as the old code left it after a resume: trial #1 twice, #2 missing
    study = make_study(pd.DataFrame(trial("a", 0, 0.15, [0.5])), space,
                       journal(str(Path(folder.path) / JOURNAL_FILE)), folder.name)
    study.add_trial(frozen_trial(trial("b", 1, 0.12, [0.99]), space))
    study.add_trial(frozen_trial(trial("c", 1, 0.12, [0.6]), space))
    results = pd.DataFrame(trial("a", 0, 0.15, [0.5]) + trial("c", 1, 0.12, [0.6]) + trial("e", 2, 0.11, [0.7]))
    unfinished = pd.DataFrame(trial("f", 3, 0.13, [0.8])).assign(status="INTERRUPTED")
    Journal(folder, space).sync(pd.concat([results, unfinished]))
    study = read_journal(folder)
    assert [t.user_attrs["trial_id"] for t in study.trials] == ["a", "c", "e", "f"]
    assert [t.number for t in study.trials] == [t.user_attrs["trial_number"] for t in study.trials]
    # an unfinished trial stays RUNNING, its curve so far kept: --resume continues that entry
    assert study.trials[3].state.name == "RUNNING" and study.trials[3].user_attrs["status"] == "INTERRUPTED"
    assert study.trials[3].intermediate_values == {1: 0.8}
    assert study.best_value == results["val_acc"].max()
    assert sorted(p.name for p in Path(folder.path).iterdir()) == [JOURNAL_FILE], "no temporary file left"


# ---- pruned is pruned: how a trial ended decides its state in optuna.journal ----

def ended(trial_id: str, number: int, lr: float, curve: list[float], status: str) -> list[dict]:
    return [{**row, "status": status} for row in trial(trial_id, number, lr, curve)]


def entries(folder: RunFolder) -> list[tuple]:
    """What optuna-dashboard shows of each trial."""
    return [(t.number, t.state.name, t.value, t.intermediate_values, t.user_attrs["status"])
            for t in read_journal(folder).trials]


def test_a_stopped_trial_is_pruned_with_its_curve_and_a_diverged_one_fails(tmp_path):
    space = journal_space()
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101500")
    Path(folder.path).mkdir()
    results = pd.DataFrame(ended("a", 0, 0.15, [0.5, 0.8, 0.9], "COMPLETED") + ended("b", 1, 0.12, [0.3], "STOPPED")
                           + ended("c", 2, 0.11, [0.6, 0.2], "STOPPED")
                           + ended("d", 3, 0.18, [0.4, math.nan], "DIVERGED"))
    Journal(folder, space).sync(results)
    assert entries(folder) == [(0, "COMPLETE", 0.9, {1: 0.5, 2: 0.8, 3: 0.9}, "COMPLETED"),
                               (1, "PRUNED", 0.3, {1: 0.3}, "STOPPED"),
                               (2, "PRUNED", 0.6, {1: 0.6, 2: 0.2}, "STOPPED"),  # its value: its best epoch
                               (3, "FAIL", None, {1: 0.4}, "DIVERGED")]
    study = read_journal(folder)
    assert (study.best_trial.number, study.best_value) == (0, 0.9)
    # the report's study keeps every scored trial COMPLETE: Optuna's plots draw no other
    assert [t.state.name for t in make_study(results, space).trials] == ["COMPLETE"] * 4


def test_a_stopped_trial_that_holds_the_best_value_is_the_studys_best_live_or_rebuilt(tmp_path):
    space = journal_space()
    # trial #1 reached 0.95 at its epoch 1, fell, and the scheduler stopped it: best.yaml's trial
    trials = [ended("a", 0, 0.15, [0.5, 0.8, 0.9], "COMPLETED"), ended("b", 1, 0.12, [0.95, 0.4], "STOPPED"),
              ended("c", 2, 0.11, [0.3], "STOPPED"), ended("d", 3, 0.13, [0.6, 0.7, 0.85], "COMPLETED")]
    results = pd.DataFrame([row for rows in trials for row in rows])
    live = RunFolder(Storage.at(str(tmp_path / "live")), "j-20261130-101500")
    Path(live.path).mkdir(parents=True)
    progress = Progress(live, space)
    for rows in trials:  # as the trials end, then the end of the search
        progress.add_to_journal(rows)
    assert [state for _, state, *_ in entries(live)] == ["COMPLETE", "PRUNED", "PRUNED", "COMPLETE"]
    Journal(live, space).sync(results)
    rebuilt = RunFolder(Storage.at(str(tmp_path / "rebuilt")), "j-20261130-101500")
    Path(rebuilt.path).mkdir(parents=True)
    Journal(rebuilt, space).sync(results)  # a journal written from results.parquet alone (a lost journal, --resume)
    assert entries(live) == entries(rebuilt) == [(0, "COMPLETE", 0.9, {1: 0.5, 2: 0.8, 3: 0.9}, "COMPLETED"),
                                                 (1, "COMPLETE", 0.95, {1: 0.95, 2: 0.4}, "STOPPED"),
                                                 (2, "PRUNED", 0.3, {1: 0.3}, "STOPPED"),
                                                 (3, "COMPLETE", 0.85, {1: 0.6, 2: 0.7, 3: 0.85}, "COMPLETED")]
    study = read_journal(live)
    assert (study.best_trial.number, study.best_value) == (1, 0.95)
    assert sorted(p.name for p in Path(live.path).iterdir()) == [JOURNAL_FILE], "no temporary file left"
    # a resume adds a better trial: #1 is pruned again, as a journal rebuilt from the new results says
    more = pd.concat([results, pd.DataFrame(ended("e", 4, 0.14, [0.7, 0.97, 0.96], "COMPLETED"))])
    Journal(live, space).sync(more)
    Journal(rebuilt, space).sync(more)
    assert entries(live) == entries(rebuilt)
    assert entries(live)[1][1] == "PRUNED" and read_journal(live).best_trial.number == 4


def test_several_objectives_a_stopped_trial_on_the_front_is_complete(tmp_path):
    space = parse_space({"experiment": {"name": "j", "metric": ["val_acc", "val_loss"], "mode": ["max", "min"]},
                         "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})
    folder = RunFolder(Storage.at(str(tmp_path)), "j-20261130-101500")
    Path(folder.path).mkdir()

    def several(trial_id, number, points, status):
        return [{**row, "val_loss": loss} for row, loss in
                zip(ended(trial_id, number, 0.15, [acc for acc, _ in points], status), [loss for _, loss in points])]

    results = pd.DataFrame(several("a", 0, [(0.5, 0.5), (0.8, 0.3)], "COMPLETED")
                           + several("b", 1, [(0.9, 0.4)], "STOPPED")  # on the front: the best val_acc
                           + several("c", 2, [(0.4, 0.6)], "STOPPED"))  # dominated by #0
    Journal(folder, space).sync(results)
    study = read_journal(folder)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert sorted(t.number for t in study.best_trials) == [0, 1]
