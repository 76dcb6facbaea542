"""experiment.time_budget and stop_when: the search ends early with exit 0, says why, and the trials
that ran are the first trials of the same search without a budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from search.budget import ended_note, reached
from search.schema import budget_seconds
from search.space import parse_space
from tests.helpers import small_space
from trainable.errors import ConfigError


@pytest.mark.parametrize("value, seconds", [("2h", 7200), ("90m", 5400), ("3600s", 3600), (45, 45), (1.5, 1.5),
                                            ("30", 30)])
def test_durations(value, seconds):
    assert budget_seconds(value) == seconds


@pytest.mark.parametrize("key, value", [("time_budget", "2 days"), ("time_budget", 0), ("time_budget", "-5m"),
                                        ("time_budget", True), ("stop_when", {"accuracy": 0.9}),
                                        ("stop_when", {"val_acc": "high"}), ("stop_when", {})])
def test_bad_budgets_name_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"experiment\.{key}: must be"):
        parse_space({"experiment": {key: value}})


def test_targets_follow_the_metric():
    assert reached("val_acc", 0.99, 0.99) and not reached("val_acc", 0.98, 0.99)
    assert reached("val_loss", 0.1, 0.2) and not reached("val_loss", 0.3, 0.2)


def test_the_summary_says_what_ended_it():
    note = ended_note({"ended_by": "time_budget", "time_budget": 60.0, "num_samples": 1000}, 7)
    assert note.startswith("ended by time_budget 60s after 7 of 1000 trials")
    note = ended_note({"ended_by": "stop_when", "metric": "val_acc", "target": 0.9, "value": 0.93,
                       "trial_number": 3, "epoch": 2, "num_samples": 16}, 5)
    assert note.startswith("ended by stop_when val_acc: 0.9 (trial #3 reached 0.9300 at epoch 2) after 5 of 16")
    assert ended_note(None, 3) is None


def offline_configs(space, frame, count: int) -> list[dict]:
    """The configs the reproducible searcher draws for trials 0..count-1, told the recorded results
    as the search told them: trial n is asked once trials 0..n-L-1 are told."""
    from search.searcher import make_searcher

    searcher = make_searcher(space).searcher  # OrderedSearch inside its ConcurrencyLimiter
    lag, configs = space.experiment.max_concurrent, []
    for n in range(count):
        if n >= lag:
            told = frame[frame["trial_number"] == n - lag].sort_values("epoch")
            for _, row in told.iterrows():
                searcher.on_trial_result(f"t{n - lag}", {"val_acc": row["val_acc"], "epoch": row["epoch"]})
            searcher.on_trial_complete(f"t{n - lag}")
        configs.append(searcher.suggest(f"t{n}"))
    return configs


@pytest.mark.slow
def test_time_budget_ends_the_search_with_a_prefix_of_its_trials(tmp_path, data_root, ray_local):
    from search.budget import read_ended
    from search.driver import run_search
    from search.run_folder import RunFolder
    from search.storage import Storage

    space = small_space(tmp_path, data_root, experiment={"num_samples": 1000, "time_budget": "4s"},
                        data={"train_size": 300, "val_size": 100}, training={"epochs": 3})
    outcome = run_search(space, name="budget")
    frame = outcome.results
    trials = frame.drop_duplicates("trial_id")
    assert not outcome.interrupted and outcome.succeeded  # the CLI exits 0
    assert f"ended by time_budget 4s after {len(trials)} of 1000 trials" in outcome.summary
    assert read_ended(RunFolder(Storage.at(str(tmp_path)), "budget"))["ended_by"] == "time_budget"
    numbers = sorted(int(n) for n in trials["trial_number"])
    assert numbers == list(range(len(numbers))) and 0 < len(numbers) < 1000
    # a trial the budget stopped keeps the epochs it reported and says so; none runs past the epochs
    assert set(trials["status"]) <= {"COMPLETED", "STOPPED"}
    for _, rows in frame.groupby("trial_id"):
        assert sorted(rows["epoch"]) == list(range(1, len(rows) + 1))
        assert rows["status"].iloc[0] == ("COMPLETED" if len(rows) == 3 else "STOPPED")
    searched = [d.name for d in space.searched]
    drawn = offline_configs(space, frame, len(numbers))
    for _, row in trials.sort_values("trial_number").iterrows():
        assert {k: row[k] for k in searched} == {k: drawn[int(row["trial_number"])][k] for k in searched}

    # `runs` calls it ended by budget; a resume with one more trial and no budget runs trial k, then finishes
    from search.runs import read_run

    folder = RunFolder(Storage.at(str(tmp_path)), "budget")
    assert read_run(folder).state == "ended by budget"
    more = small_space(tmp_path, data_root, experiment={"num_samples": len(numbers) + 1},
                       data={"train_size": 300, "val_size": 100}, training={"epochs": 3})
    resumed = run_search(more, name="budget", resume=True)
    assert not resumed.interrupted and "Ended:" not in resumed.summary
    last = resumed.results[resumed.results["trial_number"] == len(numbers)]
    assert list(last["epoch"]) == [1, 2, 3] and set(last["status"]) == {"COMPLETED"}  # no budget now
    assert sorted(resumed.results.drop_duplicates("trial_id")["trial_number"]) == list(range(len(numbers) + 1))
    stored, run = folder.read_spec()
    assert stored.experiment.num_samples == len(numbers) + 1 and stored.experiment.time_budget is None
    assert run["resumed_with"][0]["experiment.num_samples"] == len(numbers) + 1
    assert read_run(folder).state == "finished"


def test_a_resume_may_change_only_the_budget_keys(tmp_path):
    from search.cli import main

    space = tmp_path / "space.yaml"
    space.write_text("experiment: {name: x}\n")
    assert main(["--space", str(space), "--resume", "--set", "experiment.seed=3", "--epochs", "2"]) == 2
    assert main(["--space", str(space), "--more-trials", "5"]) == 2


def test_more_trials_adds_to_the_stored_num_samples(tmp_path, data_root):
    from search.cli import parse_args, resume_assignments
    from search.run_folder import RunFolder
    from search.storage import Storage

    folder = RunFolder(Storage.at(str(tmp_path)), "seven")
    folder.claim()
    folder.write_spec(small_space(tmp_path, data_root, experiment={"num_samples": 7}))
    mnist = str(Path(__file__).resolve().parents[1] / "spaces" / "mnist.yaml")
    args = parse_args(["--space", mnist, "--resume", "--name", "seven", "--storage-path", str(tmp_path),
                       "--more-trials", "5"])
    assert ("experiment.num_samples", 12) in resume_assignments(args)  # the space file says 16


def test_a_target_or_a_spent_budget_ends_the_search_and_stops_running_trials(tmp_path, data_root):
    import time

    from search.budget import BudgetStop, budgeted, read_ended
    from search.run_folder import RunFolder
    from search.searcher import make_searcher
    from search.storage import Storage

    space = small_space(tmp_path, data_root, experiment={"stop_when": {"val_loss": 0.2}, "time_budget": "1h"})
    folder = RunFolder(Storage.at(str(tmp_path)), "target")
    folder.claim()
    search, stop = budgeted(make_searcher(space), folder, space)
    search.next_trial()  # the first ask starts the clock
    assert not stop("t0", {"val_loss": 0.25, "epoch": 1, "config": {"trial_number": 0}})
    assert stop("t1", {"val_loss": 0.19, "epoch": 2, "config": {"trial_number": 1}})
    assert stop("t0", {"val_loss": 0.3, "epoch": 2, "config": {"trial_number": 0}})  # at its next epoch end
    assert search.is_finished() and search.next_trial() is None
    ended = read_ended(folder)
    assert (ended["ended_by"], ended["trial_number"], ended["epoch"], ended["value"]) == ("stop_when", 1, 2, 0.19)

    spent = RunFolder(Storage.at(str(tmp_path)), "spent")
    spent.claim()
    search, stop = budgeted(make_searcher(space), spent, space)
    search.next_trial()
    search.started -= 3601  # an hour and a second ago
    assert stop("t0", {"val_loss": 0.5, "epoch": 1}) and read_ended(spent)["ended_by"] == "time_budget"
    assert BudgetStop(spent).stop_all() is False  # running trials end at their epoch end, not at once
