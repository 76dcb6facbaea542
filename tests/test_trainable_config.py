"""TrialConfig: defaults are valid, bad values are rejected naming field, rule and value, all at once."""

from __future__ import annotations

import math

import pytest

from trainable.config import DATASETS, FIELDS, TrialConfig
from trainable.data import TORCHVISION_SETS
from trainable.errors import ConfigError


def problems_of(**values) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        TrialConfig(**values)
    return caught.value.problems


def test_defaults_are_valid_and_round_trip_through_plain_data():
    config = TrialConfig()
    plain = config.to_dict()
    assert plain["hidden_sizes"] == list(config.hidden_sizes)  # a list: YAML/Parquet friendly
    assert set(plain) == set(FIELDS)
    assert TrialConfig.from_mapping(plain) == config


def test_datasets_are_the_torchvision_sets():
    assert tuple(TORCHVISION_SETS) == DATASETS


@pytest.mark.parametrize("field, value, message", [
    ("lr", 0, "lr: must be > 0, got 0"),
    ("lr", -0.1, "lr: must be > 0, got -0.1"),
    ("lr", math.nan, "lr: must be > 0, got nan"),
    ("batch_size", 0, "batch_size: must be > 0, got 0"),
    ("epochs", -1, "epochs: must be > 0, got -1"),
    ("t_max", 0, "t_max: must be > 0 (epochs), got 0"),
    ("momentum", 1.0, "momentum: must be in [0, 1), got 1.0"),
    ("weight_decay", -1e-4, "weight_decay: must be >= 0, got -0.0001"),
    ("clip_norm", 0.0, "clip_norm: must be > 0 (or null to disable), got 0.0"),
    ("train_size", 0, "train_size: must be > 0, got 0"),
    ("val_size", -5, "val_size: must be > 0, got -5"),
    ("split_seed", -1, "split_seed: must be >= 0, got -1"),
    ("seed", -1, "seed: must be in [0, 2**63), got -1"),
    ("num_workers", -1, "num_workers: must be >= 0, got -1"),
    ("num_threads", 0, "num_threads: must be > 0 (or null for torch's default), got 0"),
    ("hidden_sizes", (), "hidden_sizes: must be a non-empty list of positive integers, got ()"),
    ("hidden_sizes", (64, 0), "hidden_sizes: must be a non-empty list of positive integers, got (64, 0)"),
    ("dataset", "cifar10", "dataset: must be one of mnist, fashion_mnist, kmnist, got 'cifar10'"),
    ("optimizer", "rmsprop", "optimizer: must be one of sgd, adam, got 'rmsprop'"),
    ("source", "disk", "source: must be one of memory, loader, got 'disk'"),
])
def test_a_bad_value_names_field_rule_and_value(field, value, message):
    assert problems_of(**{field: value}) == [message]


def test_the_error_message_lists_every_problem():
    with pytest.raises(ConfigError) as caught:
        TrialConfig(lr=0, batch_size=0)
    text = str(caught.value)
    assert "2 problem(s)" in text
    assert "lr: must be > 0, got 0" in text
    assert "batch_size: must be > 0, got 0" in text


def test_persistent_workers_need_workers():
    assert problems_of(persistent_workers=True) == ["persistent_workers: needs num_workers > 0, got True"]
    assert TrialConfig(persistent_workers=True, num_workers=2).persistent_workers


@pytest.mark.parametrize("field, value, rule", [
    ("batch_size", "big", "must be an integer"),
    ("batch_size", 64.0, "must be an integer"),
    ("batch_size", True, "must be an integer"),
    ("lr", "0.1", "must be a number"),
    ("pin_memory", "yes", "must be true or false"),
    ("hidden_sizes", "256", "must be a list of integers"),
    ("hidden_sizes", [256, 12.5], "must be a list of integers"),
    ("dataset", 3, "must be a string"),
    ("epochs", None, "must not be empty"),
])
def test_from_mapping_rejects_wrong_types(field, value, rule):
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_mapping({field: value})
    assert caught.value.problems == [f"{field}: {rule}, got {value!r}"]


def test_from_mapping_converts_plain_data():
    config = TrialConfig.from_mapping({"lr": 1, "hidden_sizes": [64, 32], "clip_norm": None, "batch_size": 32})
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.hidden_sizes == (64, 32)
    assert config.clip_norm is None
    assert config.batch_size == 32


def test_from_mapping_rejects_unknown_keys():
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_mapping({"learning_rate": 0.1})
    assert caught.value.problems == ["learning_rate: unknown field of the trial config, got 0.1"]


def test_from_mapping_reports_all_problems_at_once():
    """An unknown key, a wrong type and a broken rule in one mapping: four problems, one error."""
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_mapping({"colour": "red", "batch_size": "big", "lr": 0, "momentum": 2})
    problems = caught.value.problems
    assert len(problems) == 4, problems
    assert any(p.startswith("colour: unknown field") for p in problems)
    assert "batch_size: must be an integer, got 'big'" in problems
    assert any(p.startswith("lr: must be > 0, got 0") for p in problems)
    assert any(p.startswith("momentum: must be in [0, 1), got 2") for p in problems)


def test_from_mapping_prefixes_keys():
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_mapping({"lr": 0, "colour": "red"}, prefix="trial.")
    assert all(p.startswith("trial.") for p in caught.value.problems)
    assert any(p.startswith("trial.colour:") for p in caught.value.problems)
