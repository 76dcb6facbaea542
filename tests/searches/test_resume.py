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
from tests.helpers import SMALL, TOY_FUNCTION, assert_kept_checkpoints, assert_outputs_agree, stop_session

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


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


# The driver is what this file is about, not the MNIST loop: the user's training function of tests/helpers.py
# (TOY_FUNCTION, milliseconds a trial) with HOLDING appended, so that the kill finds a trial mid-run. Each trial
# takes a ticket as it starts; while the file `hold` exists, a trial after the first two stops after its first
# report (epoch 1, checkpointed), says so in the folder `held`, and waits there until the driver's kill ends it.
# Without `hold` (the resume, the search never stopped) every trial is TOY_FUNCTION's: the same numbers.
HOLDING = '''
import os
import threading

HOLD, HELD, TICKETS = {hold!r}, {held!r}, {tickets!r}
toy_train = train


def ticket():
    """The number of trials of this folder that started before this one (0 for the first)."""
    number = 0
    while True:
        try:
            os.close(os.open(os.path.join(TICKETS, str(number)), os.O_CREAT | os.O_EXCL))
            return number
        except FileExistsError:
            number += 1


def train(config, report, checkpoint=None):
    number = ticket()

    def held_report(**result):
        report(**result)
        if number >= 2 and os.path.exists(HOLD):
            open(os.path.join(HELD, str(number)), "w").close()
            threading.Event().wait()  # ended by the driver's kill only

    toy_train(config, held_report, checkpoint)
'''


def reported(run: Path) -> int:
    """How many trials have a report in their result.json in the run folder."""
    return sum(1 for record in run.glob("trial_*/result.json") if record.stat().st_size)


def held_toy_space(tmp_path: Path) -> dict:
    """SMALL's experiment and searched keys on TOY_FUNCTION + HOLDING (tmp_path/toy.py), as a space file holds them."""
    for folder in ("held", "tickets"):
        (tmp_path / folder).mkdir()
    holding = HOLDING.format(hold=str(tmp_path / "hold"), held=str(tmp_path / "held"), tickets=str(tmp_path / "tickets"))
    (tmp_path / "toy.py").write_text(TOY_FUNCTION + holding)
    return {"trainable": "toy.py:train",
            "experiment": {**copy.deepcopy(SMALL["experiment"]), "metric": "val_acc", "mode": "max"},
            "resources": copy.deepcopy(SMALL["resources"]),
            "training": {"epochs": SMALL["training"]["epochs"]},
            "space": copy.deepcopy(SMALL["space"])}


def test_killed_search_resumes_without_losing_trials(ray_local, tmp_path):
    raw = held_toy_space(tmp_path)
    # one trial at a time (SMALL's): a second slot would cost each of the three searches a second trial process
    raw["experiment"].update(num_samples=6, storage_path=str(tmp_path / "runs"))
    raw["training"].update(epochs=3)
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "search", "--space", str(space_file), "--name", "interrupted"]
    results = tmp_path / "runs" / "interrupted" / "results.parquet"

    (tmp_path / "hold").write_text("")
    # its own session, so everything it starts (Ray included) can be stopped by group id
    driver = subprocess.Popen(command, cwd=REPO, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # the third trial held mid-run (the one slot: no other trial can end now), two completed before it;
        # the kill waits for a snapshot of Tune's that holds the held trial's first report and checkpoint (the
        # trials' result.json reach the run folder with Tune's snapshots only), so the resume continues it
        wait_for(lambda: True if any((tmp_path / "held").iterdir()) or driver.poll() is not None else None, 180,
                 "a trial held after its first epoch")
        wait_for(lambda: True if reported(results.parent) >= 3 or driver.poll() is not None else None, 180,
                 "a snapshot of Tune's with the held trial")
        assert driver.poll() is None, "the driver ended before the kill"
        before = wait_for(lambda: completed_trials(results), 180, "two completed trials")
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        stop_session(driver)  # what the killed driver had started
    assert driver.returncode == -signal.SIGKILL
    (tmp_path / "hold").unlink()

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

    # and the resumed search equals one that was never stopped: same trials, same numbers (that search is
    # not about the command: in this process, on the session's Ray, from the space file as the command reads it)
    from search.cli import load_space
    from search.driver import run_search

    space_file.write_text(yaml.safe_dump(raw))
    straight = run_search(load_space(str(space_file), []), name="straight")
    assert straight.succeeded and not straight.interrupted, straight.summary
    never_stopped = pd.read_parquet(tmp_path / "runs" / "straight" / "results.parquet")
    table = ["trial_number", "epoch", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc", "val_loss"]
    pd.testing.assert_frame_equal(after.sort_values(["trial_number", "epoch"])[table].reset_index(drop=True),
                                  never_stopped.sort_values(["trial_number", "epoch"])[table].reset_index(drop=True))
