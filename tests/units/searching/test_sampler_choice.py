"""`sampler: auto` (search/searching/choice.py): the sampler each kind of search gets, the line that says
why, and a resume that keeps the choice made at the start even where the same rules would now choose another."""

from __future__ import annotations

import copy

import pytest
import yaml

from search.definition.space import parse_space
from search.execution.preflight import spec_for_resume
from search.searching.choice import GP_TRIALS, resolved
from search.searching.searcher import make_searcher
from search.store.run_folder import RunFolder
from search.store.storage import Storage

NUMERIC = {"lr": {"distribution": "float", "low": 0.001, "high": 0.3, "log": True},
           "clip_norm": {"distribution": "float", "low": 0.5, "high": 5.0},
           "t_max": {"distribution": "int", "low": 2, "high": 6}}
CHOICE = {"optimizer": {"distribution": "choice", "values": ["sgd", "adam"]}}
CONDITIONAL = {"momentum": {"distribution": "float", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}}}


def function_space(tmp_path, space, **experiment):
    """A function trainable's space file (metrics of its own names), parsed; `experiment`: keys to set."""
    (tmp_path / "toy.py").write_text("def train(config, report, checkpoint=None):\n    report(score=1.0, size=1.0)\n")
    raw = {"trainable": "toy.py:train",
           "experiment": {"metric": "score", "mode": "max", "num_samples": 30, "storage_path": str(tmp_path / "runs"),
                          **experiment},
           "training": {"epochs": 4},
           "space": copy.deepcopy(space)}
    return parse_space(raw, source=str(tmp_path / "space.yaml"))


def chosen(tmp_path, space, **experiment):
    out = resolved(function_space(tmp_path, space, **experiment))
    return out.experiment.sampler, out.sampler_choice


def test_auto_is_the_default(tmp_path):
    assert function_space(tmp_path, NUMERIC).experiment.sampler == "auto"


def test_a_space_of_numbers_gets_a_gp(tmp_path):
    assert chosen(tmp_path, NUMERIC) == ("gp", "sampler auto: gp (3 numeric parameters, 30 trials)")


def test_a_choice_gets_tpe(tmp_path):
    assert chosen(tmp_path, {**NUMERIC, **CHOICE}) == \
        ("tpe", "sampler auto: tpe (1 choice among 4 searched keys, 30 trials)")


def test_a_conditional_key_gets_tpe(tmp_path):
    sampler, why = chosen(tmp_path, {**CHOICE, **CONDITIONAL, **NUMERIC})
    assert (sampler, why) == ("tpe", "sampler auto: tpe (1 conditional key of 5 searched keys, 30 trials)")


def test_several_objectives_get_a_gp_while_trials_are_few_and_nsga2_after(tmp_path):
    few = chosen(tmp_path, NUMERIC, metric=["score", "size"], mode=["max", "min"])
    many = chosen(tmp_path, NUMERIC, metric=["score", "size"], mode=["max", "min"], num_samples=GP_TRIALS + 1)
    assert few == ("gp", "sampler auto: gp (3 numeric parameters, 30 trials, 2 objectives)")
    assert many[0] == "nsga2" and f"past {GP_TRIALS} trials" in many[1]


def test_constraints_are_named_and_keep_the_model_based_choice(tmp_path):
    # GPSampler and TPE both read a finished trial's constraints (ordered.py tells them): their constrained variants
    assert chosen(tmp_path, NUMERIC, constraints=["size <= 3"]) == \
        ("gp", "sampler auto: gp (3 numeric parameters, 30 trials, 1 constraint)")
    assert chosen(tmp_path, {**NUMERIC, **CHOICE}, constraints=["size <= 3"])[0] == "tpe"


def test_one_objective_past_the_gp_budget_gets_tpe(tmp_path):
    assert chosen(tmp_path, NUMERIC, num_samples=GP_TRIALS)[0] == "gp"
    assert chosen(tmp_path, NUMERIC, num_samples=GP_TRIALS + 1)[0] == "tpe"


def test_early_stopping_gets_tpe_which_learns_from_stopped_trials(tmp_path):
    for scheduler in ("asha", "hyperband"):
        assert chosen(tmp_path, NUMERIC, scheduler=scheduler)[0] == "tpe"


def test_a_named_sampler_is_kept(tmp_path):
    assert chosen(tmp_path, NUMERIC, sampler="random") == ("random", None)


def test_the_searcher_runs_the_choice(tmp_path):
    searcher = make_searcher(function_space(tmp_path, NUMERIC)).searcher  # behind the ConcurrencyLimiter
    assert searcher.sampler == "gp"


def test_a_resume_keeps_the_choice_its_run_made(tmp_path):
    """The run chose gp for 30 trials; resumed with 500 (where the rules would now choose tpe), it still runs gp,
    and spec.yaml, the summary's source, says why from the start."""
    space = resolved(function_space(tmp_path, NUMERIC))
    folder = RunFolder(Storage.at(space.experiment.storage_path), "run")
    folder.write_spec(space)
    written = yaml.safe_load((tmp_path / "runs" / "run" / "spec.yaml").read_text())
    assert written["experiment"]["sampler"] == "gp"
    assert written["run"]["sampler_choice"] == "sampler auto: gp (3 numeric parameters, 30 trials)"
    larger = function_space(tmp_path, NUMERIC, num_samples=GP_TRIALS + 300)
    assert resolved(larger).experiment.sampler == "tpe"  # what a new run of it would choose
    stored, _ = spec_for_resume(larger, folder)
    assert stored.experiment.num_samples == GP_TRIALS + 300  # the resume's change is taken ...
    assert stored.experiment.sampler == "gp"  # ... and the choice is not made again
    assert stored.sampler_choice == "sampler auto: gp (3 numeric parameters, 30 trials)"


@pytest.mark.parametrize("path", ["spaces/mnist.yaml", "spaces/multi_objective.yaml"])
def test_the_shipped_spaces_say_auto_and_say_why(path):
    from tests.conftest import REPO

    space = parse_space(yaml.safe_load((REPO / path).read_text()), source=str(REPO / path))
    assert space.experiment.sampler == "auto"
    out = resolved(space)
    assert out.experiment.sampler == "tpe" and out.sampler_choice.startswith("sampler auto: tpe (1 choice")


def test_the_summary_names_a_cheaper_sampler_when_suggestions_take_a_tenth_of_the_slots():
    import pandas as pd

    from search.searching.notes import searcher_cost

    # two trials, two rows each (suggest_seconds is on every row of a trial); 2 slots over 20 s: 40 slot-seconds
    frame = pd.DataFrame({"trial_id": ["a", "a", "b", "b"], "suggest_seconds": [2.5, 2.5, 1.5, 1.5]})
    slot_seconds = 20.0 * 2
    line = searcher_cost("gp", frame, slot_seconds)
    assert "the searcher's own time was 10% of the slots' time (4.0 s of suggestions)" in line
    assert "experiment.sampler tpe costs less" in line
    assert searcher_cost("gp", frame.assign(suggest_seconds=[1.0, 1.0, 1.0, 1.0]), slot_seconds) == ""  # 5%
