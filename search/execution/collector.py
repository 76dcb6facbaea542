"""Python's cyclic garbage collector, off while a search starts and on, over a smaller heap, for its trials.

A search's start imports Ray, Tune, Optuna, pandas and, to check a function trainable, torch: some
340,000 objects that live to the command's end. With the collector on, Python ran six full
collections during those imports, each scanning every object made so far: 0.5 s of the driver's
start, up to 0.17 s each (docs/performance.md). So `start_up` turns the collector off for the
search's start, and `trials_begin`, where Tune's loop starts, collects once (the start's cyclic
garbage, ~9,000 objects, and whatever large arrays such a cycle holds, are freed, not kept) and
moves every object still alive into the permanent generation (gc.freeze), then turns it back on:
a full collection during the trials, on the thread that hands slots over, then scans only what the
trials made (none ran during the trials of the searches measured, 1,000 trials the longest; a longer
search's would not scan the start's objects again).

`start_up` restores what it found when it ends (the collector on, nothing frozen), so that a search
run in a process that goes on (a test, a notebook) leaves its collector as it was. It does nothing in
a process whose collector is off or that froze objects of its own (gc.unfreeze takes back all or
nothing), and `trials_begin` does nothing outside a `start_up` (a Tuner fitted by a test).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_paused = False  # inside start_up, before trials_begin


@contextmanager
def start_up() -> Iterator[None]:
    """The collector off until `trials_begin`, or until this ends; as it was again on exit."""
    global _paused
    # off already (the caller's choice), objects frozen by the caller, or inside another start_up: nothing to do
    if not gc.isenabled() or gc.get_freeze_count() or _paused:
        yield
        return
    gc.disable()
    _paused = True
    try:
        yield
    finally:
        if not _paused:  # trials_begin froze the heap: back to the generations, where collections see it
            gc.unfreeze()
        _paused = False
        gc.enable()


def trials_begin() -> None:
    """One collection, what is left frozen, and the collector on again: the trials are about to start."""
    global _paused
    if not _paused:
        return
    gc.collect()
    gc.freeze()
    _paused = False
    gc.enable()
