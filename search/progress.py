"""What a running search shows: a line per epoch, and each finished trial's part of results.parquet.

A Tune callback in the driver. It keeps no copy of the reports: a trial's rows are derived
from Tune's record (its result.json) when the trial ends, so the work per finished trial
stays the same however many came before.
"""

from __future__ import annotations

import math
from typing import Any

import pyarrow.fs as pafs
from ray.tune import Callback

from search.results import read_record, trial_rows
from search.run_folder import RunFolder
from search.space import Space


def is_better(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)


def number(value: Any) -> float | None:
    """A finite float, or None (NaN, inf and missing values are no score)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


class Progress(Callback):
    """Prints `[done/total] trial epoch metric | best`, writes a trial's rows when it ends."""

    def __init__(self, folder: RunFolder, space: Space):
        self.folder, self.space = folder, space
        self.metric, self.mode = space.experiment.metric, space.experiment.mode
        self.total = space.experiment.num_samples
        self.ended: set[str] = set()
        self.best: float | None = None

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.ended.discard(trial.trial_id)  # a restarted trial is running again
        value = number(result.get(self.metric))
        if value is not None and is_better(value, self.best, self.mode):
            self.best = value
        shown = "nan" if value is None else f"{value:.4f}"
        best = "-" if self.best is None else f"{self.best:.4f}"
        print(f"[{len(self.ended):>{len(str(self.total))}}/{self.total} done] trial {trial.trial_id} "
              f"epoch {result.get('epoch')}/{trial.config.get('epochs')} {self.metric} {shown} | best {best}",
              flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended(trial, error=False)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended(trial, error=True)

    def _ended(self, trial, *, error: bool) -> None:
        self.ended.add(trial.trial_id)
        # Tune's JSON logger has flushed every report of this trial to its driver-side folder
        reports = read_record(pafs.LocalFileSystem(), trial.local_path)
        self.folder.write_part(self.space, trial.trial_id,
                               trial_rows(trial.trial_id, trial.config, reports, done=True, error=error))
