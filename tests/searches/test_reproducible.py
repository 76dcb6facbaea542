"""A parallel search reproduces: same seed, same trial numbers, configs and metrics, whatever finishes first.

The trials are a toy training function (`trainable: toy.py:train`, docs/own-training-function.md)
whose metrics depend only on its config and seed, as the canonical loop's do: what is tested is
the search's side, that trial n gets the same config and seed whatever finished before it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest

from search.definition.space import parse_space
from search.driver import run_search
from tests.helpers import SMALL

pytestmark = pytest.mark.slow
TABLE = ["trial_number", "epoch", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc", "val_loss"]

# A training function as a user would write it, with trials of one trial-number parity (`slow_parity`)
# held back before they train. The hold-back changes which trials finish first; it synchronises nothing.
TOY = '''
import math
import random
import time


def train(config, report, checkpoint=None):
    if config["trial_number"] % 2 == config["slow_parity"]:
        time.sleep(3)  # holds these trials back, so the two runs finish in other orders
    noise = random.Random(config["seed"])
    acc = 1 - math.exp(-config["lr"] * config["clip_norm"] * config["t_max"] * 32 / config["batch_size"])
    for epoch in range(config["epochs"]):
        acc = min(1.0, acc + noise.gauss(0, 0.02))
        report(val_acc=acc, val_loss=-math.log(max(acc, 1e-6)) + noise.random())
'''


def toy_space(folder: Path, slow_parity: int):
    """8 trials of the toy, 3 at once (0.5 CPU each, on the 2 CPUs of ray_local), searching SMALL's keys."""
    (folder / "toy.py").write_text(TOY)
    (folder / "space.yaml").write_text("")  # a reference is relative to the space file
    raw = {"trainable": "toy.py:train",
           "experiment": {**SMALL["experiment"], "metric": "val_acc", "mode": "max", "num_samples": 8,
                          "max_concurrent": 3, "storage_path": str(folder)},
           "resources": {"cpus": 0.5},
           "training": {"epochs": 1, "slow_parity": slow_parity},
           "space": copy.deepcopy(SMALL["space"])}
    return parse_space(raw, source=str(folder / "space.yaml"))


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trial_number", "epoch"])[TABLE].reset_index(drop=True)


def finishing_order(frame: pd.DataFrame) -> list[int]:
    last = frame.sort_values("epoch").groupby("trial_number")["finished_at"].last()
    return list(last.sort_values().index)


def test_two_searches_whose_trials_finish_in_other_orders_give_one_table(ray_local, tmp_path):
    first = run_search(toy_space(tmp_path, slow_parity=0), name="even-slow").results
    second = run_search(toy_space(tmp_path, slow_parity=1), name="odd-slow").results
    assert finishing_order(first) != finishing_order(second), "the trials did finish in other orders"
    assert sorted(first["trial_number"].unique()) == list(range(8))
    pd.testing.assert_frame_equal(table(first), table(second))
