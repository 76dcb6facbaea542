"""One small regression search through the real service (local Ray, Optuna): its metric reported and
ranked downwards, best.yaml replayed, the exported model scoring what best.yaml says (the loop's losses
and metrics on their own: tests/units/trainable/test_loss_and_metrics.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from search.definition.space import parse_space

REGRESSION = Path(__file__).resolve().parents[2] / "examples" / "regression"


@pytest.fixture(scope="module")
def regression_search(ray_local, tmp_path_factory):
    from search.driver import run_search

    raw = yaml.safe_load((REGRESSION / "space.yaml").read_text())
    raw["experiment"].update(num_samples=2, storage_path=str(tmp_path_factory.mktemp("runs")))
    raw["data"]["args"] = {"n_train": 300, "n_val": 100, "n_test": 100}
    raw["training"]["epochs"] = 2
    space = parse_space(raw, source=str(REGRESSION / "space.yaml"))
    return run_search(space, name="regression")


@pytest.mark.slow
def test_a_regression_search_reports_its_metric_and_best_yaml_replays_it(regression_search, capsys):
    from trainable.__main__ import main as trainable_main

    run = Path(regression_search.path)
    frame = pd.read_parquet(run / "results.parquet")
    assert frame["trial_id"].nunique() == 2 and len(frame) == 4
    assert "val_acc" not in frame.columns and "train_acc" not in frame.columns
    best = yaml.safe_load((run / "best.yaml").read_text())
    result = best["result"]
    assert result["metric"] == "val_mean_absolute_error"
    assert result["val_mean_absolute_error"] == frame["val_mean_absolute_error"].min()  # mode min
    assert result["test_acc"] is None and result["test_mean_absolute_error"] > 0
    assert "test_mean_absolute_error" in regression_search.summary
    capsys.readouterr()
    assert trainable_main(["--config", str(run / "best.yaml")]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith(f"Epoch [{result['epoch']}/")][0]
    assert f"val_mean_absolute_error {result['val_mean_absolute_error']:.4f}" in line
    # exported, the model is the regressor best.yaml scored: the same error on the same validation part,
    # loaded as the replay loads it (best.yaml's config through trainable's own data path)
    from search.outputs.export import export
    from trainable.__main__ import parse_args, trial_config
    from trainable.data import load_data, prepare_inputs

    path, _ = export(str(run), fmt="torchscript", output=str(run / "best.pt"))
    data = load_data(trial_config(parse_args(["--config", str(run / "best.yaml")])), with_test=False)
    with torch.no_grad():
        inputs = prepare_inputs(torch.from_numpy(data.val.inputs.copy()), data.standardize)
        predicted = torch.jit.load(path)(inputs).squeeze(-1)
    error = (predicted - torch.from_numpy(data.val.labels)).abs().mean().item()
    assert error == pytest.approx(result["val_mean_absolute_error"], rel=1e-4)
