"""KeepCheckpoints (experiment.num_to_keep), called in the order Tune calls it: a checkpoint with its
report, `get_state` at each of Tune's saves of its state, `on_experiment_end` after the final save.

The trial is a stand-in for Tune's Trial with the four attributes the callback reads; the
checkpoints are real folders, deleted through pyarrow's local file system as on storage.
Searches with it: tests/searches/test_export.py, test_scale.py, test_faults.py (a stop and resume), test_resume.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from ray import tune

from search.store.retention import KeepCheckpoints


class Trial:
    """What KeepCheckpoints reads of a Tune trial, updated as Tune updates it."""

    def __init__(self, folder: Path, trial_id: str = "t0"):
        self.trial_id, self.local_path, self.folder = trial_id, str(folder), folder
        self.last_result: dict = {}
        self.checkpoint: tune.Checkpoint | None = None  # Tune sets it after the callbacks have seen one
        folder.mkdir(parents=True, exist_ok=True)

    def report(self, keep: KeepCheckpoints, k: int, val_acc: float, metric: str = "val_acc") -> None:
        path = self.folder / f"checkpoint_{k:06d}"
        path.mkdir()
        self.last_result = {metric: val_acc, "checkpoint_dir_name": path.name}
        with (self.folder / "result.json").open("a") as f:
            f.write(json.dumps(self.last_result) + "\n")
        checkpoint = tune.Checkpoint(str(path))
        keep.on_checkpoint(iteration=k, trials=[self], trial=self, checkpoint=checkpoint)
        self.checkpoint = checkpoint

    def on_disk(self) -> set[int]:
        return {int(p.name.split("_")[1]) for p in self.folder.glob("checkpoint_*")}


def test_the_best_and_the_latest_stay_as_ray_keeps_them(tmp_path):
    keep, trial = KeepCheckpoints(1, "val_acc", "max"), Trial(tmp_path / "t")
    for k, acc in enumerate([0.5, 0.7, 0.6, float("nan"), 0.7, 0.1]):
        trial.report(keep, k, acc)
        keep.get_state()
        keep.get_state()  # two saves since: nothing is held for a saved state
    assert trial.on_disk() == {4, 5}, "the newer of two equal best scores, and the latest"


def test_min_mode_and_several_to_keep(tmp_path):
    keep, trial = KeepCheckpoints(2, "val_loss", "min"), Trial(tmp_path / "t")
    for k, loss in enumerate([0.9, 0.3, 0.5, 0.2, 0.8]):
        trial.report(keep, k, loss, metric="val_loss")
        keep.get_state()
        keep.get_state()
    assert trial.on_disk() == {1, 3, 4}


def test_no_metric_keeps_the_newest(tmp_path):
    keep, trial = KeepCheckpoints(2, None, None), Trial(tmp_path / "t")  # several objectives
    for k, acc in enumerate([0.9, 0.1, 0.2, 0.3]):
        trial.report(keep, k, acc)
    keep.get_state()
    keep.on_experiment_end(trials=[trial])
    assert trial.on_disk() == {2, 3}


def test_a_checkpoint_that_a_saved_state_names_stays_until_two_later_saves(tmp_path):
    keep, trial = KeepCheckpoints(1, "val_acc", "max"), Trial(tmp_path / "t")
    trial.report(keep, 0, 0.9)
    trial.report(keep, 1, 0.5)  # 0 is the best: nothing to delete yet
    keep.get_state()  # Tune's state names checkpoint 1 as the trial's latest
    trial.report(keep, 2, 0.6)  # 1 is no longer kept, but a resume now would restore it
    assert trial.on_disk() == {0, 1, 2}
    keep.get_state()  # names 2; the copy on storage may still be the save before
    assert trial.on_disk() == {0, 1, 2}
    keep.get_state()
    assert trial.on_disk() == {0, 2}
    trial.report(keep, 3, 0.7)  # 2 was named by the last two saves: held
    trial.report(keep, 4, 0.8)  # 3 was never named: deleted at once
    assert trial.on_disk() == {0, 2, 4}
    keep.get_state()  # Tune's final save, waited for: names 4 and the best, 0
    keep.on_experiment_end(trials=[trial])
    assert trial.on_disk() == {0, 4}


def test_an_end_without_a_final_save_keeps_what_a_saved_state_may_name(tmp_path):
    keep, trial = KeepCheckpoints(1, "val_acc", "max"), Trial(tmp_path / "t")
    trial.report(keep, 0, 0.9)
    trial.report(keep, 1, 0.5)
    keep.get_state()  # names 1
    trial.report(keep, 2, 0.6)
    keep.on_step_end(iteration=3, trials=[trial])
    keep.on_experiment_end(trials=[trial])  # Tune's loop raised: no final save, its last one names 1
    assert trial.on_disk() == {0, 1, 2}


def test_a_resumed_trial_ranks_its_checkpoints_from_before_and_keeps_the_one_it_restored(tmp_path):
    before, trial = KeepCheckpoints(1, "val_acc", "max"), Trial(tmp_path / "t")
    for k, acc in enumerate([0.8, 0.6, 0.7]):
        trial.report(before, k, acc)
        before.get_state()
    # killed here: on storage 0 (best), 1 (held: a saved state named it), 2 (the latest)
    assert trial.on_disk() == {0, 1, 2}
    after = KeepCheckpoints(1, "val_acc", "max")  # the resumed driver's copy knows nothing yet
    trial.checkpoint = tune.Checkpoint(str(trial.folder / "checkpoint_000001"))  # say Tune restored from 1
    trial.report(after, 3, 0.9)
    assert trial.on_disk() == {1, 3}, "0 and 2 ranked from result.json; 1 held: the state resumed names it"
    after.get_state()
    after.get_state()
    trial.report(after, 4, 0.1)
    assert trial.on_disk() == {3, 4}


def test_a_checkpoint_already_gone_is_no_error(tmp_path):
    keep, trial = KeepCheckpoints(1, "val_acc", "max"), Trial(tmp_path / "t")
    trial.report(keep, 0, 0.1)
    (trial.folder / "checkpoint_000000").rmdir()  # removed by hand before the callback got to it
    trial.report(keep, 1, 0.9)
    keep.on_experiment_end(trials=[trial])
    assert trial.on_disk() == {1}


def test_the_best_epoch_of_tied_scores_is_the_one_whose_checkpoint_is_kept(tmp_path):
    """Issue 49 item 5: best.yaml named the earlier of two equal epochs while num_to_keep kept the newer, so
    `make run` printed no test accuracy and `export` exited 2. One rule now: of equal scores, the later epoch."""
    import pandas as pd

    from search.definition.ranking import points, ranked
    from search.definition.objectives import objectives_of
    from search.definition.schema import Experiment

    keep, trial = KeepCheckpoints(num_to_keep=1, metric="val_acc", mode="max"), Trial(tmp_path / "t0")
    accuracies = [0.90, 0.97, 0.96, 0.97, 0.95]  # epochs 2 and 4 tie
    for k, acc in enumerate(accuracies, start=1):
        trial.report(keep, k, acc)
    frame = pd.DataFrame({"trial_id": ["t0"] * 5 + ["t1"] * 2, "trial_number": [0] * 5 + [1] * 2,
                          "epoch": [1, 2, 3, 4, 5, 1, 2], "val_acc": [*accuracies, 0.97, 0.5]})
    assert trial.on_disk() == {4, 5}, "the newer of the equal best, and the latest"
    best = ranked(frame, "val_acc", "max").iloc[0]
    assert (best["trial_number"], best["epoch"]) == (0, 4), "of equal trials the earlier, of its epochs the later"
    point = points(frame[frame["trial_id"] == "t0"], objectives_of(Experiment(metric="val_acc", mode="max")))
    assert list(point["epoch"]) == [4]
