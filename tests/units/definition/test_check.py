"""`python -m search check`: a search's checks without the search, the same messages, no Ray; `--help`."""

from __future__ import annotations

from pathlib import Path

import ray
import pytest
import yaml

from search.cli import main
from tests.helpers import blob_space, write

MNIST_SPACE = "spaces/mnist.yaml"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def ray_inits(monkeypatch) -> list:
    """Every ray.init call made while the test runs (the real one runs too): another test file's
    session Ray may already be up in this process, so ray.is_initialized() cannot tell."""
    calls, real = [], ray.init
    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: calls.append(kwargs) or real(*args, **kwargs))
    return calls


def run_and_check(capsys, argv: list[str]) -> tuple[tuple[int, str], tuple[int, str]]:
    """(exit code, stderr) of a search and of `check` with the same arguments."""
    code = main(argv)
    searched = (code, capsys.readouterr().err)
    code = main(["check", *argv])
    return searched, (code, capsys.readouterr().err)


@pytest.mark.parametrize("change, words", [
    ({"experiment": {"num_samples": 0}}, "experiment.num_samples: must be an integer in [1, 1000000], got 0"),
    ({"model": {"factory": "missing.py:tiny"}}, "model.factory"),
    ({"model": {"factory": "net.py:tiny", "depth": 3}}, "model.depth"),
    ({"data": {"dataset": "data.py:pair", "args": {}}}, "return ((X, y), None)"),
    ({"data": {"dataset": "data.py:fails", "args": {}}}, "data.py:fails raised FileNotFoundError: blobs.csv"),
])
def test_check_exits_2_with_the_messages_of_a_run_and_neither_starts_ray(tmp_path, monkeypatch, capsys,
                                                                          ray_inits, change, words):
    monkeypatch.chdir(tmp_path)
    raw = blob_space(tmp_path)
    for section, values in change.items():
        raw[section].update(values)
    with open(tmp_path / "data.py", "a") as f:
        f.write("\ndef pair(root):\n    import numpy as np\n    return np.zeros((60, 6)), np.arange(60) % 3\n"
                "\ndef fails(root):\n    raise FileNotFoundError('blobs.csv')\n")
    write(tmp_path / "space.yaml", yaml.safe_dump(raw))
    searched, checked = run_and_check(capsys, ["--space", "space.yaml"])
    assert searched[0] == checked[0] == 2
    assert words in checked[1] and checked[1] == searched[1]
    assert "Traceback" not in checked[1]
    assert not ray_inits, "user code is checked before Ray starts"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "no run folder is left"


def test_check_says_the_files_problems_and_its_codes_in_one_pass(tmp_path, monkeypatch, capsys, ray_inits):
    # before, the code a faulty file names was imported only once the file was right: a second `check`
    monkeypatch.chdir(tmp_path)
    raw = blob_space(tmp_path, experiment={"num_samples": 0})
    raw["data"]["dataset"] = "broken.py:blobs"
    write(tmp_path / "broken.py", "import not_a_module_anywhere\n")
    write(tmp_path / "space.yaml", yaml.safe_dump(raw))
    searched, checked = run_and_check(capsys, ["--space", "space.yaml"])
    assert searched[0] == checked[0] == 2 and checked[1] == searched[1]
    assert "2 problem(s) in space.yaml" in checked[1]
    assert "experiment.num_samples: must be an integer" in checked[1]
    assert "data.dataset: cannot import" in checked[1] and "not_a_module_anywhere" in checked[1]
    assert "Traceback" not in checked[1] and not ray_inits


@pytest.mark.parametrize("name", ["../x", "a/b", "."])
def test_check_refuses_a_run_name_that_the_search_refuses(tmp_path, monkeypatch, capsys, ray_inits, name):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "space.yaml", yaml.safe_dump(blob_space(tmp_path)))
    searched, checked = run_and_check(capsys, ["--space", "space.yaml", "--name", name])
    assert searched[0] == checked[0] == 2 and checked[1] == searched[1]
    assert "--name: must be" in checked[1] and not ray_inits


