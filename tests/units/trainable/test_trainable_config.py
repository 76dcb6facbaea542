"""TrialConfig: defaults are valid, bad values are rejected naming field, rule and value, all at once."""

from __future__ import annotations

import math

import pytest
import yaml

from trainable.config import BUILTIN_DATASETS, FIELDS, TrialConfig, is_reference
from trainable.data import TORCHVISION_SETS
from trainable.errors import ConfigError


def problems_of(**values) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        TrialConfig(**values)
    return caught.value.problems


def mapping_problems(values) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_mapping(values)
    return caught.value.problems


def test_defaults_are_valid_and_round_trip_through_plain_data():
    config = TrialConfig()
    nested, flat = config.to_dict(), config.to_flat()
    assert nested["model"] == {"factory": "mlp"}  # the factory's own defaults apply
    assert flat["model.factory"] == "mlp"
    # every field but the model pair appears under its own name in both forms
    assert set(nested) == set(FIELDS) - {"model_args"}
    assert set(flat) == set(FIELDS) - {"model", "model_args"} | {"model.factory"}
    assert TrialConfig.from_mapping(nested) == config
    assert TrialConfig.from_mapping(flat) == config


def test_nested_and_flat_forms_round_trip_with_model_and_data_args():
    config = TrialConfig(model="cnn", model_args={"channels": (8, 16), "hidden": 32, "opts": {"a": [1, 2]}},
                         dataset="data/sets.py:load", data_args={"n": 3}, train_size=1000, val_size=None)
    nested, flat = config.to_dict(), config.to_flat()
    assert nested["model"] == {"factory": "cnn", "channels": [8, 16], "hidden": 32, "opts": {"a": [1, 2]}}
    assert "model_args" not in nested and "model_args" not in flat
    assert {k: v for k, v in flat.items() if k.startswith("model.")} == {
        "model.factory": "cnn", "model.channels": [8, 16], "model.hidden": 32, "model.opts": {"a": [1, 2]}}
    assert flat["data_args"] == {"n": 3}
    # lists, not tuples: YAML, JSON and Parquet friendly, and what a file reads back as
    assert config.model_args["channels"] == [8, 16]
    assert TrialConfig.from_mapping(nested) == config
    assert TrialConfig.from_mapping(flat) == config
    assert TrialConfig.from_mapping(yaml.safe_load(yaml.safe_dump(nested))) == config
    # the two forms convert into each other through the config
    assert TrialConfig.from_mapping(nested).to_flat() == flat
    assert TrialConfig.from_mapping(flat).to_dict() == nested


def test_model_reads_as_a_bare_reference_or_a_mapping():
    assert TrialConfig.from_mapping({"model": "cnn"}) == TrialConfig(model="cnn")
    assert TrialConfig.from_mapping({"model": {"hidden_sizes": [64]}}) == TrialConfig(
        model_args={"hidden_sizes": [64]})
    assert TrialConfig.from_mapping({"model.factory": "cnn", "model.hidden": 8}) == TrialConfig(
        model="cnn", model_args={"hidden": 8})


def test_args_are_copied_so_the_caller_cannot_change_a_config():
    args = {"hidden_sizes": [64]}
    config = TrialConfig(model_args=args)
    args["hidden_sizes"].append(32)
    args["extra"] = 1
    assert config.model_args == {"hidden_sizes": [64]}


