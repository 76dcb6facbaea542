"""The schema: each searched field parsed once into an Optuna distribution, used the same way
by the searcher, the results columns, the study and spec.yaml."""

from __future__ import annotations


import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from search.store.results import results_schema
from search.definition.schema import label
from search.searching.searcher import suggest
from search.definition.space import example_config, parse_space, to_raw
from trainable.errors import ConfigError

MAPPINGS = [{"act": "relu", "depth": 2}, {"depth": 3, "act": "tanh"}]  # keys in two orders


def space_of(**searched):
    return parse_space({"space": searched})


def problems_of(**searched) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        space_of(**searched)
    return caught.value.problems


@pytest.mark.parametrize("spec, expected", [
    ({"distribution": "float", "low": 0.01, "high": 0.3, "log": True}, FloatDistribution(0.01, 0.3, log=True)),
    ({"distribution": "float", "low": 0.1, "high": 0.5, "step": 0.1}, FloatDistribution(0.1, 0.5, step=0.1)),
    ({"distribution": "loguniform", "low": 0.01, "high": 0.3}, FloatDistribution(0.01, 0.3, log=True)),
    ({"distribution": "uniform", "low": 0.1, "high": 0.3}, FloatDistribution(0.1, 0.3)),
])
def test_float_forms_and_their_aliases_are_one_distribution(spec, expected):
    (lr,) = space_of(lr=spec).searched
    assert lr.distribution == expected


@pytest.mark.parametrize("spec, expected", [
    ({"distribution": "int", "low": 16, "high": 256, "log": True}, IntDistribution(16, 256, log=True)),
    ({"distribution": "int", "low": 32, "high": 256, "step": 32}, IntDistribution(32, 256, step=32)),
    ({"distribution": "randint", "low": 16, "high": 256}, IntDistribution(16, 256)),
    # loguniform on an integer field always drew integers; the alias keeps that
    ({"distribution": "loguniform", "low": 16, "high": 256}, IntDistribution(16, 256, log=True)),
])
def test_int_forms_and_their_aliases_are_one_distribution(spec, expected):
    (batch,) = space_of(batch_size=spec).searched
    assert batch.distribution == expected


@pytest.mark.parametrize("searched, expected", [
    ({"batch_size": {"distribution": "float", "low": 16, "high": 256}},
     "space.batch_size.distribution: must be int or choice (batch_size is an integer field), got 'float'"),
    ({"lr": {"distribution": "float", "low": 0.01, "high": 0.3, "log": True, "step": 0.01}},
     "space.lr.step: cannot be combined with log: true (Optuna's rule), got 0.01"),
    ({"lr": {"distribution": "float", "low": 0.1, "high": 0.45, "step": 0.1}},
     "space.lr.step: must divide high - low (0.45 - 0.1), got 0.1"),
    ({"model.hidden": {"distribution": "int", "low": 16.5, "high": 256}},
     "space.model.hidden.low: must be an integer for int, got 16.5"),
    ({"model.hidden": {"distribution": "int", "low": 0, "high": 256, "log": True}},
     "space.model.hidden.low: must be > 0 for int with log, got 0"),
    ({"lr": {"distribution": "float", "low": 0.01, "high": 0.3, "log": "yes"}},
     "space.lr.log: must be true or false, got 'yes'"),
    ({"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3, "log": False}},
     "space.lr.log: unknown key for loguniform (known: distribution, high, low, when), got False"),
    ({"model.block": {"distribution": "choice", "values": [{"a": 1}, {"a": 1}]}},
     "space.model.block.values: must not repeat a value"),
])
def test_bad_distributions_name_key_rule_and_value(searched, expected):
    assert any(p.startswith(expected) for p in problems_of(**searched)), problems_of(**searched)


def test_an_integer_model_keyword_on_a_log_scale_draws_integers_everywhere():
    space = space_of(**{"model.hidden": {"distribution": "int", "low": 16, "high": 256, "log": True},
                        "lr": {"distribution": "float", "low": 0.01, "high": 0.3}})
    assert example_config(space).model_args["hidden"] == 16  # what the check before the search tries
    assert results_schema(space).field("model.hidden").type == "int64"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = [suggest(study.ask(), space.searched, experiment_seed=0)["model.hidden"] for _ in range(20)]
    assert all(type(v) is int and 16 <= v <= 256 for v in drawn)


def test_a_choice_of_mappings_is_labelled_one_way():
    space = space_of(**{"model.block": {"distribution": "choice", "values": MAPPINGS}})
    (block,) = space.searched
    assert block.distribution == CategoricalDistribution([label(v) for v in MAPPINGS])
    # a value read back in either key order is the same category of the distribution
    for value in MAPPINGS:
        assert block.param(dict(reversed(list(value.items())))) in block.distribution.choices
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = {str(suggest(study.ask(), space.searched, experiment_seed=0)["model.block"]) for _ in range(20)}
    assert drawn == {str(v) for v in MAPPINGS}  # the trial config gets the mappings, not their labels


@pytest.mark.parametrize("spec", [
    {"distribution": "int", "low": 16, "high": 256, "log": True},
    {"distribution": "int", "low": 32, "high": 256, "step": 32},
    {"distribution": "float", "low": 0.1, "high": 0.5, "step": 0.1},
    {"distribution": "choice", "values": MAPPINGS},
])
def test_spec_yaml_writes_the_canonical_form_that_reads_back_the_same(spec):
    space = space_of(**{"model.hidden": spec})
    again = parse_space(to_raw(space))
    assert again.searched == space.searched
    assert to_raw(again) == to_raw(space)
