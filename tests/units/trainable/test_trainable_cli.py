"""`python -m trainable`: one run from flags or a YAML file; bad input exits 2 without a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from trainable.__main__ import main, parse_args, trial_config
from trainable.config import TrialConfig
from trainable.device import get_default_device
from trainable.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
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
    assert "lr: must be > 0 and <= 1e6, got 0" in result.stderr
    assert "batch_size: must be in [1, 2**24], got 0" in result.stderr
    assert "Traceback" not in result.stderr
    assert not epoch_lines(result.stdout)


def best_yaml(path: Path, **fields) -> Path:
    """A file shaped like a search's best.yaml: nested config fields (model: {factory, ...}), seed,
    and the outcome under `result`."""
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
    config = best_yaml(tmp_path / "best.yaml", lr=0.2, batch_size=32, seed=7, model_args={"hidden_sizes": [256]})
    parsed = trial_config(parse_args(["--config", str(config), "--lr", "0.01",
                                      "--set", "model.hidden_sizes=[64, 32]"]))
    assert parsed.lr == 0.01  # flag over file
    assert parsed.model_args == {"hidden_sizes": [64, 32]}  # --set over file, read as YAML
    assert parsed.batch_size == 32 and parsed.seed == 7  # file over defaults
    assert parsed.momentum == TrialConfig().momentum  # defaults for the rest


def test_a_best_yaml_keeps_its_model_and_flags_change_parts_of_it(tmp_path):
    config = best_yaml(tmp_path / "best.yaml", model="cnn", model_args={"channels": [8], "hidden": 32},
                       dataset="data.py:load", data_args={"n": 3}, optimizer="adamw", beta2=0.99)
    parsed = trial_config(parse_args(["--config", str(config)]))
    assert (parsed.model, parsed.model_args) == ("cnn", {"channels": [8], "hidden": 32})
    assert (parsed.data_args, parsed.optimizer, parsed.beta2) == ({"n": 3}, "adamw", 0.99)
    parsed = trial_config(parse_args(["--config", str(config), "--set", "model.hidden=64",
                                      "--set", "data_args={n: 4}"]))
    assert parsed.model_args == {"channels": [8], "hidden": 64}  # one keyword changed, the other kept
    assert parsed.data_args == {"n": 4}
    parsed = trial_config(parse_args(["--model", "mlp", "--set", "model.hidden_sizes=[16]", "--nesterov", "true"]))
    assert (parsed.model, parsed.model_args, parsed.nesterov) == ("mlp", {"hidden_sizes": [16]}, True)


@pytest.mark.parametrize("argv, expected", [
    (["--set", "no-equals-sign"], "--set: must be KEY=VALUE, got 'no-equals-sign'"),
    (["--set", "hidden_sizes=[64]"], "hidden_sizes: moved to model.hidden_sizes, got [64]"),
    (["--set", "model.2x=1"], "model.2x: must name a keyword argument of the factory (a Python identifier), got 1"),
    (["--model", "resnet"], "model.factory: must be one of mlp, cnn or FILE.py:CALLABLE / "
                            "package.module:CALLABLE, got 'resnet'"),
    (["--optimizer", "rmsprop"], "optimizer: must be one of sgd, adam, adamw, got 'rmsprop'"),
])
def test_bad_flags_name_the_key(argv, expected):
    with pytest.raises(ConfigError) as caught:
        trial_config(parse_args(argv))
    assert caught.value.problems == [expected]


def test_a_first_release_flag_is_refused(capsys):
    with pytest.raises(SystemExit) as caught:
        parse_args(["--hidden-sizes", "[64]"])
    assert caught.value.code == 2
    assert "unrecognized arguments: --hidden-sizes" in capsys.readouterr().err


USER_FILES = {
    "my_data.py": '''
        import torch

        def blobs(root, n=240):
            g = torch.Generator().manual_seed(0)
            y = torch.arange(n) % 3
            X = torch.randn(n, 4, generator=g) + 3 * torch.nn.functional.one_hot(y, 4).float()
            return (X, y), None
        ''',
    "my_model.py": '''
        from torch import nn

        def Net(input_shape, num_classes, width=16):
            return nn.Sequential(nn.Linear(input_shape[0], width), nn.ReLU(), nn.Linear(width, num_classes))
        ''',
}


@pytest.fixture
def user_files(tmp_path):
    for name, text in USER_FILES.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def test_cli_trains_a_user_model_on_a_user_dataset(user_files, capsys):
    code = main(["--dataset", f"{user_files / 'my_data.py'}:blobs", "--model", f"{user_files / 'my_model.py'}:Net",
                 "--set", "model.width=8", "--epochs", "2", "--batch-size", "32", "--data-root", str(user_files)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    first = captured.out.splitlines()[0]
    assert "200 train / 40 val" in first and f"model: {user_files / 'my_model.py'}:Net" in first
    assert [line[:11] for line in epoch_lines(captured.out)] == ["Epoch [1/2]", "Epoch [2/2]"]


def test_cli_says_when_t_max_below_epochs_restarts_the_schedule(user_files, capsys):
    code = main(["--dataset", f"{user_files / 'my_data.py'}:blobs", "--model", f"{user_files / 'my_model.py'}:Net",
                 "--epochs", "2", "--t-max", "1", "--data-root", str(user_files)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "note: t_max (1) < epochs (2): the cosine schedule" in captured.err
    assert len(epoch_lines(captured.out)) == 2


@pytest.mark.parametrize("fields", [{"dataset": "os:system"}, {"model": "os:system"}, {"dataset": "builtins:exec"}])
def test_a_best_yaml_naming_the_standard_library_is_refused_before_it_runs(user_files, tmp_path, capsys, fields):
    """A best.yaml is code: dataset os:system would be called as os.system(data_root)."""
    marker = tmp_path / "ran"
    config = {"dataset": f"{user_files / 'my_data.py'}:blobs", "model": f"{user_files / 'my_model.py'}:Net",
              **fields}
    (tmp_path / "best.yaml").write_text(yaml.safe_dump(config))
    code = main(["--config", str(tmp_path / "best.yaml"), "--data-root", f"touch {marker}", "--epochs", "1"])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    assert "must not name the standard library" in captured.err
    assert not marker.exists() and not epoch_lines(captured.out)


def test_cli_data_root_of_an_unknown_users_home_exits_2(user_files, capsys, monkeypatch):
    code = main(["--dataset", f"{user_files / 'my_data.py'}:blobs", "--data-root", "~no_such_user_hpsearch/x"])
    assert code == 2
    assert "--data-root: ~user must name a user with a home folder" in capsys.readouterr().err
    monkeypatch.setenv("HPSEARCH_DATA", "~no_such_user_hpsearch/x")
    assert main(["--epochs", "1"]) == 2
    assert "HPSEARCH_DATA: ~user must name a user" in capsys.readouterr().err


def test_cli_bad_dataset_function_exits_2(user_files, capsys):
    code = main(["--dataset", f"{user_files / 'my_data.py'}:nope", "--data-root", str(user_files)])
    captured = capsys.readouterr()
    assert code == 2
    assert "dataset: " in captured.err and "defines no nope" in captured.err
    assert not epoch_lines(captured.out)


@pytest.mark.parametrize("argv, expected", [
    (["--set", "model.widths=[3]"], "model.widths: is not a keyword argument"),
    (["--model", "mlp", "--set", "model.hidden_sizes=[]"], "hidden_sizes must be a non-empty list"),
    (["--model", f"{Path(__file__).parent / 'no_such_file.py'}:Net"], "model.factory: file"),
])
def test_cli_bad_model_keyword_exits_2_naming_it(user_files, capsys, argv, expected):
    code = main(["--dataset", f"{user_files / 'my_data.py'}:blobs", "--data-root", str(user_files),
                 "--epochs", "1", *argv])
    captured = capsys.readouterr()
    assert code == 2
    assert expected in captured.err
    assert not epoch_lines(captured.out)


def test_config_file_problems_are_all_reported(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lr: 0\ncolour: red\nhidden_sizes: [128]\nmodel: {factory: mlp, 2x: 1}\n"
                    "result: {val_acc: 0.9}\n")
    with pytest.raises(ConfigError) as caught:
        trial_config(parse_args(["--config", str(path)]))
    problems = caught.value.problems
    assert len(problems) == 4, problems
    assert any(p.startswith("colour: unknown field") for p in problems)
    assert any(p.startswith("lr: must be > 0 and <= 1e6") for p in problems)
    assert "hidden_sizes: moved to model.hidden_sizes, got [128]" in problems  # a first-release best.yaml
    assert any(p.startswith("model.2x: must name a keyword argument") for p in problems)
    assert not any(p.startswith("result") for p in problems)  # informational, ignored


@pytest.mark.parametrize("text, expected", [
    ("lr: [0.1\n", "invalid YAML at line"),
    ("- 1\n- 2\n", "must hold a mapping"),
    ("\n", "--config: must hold a trial config (a search's best.yaml works), and this file is empty"),
    ("trainable: train.py:train\nexperiment: {name: x}\nrun: {}\n", "--config: must be a trial config, and this is a "
                                                                     "space file (it has an experiment section)"),
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


def test_a_function_best_yaml_may_name_a_key_experiment(tmp_path, capsys):
    """`experiment` is a free name of a function's config: its best.yaml is no space file."""
    (tmp_path / "train.py").write_text("def train(config, report, checkpoint=None):\n"
                                       "    report(score=1.0 if config['experiment'] == 'baseline' else 0.0)\n")
    best = tmp_path / "best.yaml"
    best.write_text(f"trainable: {tmp_path / 'train.py'}:train\nexperiment: baseline\nseed: 1\ntrial_number: 0\n"
                    "result: {metric: score, score: 1.0}\n")
    assert main(["--config", str(best)]) == 0
    assert "score 1.0000" in capsys.readouterr().out


