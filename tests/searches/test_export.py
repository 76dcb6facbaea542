"""Getting the model out: what checkpoints a default search keeps, `python -m search export` (a model,
or a function's checkpoint dict), `search.load_best`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import search
from search.cli import main
from search.driver import run_search
from search.outputs.export import META_FILE, export
from search.store.run_folder import open_run
from search.definition.space import parse_space, to_raw
from trainable.data import load_data, prepare_inputs
from trainable.errors import ConfigError
from tests.helpers import TOY_FUNCTION, assert_kept_checkpoints, small_space

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory, data_root):
    """3 trials x 3 epochs with the default num_to_keep."""
    space = small_space(tmp_path_factory.mktemp("runs"), data_root, training={"epochs": 3},
                        experiment={"num_samples": 3})
    assert space.experiment.num_to_keep == 1
    return run_search(space, name="exported")


@pytest.fixture(scope="module")
def function_run(ray_local, tmp_path_factory):
    """A search of the toy training function (tests/helpers.py): 2 trials x 3 epochs, a checkpoint
    reported each epoch, the default num_to_keep."""
    folder = tmp_path_factory.mktemp("function")
    (folder / "toy.py").write_text(TOY_FUNCTION)
    (folder / "space.yaml").write_text("")  # a reference is relative to the space file's folder
    raw = {"trainable": "toy.py:train",
           "experiment": {"name": "toy", "metric": "val_acc", "mode": "max", "num_samples": 2, "seed": 3,
                          "storage_path": str(folder / "runs"), "report": False},
           "resources": {"cpus": 0.5}, "training": {"epochs": 3},
           "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}
    return run_search(parse_space(raw, source=str(folder / "space.yaml")), name="toy")


def export_cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search", "export", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), **env})


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


def test_a_pt2_export_scores_best_yaml_val_acc_and_no_export_warns_of_a_deprecation(finished, tmp_path):
    said = {}
    for fmt in ("pt2", "torchscript"):  # every warning shown: torch.jit's deprecation is not hpsearch's to print
        done = export_cli(finished.path, "--format", fmt, "-o", f"best.{fmt}", cwd=tmp_path, PYTHONWARNINGS="always")
        assert done.returncode == 0, done.stderr
        assert "deprecated" not in done.stderr, done.stderr
        said[fmt] = done.stdout
    assert "Load it with torch.export.load('best.pt2').module()" in said["pt2"]
    extra = {META_FILE: ""}
    model = torch.export.load(str(tmp_path / "best.pt2"), extra_files=extra).module()
    assert model(torch.zeros(1, 1, 28, 28)).shape == (1, 10), "a batch of one too"
    assert val_accuracy(model, finished.path) == pytest.approx(finished.best["result"]["val_acc"], abs=1e-6)
    assert yaml.safe_load(extra[META_FILE])["checkpoint"] == finished.best["result"]["checkpoint"]


def test_a_function_run_exports_the_dict_its_best_epoch_checkpointed_with_its_config(function_run, tmp_path, capsys):
    best = yaml.safe_load((Path(function_run.path) / "best.yaml").read_text())
    result = best["result"]
    assert main(["export", function_run.path, "--format", "state_dict", "-o", str(tmp_path / "best.pt")]) == 0
    said = capsys.readouterr().out
    assert f"trial #{result['trial_number']} ({result['trial_id']}), epoch {result['epoch']}, val_acc" in said
    assert "under 'state'" in said
    saved = torch.load(tmp_path / "best.pt", weights_only=True)
    assert (saved["trial_id"], saved["epoch"]) == (result["trial_id"], result["epoch"])
    assert saved["checkpoint"] == result["checkpoint"] and saved["metrics"]["val_acc"] == result["val_acc"]
    # the toy checkpoints x and reports val_acc = x: the dict is that epoch's, not another's
    assert saved["state"]["epoch"] == result["epoch"] and float(saved["state"]["x"]) == result["val_acc"]
    assert saved["config"] == {k: v for k, v in best.items() if k != "result"}, "best.yaml's config, replayable"

    # the Python API without --format: the function's one format
    path, chosen = export(function_run.path, output=str(tmp_path / "api.pt"))
    assert chosen.epoch == result["epoch"] and torch.load(path, weights_only=True)["state"]["epoch"] == chosen.epoch
    # --trial N: that trial's best epoch that kept a checkpoint
    other = int(function_run.results.query(f"trial_number != {result['trial_number']}")["trial_number"].iloc[0])
    assert main(["export", function_run.path, "--trial", str(other), "--format", "state_dict",
                 "-o", str(tmp_path / "other.pt")]) == 0
    rows = function_run.results[function_run.results["trial_number"] == other]
    assert torch.load(tmp_path / "other.pt", weights_only=True)["metrics"]["val_acc"] == rows["val_acc"].max()


def test_a_function_run_refuses_the_formats_that_need_its_model_code(function_run, tmp_path, capsys):
    # without --format: the function's one format, as the Python API picks it
    assert main(["export", function_run.path, "-o", str(tmp_path / "default.pt")]) == 0
    assert "state" in torch.load(tmp_path / "default.pt", weights_only=True)
    capsys.readouterr()
    for args in (["--format", "pt2"], ["--format", "torchscript"]):
        assert main(["export", function_run.path, *args, "-o", str(tmp_path / "model")]) == 2
        err = capsys.readouterr().err
        assert "needs the model's code, and a search of your own training function (" in err
        assert "--format state_dict writes that dict with the trial's config" in err and "Traceback" not in err
    assert not (tmp_path / "model").exists()
    with pytest.raises(ConfigError, match=r"RUN: is a search of your own training function .*--format state_dict"):
        search.load_best(function_run.path)


@pytest.mark.parametrize("kind", ["finished", "function_run"])
def test_a_best_epoch_without_a_checkpoint_is_named_not_swapped_for_another(kind, request, tmp_path, capsys):
    """best.yaml names the best value, and that epoch may have no checkpoint kept (null)."""
    run = tmp_path / "copy"
    shutil.copytree(request.getfixturevalue(kind).path, run)
    best = yaml.safe_load((run / "best.yaml").read_text())
    result, metric = best["result"], best["result"]["metric"]
    number, trial_id = result["trial_number"], result["trial_id"]
    reports = [json.loads(line) for line in (run / f"trial_{trial_id}" / "result.json").read_text().splitlines()]
    removed = [r for r in reports if r.get("checkpoint_dir_name")
               and not (run / f"trial_{trial_id}" / r["checkpoint_dir_name"]).is_dir()]
    assert removed, "num_to_keep 1 of 3 epochs removes one"
    result.update(epoch=removed[0]["epoch"], checkpoint=None, **{metric: removed[0][metric]})
    (run / "best.yaml").write_text(yaml.safe_dump(best, sort_keys=False))

    assert main(["export", str(run), "--format", "state_dict", "-o", str(tmp_path / "best.pt")]) == 2
    err = capsys.readouterr().err
    assert (f"RUN: best.yaml's best, trial #{number} ({trial_id}) at epoch {removed[0]['epoch']} ({metric} "
            in err and "has no checkpoint kept" in err), err
    assert f"--trial {number} exports that trial's best epoch that kept one" in err
    assert not (tmp_path / "best.pt").exists()
    assert main(["export", str(run), "--trial", str(number), "--format", "state_dict",
                 "-o", str(tmp_path / "kept.pt")]) == 0
    assert torch.load(tmp_path / "kept.pt", weights_only=True)["epoch"] != removed[0]["epoch"]
