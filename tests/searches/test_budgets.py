"""experiment.time_budget and stop_when: the search ends early with exit 0, says why, and the trials
that ran are the first trials of the same search without a budget (the rules, checks and notes on their own:
tests/units/searching/test_budget_rules.py)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import small_space
from trainable.errors import ConfigError


def offline_configs(space, frame, count: int) -> list[dict]:
    """The configs the reproducible searcher draws for trials 0..count-1, told the recorded results
    as the search told them: trial n is asked once trials 0..n-L-1 are told."""
    from search.searching.searcher import make_searcher

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
    from search.searching.budget import read_ended
    from search.driver import run_search
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage

    space = small_space(tmp_path, data_root, experiment={"max_concurrent": 2, "num_samples": 1000, "time_budget": "4s"},
                        data={"train_size": 300, "val_size": 100}, training={"epochs": 3})
    outcome = run_search(space, name="budget")
    frame = outcome.results
    trials = frame.drop_duplicates("trial_id")
    assert not outcome.interrupted and outcome.succeeded  # the CLI exits 0
    assert re.search(rf"ended by time_budget 4s \(noticed [0-9.]+ s after the search's start\) after {len(trials)} "
                     "of 1000 trials", outcome.summary), outcome.summary
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
    from search.outputs.runs import read_run

    folder = RunFolder(Storage.at(str(tmp_path)), "budget")
    assert read_run(folder).state == "ended by budget"
    more = small_space(tmp_path, data_root, experiment={"max_concurrent": 2, "num_samples": len(numbers) + 1},
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
    # a total below the trials the run holds: refused, before spec.yaml records it

    fewer = small_space(tmp_path, data_root, experiment={"max_concurrent": 2, "num_samples": 1},
                        data={"train_size": 300, "val_size": 100}, training={"epochs": 3})
    with pytest.raises(ConfigError, match=rf"experiment.num_samples: on --resume .* at least the {len(numbers) + 1} "):
        run_search(fewer, name="budget", resume=True)
    assert folder.read_spec()[0].experiment.num_samples == len(numbers) + 1

    # a resume with a target: Tune brings back its own copy of the stopper, which takes the new
    # target from spec.yaml and stops the one new trial at its first epoch end
    target = small_space(tmp_path, data_root, experiment={"max_concurrent": 2, "num_samples": len(numbers) + 2,
                                                          "stop_when": {"val_loss": "<= 1000"}},
                         data={"train_size": 300, "val_size": 100}, training={"epochs": 3})
    ended = run_search(target, name="budget", resume=True)
    new = ended.results[ended.results["trial_number"] == len(numbers) + 1]
    assert list(new["epoch"]) == [1] and set(new["status"]) == {"STOPPED"}
    assert f"ended by stop_when val_loss: <= 1000 (trial #{len(numbers) + 1} reached" in ended.summary
    assert "More: --resume with --more-trials N and --set experiment.stop_when=null" in ended.summary

    # as that line says: without the target, the next trial runs all its epochs
    untargeted = small_space(tmp_path, data_root, experiment={"max_concurrent": 2, "num_samples": len(numbers) + 3,
                                                              "stop_when": None},
                             data={"train_size": 300, "val_size": 100}, training={"epochs": 3})
    more = run_search(untargeted, name="budget", resume=True).results
    assert list(more[more["trial_number"] == len(numbers) + 2]["epoch"]) == [1, 2, 3]
