"""Where a search command's time goes: its phases, one after another, from its start to its summary.

Each phase ends where the next begins, on the driver's main thread, so the phases add up to
the wall time; the wall time runs from the process's start (the CLI: Python's own start and
the imports count) or from run_search's call (the Python API) to the summary, which comes
after Ray's shutdown. The summary prints them and the run folder keeps them in timing.yaml.
Ray starts on a thread beside the imports and the data (search/execution/session.py EarlyRay), so "Ray start"
is only what the search still had to wait for; likewise Ray's shutdown begins when the trials are
over and runs beside the results and the report (search/execution/session.py RaySession.release), so
"Ray's shutdown" is only what was left of it.
"""

from __future__ import annotations

import os
import time
from typing import Any

TIMING_FILE = "timing.yaml"

# phase -> what it covers, in the order a search meets them
NAMES = {
    "imports": "Python's start, imports and the space file",
    "checks": "data load and checks, the run folder",
    "ray": "Ray start or connect",
    "probe": "GPU probe and capacity",
    "first_trial": "the first trial's start",
    "trials": "the trials",
    "results": "results.parquet and the journal",
    "test": "best.yaml's test accuracy",
    "report": "the report",
    "shutdown": "Ray's shutdown",
}

# The search running in this process, for FirstTrialStart (search/execution/tuner.py): Tune forces
# this one module-level name, since a resumed Tuner brings back the callbacks it pickled at the run's
# start, and those cannot hold this command's Phases.
_current: "Phases | None" = None


def command_start() -> float:
    """When this command began: the process's start (Linux), else now. The CLI's first step."""
    return process_start() or time.time()


def process_start() -> float | None:
    """When this process started, in unix seconds, from /proc (10 ms ticks); None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime: ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])  # seconds since boot, to 10 ms
        # not /proc/stat's btime: whole seconds, which put the start up to 1 s early
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class Phases:
    """The seconds of each phase so far; `mark(name)` ends phase `name` now."""

    def __init__(self, started: float | None = None) -> None:
        """`started`: when the command began (command_start), so its imports are the first phase;
        None (the Python API): from this call."""
        global _current
        self.called = time.time()  #: run_search's call: this run's epochs are those that ended after it
        self.started = min(started or self.called, self.called)
        self.seconds: dict[str, float] = {}
        self._last = self.started
        if started is not None:
            self.mark("imports")
        _current = self

    def mark(self, name: str) -> None:
        now = time.time()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    @property
    def wall_seconds(self) -> float:
        return self._last - self.started

    def line(self) -> str:
        """The summary's line: each phase's seconds, in order, from the figures timing.yaml keeps (rounded
        first, so that 0.04996 reads as timing.yaml's 0.05 does)."""
        return ", ".join(f"{NAMES[name]} {seconds:.1f}" for name, seconds in self.record()["phases"].items()) + " s"

    def record(self) -> dict[str, Any]:
        """timing.yaml: the wall time and the phases, in seconds."""
        return {"wall_seconds": round(self.wall_seconds, 3),
                "phases": {name: round(seconds, 3) for name, seconds in self.seconds.items()},
                "what": {name: NAMES[name] for name in self.seconds}}


def first_trial_started() -> None:
    """Ends the phase before the first trial (the Tuner, the searcher's first suggestion, an actor's start),
    for the search running in this process (search/execution/tuner.py's FirstTrialStart calls it)."""
    if _current is not None and "first_trial" not in _current.seconds:
        _current.mark("first_trial")
