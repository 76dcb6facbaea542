"""Population based training (scheduler: pbt): a trial that copies another's weights trains on with
its own values, its rows record them, and best.yaml's schedule replays its weights' whole history (the
settings and the replay on their own: tests/units/searching/test_pbt_rules.py)."""

from __future__ import annotations

import re

import pandas as pd
import pytest
import yaml

from tests.helpers import small_space
from trainable.__main__ import main as trainable_main


@pytest.mark.slow
def test_pbt_changes_lr_within_trials_and_best_yaml_replays_the_best_trial(ray_local, tmp_path, data_root, capsys):
    from search.driver import run_search

    space = small_space(tmp_path, data_root,
                        experiment={"num_samples": 4, "max_concurrent": 2, "scheduler": "pbt",
                                    "perturbation_interval": 1},
                        training={"epochs": 4}, model={"hidden_sizes": [16]},
                        data={"train_size": 500, "val_size": 200})
    outcome = run_search(space, name="pbt")
    rows = outcome.results.sort_values(["trial_number", "epoch"])
    assert sorted(rows["trial_number"].unique()) == [0, 1, 2, 3]
    assert (rows.groupby("trial_number")["epoch"].apply(list) == pd.Series([[1, 2, 3, 4]] * 4)).all()
    # one trial of four copies another at each of epochs 1, 2, 3: its lr changes from the next row on
    assert (rows.groupby("trial_number")["lr"].nunique() > 1).any()
    assert "Search: pbt:" in outcome.summary

    best_path = tmp_path / "pbt" / "best.yaml"
    best = yaml.safe_load(best_path.read_text())
    capsys.readouterr()
    assert trainable_main(["--config", str(best_path), "--data-root", str(data_root)]) == 0
    printed = capsys.readouterr().out
    line = re.search(rf"Epoch \[\s*{best['result']['epoch']}/4\].*", printed).group(0)
    assert f"val_acc {best['result']['val_acc']:.4f}" in line, (line, best)
