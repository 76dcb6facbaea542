"""The driver's cost per report and per trial (issue 38): what its cuts must keep.

- a function trial is finished for the reproducible searcher at its last planned report, so a trial
  waiting for it is asked while its actor is still there to take (search/searching/ordered.py);
- optuna.journal, whose live entries are now written in batches, still holds every trial with
  every epoch's value, as results.parquet does; the summary says how busy the slots were.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from search.definition.space import parse_space
from search.searching.searcher import make_searcher

TOY = '''
def train(config, report, checkpoint=None):
    for epoch in range(config["epochs"]):
        if config["trial_number"] == 1 and epoch == 1:
            report(score=float("nan"))  # diverges: ends early, out of turn
        report(score=config["lr"] * (epoch + 1))
'''


def toy_space(folder: Path, **experiment) -> dict:
    (folder / "toy.py").write_text(TOY)
    (folder / "space.yaml").write_text("")
    return {"trainable": "toy.py:train",
            "experiment": {"name": "toy", "metric": "score", "mode": "max", "num_samples": 4, "seed": 3,
                           "max_concurrent": 2, "storage_path": str(folder / "runs"), **experiment},
            "resources": {"cpus": 0.5},
            "training": {"epochs": 3},
            "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}


def test_a_function_trial_is_finished_for_the_searcher_at_its_last_planned_report(tmp_path):
    searcher = make_searcher(parse_space(toy_space(tmp_path), source=str(tmp_path / "space.yaml"))).searcher
    first, second = searcher.suggest("a"), searcher.suggest("b")
    assert (first["trial_number"], second["trial_number"]) == (0, 1)
    searcher.on_trial_result("b", {"score": 0.5, "epoch": 1})
    searcher.on_trial_complete("b", {"score": 0.5, "epoch": 1})  # ended early (diverged), before trial 0
    assert searcher.suggest("c") is None, "trial 2 is asked on trial 0's result, still out"
    for epoch in (1, 2, 3):
        searcher.on_trial_result("a", {"score": 0.1 * epoch, "epoch": epoch})
    # trial 0's report of its last epoch (training.epochs 3) is its last: trial 2 is asked now, before Tune
    # ends trial 0, so that it takes the actor trial 1 left (Tune keeps one idle actor, and stops trial 0's
    # if no trial is waiting for it)
    third = searcher.suggest("c")
    assert third is not None and third["trial_number"] == 2
    searcher.on_trial_complete("a", {"score": 0.3, "epoch": 3})
    assert searcher.finished[0] == pytest.approx(0.3), "its value is its best epoch's, told once"


def test_a_report_past_the_trials_epochs_is_refused_not_left_out_of_the_searchers_value():
    from trainable.function import Reporter, TooManyReports

    sent = []
    reporter = Reporter("score", lambda row, epoch, checkpoint: sent.append(epoch), limit=2)
    reporter(score=0.1)
    reporter(score=0.2)
    with pytest.raises(TooManyReports, match=r"this is report 3, past the trial's epochs \(2\)"):
        reporter(score=0.9)  # better than the value the searcher took at report 2
    assert sent == [1, 2]
    unlimited = Reporter("score", lambda row, epoch, checkpoint: sent.append(epoch))  # no `epochs` key
    for _ in range(3):
        unlimited(score=0.5)
    assert sent == [1, 2, 1, 2, 3]


@pytest.mark.slow
def test_the_journal_holds_every_epoch_of_every_trial_and_the_summary_says_how_busy_the_slots_were(
        ray_local, tmp_path):
    from search.driver import run_search
    from search.searching.study import JOURNAL_FILE

    outcome = run_search(parse_space(toy_space(tmp_path), source=str(tmp_path / "space.yaml")), name="toy")
    frame = outcome.results
    assert sorted(frame["trial_number"].unique()) == [0, 1, 2, 3]
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        str(tmp_path / "runs" / "toy" / JOURNAL_FILE)))
    listed = optuna.load_study(study_name="toy", storage=storage).get_trials(deepcopy=False)
    assert [t.number for t in listed] == [0, 1, 2, 3]
    for t in listed:  # written in batches during the search: no epoch lost, none added
        rows = frame[(frame["trial_number"] == t.number) & frame["score"].notna()]
        finite = rows[rows["score"].map(lambda v: v == v)]
        assert t.intermediate_values == dict(zip(finite["epoch"].astype(int), finite["score"])), t.number
    assert "Slots: 2 trials training at once " in outcome.summary and "% of the training span" in outcome.summary


def test_the_slots_share_is_the_time_that_many_trials_overlap_over_their_span():
    import pandas as pd

    from search.outputs.summary import busy_share, trial_spans

    # trial a: epochs 0-4 and 4-10; b: 2-8; c: 9-12 (finished_at minus epoch_seconds is each epoch's start)
    frame = pd.DataFrame({"trial_id": ["a", "a", "b", "c"], "finished_at": [4.0, 10.0, 8.0, 12.0],
                          "epoch_seconds": [4.0, 6.0, 6.0, 3.0]})
    spans = trial_spans(frame)
    assert sorted(spans) == [(0.0, 10.0), (2.0, 8.0), (9.0, 12.0)]
    assert busy_share(spans, 2) == (12.0, pytest.approx(7 / 12))  # two at once over 2-8 and 9-10
    assert busy_share(spans, 3) == (12.0, 0.0)
    # a run's first epoch starts after its set-up, whatever came between that epoch's end and its report (the
    # canonical loop's latency measure and checkpoint: b's first report at 8.0 after 5.0 s of training)
    frame = frame.assign(started_at=[0.0, None, 1.0, 8.5], fetch_seconds=[0.0, None, 0.25, 0.0],
                         setup_seconds=[0.0, None, 0.75, 0.5], epoch_seconds=[4.0, 6.0, 5.0, 3.0])
    assert sorted(trial_spans(frame)) == [(0.0, 10.0), (2.0, 8.0), (9.0, 12.0)]
