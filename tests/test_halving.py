"""Early stopping that reproduces: the same trials stop at the same epochs, whatever runs at once."""

from __future__ import annotations

import pandas as pd
import pytest

from search.driver import run_search
from tests.helpers import small_space
from trainable.errors import ConfigError

pytestmark = pytest.mark.slow
TABLE = ["trial_number", "epoch", "status", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc"]


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trial_number", "epoch"])[TABLE].reset_index(drop=True)


def stopped_early(frame: pd.DataFrame, epochs: int) -> dict[int, int]:
    """trial number -> last epoch, for the trials that ended before `epochs`."""
    last = frame.groupby("trial_number")["epoch"].max()
    return {int(n): int(e) for n, e in last.items() if e < epochs}


def two_runs(tmp_path, data_root, scheduler: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The same 12 trials x 4 epochs at 4 trials at once (0.5 CPU each) and at 2 (1 CPU each, on the 2 CPUs of ray_local)."""
    runs = []
    for cpus in (0.5, 1):
        space = small_space(tmp_path, data_root, experiment={"num_samples": 12, "max_concurrent": 4,
                                                             "scheduler": scheduler},
                            resources={"cpus": cpus}, training={"epochs": 4}, model={"hidden_sizes": [16]},
                            data={"train_size": 300, "val_size": 200})
        runs.append(run_search(space, name=f"{scheduler}-{cpus}"))
    return runs[0].results, runs[1].results, runs[1].summary


def test_reproducible_asha_stops_the_same_trials_at_the_same_epochs(ray_local, tmp_path, data_root):
    first, second, summary = two_runs(tmp_path, data_root, "asha")
    assert stopped_early(first, 4), "some trials stopped early"
    assert stopped_early(first, 4) == stopped_early(second, 4)
    pd.testing.assert_frame_equal(table(first), table(second))
    assert "asha: reproducible" in summary

    # a trial stopped while it waited at a rung can stay PAUSED in Tune's record: Tune re-snapshots a
    # trial only when it has an actor. A resume with one trial more must not run it on from its rung.
    import json

    state = sorted((tmp_path / "asha-1").glob("experiment_state-*.json"))[-1]
    record = json.loads(state.read_text())
    for entry in record["trial_data"]:
        trial = json.loads(entry[0])
        if trial["config"]["trial_number"] in stopped_early(second, 4):
            entry[0] = json.dumps({**trial, "status": "PAUSED"})
    state.write_text(json.dumps(record))
    space = small_space(tmp_path, data_root, experiment={"num_samples": 13, "max_concurrent": 4, "scheduler": "asha"},
                        resources={"cpus": 1}, training={"epochs": 4}, model={"hidden_sizes": [16]},
                        data={"train_size": 300, "val_size": 200})
    resumed = run_search(space, name="asha-1", resume=True).results
    assert sorted(resumed["trial_number"].unique()) == list(range(13))
    pd.testing.assert_frame_equal(table(resumed[resumed["trial_number"] < 12]), table(second))


def test_reproducible_hyperband_stops_the_same_trials_at_the_same_epochs(ray_local, tmp_path, data_root):
    first, second, summary = two_runs(tmp_path, data_root, "hyperband")
    assert stopped_early(first, 4), "some trials stopped early"
    assert stopped_early(first, 4) == stopped_early(second, 4)
    pd.testing.assert_frame_equal(table(first), table(second))
    assert "hyperband: reproducible" in summary


def test_a_rung_without_its_checkpoint_is_refused_before_the_search(tmp_path, data_root):
    with pytest.raises(ConfigError) as error:
        small_space(tmp_path, data_root, experiment={"scheduler": "asha", "grace_period": 3, "checkpoint_every": 2},
                    training={"epochs": 6})
    assert "experiment.checkpoint_every: must divide grace_period (3) for a reproducible asha" in str(error.value)
