"""`python -m trainable`: one run from flags or a YAML file; bad input exits 2 without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainable.__main__ import main, parse_args, trial_config
from trainable.config import TrialConfig
from trainable.device import get_default_device
from trainable.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
SMALL_FLAGS = ["--train-size", "2000", "--val-size", "500"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # timeout only guards against a hang; a run here takes a few seconds
    return subprocess.run([sys.executable, "-m", "trainable", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def epoch_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("Epoch [")]


@pytest.mark.slow
def test_cli_trains_from_flags(data_root):
    result = run_cli("--data-root", str(data_root), *SMALL_FLAGS, "--epochs", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"device: {get_default_device()}")
    assert "2000 train / 500 val" in result.stdout
    lines = epoch_lines(result.stdout)
    assert len(lines) == 2
    assert lines[0].startswith("Epoch [1/2]")
    assert lines[1].startswith("Epoch [2/2]")
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_cli_bad_values_exit_2_with_every_problem_and_no_traceback(data_root):
    result = run_cli("--data-root", str(data_root), "--lr", "0", "--batch-size", "0")
    assert result.returncode == 2
    assert "lr: must be > 0" in result.stderr
    assert "batch_size: must be > 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not epoch_lines(result.stdout)


def best_yaml(path: Path, **fields) -> Path:
    """A file shaped like a search's best.yaml: config fields, seed, and the outcome under `result`."""
    data = {**TrialConfig(**fields).to_dict(), "result": {"val_acc": 0.97, "test_acc": 0.96, "trial_id": "t0"}}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_cli_runs_a_best_yaml_and_flags_override_it(data_root, tmp_path):
    config = best_yaml(tmp_path / "best.yaml", train_size=2000, val_size=500, epochs=3, seed=7)
    result = run_cli("--config", str(config), "--data-root", str(data_root), "--epochs", "1")
    assert result.returncode == 0, result.stderr
    assert "seed: 7" in result.stdout.splitlines()[0]  # from the file
    lines = epoch_lines(result.stdout)
    assert len(lines) == 1 and lines[0].startswith("Epoch [1/1]")  # the flag wins over epochs: 3


def test_config_precedence_defaults_file_flags(tmp_path):
    config = best_yaml(tmp_path / "best.yaml", lr=0.2, batch_size=32, seed=7)
    parsed = trial_config(parse_args(["--config", str(config), "--lr", "0.01", "--hidden-sizes", "[64, 32]"]))
    assert parsed.lr == 0.01  # flag over file
    assert parsed.hidden_sizes == (64, 32)  # flags are read as YAML
    assert parsed.batch_size == 32 and parsed.seed == 7  # file over defaults
    assert parsed.momentum == TrialConfig().momentum  # defaults for the rest


def test_config_file_problems_are_all_reported(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0\ncolour: red\nresult: {val_acc: 0.9}\n")
    with pytest.raises(ConfigError) as caught:
        trial_config(parse_args(["--config", str(path)]))
    problems = caught.value.problems
    assert any(p.startswith("colour: unknown field") for p in problems)
    assert any(p.startswith("lr: must be > 0") for p in problems)
    assert not any(p.startswith("result") for p in problems)  # informational, ignored


@pytest.mark.parametrize("text, expected", [
    ("lr: [0.1\n", "invalid YAML at line"),
    ("- 1\n- 2\n", "must hold a mapping"),
])
def test_unreadable_config_file_exits_2(tmp_path, capsys, text, expected):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    assert main(["--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert expected in captured.err
    assert captured.out == ""


def test_missing_config_file_exits_2(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot be read" in capsys.readouterr().err
