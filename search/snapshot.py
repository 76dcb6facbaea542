"""Tune's experiment state is saved when a trial ends, so a killed driver loses no finished trial.

Tune snapshots its state (every trial's status and checkpoints, the searcher) every ~10 s
by default. A driver killed between two snapshots resumes without the trials that ended
since: they run again, and an asynchronous searcher may not even ask for them again.
Snapshotting on every controller step (TUNE_GLOBAL_CHECKPOINT_S=0, what hpsearch did
before) closes the gap but serialises every trial many times per trial: O(n) per step,
O(n^2) per search. A snapshot when a trial ends is what the guarantee needs.

Tune has no option for it, and callbacks get no handle on the controller. So this callback
finds the controller that calls it (it is on the call stack) and asks it for a forced,
waited-for snapshot at the end of the step in which a trial ended, once its status reads
TERMINATED or ERROR. If a Ray upgrade moves the controller, `missing_controller` says so and
Tune's periodic snapshots remain.
"""

from __future__ import annotations

import sys
import warnings

from ray.tune import Callback


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
    """After a step in which a trial ended (completed, stopped or failed for good), snapshot."""

    def __init__(self):
        self.ended = False
        self.snapshots = 0  #: forced snapshots taken (tests check this)
        self.missing_controller = False

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.ended = True

    def on_trial_error(self, iteration, trials, trial, **info):
        self.ended = True

    def on_step_end(self, iteration, trials, **info):
        if not self.ended:
            return
        self.ended = False
        controller = calling_controller()
        if controller is None:
            if not self.missing_controller:
                warnings.warn("hpsearch: cannot snapshot Tune's state when a trial ends (no TuneController "
                              "on the call stack); a killed driver may rerun trials that ended in its last "
                              "seconds", RuntimeWarning, stacklevel=2)
            self.missing_controller = True
            return
        # its statuses are final by the end of the step; wait: a killed driver leaves this snapshot whole
        controller.checkpoint(force=True, wait=True)
        self.snapshots += 1

    def __getstate__(self):  # Tune pickles callbacks into its state; the counters are not state
        return {}

    def __setstate__(self, state):
        self.__init__()
