"""Starting or joining Ray for a search, quietly, and how a search stops: SIGTERM as Ctrl-C, without waiting on epochs.

A search either joins the cluster at --address ($RAY_ADDRESS), waiting at most
experiment.connect_timeout for it to answer, or starts a local Ray (the CLI begins that one
beside its imports, EarlyRay, and the search takes it over here).

Unless --verbose, Ray and Tune keep the hints that mislead here to themselves (`quiet`):
hpsearch prints its own progress, resume command and run folder.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
import warnings
from contextlib import contextmanager

import ray
from ray.exceptions import AuthenticationError

from search.execution.ray_internals import lean_local_ray, silent_raylet_errors, token_refusal
from trainable.errors import ConfigError, problem


class DropMessages(logging.Filter):
    """Drops a logger's records that contain one of `texts`."""

    def __init__(self, *texts: str):
        super().__init__()
        self.texts = texts

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.texts)


class _Once(logging.Filter):
    """Lets each message through once (Ray's handler on the "ray" logger prints every record)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def quiet(verbose: bool = False) -> None:
    """Before Ray starts: Ray and Tune print only warnings that are news, unless `verbose`.

    Silenced, each through a public knob (an environment variable, logging levels and filters):
    - Tune's start-up box, with `tensorboard --logdir /tmp/ray/session_.../driver_artifacts` (a
      temporary copy that disappears; TensorBoard reads the run folder): RAY_AIR_NEW_OUTPUT=0 picks
      Tune's plain output, silent at the verbose=0 the Tuner runs with;
    - after Ctrl-C, Tune's `Tuner.restore(path=..., trainable=...)` hint: hpsearch prints its own
      --resume command (and `search.restore(path)` is the Python way, search/api.py);
    - Ray's "Token authentication is enabled for this Ray cluster" on every local start, and Ray's
      and Tune's INFO lines (the local Ray started, Tune wrote its state);
    - Tune's "Experiment state snapshotting has been triggered multiple times" advice on
      CheckpointConfig(num_to_keep), printed whenever two trials checkpoint within 5 s where Tune
      keeps the checkpoints (object-store storage): hpsearch sets num_to_keep, and the user cannot
      act on it (TUNE_WARN_EXCESSIVE_..._THRESHOLD_S=0);
    - a warning said twice: Ray's records once per message, and Python warnings that no filter
      names once per message rather than once per place (matplotlib's, say, each report figure);
    - a failed trial's traceback, 40 lines in the progress, and Tune's "Trials did not complete"
      list (TUNE_PRINT_ALL_TRIAL_ERRORS=0): hpsearch says each failure in one line, with where its
      error.txt is (search/execution/progress.py), and the summary again;
    - on --resume, Tune's "Failed to fetch metrics for N trial(s)" for trials that had not reported
      yet: the resume reads Tune's record only for the trials' states, and runs those trials;
    - Tune's "Remote file not found: .../result.json" when a trial restarts from a checkpoint (PBT
      does it at every exploit) before Tune's snapshot has copied that file to the run folder: there
      is nothing there to bring back, and the trial's file on the driver goes on;
    - Tune's "The `X` operation took 0.6 s, which may be a performance bottleneck" about its own steps
      (results, snapshots) on a busy machine: advice on Tune's internals the user cannot act on;
    - after Ctrl-C or SIGTERM, Tune's "Stop signal received ... Press CTRL+C ... to skip": hpsearch ends the
      search in seconds itself (search/execution/ray_internals.py quick_stop) and prints its --resume command.
    - Ray's "(raylet) A worker died or was killed ..." hint, which Ray's error thread prints to the terminal
      past any logger (search/execution/ray_internals.py silent_raylet_errors): the trial ends ERROR and
      the progress says so in one line, with where its error.txt is.
    """
    if verbose:
        return
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")
    logging.getLogger("ray.tune").setLevel(logging.WARNING)
    logging.getLogger("ray._private.worker").setLevel(logging.WARNING)
    logging.getLogger("ray.tune.tune").addFilter(DropMessages("Tuner.restore(", "Trials did not complete"))
    logging.getLogger("ray.tune.analysis.experiment_analysis").addFilter(DropMessages("Failed to fetch metrics for"))
    logging.getLogger("ray.tune.logger.logger").addFilter(DropMessages("Remote file not found: "))
    for name in ("ray.tune.utils.util", "ray.tune.execution.tune_controller"):  # warn_if_slow's loggers
        logging.getLogger(name).addFilter(DropMessages("which may be a performance bottleneck"))
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        DropMessages("Token authentication is enabled for this Ray cluster"))
    silent_raylet_errors()
    warnings.filterwarnings("once", append=True)  # after every filter set (-W, ignores): only the default changes
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, _Once) for f in handler.filters):
            handler.addFilter(_Once())
            # on the handler, not the logger: ray_internals.quick_stop's filter on Tune's logger must still read it
            handler.addFilter(DropMessages("Stop signal received"))


def reachable(address: str, timeout_s: float) -> bool:
    """True once a TCP connection to host:port of `address` succeeds within `timeout_s`.

    ray.init retries an unreachable cluster for minutes; this gives up in the bound.
    Addresses without a port (auto, local) are Ray's to resolve.
    """
    target = address.split("://", 1)[-1]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(0.1, min(5.0, timeout_s))):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.5)  # a retry interval, not a wait for something we control


def start_local_ray() -> None:
    """A new local Ray of the search's own (address "local" never joins one another process started), without
    the dashboard (its web UI and its API server), workers' logs sent here, Ray's two monitors or prestarted
    workers (ray_internals.lean_local_ray)."""
    with lean_local_ray():
        ray.init(address="local", include_dashboard=False, log_to_driver=False)


class EarlyRay:
    """A local Ray started on a thread while the driver imports torch and loads the data.

    `ray.init` of a local instance takes seconds, mostly waiting for its processes to come up; so do
    the driver's loading of the run folder and the trials' set-up. The CLI makes one and asks for it
    (`begin_after_checks`, or `begin` at once where no user code is checked); the preflight begins
    it once the data and user code passed their checks (`checks_passed`), so a bad dataset function
    fails in seconds, before Ray starts; the search takes the running instance over (`ray_session`)
    and shuts it down when done, or the CLI `abandon`s it if the search never got that far. Only for
    a new local instance: joining a cluster keeps its checks (start_ray). The object is handed down
    run_search's calls, so nothing of it lives in a module.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._wanted = False  # the CLI's: begin once the checks pass
        self._taken = False

    def begin_after_checks(self) -> None:
        self._wanted = True

    def checks_passed(self) -> None:
        """The data and user code are fine: begin the local Ray asked for, if it was."""
        if self._wanted:
            self._wanted = False
            self.begin()

    def begin(self) -> None:
        """Start `ray.init(address="local")` on a thread (once)."""
        if self._thread is not None:
            return

        def run() -> None:
            # Ray warns that it sets no SIGTERM handler off the main thread: the CLI sets its own
            logging.getLogger("ray._private.worker").addFilter(DropMessages("SIGTERM handler is not set"))
            try:
                start_local_ray()
            except BaseException as error:  # raised again in the thread that takes the instance over
                self._error = error
                self._done.set()
                return
            self._done.set()
            # Ray's processes get SIGKILL when the *thread* that started them ends (PR_SET_PDEATHSIG
            # is per thread), so this one stays until the process exits, after Ray's shutdown
            threading.Event().wait()

        self._thread = threading.Thread(target=run, name="hpsearch-ray-init", daemon=True)
        self._thread.start()

    def pending(self) -> bool:
        return self._thread is not None and not self._taken

    def take(self) -> None:
        """Wait for the start; from then on the caller owns the instance (and shuts it down)."""
        if not self.pending():
            return
        self._done.wait()  # a Ctrl-C here leaves it pending, so abandon() still shuts it down
        self._taken = True
        if self._error is not None:
            raise self._error

    def abandon(self) -> None:
        """Shut down an instance begun here that nobody took over."""
        self._wanted = False
        if not self.pending():
            return
        try:
            self.take()
        except BaseException:  # it never came up: nothing to shut down
            return
        ray.shutdown()