def test_check_of_the_shipped_space_prints_the_resolved_spec_and_exits_0(data_root, capsys, ray_inits):
    assert main(["check", "--space", MNIST_SPACE, "--data-root", str(data_root), "--set", "data.train_size=1000",
                 "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# The resolved spec of {MNIST_SPACE}: defaults and flags applied; checks passed")
    assert "inputs (1, 28, 28), 10 classes; the model on two inputs" in out.splitlines()[0], "cross_entropy: classes"
    spec = yaml.safe_load(out)
    assert spec["data"]["train_size"] == 1000 and spec["training"]["epochs"] == 2
    assert spec["experiment"]["num_to_keep"] == 1, "defaults are filled in"
    assert not ray_inits


def test_check_of_a_regression_speaks_of_outputs_not_classes(capsys, ray_inits):
    """examples/regression (training.loss mse, float targets): the model has one output, and no classes."""
    assert main(["check", "--space", str(REPO / "examples" / "regression" / "space.yaml")]) == 0
    said = capsys.readouterr().out.splitlines()[0]
    assert "inputs (8), 1 output (training.loss mse); the model on two inputs" in said, said
    assert "class" not in said, said
    assert not ray_inits


def test_check_says_every_width_of_a_built_in_model_that_it_would_refuse(tmp_path, data_root, capsys, ray_inits):
    raw = yaml.safe_load(open(MNIST_SPACE))
    raw["model"].pop("hidden_sizes", None)
    raw["space"]["model.hidden_sizes"] = {"distribution": "choice", "values": [[], [64], [0, 8], 128]}
    write(tmp_path / "space.yaml", yaml.safe_dump(raw))
    assert main(["check", "--space", str(tmp_path / "space.yaml"), "--data-root", str(data_root)]) == 2
    rule = "must be a non-empty list of integers in [1, 65536]"
    said = [line.strip() for line in capsys.readouterr().err.splitlines()[1:]]
    assert said == [f"space.model.hidden_sizes.values[0]: {rule}, got []",
                    f"space.model.hidden_sizes.values[2]: {rule}, got [0, 8]",
                    f"space.model.hidden_sizes.values[3]: {rule}, got 128"], "all at once, [64] passes"
    assert not ray_inits


@pytest.mark.parametrize("sets, said", [
    (["data.drop_last=true"], "space.batch_size: must be at most the 200 training examples with data.drop_last: true "
                              "(every training batch would be dropped: no step is taken); lower it or set drop_last: "
                              "false, got 256"),
    (["data.drop_last=true", "space.batch_size=201"], "training.batch_size: must be at most the 200 training examples"),
    (["data.drop_last=true", "space.batch_size=200"], None),  # one full batch: it trains
    (["space.batch_size=201"], None),  # without drop_last the one short batch trains
])
def test_check_refuses_a_batch_size_that_drop_last_would_drop_whole(data_root, capsys, ray_inits, sets, said):
    flags = [f for s in ["data.train_size=200", *sets] for f in ("--set", s)]
    code = main(["check", "--space", MNIST_SPACE, "--data-root", str(data_root), *flags])
    assert (code, said is None or said in capsys.readouterr().err) == (0 if said is None else 2, True)
    assert not ray_inits


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    for command in ("--space FILE", "check --space FILE", "report RUN", "export RUN"):
        assert f"python -m search {command}" in out


def test_a_flag_given_as_null_or_empty_sets_null_and_is_judged(tmp_path, data_root, capsys, ray_inits):
    """`--storage-path ""` was ignored (the file's path used); `--warm-start null` could not drop the file's."""
    assert main(["check", "--space", MNIST_SPACE, "--data-root", str(data_root), "--storage-path", ""]) == 2
    assert "experiment.storage_path: must be a folder or URI, got None" in capsys.readouterr().err
    raw = yaml.safe_load(open(MNIST_SPACE))
    raw["experiment"]["warm_start"] = str(tmp_path / "no-such-run")  # refused unless the flag drops it
    write(tmp_path / "space.yaml", yaml.safe_dump(raw))
    assert main(["check", "--space", str(tmp_path / "space.yaml"), "--data-root", str(data_root),
                 "--set", "data.train_size=500", "--warm-start", "null"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["experiment"]["warm_start"] is None
    assert not ray_inits
