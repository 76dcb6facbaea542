"""When Tune saves its experiment state, so a killed driver loses no finished trial.

Tune snapshots its state (every trial's status and checkpoints, the searcher) at most every
~10 s by default; hpsearch used to snapshot on every controller step
(TUNE_GLOBAL_CHECKPOINT_S=0). A snapshot serialises every trial and copies Tune's driver
folder to the storage path, so it costs O(n) in the trials so far: per step, or even per
ended trial, that is O(n^2) per search (0.5 s per snapshot at 1,000 trials, bench/scale.py).

So this callback snapshots after a step in which a trial ended, but no more often than
19x the last snapshot's cost (at most ~5% of the driver's time, as Tune's own automatic
period), and never more than `max_gap_s` apart. What a killed driver then loses is only
what a reproducible search (experiment.reproducible, OrderedSearch) redoes identically: on
resume, Tune runs the trials that ended after its last snapshot again, with the same trial
numbers, configs and seeds, and the same results. run_folder.drop_unrecorded_parts removes
their results parts written before the kill, so every trial is counted once. An
asynchronous searcher would ask for other configs on a rerun, so with `every_trial=True`
(reproducible: false) every ended trial is snapshotted.

Tune has no option for any of this, and callbacks get no handle on the controller. So the
callback finds the controller that calls it on the call stack and asks it for a forced,
waited-for snapshot at the end of the step (once the ended trials' statuses read
TERMINATED or ERROR). If a Ray upgrade moves the controller, `missing_controller` says so
and Tune's periodic snapshots remain.
"""

from __future__ import annotations

import sys
import time
import warnings

from ray.tune import Callback

COST_FACTOR = 19  # as Tune's "auto" period: snapshots take at most 1/(1+19) = 5% of the driver


def calling_controller(depth: int = 8):
    """The TuneController on the call stack within `depth` frames, else None."""
    frame = sys._getframe(1)
    for _ in range(depth):
        frame = frame.f_back
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if type(owner).__name__ == "TuneController" and callable(getattr(owner, "checkpoint", None)):
            return owner
    return None


class SnapshotOnTrialEnd(Callback):
    """After a step in which a trial ended (completed, stopped or failed for good), maybe snapshot."""

    def __init__(self, every_trial: bool = False, max_gap_s: float = 60.0):
        self.every_trial, self.max_gap_s = every_trial, max_gap_s
        self.pending = 0  #: trials ended since the last snapshot
        self.snapshots = 0  #: forced snapshots taken (tests and the summary read it)
        self.cost = 0.0  #: seconds the last snapshot took
        self.last = time.monotonic()
        self.missing_controller = False

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.pending += 1

    def on_trial_error(self, iteration, trials, trial, **info):
        self.pending += 1

    def due(self) -> bool:
        if not self.pending:
            return False
        waited = time.monotonic() - self.last
        return self.every_trial or waited >= min(self.max_gap_s, COST_FACTOR * self.cost)

    def on_step_end(self, iteration, trials, **info):
        if not self.due():
            return
        controller = calling_controller()
        if controller is None:
            if not self.missing_controller:
                warnings.warn("hpsearch: cannot snapshot Tune's state when a trial ends (no TuneController "
                              "on the call stack); a killed driver may rerun trials that ended in its last "
                              "seconds", RuntimeWarning, stacklevel=2)
            self.missing_controller = True
            return
        start = time.monotonic()
        # statuses are final by the end of the step; wait: a killed driver leaves this snapshot whole
        controller.checkpoint(force=True, wait=True)
        self.last = time.monotonic()
        self.cost, self.pending = self.last - start, 0
        self.snapshots += 1

    def __getstate__(self):  # Tune pickles callbacks into its state; the counters are not state
        return {"every_trial": self.every_trial, "max_gap_s": self.max_gap_s}

    def __setstate__(self, state):
        self.__init__(**state)