# configs a search really builds: defaults, a built-in model with keywords, and every field
# away from its default (user dataset and model references, nested keyword values)
REAL_CONFIGS = {
    "defaults": {},
    "cnn": {"model": "cnn", "model_args": {"channels": [8, 16], "hidden": 32}, "lr": 0.01, "clip_norm": 1.0},
    "every field set": {
        "dataset": "data/sets.py:load", "data_args": {"n": 3, "kind": {"a": [1, 2]}}, "train_size": 1000,
        "val_size": 200, "split_seed": 5, "source": "loader", "num_workers": 2, "pin_memory": False,
        "persistent_workers": True, "drop_last": True, "model": "models/net.py:make",
        "model_args": {"depth": 2, "act": "relu", "widths": [8, 16], "opts": {"p": 0.1}}, "epochs": 3,
        "optimizer": "adamw", "lr": 0.003, "momentum": 0.8, "nesterov": True, "beta1": 0.85, "beta2": 0.99,
        "weight_decay": 0.01, "batch_size": 64, "t_max": 3, "seed": 11, "num_threads": 1, "trial_number": 4},
    # a keyword named like the factory key would otherwise change the model on the way to YAML
    "a keyword named factory": {"model": "mlp", "model_args": {"factory": "cnn"}},
}


@pytest.mark.parametrize("values", REAL_CONFIGS.values(), ids=REAL_CONFIGS.keys())
def test_a_config_that_constructs_round_trips(values):
    """Nested (YAML) and flat (results columns) forms both read back as the same config."""
    try:
        config = TrialConfig(**values)
    except ConfigError as error:  # refusing the factory-named keyword is fine too; nothing else
        assert values.get("model_args", {}).get("factory") and "factory" in str(error), error
        return
    assert TrialConfig.from_mapping(config.to_dict()) == config
    assert TrialConfig.from_mapping(config.to_flat()) == config
    assert TrialConfig.from_mapping(yaml.safe_load(yaml.safe_dump(config.to_dict()))) == config
    # the values themselves came back, not defaults that happen to compare equal
    for name, value in values.items():
        assert getattr(TrialConfig.from_mapping(config.to_flat()), name) == value, name


def test_builtin_datasets_are_the_torchvision_sets():
    assert tuple(TORCHVISION_SETS) == BUILTIN_DATASETS
    for name in BUILTIN_DATASETS:
        assert TrialConfig(dataset=name).dataset == name


@pytest.mark.parametrize("reference, expected", [
    ("net.py:Net", True),
    ("models/net.py:make", True),
    ("/abs/path/net.py:Net", True),
    ("pkg.mod:Net", True),
    ("pkg:Net", True),
    ("mlp", False),
    ("net.py", False),
    ("pkg.mod:", False),
    ("pkg.mod:1x", False),
    (":Net", False),
])
def test_references_name_a_file_or_module_and_a_callable(reference, expected):
    assert is_reference(reference) is expected


def test_references_are_valid_datasets_and_models():
    config = TrialConfig(dataset="data.py:load", model="pkg.models:Net")
    assert (config.dataset, config.model) == ("data.py:load", "pkg.models:Net")


