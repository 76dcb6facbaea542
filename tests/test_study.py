"""The search as an Optuna study, from results rows (the journal's and the report's source)."""

from __future__ import annotations

import math

import pandas as pd

from search.space import parse_space
from search.study import frozen_trial, make_study


def rows(**columns) -> pd.DataFrame:
    base = {"trial_id": "a", "trial_number": 0, "seed": 7, "status": "COMPLETED", "epoch": [1, 2],
            "val_acc": [0.5, 0.7]}
    return pd.DataFrame({**base, **columns})


def test_a_null_choice_read_back_as_nan_is_the_null_choice():
    space = parse_space({"space": {"clip_norm": {"distribution": "choice", "values": [None, 1.0]}}})
    trial = frozen_trial(rows(clip_norm=[math.nan, math.nan]), space)
    assert trial.params == {"clip_norm": None}


def test_a_trials_value_is_its_best_epoch_and_nan_epochs_are_no_score():
    space = parse_space({"experiment": {"metric": "val_loss", "mode": "min"},
                         "space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})
    trial = frozen_trial(rows(lr=[0.15, 0.15], val_loss=[0.4, math.nan]), space)
    assert trial.value == 0.4 and trial.intermediate_values == {1: 0.4}
    failed = frozen_trial(rows(lr=[0.15, 0.15], val_loss=[math.nan, math.nan]), space)
    assert failed.state.name == "FAIL"


def test_the_study_lists_trials_in_trial_number_order():
    space = parse_space({"space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})
    frame = pd.concat([rows(trial_id="late", trial_number=1, lr=0.12), rows(trial_id="early", trial_number=0, lr=0.18)])
    study = make_study(frame, space)
    assert [t.user_attrs["trial_id"] for t in study.trials] == ["early", "late"]
