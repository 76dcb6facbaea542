"""A local Ray started on a thread while the driver imports torch and loads the data.

`ray.init` of a local instance takes seconds, mostly waiting for its processes to come up;
so do the driver's imports and data loading. The CLI begins the start before it imports
the driver; the driver takes the running instance over (and shuts it down when done), or
the CLI shuts it down if the search never got that far (a bad data file, a taken --name).
Only for a new local instance: joining a cluster keeps its checks (driver.start_ray).
"""

from __future__ import annotations

import threading

_thread: threading.Thread | None = None
_error: list[BaseException] = []
_started = threading.Event()


def begin() -> None:
    """Start `ray.init(address="local")` on a thread (once)."""
    global _thread
    if _thread is not None:
        return

    def start() -> None:
        import ray

        try:
            ray.init(address="local", include_dashboard=False, log_to_driver=False)
        except BaseException as error:  # raised again in the thread that takes the instance over
            _error.append(error)
            _started.set()
            return
        _started.set()
        # Ray's processes get SIGKILL when the *thread* that started them ends (PR_SET_PDEATHSIG
        # is per thread), so this one stays until the process exits, after Ray's shutdown
        threading.Event().wait()

    _thread = threading.Thread(target=start, name="hpsearch-ray-init", daemon=True)
    _thread.start()


def pending() -> bool:
    return _thread is not None


def take() -> None:
    """Wait for the start; from here the caller owns the instance (and shuts it down)."""
    global _thread
    thread, _thread = _thread, None
    if thread is not None:
        _started.wait()
    if _error:
        raise _error.pop()


def abandon() -> None:
    """Shut down an instance begun here that nobody took over."""
    if _thread is None:
        return
    try:
        take()
    except BaseException:
        return
    import ray

    ray.shutdown()