@pytest.mark.parametrize("field, value, message", [
    ("lr", 0, "lr: must be > 0 and <= 1e6, got 0"),
    ("lr", -0.1, "lr: must be > 0 and <= 1e6, got -0.1"),
    ("lr", math.nan, "lr: must be > 0 and <= 1e6, got nan"),
    ("lr", math.inf, "lr: must be > 0 and <= 1e6, got inf"),
    ("lr", 2e6, "lr: must be > 0 and <= 1e6, got 2000000.0"),
    ("batch_size", 0, "batch_size: must be in [1, 2**24], got 0"),
    ("batch_size", 2**24 + 1, "batch_size: must be in [1, 2**24], got 16777217"),
    ("epochs", -1, "epochs: must be in [1, 100000], got -1"),
    ("epochs", 100_001, "epochs: must be in [1, 100000], got 100001"),
    ("t_max", 0, "t_max: must be in [1, 100000] (epochs), got 0"),
    ("momentum", 1.0, "momentum: must be in [0, 1), got 1.0"),
    ("beta1", 1.0, "beta1: must be in [0, 1), got 1.0"),
    ("beta2", -0.1, "beta2: must be in [0, 1), got -0.1"),
    ("weight_decay", -1e-4, "weight_decay: must be in [0, 10], got -0.0001"),
    ("weight_decay", math.inf, "weight_decay: must be in [0, 10], got inf"),
    ("clip_norm", 0.0, "clip_norm: must be > 0 (or null to disable), got 0.0"),
    ("train_size", 0, "train_size: must be in [1, 10**9] (or null for the rest), got 0"),
    ("val_size", -5, "val_size: must be in [1, 10**9] (or null for a sixth), got -5"),
    ("split_seed", -1, "split_seed: must be in [0, 2**63), got -1"),
    ("seed", -1, "seed: must be in [0, 2**63), got -1"),
    ("seed", 2**63, "seed: must be in [0, 2**63), got 9223372036854775808"),
    ("num_workers", -1, "num_workers: must be in [0, 256], got -1"),
    ("num_threads", 0, "num_threads: must be in [1, 1024] (or null for torch's default), got 0"),
    ("dataset", "imagenet", "dataset: must be one of mnist, fashion_mnist, kmnist, cifar10 or "
                            "FILE.py:FUNCTION / package.module:FUNCTION, got 'imagenet'"),
    ("dataset", "data.py", "dataset: must be one of mnist, fashion_mnist, kmnist, cifar10 or "
                           "FILE.py:FUNCTION / package.module:FUNCTION, got 'data.py'"),
    ("model", "resnet", "model.factory: must be one of mlp, cnn or FILE.py:CALLABLE / "
                        "package.module:CALLABLE, got 'resnet'"),
    ("optimizer", "rmsprop", "optimizer: must be one of sgd, adam, adamw, got 'rmsprop'"),
    ("source", "disk", "source: must be one of memory, loader, got 'disk'"),
    ("model_args", {"hidden-sizes": [64]},
     "model.hidden-sizes: must name a keyword argument of the factory (a Python identifier), got [64]"),
    ("model_args", {"width": 2**63},
     "model.width: must be plain data (numbers within int64, strings, lists, mappings), got 9223372036854775808"),
    ("model_args", {"widths": [64, 2**64]},
     "model.widths: must be plain data (numbers within int64, strings, lists, mappings), "
     "got [64, 18446744073709551616]"),
])
def test_a_bad_value_names_field_rule_and_value(field, value, message):
    assert problems_of(**{field: value}) == [message]


def test_optional_sizes_and_new_fields_take_their_defaults():
    config = TrialConfig(optimizer="adamw", nesterov=True, beta1=0.8, beta2=0.99, train_size=None, val_size=None)
    assert (config.train_size, config.val_size) == (None, None)
    assert (config.optimizer, config.nesterov, config.beta1, config.beta2) == ("adamw", True, 0.8, 0.99)
    assert TrialConfig().train_size is None and TrialConfig().val_size is None


def test_the_error_message_lists_every_problem():
    with pytest.raises(ConfigError) as caught:
        TrialConfig(lr=0, batch_size=0)
    text = str(caught.value)
    assert "2 problem(s)" in text
    assert "lr: must be > 0 and <= 1e6, got 0" in text
    assert "batch_size: must be in [1, 2**24], got 0" in text


def test_persistent_workers_need_workers():
    assert problems_of(persistent_workers=True) == ["persistent_workers: needs num_workers > 0, got True"]
    assert TrialConfig(persistent_workers=True, num_workers=2).persistent_workers


def test_data_args_are_for_a_dataset_function_only():
    assert problems_of(data_args={"n": 1}) == [
        "data_args: is for a dataset function (FILE.py:FUNCTION); the built-in mnist takes no arguments, got {'n': 1}"]
    assert TrialConfig(dataset="data.py:load", data_args={"n": 1}).data_args == {"n": 1}


def test_sizes_are_not_checked_against_a_dataset_here():
    """A user's dataset has no size known before it loads; data.split checks the sum (test_trainable_data)."""
    config = TrialConfig(train_size=55_000, val_size=10_000)
    assert config.train_size + config.val_size > 60_000