def test_replay_flags_that_would_fail_or_be_ignored_exit_2_naming_them(tmp_path, capsys):
    """Issue 49 items 9 and 10: --workers 3 with a batch of 128 gave two tracebacks, one per worker process;
    flags on a function's best.yaml were silently ignored; --pick on a best.yaml said '(it holds [])'."""
    assert main(["--workers", "3", "--epochs", "1"]) == 2
    assert "workers: must divide batch_size (128): each worker takes batch_size / workers examples of every " \
           "batch, got 3" in capsys.readouterr().err
    (tmp_path / "train.py").write_text("def train(config, report, checkpoint=None):\n    report(score=1.0)\n")
    best = tmp_path / "best.yaml"
    best.write_text(f"trainable: {tmp_path / 'train.py'}:train\nx: 1\nseed: 1\ntrial_number: 0\n"
                    "result: {metric: score, score: 1.0}\n")
    assert main(["--config", str(best), "--workers", "1", "--set", "x=2"]) == 2
    said = capsys.readouterr().err
    assert "--workers: does not apply to a function trainable's replay, which calls the function with the config " \
           "it ran with" in said and "--set: does not apply" in said and "got 'x=2'" in said
    assert main(["--config", str(best), "--pick", "0"]) == 2
    assert "--pick: is for a Pareto front (--config pareto.yaml); this --config is one trial's config" in \
        capsys.readouterr().err