def speaks_http(address: str) -> bool:
    """True if host:port answers an HTTP/1.0 request in HTTP (a dashboard); Ray's GCS answers in gRPC's
    HTTP/2 frames. False for anything else, or an address without a port."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host, int(port)), timeout=2.0) as conn:
            conn.settimeout(2.0)
            conn.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
            head = b""
            while len(head) < 5 and (part := conn.recv(5 - len(head))):  # a reply may come in pieces
                head += part
            return head == b"HTTP/"
    except OSError:
        return False


def start_ray(address: str | None, connect_timeout: float = 60.0, early: EarlyRay | None = None) -> str | None:
    """Join the cluster at `address` (or $RAY_ADDRESS), else start a local Ray (or take over `early`'s).

    Returns "private" where this search started a local Ray for itself (no autoscaler adds nodes to
    it, whatever the machine is, a `ray up` head included: search/execution/capacity.py), "joined"
    where it joined a cluster, None where it found Ray running in this process and uses that."""
    if address is None and early is not None and early.pending():  # begun by the CLI, beside the imports
        early.take()
        return "private"
    if ray.is_initialized():
        return None
    if address is None and "RAY_ADDRESS" not in os.environ:
        start_local_ray()
        return "private"
    target = address or os.environ["RAY_ADDRESS"]
    if not reachable(target, connect_timeout):
        raise ConfigError([problem("--address", f"no Ray cluster answered at {target} within "
                                                f"{connect_timeout:g} s (experiment.connect_timeout); is it up, "
                                                "and is the port open?", target)])
    if speaks_http(target):  # ray.init would retry it for about 14 minutes, whatever connect_timeout says
        raise ConfigError([problem("--address", "answers HTTP there (Ray's dashboard, or another web server), not "
                                                "Ray's GCS: give the head's GCS address, host:6379 by default (`ray "
                                                "status` on the head says it)", target)])
    if (refusal := token_refusal(target)) is not None:  # ray.init: 20 s of retries, then no reason
        raise ConfigError([problem("--address", f"cannot join a Ray cluster there: the head refused this client "
                                                f"({refusal}){auth_hint(refused=True)}", target)])
    try:
        ray.init(address=address, log_to_driver=False)
    except (AuthenticationError, ConnectionError, RuntimeError, ValueError) as error:  # "auto" with none running
        raise ConfigError([problem("--address", f"cannot join a Ray cluster there ({type(error).__name__}: "
                                                f"{error}){auth_hint()}", target)]) from None
    return "joined"


def auth_hint(refused: bool = False) -> str:
    """What to set when the cluster may want a token: Ray 2.60 turns token authentication on for
    `ray start --head`, and a client without RAY_AUTH_MODE=token is refused (Ray logs InvalidAuthToken).
    `refused`: the head said so (token_refusal), rather than only failing to answer ray.init."""
    if os.environ.get("RAY_AUTH_MODE") == "token":  # set, and still refused: perhaps another head's token
        return ("; " + ("" if refused else "if Ray's log says InvalidAuthToken, ") + "the token this client sends "
                "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is not the head's")
    return ("; a cluster made with `ray start --head` (Ray 2.60) admits only clients with RAY_AUTH_MODE=token "
            "set, the token in ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN")


class RaySession:
    """Ray for one search, joined or started by it; `release()` begins its shutdown on a thread.

    A search no longer needs Ray once the trials are over: results.parquet, best.yaml and the
    report are made from Tune's record and the run folder. Ray's shutdown (about 1.5 s for a local
    instance, mostly waiting for its processes to end) then runs beside them, and the search
    waits for it only at its very end (`close`), so the command still ends with nothing of Ray left.
    """

    def __init__(self, how: str | None):
        self.started = how is not None  #: whether this search joined or started Ray (else it found it running)
        self.private = how == "private"  #: a local Ray this search started for itself: no autoscaler
        self._shutdown: threading.Thread | None = None
        self._gc_was_on = False

    def release(self) -> None:
        """Begin the shutdown; the caller uses no Ray object from now on.

        Python's cyclic collector stays off until the shutdown is over: a Ray handle it freed on this
        thread (an actor handle in a cycle of Tune's objects) would call into Ray's core worker while
        the other thread takes it down. Freed after the shutdown, such a handle finds Ray gone and
        does nothing."""
        if self.started and self._shutdown is None:
            self._gc_was_on = gc.isenabled()
            gc.disable()
            self._shutdown = threading.Thread(target=ray.shutdown, name="hpsearch-ray-shutdown", daemon=True)
            self._shutdown.start()

    def close(self) -> None:
        """Shut Ray down, or wait for the shutdown `release` began."""
        if not self.started:
            return
        self.private = False
        if self._shutdown is None:
            ray.shutdown()
            return
        self._shutdown.join()
        if self._gc_was_on:
            gc.enable()


@contextmanager
def ray_session(address: str | None, connect_timeout: float, early: EarlyRay | None = None):
    """Ray for the search: joined or started on entry (yields a RaySession), shut down on exit if this
    started or joined it."""
    session = RaySession(start_ray(address, connect_timeout, early))
    try:
        yield session
    finally:
        session.close()


@contextmanager
def sigterm_as_sigint():
    """SIGTERM stops the search as Ctrl-C does: Tune saves its state, trials stay resumable.

    Tune handles SIGINT inside fit() (it ends the run and saves the experiment state);
    SIGTERM would otherwise kill the driver mid-write. Signals are the main thread's only.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