@pytest.mark.parametrize("values, expected", [
    ({"batch_size": "big"}, "batch_size: must be an integer, got 'big'"),
    ({"batch_size": 64.0}, "batch_size: must be an integer, got 64.0"),
    ({"batch_size": True}, "batch_size: must be an integer, got True"),
    ({"lr": "0.1"}, "lr: must be a number, got '0.1'"),
    ({"pin_memory": "yes"}, "pin_memory: must be true or false, got 'yes'"),
    ({"nesterov": 1}, "nesterov: must be true or false, got 1"),
    ({"dataset": 3}, "dataset: must be a string, got 3"),
    ({"epochs": None}, "epochs: must not be empty, got None"),
    ({"model": {"factory": 3}}, "model.factory: must be a string, got 3"),
    ({"model": 3}, "model.factory: must be a string, got 3"),
    ({"model.2x": 1}, "model.2x: must name a keyword argument of the factory (a Python identifier), got 1"),
    ({"model": {"hidden sizes": [64]}},
     "model.hidden sizes: must name a keyword argument of the factory (a Python identifier), got [64]"),
    ({"model": {"width": 2**63}},
     "model.width: must be plain data (numbers within int64, strings, lists, mappings), got 9223372036854775808"),
    ({"data_args": [1]}, "data_args: must be a mapping of keyword arguments to plain values, got [1]"),
    ({"data_args": {"n": 2**63}},
     "data_args: must be a mapping of keyword arguments to plain values, got {'n': 9223372036854775808}"),
])
def test_from_mapping_rejects_wrong_types(values, expected):
    assert mapping_problems(values) == [expected]


def test_from_mapping_converts_plain_data():
    config = TrialConfig.from_mapping({"lr": 1, "model": {"hidden_sizes": [64, 32]}, "clip_norm": None,
                                       "batch_size": 32, "train_size": None})
    assert config.lr == 1.0 and isinstance(config.lr, float)
    assert config.model == "mlp"
    assert config.model_args == {"hidden_sizes": [64, 32]}
    assert config.clip_norm is None
    assert config.batch_size == 32
    assert config.train_size is None


def test_from_mapping_rejects_unknown_keys():
    assert mapping_problems({"learning_rate": 0.1}) == ["learning_rate: unknown field of the trial config, got 0.1"]
    # the dataclass field is not a key of either plain form: model.<key> is
    assert mapping_problems({"model_args": {"hidden_sizes": [64]}}) == [
        "model_args: unknown field of the trial config, got {'hidden_sizes': [64]}"]


def test_a_first_release_hidden_sizes_key_says_where_it_moved():
    assert mapping_problems({"hidden_sizes": [128]}) == ["hidden_sizes: moved to model.hidden_sizes, got [128]"]
    # with a prefix (a space file's or a best.yaml's context) too
    assert mapping_problems_prefixed({"hidden_sizes": [128]}, "trial.") == [
        "trial.hidden_sizes: moved to model.hidden_sizes, got [128]"]


def mapping_problems_prefixed(values, prefix: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        TrialConfig.from_mapping(values, prefix=prefix)
    return caught.value.problems


def test_from_mapping_reports_all_problems_at_once():
    """An unknown key, a wrong type, a broken rule and a bad model keyword: five problems, one error."""
    problems = mapping_problems({"colour": "red", "batch_size": "big", "lr": 0, "momentum": 2,
                                 "model": {"1st": 3}})
    assert len(problems) == 5, problems
    assert any(p.startswith("colour: unknown field") for p in problems)
    assert "batch_size: must be an integer, got 'big'" in problems
    assert any(p.startswith("lr: must be > 0 and <= 1e6, got 0") for p in problems)
    assert any(p.startswith("momentum: must be in [0, 1), got 2") for p in problems)
    assert any(p.startswith("model.1st: must name a keyword argument") for p in problems)


def test_from_mapping_prefixes_keys():
    problems = mapping_problems_prefixed({"lr": 0, "colour": "red", "model": {"2x": 1}}, "trial.")
    assert all(p.startswith("trial.") for p in problems)
    assert any(p.startswith("trial.colour:") for p in problems)
    assert any(p.startswith("trial.model.2x:") for p in problems)
