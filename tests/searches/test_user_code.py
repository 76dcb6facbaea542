"""A user's own model and dataset function: tuned end to end, replayed, and bad references refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import search
from search.store.results import COMPLETED
from trainable.config import TrialConfig
from trainable.data import load_data
from trainable.device import get_default_device
from trainable.loop import build_run, train_and_evaluate

from tests.helpers import blob_space, run_search_cli, write

REPO = Path(__file__).resolve().parents[2]

@pytest.mark.slow
def test_a_dataset_function_and_model_file_are_tuned_through_the_python_api(ray_local, tmp_path):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(blob_space(tmp_path)))
    outcome = search.run(space_file, overrides={"experiment.num_samples": 3}, name="api")
    frame = outcome.results
    assert frame["trial_id"].nunique() == 3 and set(frame["status"]) == {COMPLETED}
    assert set(frame["model.width"]) <= {8, 32}, "a searched factory keyword is a column of its own"
    assert (frame["model.factory"] == f"{tmp_path / 'net.py'}:tiny").all(), "references are stored absolute"
    assert frame["val_acc"].max() > 0.9, "the blobs are separable"
    best = {**outcome.best["config"], "result": outcome.best["result"]}  # as best.yaml holds it
    assert best == {k: v for k, v in yaml.safe_load((Path(outcome.path) / "best.yaml").read_text()).items()}
    assert best["model"]["factory"] == f"{tmp_path / 'net.py'}:tiny" and best["model"]["width"] in (8, 32)
    assert best["data_args"] == {"n": 600}
    assert 0.9 < best["result"]["test_acc"] <= 1, "the function's test part scores the best checkpoint"
    # num_classes came from the data: three logits
    config = TrialConfig.from_mapping({k: v for k, v in best.items() if k != "result"})
    data = load_data(config, tmp_path)
    assert data.num_classes == 3 and data.input_shape == (6,)
    assert len(data.val) == 150 and len(data.train) == 450, "no val part returned: the fixed split applies"


@pytest.mark.slow
def test_the_example_tunes_a_user_model_and_best_yaml_replays_bit_for_bit(tmp_path, data_root):
    """examples/mnist_cnn on a subset, from the CLI; best.yaml then re-runs from another folder."""
    runs = tmp_path / "runs"
    done = run_search_cli(REPO / "examples" / "mnist_cnn" / "space.yaml", "--name", "cnn", "--num-samples", "2",
                          "--epochs", "2", "--storage-path", str(runs), "--data-root", str(data_root),
                          "--set", "data.train_size=500", "--set", "data.val_size=200",
                          "--set", "experiment.max_concurrent=1")  # one trial process, not two (tests/helpers.py)
    assert done.returncode == 0, done.stderr[-3000:]
    best_file = runs / "cnn" / "best.yaml"
    best = yaml.safe_load(best_file.read_text())
    assert best["model"]["factory"] == f"{REPO / 'examples' / 'mnist_cnn' / 'model.py'}:Net"
    frame = pd.read_parquet(runs / "cnn" / "results.parquet")
    assert {"model.channels", "model.dropout", "model.hidden"} <= set(frame.columns)
    spec = yaml.safe_load((runs / "cnn" / "spec.yaml").read_text())
    assert spec["training"]["epochs"] == 2 and spec["experiment"]["num_samples"] == 2, "flags are in the spec"

    # the replay, in this process: the same numbers, bit for bit
    config = TrialConfig.from_mapping({k: v for k, v in best.items() if k != "result"})
    records = list(train_and_evaluate(build_run(config, load_data(config, data_root, with_test=False),
                                                get_default_device())))
    assert records[best["result"]["epoch"] - 1].val_acc == best["result"]["val_acc"]
    # and from the command line, in another folder (the references are absolute)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    replay = subprocess.run([sys.executable, "-m", "trainable", "--config", str(best_file),
                             "--data-root", str(data_root)], cwd=elsewhere, capture_output=True, text=True,
                            timeout=300, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert f"val_acc {best['result']['val_acc']:.4f}" in replay.stdout


@pytest.mark.parametrize("change, key, words", [
    ({"model": {"factory": "missing.py:tiny"}}, "model.factory", ["missing.py", "not found"]),
    ({"model": {"factory": "broken.py:tiny"}}, "model.factory", ["broken.py, line 3", "ZeroDivisionError"]),
    ({"model": {"factory": "net.py:nothing"}}, "model.factory", ["defines no nothing", "tiny"]),
    ({"model": {"factory": "no_such_package.models:Net"}}, "model.factory", ["no module named 'no_such_package'"]),
    ({"model": {"factory": "net.py:tiny", "depth": 3}}, "model.depth", ["not a keyword argument", "width"]),
    ({"space": {"model.heads": {"distribution": "choice", "values": [1, 2]}}}, "model.heads",
     ["not a keyword argument"]),
    ({"model": {"factory": "net.py:wrong_logits"}}, "model.factory", ["logits of shape (2, 3)", "(2, 5)"]),
    ({"data": {"dataset": "data.py:one_tensor", "args": {}}}, "data.dataset", ["must return (train, val)", "Tensor(10, 6)"]),
    ({"data": {"dataset": "data.py:four_parts", "args": {}}}, "data.dataset", ["must return (train, val)", "tuple of 4"]),
    ({"data": {"dataset": "data.py:blobs", "args": {"colour": 1}}}, "data.args.colour",
     ["not a keyword argument", "classes"]),
    # a reference is code: never the standard library, only what the named module defines
    ({"model": {"factory": "os:system"}}, "model.factory", ["must not name the standard library (os)"]),
    ({"data": {"dataset": "builtins:eval", "args": {}}}, "data.dataset", ["must not name the standard library"]),
    ({"data": {"dataset": "data.py:text", "args": {}}}, "data.dataset", ["numeric inputs", "<U5"]),
    ({"data": {"root": "~no_such_user_hpsearch/data"}}, "data.root", ["~user must name a user with a home"]),
])
def test_bad_references_keywords_and_returns_exit_2_naming_the_key(tmp_path, change, key, words):
    raw = blob_space(tmp_path)
    for section, values in change.items():
        raw[section].update(values)
    write(tmp_path / "broken.py", "import torch\n\nx = 1 / 0\n")
    with open(tmp_path / "net.py", "a") as f:
        f.write("\ndef wrong_logits(input_shape, num_classes, width=8):\n    return nn.Linear(input_shape[0], 5)\n")
    with open(tmp_path / "data.py", "a") as f:
        f.write("\ndef one_tensor(root):\n    return torch.zeros(10, 6)\n"
                "\ndef four_parts(root):\n    return (1, 2, 3, 4)\n"
                "\ndef text(root):\n    import numpy as np\n"
                "    return (np.array([['hello']] * 10), torch.zeros(10, dtype=torch.long)), None\n")
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(raw))
    done = run_search_cli(space_file, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"  {key}:" in done.stderr, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists(), "nothing was started: no run folder"
