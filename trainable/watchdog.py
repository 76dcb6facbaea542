"""experiment.trial_timeout: a trial whose epoch takes too long ends as an error; the search goes on.

A thread beside the trial watches the time since the trial started its work or last reported.
Past the timeout it raises TrialTimeout in the trial's thread (PyThreadState_SetAsyncExc, a
documented part of CPython's C API): Python code, a training step, a spinning user function all
stop at their next bytecode, and Tune ends the trial as an error that says why. Code blocked
inside C (a sleep, a lock, a read) runs no bytecode; if the trial still has not moved GRACE_S
later, the watchdog ends the trial's process, and Tune ends the trial as an error when it sees
the actor die (after experiment.max_failures restarts). The summary's Failed line says which.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

GRACE_S = 10.0  # after the exception, how long a trial stuck in C gets before its process ends
POLL_S = 0.25


# thread id -> the message its TrialTimeout carries: the C API raises a class, which is
# instantiated without arguments in the stopped thread
_messages: dict[int, str] = {}


class TrialTimeout(RuntimeError):
    """A trial's epoch took longer than experiment.trial_timeout."""

    def __init__(self, *args):
        super().__init__(*(args or (_messages.get(threading.get_ident(), "experiment.trial_timeout passed"),)))


class Watchdog:
    """Watches the calling thread: `progress()` at each report; past `timeout_s` without it, stop it."""

    def __init__(self, timeout_s: float | None, what: str):
        self.timeout_s, self.what = timeout_s, what
        self._target = threading.get_ident()
        self._last = time.monotonic()
        self._done = threading.Event()
        self._lock = threading.Lock()  # the stop and the end of the trial: one or the other, not both
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "Watchdog":
        if self.timeout_s is not None:
            self._thread = threading.Thread(target=self._watch, name="hpsearch-watchdog", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._done.set()
            if exc[0] is None:  # the trial ended first: a stop sent at that instant is withdrawn
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._target), None)
        if self._thread is not None:
            self._thread.join()
        _messages.pop(self._target, None)

    def progress(self) -> None:
        self._last = time.monotonic()

    def _watch(self) -> None:
        timeout_s = self.timeout_s
        assert timeout_s is not None  # __enter__ starts this thread only with a timeout
        while not self._done.wait(POLL_S):
            if time.monotonic() - self._last > timeout_s:
                break
        else:
            return
        message = (f"{self.what} went {self.timeout_s:g} s without finishing an epoch "
                   f"(experiment.trial_timeout); it was stopped")
        with self._lock:
            if self._done.is_set():
                return
            _messages[self._target] = message
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._target), ctypes.py_object(TrialTimeout))
        if self._done.wait(GRACE_S):
            return
        print(f"hpsearch: {message}, and as it did not react (blocked outside Python), its process is ended",
              file=sys.stderr, flush=True)
        os._exit(70)  # Tune sees the actor die: the trial ends as an error
