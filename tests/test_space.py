"""The space file: every shipped file loads; bad files fail with exit 2 naming key, rule, value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from search.cli import apply_overrides, parse_args
from search.space import parse_space
from trainable.errors import ConfigError
from trainable.yaml_file import read_yaml_mapping

REPO = Path(__file__).resolve().parents[1]
SPACES = sorted((REPO / "spaces").glob("*.yaml"))


def lr_space(**lr):
    return {"space": {"lr": {"distribution": "loguniform", **lr}}}


def problems_of(raw) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_space(raw)
    return caught.value.problems


@pytest.mark.parametrize("path", SPACES, ids=[p.name for p in SPACES])
def test_every_shipped_space_is_valid(path):
    space = parse_space(read_yaml_mapping(path), source=str(path))
    assert space.searched, "a shipped space searches something"
    space.trial_defaults()  # the fixed part alone is a valid trial config
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each space file opens with a comment saying what it tunes"
    assert f"--space spaces/{path.name}" in path.read_text(), "and the command that runs it"


def test_shipped_mnist_space_searches_the_four_fields():
    space = parse_space(read_yaml_mapping(REPO / "spaces" / "mnist.yaml"))
    kinds = {d.name: d.distribution for d in space.searched}
    assert kinds == {"lr": "loguniform", "batch_size": "choice", "t_max": "randint", "clip_norm": "loguniform"}
    batch = next(d for d in space.searched if d.name == "batch_size")
    assert all(b % 8 == 0 for b in batch.values)


@pytest.mark.parametrize("raw, expected", [
    (lr_space(low=0, high=1), "space.lr.low: must be > 0 for loguniform, got 0"),
    (lr_space(low=0.5, high=0.1), "space.lr.low: must be < high (0.1), got 0.5"),
    (lr_space(low=0.1), "space.lr.high: must be a number for loguniform, got None"),
    ({"space": {"batch_size": {"distribution": "choice", "values": []}}},
     "space.batch_size.values: must be a non-empty list, got []"),
    ({"space": {"batch_size": {"distribution": "choice", "values": [64, 0]}}},
     "space.batch_size.values[1]: must be > 0, got 0"),
    ({"space": {"batch_size": {"distribution": "choice", "values": [64, 12.5]}}},
     "space.batch_size.values[1]: must be an integer, got 12.5"),
    ({"space": {"t_max": {"distribution": "randint", "low": 2.5, "high": 6}}},
     "space.t_max.low: must be an integer for randint, got 2.5"),
    ({"space": {"lr": {"distribution": "normal", "low": 1, "high": 2}}},
     "space.lr.distribution: must be one of loguniform, uniform, randint, choice, got 'normal'"),
    ({"space": {"learning_rate": 0.1}}, "space.learning_rate: unknown field of the trial config, got 0.1"),
    ({"space": {"seed": 3}}, "space.seed: cannot be searched: it is set by the driver, got 3"),
    ({"resources": {"gpus": -1}}, "resources.gpus: must be a number >= 0"),
    ({"resources": {"gpus": 1.5}}, "resources.gpus: must be a number >= 0, a fraction only below 1"),
    ({"experiment": {"scheduler": "hyperband"}}, "experiment.scheduler: must be one of fifo, asha, got 'hyperband'"),
    ({"experiment": {"metric": "accuracy"}}, "experiment.metric: must be a metric the trainable reports"),
    ({"experiment": {"num_samples": "many"}}, "experiment.num_samples: must be an integer > 0, got 'many'"),
    ({"experiment": {"colour": "blue"}}, "experiment.colour: unknown key"),
    ({"training": {"lr": 0.1}, "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}},
     "space.lr: is also fixed in the training section; set it in one place"),
    ({"training": {"dataset": "mnist"}}, "training.dataset: belongs in the data section"),
    ({"data": {"dataset": "cifar10"}}, "data.dataset: must be one of mnist, fashion_mnist, kmnist, got 'cifar10'"),
    ({"data": {"persistent_workers": True}}, "data.persistent_workers: needs num_workers > 0, got True"),
    ({"optimiser": {}}, "optimiser: unknown section"),
    ({"space": {"lr": {"distribuion": "loguniform", "low": 0.01, "high": 0.1}}},
     "space.lr.distribuion: unknown key (known: distribution, high, low, values), got 'loguniform'"),
    ({"space": {"lr": {"low": 0.01, "high": 0.1}}}, "space.lr: needs a distribution key"),
    ({"training": {"epochs": 2}}, "space: must search at least one field"),
    ({"data": {"train_size": 55000}, "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}},
     "data.train_size: train_size + val_size must be <= 60000 (the official training set), got 55000 + 10000"),
])
def test_bad_input_names_key_rule_and_value(raw, expected):
    assert any(p.startswith(expected) for p in problems_of(raw)), problems_of(raw)


def test_every_problem_is_reported_at_once():
    raw = {"experiment": {"mode": "up", "max_concurrent": 0}, "resources": {"cpus": 0},
           "space": {"lr": {"distribution": "loguniform", "low": -1, "high": 1},
                     "batch_size": {"distribution": "choice", "values": [-8]}}}
    keys = {p.split(":")[0] for p in problems_of(raw)}
    assert keys == {"experiment.mode", "experiment.max_concurrent", "resources.cpus",
                    "space.lr.low", "space.batch_size.values[0]"}


def test_plain_values_in_space_are_fixed_and_lists_can_be_chosen():
    space = parse_space({"space": {"momentum": 0.5, "hidden_sizes": {"distribution": "choice",
                                                                      "values": [[64], [128, 64]]}}})
    assert space.fixed["momentum"] == 0.5
    assert space.searched[0].values == ((64,), (128, 64))


def test_overrides_set_any_key_and_are_validated_like_the_file():
    args = parse_args(["--space", "x.yaml", "--epochs", "3", "--gpus-per-trial", "0.5",
                       "--set", "space.lr.high=0.5", "--set", "training.momentum=0.8"])
    raw = apply_overrides(yaml.safe_load((REPO / "spaces" / "mnist.yaml").read_text()), args)
    space = parse_space(raw)
    assert space.fixed["epochs"] == 3 and space.fixed["momentum"] == 0.8
    assert space.resources.gpus == 0.5
    assert next(d for d in space.searched if d.name == "lr").high == 0.5
    with pytest.raises(ConfigError) as caught:
        apply_overrides({}, parse_args(["--space", "x", "--set", "no-equals-sign"]))
    assert caught.value.problems == ["--set: must be section.key=value, got 'no-equals-sign'"]


def run_cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "search", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_cli_bad_file_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("space:\n  lr: {distribution: loguniform, low: 0, high: 1}\n"
                   "  batch_size: {distribution: choice, values: [64, -1]}\n")
    done = run_cli("--space", str(bad), "--storage-path", str(tmp_path / "runs"))
    assert done.returncode == 2
    assert "space.lr.low: must be > 0 for loguniform, got 0" in done.stderr
    assert "space.batch_size.values[1]: must be > 0, got -1" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists(), "nothing starts before the file is valid"


def test_cli_yaml_syntax_error_names_the_line(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("experiment:\n  name: x\n  seed: [1, 2\n")
    done = run_cli("--space", str(bad))
    assert done.returncode == 2
    assert f"{bad}: invalid YAML at line" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_bad_flag_value_exits_2(tmp_path):
    done = run_cli("--space", "spaces/mnist.yaml", "--scheduler", "pbt", "--max-concurrent", "0")
    assert done.returncode == 2
    assert "experiment.scheduler: must be one of fifo, asha, got 'pbt'" in done.stderr
    assert "experiment.max_concurrent: must be an integer > 0, got 0" in done.stderr


def test_cli_resume_without_a_run_exits_2(tmp_path):
    done = run_cli("--space", "spaces/mnist.yaml", "--resume", "--storage-path", str(tmp_path))
    assert done.returncode == 2
    assert "--resume: no run named mnist-* under" in done.stderr
    assert "Traceback" not in done.stderr


def test_numbers_in_scientific_notation_are_numbers(tmp_path):
    path = tmp_path / "sci.yaml"
    path.write_text("space:\n  lr: {distribution: loguniform, low: 1e-3, high: 3E-1}\n  weight_decay: 5e-4\n")
    space = parse_space(read_yaml_mapping(path))
    assert (space.searched[0].low, space.searched[0].high) == (0.001, 0.3)
    assert space.fixed["weight_decay"] == 0.0005
    args = parse_args(["--space", "x", "--set", "space.lr.high=5e-1"])
    assert apply_overrides({}, args)["space"]["lr"]["high"] == 0.5
