"""A local Ray started on a thread while the driver imports torch and loads the data.

`ray.init` of a local instance takes seconds, mostly waiting for its processes to come up;
so do the driver's loading of the run folder and the trials' set-up. The CLI asks for it
(`begin_after_checks`) and the preflight begins it once the data and user code passed their
checks (`checks_passed`), so a bad dataset function fails in seconds, before Ray starts; the
driver takes the running instance over (and shuts it down when done), or the CLI shuts it
down if the search never got that far.
Only for a new local instance: joining a cluster keeps its checks (driver.start_ray).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field


@dataclass
class _Start:
    thread: threading.Thread | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


_current: _Start | None = None
_wanted = False  # the CLI's: begin once the checks pass


def begin_after_checks() -> None:
    """Begin a local Ray once search.preflight's checks pass (the CLI's; the Python API starts its own)."""
    global _wanted
    _wanted = True


def checks_passed() -> None:
    """The data and user code are fine: begin the local Ray the CLI asked for, if it did."""
    global _wanted
    if _wanted:
        _wanted = False
        begin()


def begin() -> None:
    """Start `ray.init(address="local")` on a thread (once until taken or abandoned)."""
    global _current
    if _current is not None:
        return
    start = _current = _Start()

    def run() -> None:
        import ray

        from search.session import DropMessages

        # Ray warns that it sets no SIGTERM handler off the main thread: the CLI sets its own
        logging.getLogger("ray._private.worker").addFilter(DropMessages("SIGTERM handler is not set"))
        try:
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
        except BaseException as error:  # raised again in the thread that takes the instance over
            start.error = error
            start.done.set()
            return
        start.done.set()
        # Ray's processes get SIGKILL when the *thread* that started them ends (PR_SET_PDEATHSIG
        # is per thread), so this one stays until the process exits, after Ray's shutdown
        threading.Event().wait()

    start.thread = threading.Thread(target=run, name="hpsearch-ray-init", daemon=True)
    start.thread.start()


def pending() -> bool:
    return _current is not None


def take() -> None:
    """Wait for the start; from then on the caller owns the instance (and shuts it down)."""
    global _current
    start = _current
    if start is None:
        return
    start.done.wait()  # a Ctrl-C here leaves it pending, so abandon() still shuts it down
    _current = None
    if start.error is not None:
        raise start.error


def abandon() -> None:
    """Shut down an instance begun here that nobody took over."""
    global _wanted
    _wanted = False
    if _current is None:
        return
    try:
        take()
    except BaseException:  # it never came up: nothing to shut down
        return
    import ray

    ray.shutdown()
