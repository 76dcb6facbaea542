"""The search end to end on a real local Ray, real Optuna and MNIST subsets."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from search.execution.capacity import CapacityError
from search.cli import load_space
from search.driver import run_search
from search.store.searcher_record import RECORD_FILE, record_from_json
from search.store.results import COMPLETED, DIVERGED, STOPPED, columns, config_from_row, results_schema
from tests.helpers import assert_outputs_agree, small_space, toy_space_file
from trainable.config import TrialConfig
from trainable.data import load_data
from trainable.device import get_default_device
from trainable.loop import build_run, train_and_evaluate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def four_trials(ray_local, tmp_path_factory, data_root):
    space = small_space(tmp_path_factory.mktemp("runs"), data_root)
    return space, run_search(space, name="four")


def test_search_writes_results_with_documented_columns(four_trials):
    space, outcome = four_trials
    frame = pd.read_parquet(Path(outcome.path) / "results.parquet")
    assert list(frame.columns) == columns(space)
    assert "model.hidden_sizes" in frame.columns and "model.factory" in frame.columns
    assert frame["trial_id"].nunique() == 4
    assert len(frame) == 4 * 2, "one row per trial per epoch"
    assert set(frame["status"]) == {COMPLETED}
    assert frame.groupby("trial_id")["epoch"].apply(list).map(lambda e: e == [1, 2]).all()
    assert frame["seed"].nunique() == 4, "each trial has its own seed"
    assert (frame["device"] == "cpu").all() and frame["node"].str.len().gt(0).all()
    assert frame["val_acc"].between(0.5, 1).all()
    assert (frame["num_threads"] == 1).all(), "torch threads = the trial's CPU share"


def test_best_yaml_is_the_best_epoch_and_reruns_exactly(four_trials, data_root):
    space, outcome = four_trials
    best = yaml.safe_load((Path(outcome.path) / "best.yaml").read_text())
    frame = outcome.results
    assert best["result"]["val_acc"] == pytest.approx(frame["val_acc"].max(), abs=0)
    assert 0.5 < best["result"]["test_acc"] <= 1
    assert best["model"] == {"factory": "mlp", "hidden_sizes": [64]}
    # the trainable library, fed best.yaml, reproduces the trial bit for bit
    config = TrialConfig.from_mapping({k: v for k, v in best.items() if k != "result"})
    data = load_data(config, data_root, with_test=False)
    records = list(train_and_evaluate(build_run(config, data, get_default_device())))
    assert records[best["result"]["epoch"] - 1].val_acc == best["result"]["val_acc"]


def test_summary_names_the_best_and_the_overhead(four_trials):
    _, outcome = four_trials
    assert "Top trials by val_acc (max), 4 trials: 4 completed" in outcome.summary
    assert f"re-run: python -m trainable --config {outcome.path}/best.yaml" in outcome.summary
    assert "outside training" in outcome.summary
    assert 0 <= outcome.timing.overhead_share < 1


def test_searcher_gets_one_report_per_epoch(four_trials):
    _, outcome = four_trials
    # OrderedSearch saves what it was told, as JSON: per trial number, the metric of every epoch and a value
    state = record_from_json((Path(outcome.path) / RECORD_FILE).read_text())
    assert len(state["asked"]) == 4 and sorted(state["finished"]) == [0, 1, 2, 3]
    assert all(sorted(curve) == [1, 2] for curve in state["curves"].values())
    best = outcome.results.groupby("trial_number")["val_acc"].max()
    assert {n: v for n, v in state["finished"].items()} == best.to_dict(), "a trial's value: its best epoch"


def test_same_seed_same_trials(four_trials, tmp_path, data_root):
    # the module's search again, from the same space in another storage path: one new search, not two
    _, first = four_trials
    second = run_search(small_space(tmp_path, data_root), name="again")

    def trials(frame):
        return frame.sort_values(["seed", "epoch"])[["seed", "epoch", "lr", "batch_size", "t_max", "clip_norm",
                                                     "val_acc"]].reset_index(drop=True)

    pd.testing.assert_frame_equal(trials(first.results), trials(second.results))


def test_rays_asha_stops_some_trials_early(ray_local, tmp_path):
    # Ray's scheduler stops on the reported metric, whichever loop reports it: the toy function's val_acc
    space = load_space(str(toy_space_file(tmp_path,  # reproducible: false keeps Ray's own ASHAScheduler
        experiment={"scheduler": "asha", "num_samples": 6, "grace_period": 1, "reproducible": False},
        training={"epochs": 4})), [])
    frame = run_search(space, name="asha").results
    per_trial = frame.groupby("trial_id").agg(status=("status", "first"), epochs=("epoch", "max"))
    stopped = per_trial[per_trial["status"] == STOPPED]
    assert len(stopped) >= 1 and (stopped["epochs"] < 4).all()
    assert (per_trial["status"] == COMPLETED).any()


@pytest.mark.parametrize("metric, mode", [("val_acc", "max"), ("val_loss", "min"), ("train_loss", "min")])
def test_divergent_trials_end_as_low_scores_not_errors(ray_local, tmp_path, data_root, metric, mode):
    """NaN losses under every metric and mode: the search ends with results and a best.yaml."""
    space = small_space(tmp_path, data_root, experiment={"num_samples": 4, "metric": metric, "mode": mode},
                        training={"epochs": 3},
                        space={"lr": {"distribution": "choice", "values": [1.0e6, 0.05]}, "clip_norm": None})
    outcome = run_search(space, name="diverge")
    per_trial = outcome.results.groupby("trial_id").agg(status=("status", "first"), epochs=("epoch", "max"),
                                                        lr=("lr", "first"))
    diverged = per_trial[per_trial["status"] == DIVERGED]
    assert len(diverged) >= 1 and (diverged["lr"] == 1.0e6).all()
    assert (diverged["epochs"] == 1).all(), "a diverged trial stops after the epoch it diverged in"
    assert (per_trial["status"] == COMPLETED).any()
    best = yaml.safe_load((Path(outcome.path) / "best.yaml").read_text())
    assert best["lr"] == 0.05, "the best trial is one that did not diverge"
    assert "best" in outcome.summary.lower()


def test_gpu_request_without_gpus_fails_before_any_trial(ray_local, tmp_path, data_root):
    space = small_space(tmp_path, data_root, resources={"gpus": 1})
    with pytest.raises(CapacityError, match=r"each trial asks for 1 CPU and 1 GPU, but no node"):
        run_search(space, name="gpu")
    assert not (tmp_path / "gpu").exists(), "no trial was created, and the claimed run folder is released"


def fails_once(marker: Path):
    """The real trainable, made to crash once right after its first epoch's checkpoint.

    A closure, so Ray pickles it by value (workers cannot import test modules).
    """

    def trial(config, **data):
        import trainable.adapter as adapter
        import trainable.loop as loop  # the adapter imports the loop when a trial runs: patched there

        real = loop.train_and_evaluate

        def flaky(run):
            with open(marker.with_suffix(".starts"), "a") as log:
                log.write(f"{run.epoch}\n")  # the epoch the run (re)starts from
            for record in real(run):
                yield record
                if not marker.exists():
                    marker.touch()
                    raise RuntimeError("injected failure")

        loop.train_and_evaluate = flaky
        try:
            adapter.tune_trial(config, **data)
        finally:
            loop.train_and_evaluate = real

    return trial


def test_crashed_trial_resumes_from_its_checkpoint(ray_local, tmp_path, data_root):
    space = small_space(tmp_path, data_root, experiment={"num_samples": 1, "max_failures": 1},
                        training={"epochs": 3})
    outcome = run_search(space, name="flaky", trainable=fails_once(tmp_path / "crashed"))
    assert (tmp_path / "crashed").exists(), "the injected failure happened"
    assert (tmp_path / "crashed.starts").read_text().split() == ["0", "1"], "restarted from epoch 1's checkpoint"
    frame = outcome.results
    assert list(frame["epoch"]) == [1, 2, 3] and set(frame["status"]) == {COMPLETED}
    # and the restored run is the same run: identical to one that never crashed
    config = TrialConfig.from_mapping(config_from_row(frame.iloc[0], results_schema(space)))
    straight = list(train_and_evaluate(build_run(config, load_data(config, data_root, with_test=False),
                                                 get_default_device())))
    assert list(frame["val_acc"]) == [r.val_acc for r in straight]
    assert_outputs_agree(Path(outcome.path))


def always_fails():
    def trial(config, **data):
        raise ValueError("broken trainable")

    return trial


def test_a_failing_trial_is_reported_not_fatal(ray_local, tmp_path, data_root):
    space = small_space(tmp_path, data_root, experiment={"num_samples": 1, "max_failures": 0})
    outcome = run_search(space, name="failing", trainable=always_fails())
    assert list(outcome.results["status"]) == ["ERROR"]
    assert outcome.best is None and not (tmp_path / "failing" / "best.yaml").exists()
    assert "Failed: " in outcome.summary and "ValueError: broken trainable" in outcome.summary
    assert_outputs_agree(Path(outcome.path))
