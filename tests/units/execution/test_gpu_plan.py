"""GPUs on their own: the 8-GPU arithmetic of spreading trials, the probe's knee on stand-in figures and the
copies it measures (searches over fake GPUs: tests/searches/test_gpus.py)."""

from __future__ import annotations

import copy
import importlib.util
import time
from pathlib import Path

import pytest

from search.execution.capacity import spread_gpus
from search.execution.gpu_probe import (Round, choose_trials_per_gpu, copies_wanted, largest_config, probe,
                                        rounds_to_try)
from search.definition.schema import Resources
from search.definition.space import parse_space
from tests.helpers import SMALL, small_space
from trainable.data import load_data


REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("nodes, resources, trials, gpus", [
    ([{"CPU": 8, "GPU": 8}], Resources(cpus=1, gpus=0.125), 8, 1.0),
    ([{"CPU": 8, "GPU": 8}], Resources(cpus=1, gpus=0.125), 4, 1.0),  # fewer trials than GPUs: one GPU each
    ([{"CPU": 32, "GPU": 8}], Resources(cpus=1, gpus=0.125), 16, 0.5),
    ([{"CPU": 32, "GPU": 8}], Resources(cpus=1, gpus=0.125), 24, 0.3333),  # three to a GPU: 0.3333 x 3 fits
    ([{"CPU": 32, "GPU": 8}], Resources(cpus=1, gpus=0.5), 16, 0.5),  # already fills every GPU
    ([{"CPU": 32, "GPU": 8}], Resources(cpus=1, gpus=0.4), 20, 0.5),  # 0.4 fits two per GPU, as 0.5 does
    ([{"CPU": 32, "GPU": 8}], Resources(cpus=1, gpus=0.3), 24, 0.3333),  # three per GPU either way
    # unequal nodes: the GPU-less head holds none; the small node is CPU-bound at 2 trials
    ([{"CPU": 4, "GPU": 0}, {"CPU": 16, "GPU": 4}, {"CPU": 2, "GPU": 4}], Resources(cpus=1, gpus=0.125), 6, 1.0),
    ([{"CPU": 4, "GPU": 0}, {"CPU": 16, "GPU": 4}, {"CPU": 2, "GPU": 4}], Resources(cpus=1, gpus=0.125), 12, 0.3333),
    ([{"CPU": 8, "GPU": 8}], Resources(cpus=1, gpus=0.125, spread=False), 8, 0.125),
    ([{"CPU": 8, "GPU": 8}], Resources(cpus=1, gpus=0.0), 8, 0.0),
])
def test_spread_takes_the_largest_fraction_that_still_holds_the_trials(nodes, resources, trials, gpus):
    assert spread_gpus(nodes, resources, trials).gpus == gpus


def test_an_autoscaler_cluster_keeps_the_fraction_and_says_why():
    plan = spread_gpus([{"CPU": 4, "GPU": 0}], Resources(cpus=1, gpus=0.25), 8, autoscaler=True)
    assert plan.gpus == 0.25 and "autoscaler adds them" in plan.note


def stand_in(*steps: float | None, context: float | None = 500.0, reserved: float | None = 4000.0) -> list[Round]:
    """Rounds of 1, 2, 4, ... copies with these aggregate steps/s (None: the round failed);
    context and reserved None: the CPU's figures (no memory)."""
    gpu = context is not None and reserved is not None
    return [Round(2 ** i, s, context, reserved, 2 ** i * (context + reserved) if gpu and s else None,
                  "" if s is not None else "OutOfMemoryError: CUDA out of memory")
            for i, s in enumerate(steps)]


@pytest.mark.parametrize("rounds, total_mb, chosen, why", [
    (stand_in(100, 190, 350, 370), 140_000, 4, "8 at once gained +6% steps/s over 4"),  # the knee
    (stand_in(100, 190, 350, 700), 140_000, 8, "the largest round tried"),
    (stand_in(100, 190, 350, 700), 20_000, 4, "8 at once would not fit 18000 MiB"),  # memory, not speed
    (stand_in(100, 190, None), 140_000, 2, "4 at once failed (OutOfMemoryError"),
    (stand_in(100, 105), 140_000, 1, "2 at once gained +5%"),  # a GPU one trial already fills
    (stand_in(None), 140_000, 1, "one trial alone could not be measured"),
    (stand_in(100, 180, 300, context=None, reserved=None), None, 4, "the largest round tried"),  # CPU stand-in
])
def test_the_knee_is_the_most_trials_that_fit_and_still_pay(rounds, total_mb, chosen, why):
    choice = choose_trials_per_gpu(rounds, total_mb)
    assert choice.trials_per_gpu == chosen and why in choice.reason


