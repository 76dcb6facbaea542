"""A parallel search reproduces: same seed, same trial numbers, configs and metrics, whatever finishes first."""

from __future__ import annotations

import pandas as pd
import pytest

from search.driver import run_search
from tests.helpers import small_space

pytestmark = pytest.mark.slow
TABLE = ["trial_number", "epoch", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc", "val_loss"]


def delayed(slow_parity: int):
    """The real trainable, with trials of one trial-number parity held back before they train.

    The hold-back changes which trials finish first; it synchronises nothing. A closure, so
    Ray pickles it by value (workers cannot import test modules).
    """

    def trial(config, **data):
        import time

        from trainable.adapter import tune_trial

        if config["trial_number"] % 2 == slow_parity:
            time.sleep(3)
        tune_trial(config, **data)

    return trial


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trial_number", "epoch"])[TABLE].reset_index(drop=True)


def finishing_order(frame: pd.DataFrame) -> list[int]:
    last = frame.sort_values("epoch").groupby("trial_number")["finished_at"].last()
    return list(last.sort_values().index)


def test_two_searches_whose_trials_finish_in_other_orders_give_one_table(ray_local, tmp_path, data_root):
    space = small_space(tmp_path, data_root, experiment={"num_samples": 8, "max_concurrent": 3},
                        resources={"cpus": 0.5}, training={"epochs": 1}, data={"train_size": 1000})
    first = run_search(space, name="even-slow", trainable=delayed(0)).results
    second = run_search(space, name="odd-slow", trainable=delayed(1)).results
    assert finishing_order(first) != finishing_order(second), "the trials did finish in other orders"
    assert sorted(first["trial_number"].unique()) == list(range(8))
    pd.testing.assert_frame_equal(table(first), table(second))
