"""Getting the model out: what checkpoints a default search keeps, `python -m search export`, `search.load_best`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import search
from search.cli import main
from search.driver import run_search
from search.outputs.export import META_FILE
from search.store.run_folder import open_run
from search.spec.space import to_raw
from trainable.data import load_data, prepare_inputs
from tests.helpers import assert_kept_checkpoints, small_space

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory, data_root):
    """3 trials x 3 epochs with the default num_to_keep."""
    space = small_space(tmp_path_factory.mktemp("runs"), data_root, training={"epochs": 3},
                        experiment={"num_samples": 3})
    assert space.experiment.num_to_keep == 1
    return run_search(space, name="exported")


def export_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search", "export", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def val_accuracy(model, run: str) -> float:
    """The model's accuracy on the run's validation split, inputs prepared as the trials' were."""
    space, _ = open_run(run).read_spec()
    config = space.trial_defaults()
    data = load_data(config, space.data_root, with_test=False)
    inputs = prepare_inputs(torch.from_numpy(data.val.inputs.copy()), data.standardize)
    with torch.inference_mode():
        predicted = torch.cat([model(batch).argmax(1) for batch in inputs.split(128)])
    return (predicted.numpy() == data.val.labels).mean()


def test_a_default_search_keeps_the_best_and_the_latest_checkpoint_of_each_trial(finished):
    run = Path(finished.path)
    assert_kept_checkpoints(run)
    result = finished.best["result"]
    assert (run / result["checkpoint"] / "state.pt").is_file()
    assert result["checkpoint"].startswith(f"trial_{result['trial_id']}/checkpoint_")
    assert yaml.safe_load((run / "best.yaml").read_text())["result"]["checkpoint"] == result["checkpoint"]


def test_a_torchscript_export_scores_best_yaml_val_acc_on_the_validation_split(finished, tmp_path):
    done = export_cli(finished.path, "--format", "torchscript", "-o", "best.pt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "best.pt" in done.stdout and f"epoch {finished.best['result']['epoch']}" in done.stdout
    extra = {META_FILE: ""}
    model = torch.jit.load(str(tmp_path / "best.pt"), _extra_files=extra)
    assert model(torch.zeros(5, 1, 28, 28)).shape == (5, 10), "it runs on a batch of any size"
    assert val_accuracy(model, finished.path) == pytest.approx(finished.best["result"]["val_acc"], abs=1e-6)
    meta = yaml.safe_load(extra[META_FILE])
    assert meta["checkpoint"] == finished.best["result"]["checkpoint"]
    assert meta["input_shape"] == [1, 28, 28] and meta["inputs"]["mean"] == [0.1307]


def test_load_best_and_a_state_dict_export_give_the_same_model(finished, tmp_path):
    model = search.load_best(finished.path)
    assert not model.training and next(model.parameters()).device.type == "cpu"
    assert val_accuracy(model, finished.path) == pytest.approx(finished.best["result"]["val_acc"], abs=1e-6)
    done = export_cli(finished.path, "--format", "state_dict", "-o", "best_state.pt", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    saved = torch.load(tmp_path / "best_state.pt", weights_only=True)
    assert saved["config"]["lr"] == finished.best["config"]["lr"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(saved["state_dict"][name], tensor)


def test_a_chosen_trial_exports_its_best_kept_epoch(finished, tmp_path, capsys):
    frame = finished.results
    number = int(frame["trial_number"].max())
    rows = frame[frame["trial_number"] == number]
    model = search.load_best(finished.path, trial=number)
    assert val_accuracy(model, finished.path) == pytest.approx(rows["val_acc"].max(), abs=1e-6)
    assert main(["export", finished.path, "--trial", "99"]) == 2
    assert "--trial: no trial with that trial_number in" in capsys.readouterr().err
    assert main(["export", str(tmp_path)]) == 2
    assert f"error: {tmp_path}: not a run folder of hpsearch" in capsys.readouterr().err


def test_an_onnx_export_computes_what_the_model_computes(finished, tmp_path):
    pytest.importorskip("onnxscript", reason="the export extra: pip install -e '.[export]'")
    from onnx.reference import ReferenceEvaluator

    done = export_cli(finished.path, "--format", "onnx", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    exported = tmp_path / "exported-best.onnx"
    inputs = torch.randn(3, 1, 28, 28)
    logits = ReferenceEvaluator(str(exported)).run(None, {"inputs": inputs.numpy()})[0]
    with torch.inference_mode():
        expected = search.load_best(finished.path)(inputs).numpy()
    assert logits.shape == (3, 10) and abs(logits - expected).max() < 1e-4


def test_resuming_a_finished_run_says_so_without_starting_ray(finished, tmp_path):
    space, _ = open_run(finished.path).read_spec()
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(to_raw(space)))
    code = (f"import ray, search; o = search.run({str(space_file)!r}, name='exported', resume=True); "
            "print(o.summary); print('ray started:', ray.is_initialized())")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert "Search exported is finished: all 3 of experiment.num_samples 3 trials ended (3 completed)" in done.stdout
    assert f"epoch {finished.best['result']['epoch']}" in done.stdout
    assert "ray started: False" in done.stdout