def test_rounds_double_up_to_what_the_cpus_allow():
    assert rounds_to_try(1) == [1] and rounds_to_try(6) == [1, 2, 4] and rounds_to_try(100) == [1, 2, 4, 8, 16]


def test_the_probe_stops_at_the_trials_the_search_runs_at_once_on_a_gpu():
    """Rounds past what the search can run at once per GPU are waited for and never used (on the H200,
    the default space's probe went on to 16 copies for max_concurrent 2)."""
    assert copies_wanted(max_concurrent=2, num_samples=16, gpus=1) == 2
    assert copies_wanted(max_concurrent=3, num_samples=16, gpus=1) == 4, "up to the round that holds all 3"
    assert copies_wanted(max_concurrent=16, num_samples=100, gpus=8) == 2, "spread over the cluster's GPUs"
    assert copies_wanted(max_concurrent=8, num_samples=2, gpus=1) == 2, "no more than the trials there are"
    assert copies_wanted(max_concurrent=4, num_samples=10, gpus=0) == 4, "a GPU an autoscaler will add counts as one"
    assert rounds_to_try(copies_wanted(2, 16, 1)) == [1, 2]


def test_the_probe_takes_the_largest_batch_and_model():
    raw = copy.deepcopy(SMALL)
    raw["model"] = {}
    raw["space"]["model.hidden_sizes"] = {"distribution": "choice", "values": [[64], [512, 256], [128]]}
    space = parse_space(raw)
    config = largest_config(space, (1, 28, 28), 10)
    assert config.batch_size == 128 and config.model_args["hidden_sizes"] == [512, 256]
    assert config.num_threads == 1, "the trial's torch threads"


@pytest.mark.slow
def test_the_probe_times_copies_running_at_once(tmp_path, data_root):
    space = small_space(tmp_path, data_root, data={"train_size": 300, "val_size": 100})
    data = load_data(space.trial_defaults(), data_root).for_trials()
    flat = largest_config(space, data.input_shape, data.num_classes).to_flat()
    figures = probe(flat, data, max_copies=2, window_s=0.3)
    assert figures["device"] == "cpu" and figures["total_mb"] is None
    # round 2 always runs: after one copy alone, one is the choice so far
    assert [r["copies"] for r in figures["rounds"]] == [1, 2]
    assert all(r["steps_per_s"] > 0 and r["context_mb"] is None for r in figures["rounds"]), figures["rounds"]


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_prints_its_table():
    gpu_check = load_gpu_check()
    args = gpu_check.parse_args(["--epochs", "1", "--budget-s", "60"])
    assert (args.epochs, args.budget_s, args.trials_per_slot) == (1, 60.0, 8)
    rows = [{"trials/GPU": k, "gpus/trial": f"{1 / k:g}", "trials": f"{8 * k}/{8 * k}", "at once": k,
             "train span s": 30.0, "steady trials/min": 16.0 * k ** 0.5, "GPU util %": 40.0 * k ** 0.5,
             "alloc MiB/trial": "150 (max 160)", "reserved MiB/trial": "180 (max 200)",
             "process MiB/trial": "700 (max 720)"} for k in (1, 2, 4, 8)]
    rows.append({**rows[1], "trials/GPU": "auto (2)"})
    rows.append({**rows[0], "trials/GPU": "2 workers", "gpus/trial": "2", "steady trials/min": 24.0})
    table = gpu_check.format_table(rows)
    assert "2 workers" in table and "1.50" in table  # one trial on 2 GPUs: its rate over one trial on one
    assert table.splitlines()[0].split()[:2] == ["trials/GPU", "gpus/trial"]
    assert "vs 1/GPU" in table and "2.83" in table  # 8 per GPU: sqrt(8) times the rate of 1


def test_gpu_checks_workers_row_says_why_it_is_not_run_on_one_gpu(tmp_path, capsys):
    gpu_check = load_gpu_check()
    rows = []
    failed = gpu_check.workers_row(["0"], gpu_check.parse_args([]), tmp_path, time.monotonic() + 60, rows)
    assert not failed and rows == [] and not any(tmp_path.iterdir()), "nothing run, not a failure"
    assert "2 workers: not run: a trial of 2 workers needs 2 GPUs (nccl takes one per worker), this machine " \
           "shows 1" in capsys.readouterr().out
