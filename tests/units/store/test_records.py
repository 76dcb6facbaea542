"""result.json, the record results.parquet is derived from, keeps every report when a trial starts again."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from ray import tune
from ray.tune.logger import JsonLoggerCallback
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from search.store.results import RECORD_FILE
from search.execution.tuner import KeepingJsonLogger

EPOCHS = 4


def four_epochs():
    """A trainable reporting epochs 1..4 with a checkpoint each; a restart goes on after its checkpoint's epoch.
    Made here, so that Ray pickles it by value (the tests folder is not on the workers' path)."""

    def train(config: dict) -> None:
        start = 0
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as folder, open(os.path.join(folder, "epoch.json")) as f:
                start = json.load(f)
        for epoch in range(start + 1, EPOCHS + 1):
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "epoch.json"), "w") as f:
                    json.dump(epoch, f)
                tune.report({"epoch": epoch}, checkpoint=tune.Checkpoint.from_directory(folder))

    return train


class PauseOnce(FIFOScheduler):
    """Pauses the trial once, at epoch 2, as a rung does; it starts again from that epoch's checkpoint."""

    _supports_buffered_results = False

    def __init__(self):
        super().__init__()
        self.paused = False

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        if result["epoch"] == 2 and not self.paused:
            self.paused = True
            return TrialScheduler.PAUSE
        return TrialScheduler.CONTINUE


class LaggingUpload(tune.Callback):
    """What a background upload of the driver's folder does when it began before the trial's last
    report and lands after it: the run folder's result.json lacks that report when the trial starts again."""

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        local = os.path.join(trial.local_path, RECORD_FILE)
        if os.path.exists(local):  # a restart: the driver's copy holds epochs 1 and 2
            with open(local) as f:
                first = f.readline()
            with open(os.path.join(trial.path, RECORD_FILE), "w") as f:
                f.write(first)


def recorded_epochs(tmp_path, name: str, logger: JsonLoggerCallback) -> list[int]:
    tuner = tune.Tuner(four_epochs(), tune_config=tune.TuneConfig(scheduler=PauseOnce(), num_samples=1),
                       run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), verbose=0,
                                                 callbacks=[LaggingUpload(), logger]))
    [result] = list(tuner.fit())
    with open(os.path.join(result.path, RECORD_FILE)) as f:
        return [json.loads(line)["epoch"] for line in f]


@pytest.mark.slow
def test_a_trial_started_again_keeps_the_report_a_lagging_upload_missed(ray_local, tmp_path):
    # Tune's own logger takes the run folder's copy back over the driver's: epoch 2 is lost
    assert recorded_epochs(tmp_path, "tunes", JsonLoggerCallback()) == [1, 3, 4]
    assert recorded_epochs(tmp_path, "ours", KeepingJsonLogger()) == [1, 2, 3, 4]


def test_a_record_of_any_release_reads_back_its_placement_and_phases_as_columns():
    """result.json holds a report's placement and phase columns as one value (trainable/report.py PACKED):
    JSON text now, a list of pairs in the first packing, the columns one by one before it. Each reads back
    as the columns, and a report without any of them is left as it is."""
    from trainable.report import PACKED, packed, unpacked

    report = {"val_acc": 0.5, "epoch": 2, "node": "n1", "device": "cpu", "world_size": 1, "ready_at": 1.5,
              "fetch_seconds": float("nan"), "finished_at": None}
    sent = packed(report)
    assert set(sent) == {"val_acc", "epoch", PACKED} and isinstance(sent[PACKED], str)
    through_json = json.loads(json.dumps(sent))  # as Tune's JSON logger writes it and results.read_record reads it
    for record in (through_json, {**sent, PACKED: json.loads(sent[PACKED])}, report):
        back = unpacked(record)
        assert back.keys() == report.keys() and back["node"] == "n1" and back["ready_at"] == 1.5, record
        assert back["fetch_seconds"] != back["fetch_seconds"] and back["finished_at"] is None
    assert unpacked({"val_acc": 0.5}) == {"val_acc": 0.5} and packed({"val_acc": 0.5}) == {"val_acc": 0.5}


def test_our_json_logger_writes_the_lines_tunes_writes(ray_local, tmp_path):
    """KeepingJsonLogger writes a report with json's C encoder (search/execution/ray_internals.py's record_file):
    the same bytes as Tune's logger, for every kind of value a report and its config hold."""
    import numpy as np
    from ray.train._internal.storage import StorageContext
    from ray.tune.experiment import Trial

    results = [
        {"val_acc": np.float32(0.5), "loss": float("nan"), "inf": float("inf"), "epoch": np.int64(3), "ok": np.bool_(True),
         "none": None, "list": [1, 2.5, "x"], "array": np.arange(3), "text": "ü \"q\" \n", "done": False,
         "config": {"lr": np.float64(0.1), "model": {"hidden_sizes": (64, 32)}, "name": "a/b"}},
        {"val_acc": 0.25, "epoch": 4, "placement_and_phases": json.dumps([["node", "n1"], ["ready_at", None]]),
         "other": object.__new__(tune.Callback), "config": {}},
    ]
    written = {}
    for name, logger in (("tunes", JsonLoggerCallback()), ("ours", KeepingJsonLogger())):
        trial = Trial("noop", config={"lr": 0.1}, stub=True,
                      storage=StorageContext(storage_path=str(tmp_path), experiment_dir_name=name))
        trial.storage.trial_dir_name = "trial_0"
        os.makedirs(trial.local_path)
        logger.log_trial_start(trial)
        for epoch, result in enumerate(results, 1):
            logger.log_trial_result(epoch, trial, result)
        logger.log_trial_end(trial)
        with open(os.path.join(trial.local_path, RECORD_FILE), "rb") as f:
            written[name] = f.read()
    assert written["ours"].count(b"\n") == len(results)
    assert written["ours"] == written["tunes"]
