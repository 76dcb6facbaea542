"""An interrupted search (driver killed with SIGKILL) resumes to exactly num_samples trials,
from the spec stored in its run folder, whatever the space file says by then."""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from search.store.results import COMPLETED
from tests.helpers import SMALL, assert_kept_checkpoints, assert_outputs_agree, stop_session

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def wait_for(condition, timeout: float, what: str):
    """Poll `condition` until it returns something other than None (it watches another process's files)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value is not None:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def completed_trials(results: Path) -> pd.DataFrame | None:
    if not results.exists():
        return None
    frame = pd.read_parquet(results)
    if "status" not in frame:  # written before any trial had a row: no columns yet
        return None
    done = frame[frame["status"] == COMPLETED]
    return done if done["trial_id"].nunique() >= 2 else None


def test_killed_search_resumes_without_losing_trials(tmp_path, data_root):
    raw = copy.deepcopy(SMALL)
    raw["experiment"].update(num_samples=6, max_concurrent=2, storage_path=str(tmp_path / "runs"))
    raw["data"].update(root=str(data_root))
    raw["training"].update(epochs=3)
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "search", "--space", str(space_file), "--name", "interrupted"]
    results = tmp_path / "runs" / "interrupted" / "results.parquet"

    # its own session, so everything it starts (Ray included) can be stopped by group id
    driver = subprocess.Popen(command, cwd=REPO, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        before = wait_for(lambda: completed_trials(results), 180, "two completed trials")
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        stop_session(driver)  # what the killed driver had started
    assert driver.returncode == -signal.SIGKILL

    # the user edits the space file before resuming: the stored spec still decides
    edited = copy.deepcopy(raw)
    edited["experiment"]["num_samples"] = 9
    edited["training"]["epochs"] = 5
    space_file.write_text(yaml.safe_dump(edited))
    resumed = subprocess.run(command + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "differs from the stored spec of this run in experiment.num_samples, training.epochs" in resumed.stderr
    after = pd.read_parquet(results)
    assert after["trial_id"].nunique() == 6, "exactly num_samples trials in all"
    assert set(after["status"]) == {COMPLETED}, resumed.stdout[-3000:]
    assert (after.groupby("trial_id")["epoch"].apply(sorted).map(lambda e: e == [1, 2, 3])).all()
    # every trial completed before the kill is kept with its rows unchanged (by trial number: one
    # that ended after Tune's last snapshot runs again under a new id, with the same results)
    kept = after[after["trial_number"].isin(before["trial_number"])].sort_values(["trial_number", "epoch"])
    columns = ["trial_number", "epoch", "seed", "lr", "val_acc", "val_loss"]
    pd.testing.assert_frame_equal(kept[columns].reset_index(drop=True),
                                  before.sort_values(["trial_number", "epoch"])[columns].reset_index(drop=True))
    assert "Top trials by val_acc (max), 6 trials" in resumed.stdout
    assert_outputs_agree(results.parent)
    assert_kept_checkpoints(results.parent)  # trials resumed with checkpoints from before the kill too

    # and the resumed search equals one that was never stopped: same trials, same numbers
    space_file.write_text(yaml.safe_dump(raw))
    straight_command = command[:-1] + ["straight"]
    straight = subprocess.run(straight_command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    never_stopped = pd.read_parquet(tmp_path / "runs" / "straight" / "results.parquet")
    table = ["trial_number", "epoch", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc", "val_loss"]
    pd.testing.assert_frame_equal(after.sort_values(["trial_number", "epoch"])[table].reset_index(drop=True),
                                  never_stopped.sort_values(["trial_number", "epoch"])[table].reset_index(drop=True))
