"""experiment.num_to_keep: each trial keeps its best `num_to_keep` checkpoints and its latest.

Tune's `CheckpointConfig(num_to_keep)` keeps the same ones, but it also saves its whole
experiment state (every trial, the searcher's record) whenever a trial has checkpointed
num_to_keep times since the last save, so that the saved state never names a deleted
checkpoint. With the default of 1 that is a save after every checkpoint of every trial,
O(trials) each: a search of 400 one-epoch trials spent a fifth of its driver's time in them
(docs/performance.md). So Tune is told to keep every checkpoint, and saves its state by its
own time rule (~5% of the driver's time), and this callback deletes the checkpoints that are
no longer kept.

Kept, as Ray 2.60's checkpoint manager keeps them: ranked by the metric (of equal scores the
newer above), the top num_to_keep, and always the latest. With several objectives there is no
one metric: the newest num_to_keep.

What Tune's forced save guaranteed is kept another way: a resume restores each unfinished trial
from the latest checkpoint Tune's saved state names, and Tune refuses a trial whose checkpoint is
gone. So a checkpoint that was a trial's latest at one of Tune's last two saves (Tune calls
`get_state` at each) is deleted only once two later saves have passed: the copy on storage may
lag the newest by an upload (Tune uploads its state in the background, and starts no upload while
one runs). That lag is milliseconds on a local disk. On an object store it has no bound, and
Tune's own num_to_keep, which deletes at once, left a run folder whose state named deleted
checkpoints; there a resume reads tune_state.zip instead, the state of the last save, written
whole before that save's upload (search/store/snapshot.py), which names only checkpoints held here.
Tune's final save, waited for, ends a search that runs to its end, so what is still held then goes
too; after an error in Tune's loop, or a stop, it stays.
After a stop or a kill, a resumed trial's older checkpoints are ranked with its new ones at its
next checkpoint; a trial that had ended may keep up to two more.

The ranking differs from Ray's in one way: a NaN, infinite or missing metric is no score
(trainable/metrics.py score, as for best.yaml), where Ray ranks an infinity in the good direction
first and a checkpoint without the metric at the best end.
"""

from __future__ import annotations

import sys
from typing import cast

import pyarrow.fs as pafs
from ray import tune

from search.definition.ranking import Rank, rank
from search.store.results import read_record


def on_storage(checkpoint: tune.Checkpoint) -> bool:
    """Whether a checkpoint Tune lists is still there: Tune lists every one, KeepCheckpoints deletes some."""
    # Checkpoint.__init__ takes the filesystem from the path where none is given: it is never None here
    filesystem = cast(pafs.FileSystem, checkpoint.filesystem)
    return filesystem.get_file_info(checkpoint.path).type != pafs.FileType.NotFound


class KeepCheckpoints(tune.Callback):
    """Deletes each trial's checkpoints beyond its best `num_to_keep` by `metric` and its latest."""

    def __init__(self, num_to_keep: int, metric: str | None, mode: str | None):
        self.num_to_keep, self.metric, self.mode = num_to_keep, metric, mode
        self.kept: dict[str, list[tuple[Rank, str]]] = {}  # trial id -> its checkpoints still kept
        self.named: tuple[set[str], set[str]] = (set(), set())  # the latest of each trial at Tune's last two saves
        self.held: list[tuple[pafs.FileSystem, str]] = []  # no longer kept, but maybe named by a saved state
        self._saved_last = False  # whether Tune saved its state after its last controller step (its final save)
        self._failed = False  # a deletion that failed is said once

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info) -> None:
        fs, new = checkpoint.filesystem, checkpoint.path
        kept = self.kept.get(trial.trial_id)
        if kept is None:  # first seen by this process: after a resume it may already have some
            kept = self.kept[trial.trial_id] = self._earlier(trial, fs, new)
            if trial.checkpoint is not None:  # what it was restored from: named by the state it resumed
                self.named[0].add(trial.checkpoint.path)
                self.named[1].add(trial.checkpoint.path)
        # the report that came with this checkpoint is the trial's last result when Tune hands it over
        order = max((r[2] for r, _ in kept), default=-1) + 1
        kept.append((rank(trial.last_result.get(self.metric) if self.metric else None, self.mode, order), new))
        keep = {path for _, path in sorted(kept)[-self.num_to_keep:]} | {new}
        self.kept[trial.trial_id] = [entry for entry in kept if entry[1] in keep]
        self._delete([(fs, path) for _, path in kept if path not in keep])

    def get_state(self) -> None:
        """Tune saves its state: each trial's latest checkpoint is now named there."""
        latest = {max(kept, key=lambda entry: entry[0][2])[1] for kept in self.kept.values() if kept}
        self.named = (self.named[1], latest)
        self._saved_last = True
        held, self.held = self.held, []
        self._delete(held)
        return None  # nothing of ours for Tune to save

    def on_step_end(self, iteration, trials, **info) -> None:
        self._saved_last = False

    def on_experiment_end(self, trials, **info) -> None:
        """After Tune's final save, waited for, only what it names must stay; Tune also ends here after
        an error in its loop, with no final save: then everything held stays."""
        if not self._saved_last:
            return
        self.named = (set(), self.named[1])
        held, self.held = self.held, []
        self._delete(held)

    def _delete(self, paths: list[tuple[pafs.FileSystem, str]]) -> None:
        for fs, path in paths:
            if path in self.named[0] or path in self.named[1]:
                self.held.append((fs, path))
                continue
            try:
                fs.delete_dir(path)  # what Tune's own deletion calls
            except FileNotFoundError:
                pass  # gone already: removed by hand, or by an earlier process of this search
            except Exception as failure:  # a checkpoint left behind costs disk, never the search (Tune's rule too)
                if not self._failed:
                    self._failed = True
                    print(f"note: could not delete the checkpoint {path} that num_to_keep no longer keeps "
                          f"({type(failure).__name__}: {failure}); it and any others like it stay",
                          file=sys.stderr, flush=True)

    def _earlier(self, trial, fs: pafs.FileSystem, new: str) -> list[tuple[Rank, str]]:
        """A trial's other checkpoints already on storage (a resumed trial's), ranked by its record's reports."""
        folder = new.rstrip("/").rpartition("/")[0]
        paths = sorted(i.path for i in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
                       if i.type == pafs.FileType.Directory and i.base_name.startswith("checkpoint_") and i.path != new)
        if not paths:
            return []
        metrics = {r["checkpoint_dir_name"]: r.get(self.metric) if self.metric else None
                   for r in read_record(pafs.LocalFileSystem(), trial.local_path) if r.get("checkpoint_dir_name")}
        return [(rank(metrics.get(path.rpartition("/")[2]), self.mode, order), path)
                for order, path in enumerate(paths)]
