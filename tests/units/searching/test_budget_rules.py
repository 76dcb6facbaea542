"""experiment.time_budget and stop_when on their own: the durations, the targets and their checks, the notes,
what a resume may change, the stopper (a search that a budget ends: tests/searches/test_budgets.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from search.definition.schema import budget_seconds
from search.definition.space import parse_space
from search.searching.budget import ended_note
from tests.helpers import small_space
from trainable.errors import ConfigError


@pytest.mark.parametrize("value, seconds", [("2h", 7200), ("90m", 5400), ("3600s", 3600), (45, 45), (1.5, 1.5),
                                            ("30", 30)])
def test_durations(value, seconds):
    assert budget_seconds(value) == seconds


@pytest.mark.parametrize("key, value", [("time_budget", "2 days"), ("time_budget", 0), ("time_budget", "-5m"),
                                        ("time_budget", True), ("stop_when.accuracy", {"accuracy": 0.9}),
                                        ("stop_when.val_acc", {"val_acc": "high"}), ("stop_when", {})])
def test_bad_budgets_name_the_key(key, value):
    with pytest.raises(ConfigError, match=rf"experiment\.{key}: must be"):
        parse_space({"experiment": {key.split(".")[0]: value}})


LR = {"space": {"lr": {"distribution": "float", "low": 0.01, "high": 0.3, "log": True}}}


@pytest.mark.parametrize("experiment, stop_when, op", [
    ({}, {"val_acc": 0.99}, ">="),                                              # the objective, max
    ({}, {"val_loss": 0.2}, "<="),                                              # no objective: by name
    ({"metric": "val_loss", "mode": "min"}, {"val_loss": 0.2}, "<="),
    ({"metric": ["val_acc", "latency_ms"], "mode": ["max", "min"]}, {"val_acc": 0.9}, ">="),
    ({"metric": "val_acc", "mode": "min"}, {"val_acc": 0.2}, "<="),             # the search's mode, not the name
    ({}, {"val_loss": ">= 0.5"}, ">="),                                         # an explicit direction wins
    ({}, {"val_acc": "<= 0.1"}, "<="),
])
def test_a_targets_direction_comes_from_the_search(experiment, stop_when, op):
    from search.searching.budget import targets_of

    (target,) = targets_of(parse_space({"experiment": {**experiment, "stop_when": stop_when}, **LR}).experiment)
    assert target.op == op
    assert target.holds(target.bound) and target.holds(target.bound + (1 if op == ">=" else -1))
    assert not target.holds(target.bound + (-1 if op == ">=" else 1)) and not target.holds(float("nan"))


def test_a_plain_number_on_a_metric_no_objective_names_falls_back_to_its_name():
    from search.searching.budget import direction

    experiment = parse_space(LR).experiment
    assert direction(experiment, "val_mean_absolute_error") == "<=" and direction(experiment, "val_f1") == ">="


@pytest.mark.parametrize("value, key, got", [
    ({"val_acc": "> 0.9"}, "experiment.stop_when.val_acc", "'> 0.9'"),
    ({"val_acc": "<= x"}, "experiment.stop_when.val_acc", "'<= x'"),
    ({"val_acc": "<= nan"}, "experiment.stop_when.val_acc", "'<= nan'"),
    ({"val_acc": True}, "experiment.stop_when.val_acc", "True"),
    ({"val_acc": None}, "experiment.stop_when.val_acc", "None"),
    ({"": 0.5}, "experiment.stop_when['']", "0.5"),
    ({"val_loss": 0.1, "val_acc": "high"}, "experiment.stop_when.val_acc", "'high'"),  # the bad entry, not the mapping
    ({}, "experiment.stop_when", "{}"),
])
def test_a_bad_target_names_the_key_the_rule_and_the_value(value, key, got):
    with pytest.raises(ConfigError) as error:
        parse_space({"experiment": {"stop_when": value}, **LR})
    text = str(error.value)
    assert f"{key}: must be null or a mapping" in text and "'<= NUMBER' / '>= NUMBER'" in text
    assert text.rstrip().endswith(f"got {got}") and text.count("stop_when") == 1 + text.count("stop_when_"), text


def test_a_bad_target_exits_2_before_ray_starts(tmp_path, capsys):
    from search.cli import main

    space = tmp_path / "space.yaml"
    space.write_text("experiment: {stop_when: {val_acc: '=> 0.9'}}\n")
    assert main(["--space", str(space)]) == 2
    err = capsys.readouterr().err
    assert "experiment.stop_when" in err and "=> 0.9" in err and "Traceback" not in err


def test_a_function_trainables_own_metric_may_be_a_target(tmp_path):
    from search.searching.budget import targets_of

    raw = {"trainable": "train.py:train", "experiment": {"metric": "mae", "mode": "min", "stop_when": {"mae": 0.05}},
           "space": {"lr": {"distribution": "float", "low": 0.1, "high": 1.0}}}
    assert targets_of(parse_space(raw, source=str(tmp_path / "s.yaml")).experiment)[0].op == "<="
    raw["experiment"]["stop_when"] = {"mae": "less than 0.05"}
    with pytest.raises(ConfigError, match=r"experiment\.stop_when\.mae: must be null or a mapping of a metric the function"):
        parse_space(raw, source=str(tmp_path / "s.yaml"))


def test_a_target_no_report_holds_is_said_once(tmp_path, capsys):
    from search.searching.budget import Budget
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage

    raw = {"trainable": "train.py:train", "experiment": {"metric": "mae", "mode": "min", "stop_when": {"maee": 0.05}},
           "space": {"lr": {"distribution": "float", "low": 0.1, "high": 1.0}}}
    budget = Budget(RunFolder(Storage.at(str(tmp_path)), "typo"), parse_space(raw, source=str(tmp_path / "s.yaml")).experiment)
    for number in (0, 1):
        assert not budget.observe({"mae": 0.01, "trial_number": number, "epoch": 1})
    err = capsys.readouterr().err
    assert err.count("note: experiment.stop_when names maee, which trial #0's report does not hold") == 1, err


def test_the_summary_says_what_ended_it():
    note = ended_note({"ended_by": "time_budget", "time_budget": 60.0, "num_samples": 1000}, 7)
    assert note.startswith("ended by time_budget 60s after 7 of 1000 trials")
    note = ended_note({"ended_by": "time_budget", "time_budget": 60.0, "num_samples": 1000, "after_seconds": 61.04}, 7)
    assert note.startswith("ended by time_budget 60s (noticed 61.0 s after the search's start) after 7 of 1000 trials")
    note = ended_note({"ended_by": "stop_when", "metric": "val_acc", "target": 0.9, "value": 0.93,
                       "trial_number": 3, "epoch": 2, "num_samples": 16}, 5)
    assert note.startswith("ended by stop_when val_acc: 0.9 (trial #3 reached 0.9300 at epoch 2) after 5 of 16")
    assert ended_note(None, 3) is None


def test_a_resume_may_change_only_the_budget_keys(tmp_path):
    from search.cli import main

    space = tmp_path / "space.yaml"
    space.write_text("experiment: {name: x}\n")
    assert main(["--space", str(space), "--resume", "--set", "experiment.seed=3", "--epochs", "2"]) == 2
    assert main(["--space", str(space), "--more-trials", "5"]) == 2


def test_more_trials_adds_to_the_stored_num_samples_or_to_the_trials_a_budget_let_run(tmp_path, data_root):
    from search.cli import parse_args, resume_assignments
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage

    folder = RunFolder(Storage.at(str(tmp_path)), "seven")
    folder.claim()
    folder.write_spec(small_space(tmp_path, data_root, experiment={"num_samples": 7}))
    mnist = str(Path(__file__).resolve().parents[3] / "spaces" / "mnist.yaml")
    args = parse_args(["--space", mnist, "--resume", "--name", "seven", "--storage-path", str(tmp_path),
                       "--more-trials", "5"])
    assert ("experiment.num_samples", 12) in resume_assignments(args)  # the space file says 16
    # a budget ended it after 3 trials: num_samples 7 was a ceiling, and 5 more means 5 more than it ran
    import pandas as pd
    import yaml

    from search.searching.budget import ENDED_FILE

    pd.DataFrame({"trial_id": ["a", "a", "b", "c"], "epoch": [1, 2, 1, 1]}).to_parquet(
        Path(folder.path) / "results.parquet")
    (Path(folder.path) / ENDED_FILE).write_text(yaml.safe_dump({"ended_by": "time_budget", "num_samples": 7}))
    assert ("experiment.num_samples", 8) in resume_assignments(args)


def test_a_target_or_a_spent_budget_ends_the_search_and_stops_running_trials(tmp_path, data_root):
    from ray.tune.search import Searcher

    from search.searching.budget import budgeted, read_ended
    from search.store.run_folder import RunFolder
    from search.searching.searcher import make_searcher
    from search.store.storage import Storage

    space = small_space(tmp_path, data_root, experiment={"stop_when": {"val_loss": 0.2}, "time_budget": "1h"})
    folder = RunFolder(Storage.at(str(tmp_path)), "target")
    folder.claim()
    search, stop = budgeted(make_searcher(space), folder, space)
    assert search.searcher.suggest("t0")["trial_number"] == 0  # the first ask starts the clock
    assert not stop("t0", {"val_loss": 0.25, "epoch": 1, "config": {"trial_number": 0}})
    assert stop("t1", {"val_loss": 0.19, "epoch": 2, "config": {"trial_number": 1}})
    assert stop("t0", {"val_loss": 0.3, "epoch": 2, "config": {"trial_number": 0}})  # at its next epoch end
    assert search.is_finished() and search.searcher.suggest("t2") == Searcher.FINISHED
    ended = read_ended(folder)
    assert (ended["ended_by"], ended["trial_number"], ended["epoch"], ended["value"]) == ("stop_when", 1, 2, 0.19)
    assert ended["op"] == "<=" and "val_loss: <= 0.2 (trial #1 reached 0.1900" in ended_note(ended, 2)

    spent = RunFolder(Storage.at(str(tmp_path)), "spent")
    spent.claim()
    search, stop = budgeted(make_searcher(space), spent, space)
    search.searcher.suggest("t0")
    stop.budget.started -= 3601  # an hour and a second ago
    assert stop("t0", {"val_loss": 0.5, "epoch": 1}) and read_ended(spent)["ended_by"] == "time_budget"
    assert search.is_finished() and stop.stop_all() is False  # running trials end at their epoch end, not at once


def test_a_resume_gets_spec_yamls_budget_and_more_trials_and_its_stopper_copy_follows(tmp_path, data_root):
    """Tune brings back the searcher (tuner.pkl, then set_state) and the stopper (its runner snapshot)
    as separate copies; both take spec.yaml's settings and one clock, and the trials started stand."""
    import ray.cloudpickle as pickle  # as Tune pickles tuner.pkl and its runner snapshot

    from ray.tune.search import Searcher

    from search.searching.budget import budgeted, read_ended, read_record
    from search.store.run_folder import RunFolder
    from search.searching.searcher import make_searcher
    from search.store.storage import Storage

    # two slots: the searcher hands out both trials before either reports
    space = small_space(tmp_path, data_root, experiment={"num_samples": 2, "max_concurrent": 2,
                                                         "stop_when": {"val_acc": 0.9}})
    folder = RunFolder(Storage.at(str(tmp_path)), "resumed")
    folder.claim()
    folder.write_spec(space)
    search, stop = budgeted(make_searcher(space), folder, space)
    for t in range(2):
        assert search.searcher.suggest(f"t{t}")["trial_number"] == t
    assert search.searcher.suggest("t2") == Searcher.FINISHED and search.is_finished() and read_ended(folder) is None
    saved = search.searcher.get_state()

    # the resume: num_samples 3, a 30 s budget, a target on val_loss instead
    folder.write_spec(small_space(tmp_path, data_root, experiment={"num_samples": 3, "max_concurrent": 2,
                                                                   "time_budget": 30,
                                                                   "stop_when": {"val_loss": "<= 0.1"}}))
    searcher_copy, stopper_copy = pickle.loads(pickle.dumps(search)), pickle.loads(pickle.dumps(stop))
    searcher_copy.searcher.set_state(saved)
    assert not searcher_copy.is_finished() and searcher_copy.searcher.budget.trials_started == 2
    started = read_record(folder)["started_at"]
    assert not stopper_copy("t1", {"val_acc": 0.95, "val_loss": 0.5})  # the old target is gone
    assert stopper_copy.budget.started == started == searcher_copy.searcher.budget.started  # one clock
    assert stopper_copy("t1", {"val_loss": 0.05, "epoch": 1}) and read_ended(folder) is None  # the copy writes nothing
    searcher_copy.searcher.on_trial_complete("t1", {"val_loss": 0.05, "epoch": 1, "config/trial_number": 1})
    assert read_ended(folder)["trial_number"] == 1 and searcher_copy.searcher.suggest("t3") == Searcher.FINISHED
    assert searcher_copy.searcher.budget.num_samples == 3
    # so does the progress line's total (Tune restores its Progress callback pickled at the start)
    from search.execution.progress import Progress

    assert pickle.loads(pickle.dumps(Progress(folder, space))).total == 3


def test_a_resume_takes_a_flag_that_lifts_a_target_the_file_never_had(tmp_path):
    """The target came from a flag at the start; the file has none: `--set experiment.stop_when=null` on the
    resume equals the file's value, and is still the user's ask."""
    from search.searching.budget import resume_changes
    from search.cli import load_space

    space_file = tmp_path / "space.yaml"
    space_file.write_text("space:\n  lr: {distribution: float, low: 0.01, high: 0.3}\n")
    stored = load_space(str(space_file), [("experiment.stop_when", {"val_acc": 0.9})])
    assert resume_changes(load_space(str(space_file), [("experiment.stop_when", None)]), stored) == {"stop_when": None}
    assert resume_changes(load_space(str(space_file), []), stored) == {}, "no flag: spec.yaml's target stays"
