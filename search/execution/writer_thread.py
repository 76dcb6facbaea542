"""A thread of the driver's for writes that Tune's controller thread should not wait for.

Tune runs every callback on its controller thread, which also hands each next trial to a free actor: a write
there (a file synced to disk, a Parquet part, the journal) is time a slot sits empty between two short trials
(issue 49, docs/performance.md). Progress writes the ended trials' results parts and the journal on one, EventFiles
flushes and closes the TensorBoard event files on another (search/execution/tuner.py).
"""

from __future__ import annotations

import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable


class WriterThread:
    """Calls run in order on one thread of their own, made at the first call.

    `wait` returns once every call made so far has run; a call's error is said on stderr (`what` names the
    writes), not raised: a write the search can do without never ends it (its callers catch what they must
    say otherwise). Tune pickles its callbacks before the first trial, and a resume unpickles them: a pickled
    WriterThread holds no thread and no calls."""

    def __init__(self, name: str, what: str) -> None:
        self.name, self.what = name, what  # the thread's name; what its writes are, for an error's line
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future] = []

    def submit(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self._pending = [f for f in self._pending if not f.done()] + [self._thread.submit(call, *args, **kwargs)]

    def wait(self) -> None:
        pending, self._pending = self._pending, []
        for future in pending:
            if (error := future.exception()) is not None:
                print(f"hpsearch: {self.what} failed: {error}", file=sys.stderr, flush=True)

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "what": self.what, "_thread": None, "_pending": []}
