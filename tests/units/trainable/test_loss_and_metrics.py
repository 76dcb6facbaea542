"""The canonical loop beyond classification: training.loss, training.metrics, float targets.

Fast checks of the names, the checks before a search and the loop itself on small data; one small
regression search through the real service (local Ray, Optuna) and its best.yaml replayed is
tests/searches/test_regression_search.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from search.store.results import columns
from search.definition.space import parse_space
from tests.helpers import SMALL
from trainable.config import TrialConfig
from trainable.data import load_data
from trainable.errors import ConfigError
from trainable.loop import build_run, train_and_evaluate
from trainable.measures import build_metrics, check_measures
from trainable.metrics import epoch_metrics, metric_column
from trainable.report import Placement, epoch_report

REPO = Path(__file__).resolve().parents[3]
CPU = torch.device("cpu")
REGRESSION = REPO / "examples" / "regression"


def space_with(tmp_path: Path, data_root: Path | None = None, **sections) -> dict:
    raw = copy.deepcopy(SMALL)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    raw["experiment"]["storage_path"] = str(tmp_path)
    if data_root is not None:
        raw["data"]["root"] = str(data_root)
    return raw


def problems_of(raw) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_space(raw)
    return caught.value.problems


def regression_config(**values) -> TrialConfig:
    return TrialConfig.from_mapping({"dataset": f"{REGRESSION}/data.py:friedman", "loss": "mse",
                                     "data_args": {"n_train": 200, "n_val": 100, "n_test": 100},
                                     "model": {"factory": "mlp", "hidden_sizes": [16]}, "epochs": 1, **values})


# ---- names ----

def test_a_metric_column_is_its_class_name_in_snake_case_without_the_task_prefix():
    assert [metric_column(n) for n in ("MulticlassF1Score", "BinaryF1Score", "MeanAbsoluteError",
                                       "MulticlassAUROC", "R2Score", "MulticlassAccuracy")] == \
        ["f1_score", "f1_score", "mean_absolute_error", "auroc", "r2_score", "accuracy"]


def test_accuracy_is_reported_with_cross_entropy_only():
    assert epoch_metrics("cross_entropy", {"MulticlassF1Score": {}}) == \
        ("train_loss", "train_acc", "train_f1_score", "val_loss", "val_acc", "val_f1_score")
    assert epoch_metrics("mse", {"MeanAbsoluteError": {}}) == \
        ("train_loss", "train_mean_absolute_error", "val_loss", "val_mean_absolute_error")


# ---- the checks of the space file ----

def test_a_regression_loss_without_a_metric_optimises_val_loss_downwards(tmp_path):
    space = parse_space(space_with(tmp_path, training={"loss": "smooth_l1"}))
    assert (space.experiment.metric, space.experiment.mode) == ("val_loss", "min")
    assert "val_acc" not in columns(space) and "train_acc" not in columns(space)


def test_val_acc_with_a_regression_loss_is_an_error_naming_the_rule(tmp_path):
    problems = problems_of(space_with(tmp_path, experiment={"metric": "val_acc"}, training={"loss": "mse"}))
    assert len(problems) == 1 and problems[0].startswith("experiment.metric: must be a metric the canonical loop")
    assert "cross_entropy only" in problems[0] and problems[0].endswith("got 'val_acc'")


def test_unknown_loss_and_unreported_or_colliding_metrics_are_said_at_once(tmp_path):
    problems = problems_of(space_with(tmp_path, experiment={"metric": "val_f1_score"},
                                      training={"loss": "hinge", "metrics": {"MulticlassF1Score": {},
                                                                             "BinaryF1Score": {}}}))
    assert any(p.startswith("training.loss: must be one of cross_entropy, mse, smooth_l1 or FILE.py:CALLABLE")
               for p in problems)
    problems = problems_of(space_with(tmp_path, experiment={"metric": "val_r2_score"},
                                      training={"metrics": {"MulticlassF1Score": {}, "BinaryF1Score": {}}}))
    assert any(p.startswith("training.metrics.BinaryF1Score: must give a column of its own") for p in problems)
    assert any(p.startswith("experiment.metric: must be a metric the canonical loop reports") and
               "val_f1_score" in p for p in problems)


def test_targets_and_constraints_take_the_metric_columns_the_loop_reports(tmp_path):
    regression = {"loss": "mse", "metrics": {"MeanAbsoluteError": {}}}
    space = parse_space(space_with(tmp_path, training=regression, experiment={
        "metric": ["val_mean_absolute_error", "params"], "mode": ["min", "min"],
        "constraints": ["train_mean_absolute_error <= 3"], "stop_when": {"val_loss": "<= 0.5"}}))
    assert space.experiment.constraints == ("train_mean_absolute_error <= 3",)
    problems = problems_of(space_with(tmp_path, training=regression, experiment={
        "metric": ["val_mean_absolute_error", "params"], "mode": ["min", "min"],
        "constraints": ["val_f1_score >= 0.5"], "stop_when": {"val_acc": 0.9}}))
    assert [p.split(":")[0] for p in problems] == ["experiment.stop_when.val_acc", "experiment.constraints"]
    assert all("must be a metric the canonical loop reports with training.loss mse" in p for p in problems)


def test_the_loss_is_fixed_for_a_search_not_searched(tmp_path):
    raw = space_with(tmp_path)
    raw["space"]["loss"] = {"distribution": "choice", "values": ["mse", "smooth_l1"]}
    assert problems_of(raw)[0].startswith("space.loss: cannot be searched: it is set by the training section")


def test_a_torchmetrics_class_is_built_once_with_num_classes_from_the_data():
    config = TrialConfig.from_mapping({"metrics": {"MulticlassF1Score": {"average": "macro"}}})
    metrics = build_metrics(config, 10, CPU)
    assert set(metrics) == {"acc", "f1_score"} and metrics["f1_score"].num_classes == 10
    with pytest.raises(ConfigError) as caught:
        build_metrics(TrialConfig.from_mapping({"metrics": {"NoSuchScore": {}, "MulticlassF1Score": {
            "average": "sideways"}}}), 10, CPU)
    first, second = caught.value.problems
    assert first.startswith("training.metrics.NoSuchScore: must name a torchmetrics Metric class")
    assert second.startswith("training.metrics.MulticlassF1Score: MulticlassF1Score(average='sideways', "
                             "num_classes=10) failed: ValueError")


def test_an_unknown_metric_class_exits_2_before_ray_starts(tmp_path, capsys):
    from search.cli import check_main

    raw = {"experiment": {"metric": "val_loss", "mode": "min", "storage_path": str(tmp_path)},
           "data": {"dataset": f"{REGRESSION}/data.py:friedman", "args": {"n_train": 50, "n_val": 20, "n_test": 20}},
           "training": {"loss": "mse", "metrics": {"MeanAbsoluteEror": {}}},
           "space": {"lr": {"distribution": "loguniform", "low": 0.001, "high": 0.1}}}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert check_main(["--space", str(path)]) == 2  # the check a search makes before Ray starts
    stderr = capsys.readouterr().err
    assert "training.metrics.MeanAbsoluteEror: must name a torchmetrics Metric class" in stderr
    assert "Traceback" not in stderr


# ---- float targets and the user's loss ----

def test_a_regression_dataset_keeps_float_targets_and_the_model_one_output():
    data = load_data(regression_config())
    assert data.train.labels.dtype == np.float32 and data.train.labels.shape == (200,) and data.num_classes == 1
    with pytest.raises(ConfigError, match="N integer labels"):  # cross_entropy wants class labels
        load_data(regression_config(loss="cross_entropy"))


def test_a_users_loss_is_resolved_like_other_references_and_must_give_a_scalar(tmp_path):
    losses = tmp_path / "losses.py"
    losses.write_text("import torch\n"
                      "def huber(outputs, targets):\n    return torch.nn.functional.huber_loss(outputs, targets)\n"
                      "def per_example(outputs, targets):\n    return (outputs - targets) ** 2\n")
    raw = {"experiment": {"metric": "val_loss", "mode": "min", "storage_path": str(tmp_path), "report": False},
           "data": {"dataset": f"{REGRESSION}/data.py:friedman"}, "training": {"loss": "losses.py:huber"},
           "space": {"lr": {"distribution": "loguniform", "low": 0.001, "high": 0.1}}}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(raw))
    space = parse_space(raw, source=str(tmp_path / "space.yaml"))
    assert space.fixed["loss"] == f"{losses}:huber"  # absolute, as spec.yaml and best.yaml keep it
    config = regression_config(loss=f"{losses}:huber")
    data = load_data(config)
    check_measures(config, data)
    record = next(train_and_evaluate(build_run(config, data, CPU)))
    assert record.train_acc is None and np.isfinite(record.val_loss)
    with pytest.raises(ConfigError) as caught:
        check_measures(regression_config(loss=f"{losses}:per_example"), data)
    assert caught.value.problems[0].startswith("training.loss: must return a scalar tensor")


# ---- an extra torchmetric on MNIST: a column, and an objective ----

def test_an_extra_torchmetric_is_reported_each_epoch_and_can_be_the_metric(tmp_path, data_root):
    space = parse_space(space_with(tmp_path, data_root, experiment={"metric": "val_f1_score"},
                                   training={"metrics": {"MulticlassF1Score": {"average": "macro"}}}))
    assert {"train_f1_score", "val_f1_score", "val_acc"} <= set(columns(space))
    config = TrialConfig.from_mapping({**space.fixed, "train_size": 500, "val_size": 200, "epochs": 1})
    data = load_data(config, data_root)
    record = next(train_and_evaluate(build_run(config, data, CPU)))
    report = epoch_report(record, Placement("n", "h", "cpu", ""), CPU)
    assert 0 < report["val_f1_score"] <= 1 and 0 < report["train_f1_score"] <= 1
    assert report["val_f1_score"] != report["val_acc"]  # macro F1, not accuracy under another name
