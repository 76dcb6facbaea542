"""When Tune saves its experiment state, and what a killed driver loses: Tune's own rule.

Tune snapshots its state (every trial's status and checkpoints, the searcher's record) at the
end of a controller step, at most every max(10 s, 19 x the last snapshot's cost): at most ~5%
of the driver's time, however long a snapshot takes as the trials grow
(its "auto" period: TUNE_GLOBAL_CHECKPOINT_S unset). The end of a search,
and Ctrl-C, save it once more and wait for it. hpsearch leaves that rule alone. It used to
force a snapshot after each step in which a trial ended, which needs Tune's controller, and
callbacks get no handle on it (it was found by walking the call stack); its coalescing also
stopped holding 5% once a snapshot cost over ~3 s (min(60 s, 19 x cost)).

What a SIGKILLed driver loses is the trials that ended after the last snapshot. On resume:

- Tune does not know them, so it asks its searcher again. A reproducible search
  (OrderedSearch, experiment.reproducible: true) restores its record as of that snapshot
  (searcher.json, saved and uploaded with Tune's state) and hands out the same trial
  numbers, configs and seeds, and the trials give the same results: the resumed search equals
  one never stopped (tests/test_resume.py).
- With reproducible: false, Tune's OptunaSearch asks in arrival order, so those trials are
  replaced by other configs; the search still ends with exactly num_samples trials.
- Either way, run_folder.drop_unrecorded_parts removes their results parts written before the
  kill: a trial's part counts only once Tune's saved state holds the trial.

So a kill costs at most the last ~10 s (or 19 snapshot costs) of finished trials, run again.
"""

from __future__ import annotations

from ray.tune import Callback


class SnapshotOnTrialEnd(Callback):
    """Does nothing: Tune's own snapshot rule above stands.

    Kept only so that search/driver.py, which still passes it in its callbacks, runs; remove
    it with that line.
    """

    def __init__(self, every_trial: bool = False, max_gap_s: float = 60.0):
        self.every_trial, self.max_gap_s = every_trial, max_gap_s
