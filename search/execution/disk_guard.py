"""A full disk stops the search as Ctrl-C does, before it can break Tune's record.

Tune writes its experiment state, every trial's result.json and checkpoints under the
storage path; when the disk fills mid-write, those files are cut short and a resume refuses
the run. So a callback in the driver looks at the free space of a local storage path after
each controller step (at most once a second) and, below experiment.min_free_mb, says so and
sends the driver SIGINT: Tune stops the trials and saves its state while there is room, the
command exits 130, and `--resume` continues once space is freed. Checkpoints that were being
written when the guard tripped may still run out of room: that trial errs and is resumed from
its last good checkpoint, and the driver turns a write that ran out of space into DiskFull
(exit 130, the same advice) rather than a traceback. Object stores do not fill.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time

from ray.tune import Callback

CHECK_EVERY_S = 0.1  # a statvfs call is microseconds; checkpoints are written between checks, so check often
# Why the guard stopped this process's search. Tune forces this module-level list: it keeps (and on
# a resume, restores) its own copy of the callback, so the driver asks here (search/driver.py)
# rather than holding the instance.
_stopped: list[str] = []


def stop_reason() -> str | None:
    """Why the guard stopped the search that just returned, once; None if it did not."""
    return _stopped.pop() if _stopped else None


class DiskGuard(Callback):
    """Stops the search (SIGINT) when `path` has less than `min_free_mb` free."""

    def __init__(self, path: str, min_free_mb: float):
        self.path, self.min_free_mb = path, min_free_mb
        self.tripped: str | None = None  #: what the summary says, once it stopped the search
        self._checked = 0.0

    def on_step_end(self, iteration, trials, **info) -> None:
        now = time.monotonic()
        if self.tripped or now - self._checked < CHECK_EVERY_S:
            return
        self._checked = now
        free_mb = shutil.disk_usage(self.path).free / 2**20
        if free_mb >= self.min_free_mb:
            return
        self.tripped = (f"the disk of {self.path} is nearly full ({free_mb:.0f} MB free, below experiment."
                        f"min_free_mb {self.min_free_mb:g}): the search stopped as Ctrl-C stops it; free space, "
                        "then resume")
        _stopped[:] = [self.tripped]
        print(f"\nstopping: {self.tripped}", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGINT)  # Tune's own graceful stop: trials end, its state is saved

    def __getstate__(self):  # Tune pickles its callbacks; a resumed search starts untripped
        return {"path": self.path, "min_free_mb": self.min_free_mb}

    def __setstate__(self, state):
        self.__init__(**state)
