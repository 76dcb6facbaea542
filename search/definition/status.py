"""A trial's status: the one list of the words results.parquet, the journal, the summary and `runs` use,
and the words of Tune's own record that hpsearch reads (search/outputs/finish.py, preflight.py).

Plain strings, not an Enum: each goes as it is into Parquet, YAML (yaml.safe_dump refuses str subclasses)
and Optuna's user attributes; `Status` is their type for the type checker.
"""

from __future__ import annotations

from typing import Final, Literal

# How each trial ended, in results.parquet. INTERRUPTED: the search stopped (Ctrl-C, SIGTERM, a killed
# driver) before the trial finished; --resume continues it from its last checkpoint.
COMPLETED: Final = "COMPLETED"
STOPPED: Final = "STOPPED"  #: a scheduler stopped it at a rung (asha, hyperband, bohb) or PBT's end
DIVERGED: Final = "DIVERGED"  #: its loss went NaN or inf
ERROR: Final = "ERROR"
INTERRUPTED: Final = "INTERRUPTED"
# LOST: the trial's folder (Tune's record of it) and its results part are both gone; a note names it.
LOST: Final = "LOST"
# A trial that has not ended, as the journal's status user attribute says it
RUNNING: Final = "RUNNING"
PENDING: Final = "PENDING"

Status = Literal["COMPLETED", "STOPPED", "DIVERGED", "ERROR", "INTERRUPTED", "LOST", "RUNNING", "PENDING"]
ENDED: Final = (COMPLETED, STOPPED, DIVERGED, ERROR)  #: a trial with one of these will not run again
UNFINISHED: Final = (ERROR, INTERRUPTED)  #: no result stands for these where a finished trial's does

# Tune's words for a trial in its own record (ray.tune.experiment.Trial's states); Tune's ERROR is ours
TUNE_TERMINATED: Final = "TERMINATED"
TUNE_PENDING: Final = "PENDING"
TUNE_ENDED: Final = (TUNE_TERMINATED, ERROR)  #: Tune's loop ends once every trial has one of these
