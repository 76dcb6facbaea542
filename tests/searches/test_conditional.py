"""Conditional keys (`when:`) in a search: null in results where not drawn, and the replay (the checks and the
drawing on their own: tests/units/definition/test_conditional_keys.py)."""

from __future__ import annotations

import copy
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from search.driver import run_search
from search.definition.space import parse_space
from search.searching.study import make_study
from tests.helpers import SMALL
from trainable.config import TrialConfig
from trainable.data import load_data
from trainable.device import get_default_device
from trainable.loop import build_run, train_and_evaluate
from tests.units.definition.test_conditional_keys import OPTIMIZERS


TABLE = ["trial_number", "seed", "optimizer", "lr", "momentum", "beta1", "model.hidden_sizes", "val_acc"]


@pytest.mark.slow
def test_a_conditional_search_records_nulls_where_keys_were_not_drawn_and_replays(ray_local, tmp_path,
                                                                                      data_root):
    searched = {"optimizer": OPTIMIZERS["optimizer"], "lr": {"distribution": "float", "low": 0.01, "high": 0.1,
                                                             "log": True},
                "momentum": OPTIMIZERS["momentum"], "beta1": OPTIMIZERS["beta1"],
                "model.hidden_sizes": {"distribution": "choice", "values": [[16], [32, 16]]}}

    def space(max_concurrent: int):
        raw = copy.deepcopy(SMALL)
        raw["experiment"].update(num_samples=6, max_concurrent=max_concurrent, seed=3, storage_path=str(tmp_path),
                                 report=True)
        raw.update(resources={"cpus": 0.5}, training={"epochs": 1}, model={}, space=searched,
                   data={"train_size": 500, "val_size": 200, "root": str(data_root)})
        return parse_space(raw)

    outcome = run_search(space(3), name="three")
    frame, run = outcome.results, Path(outcome.path)
    assert set(frame["optimizer"]) == {"sgd", "adamw"}, "both branches ran"
    sgd = frame["optimizer"] == "sgd"
    assert frame.loc[sgd, "momentum"].notna().all() and frame.loc[~sgd, "momentum"].isna().all()
    assert frame.loc[~sgd, "beta1"].notna().all() and frame.loc[sgd, "beta1"].isna().all()
    written = pd.read_parquet(run / "results.parquet").sort_values("trial_number").reset_index(drop=True)
    pd.testing.assert_frame_equal(written[TABLE], frame[TABLE])

    # spec.yaml keeps the conditions: a resume runs the same space
    assert parse_space(yaml.safe_load((run / "spec.yaml").read_text())).searched == space(3).searched
    # the report's parallel coordinates and importances take trials that lack a key
    study = make_study(frame, space(3))
    assert {"momentum", "beta1"} <= {p for t in study.trials for p in t.params}
    optuna.visualization.matplotlib.plot_parallel_coordinate(study, params=["optimizer", "momentum", "beta1", "lr"])
    optuna.visualization.matplotlib.plot_param_importances(study)
    assert (run / "report.html").stat().st_size > 0
    import warnings

    from search.outputs import report

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report.figures(frame[frame["trial_number"] < 3], space(3), None)  # a branch drawn by one trial
        drawn = report.figures(frame, space(3), outcome.best["result"]["trial_id"])
    report.plt.close("all")
    assert [str(w.message) for w in caught] == [], "PED-ANOVA's few-trials warning on a when: key is not printed"
    assert "PED-ANOVA" in drawn["importance"][0]

    # best.yaml holds the config as the trial ran (an inactive key at its default) and replays it
    best = yaml.safe_load((run / "best.yaml").read_text())
    config = TrialConfig.from_mapping({k: v for k, v in best.items() if k != "result"})
    row = frame[frame["trial_number"] == best["result"]["trial_number"]].iloc[0]
    assert (config.momentum, config.beta1) == ((row["momentum"], 0.9) if row["optimizer"] == "sgd" else
                                               (0.9, row["beta1"]))
    records = list(train_and_evaluate(build_run(config, load_data(config, data_root, with_test=False),
                                                get_default_device())))
    assert records[-1].val_acc == best["result"]["val_acc"]
