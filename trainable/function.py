"""Your own training function as a trial: `trainable: FILE.py:FUNCTION` in the space file.

The function is the user's whole loop, and never imports Ray:

    def train(config: dict, report, checkpoint: dict | None = None) -> None

- `config`: the space file's searched and fixed keys under their own names, plus `seed` and
  `trial_number` (and, with `resources.workers` above 1, `rank` and `world_size`: the function runs on
  every worker, rank 0's reports and checkpoints count; trainable/distributed.py prepare_model, shard);
- `report(**metrics, checkpoint=None)`, or `report(metrics_dict, checkpoint=None)` as tune.report takes
  it: once per epoch (or step); the names are the function's
  own, every objective and constraint metric among them (checked on each report), none a name
  the run folder uses for itself (a config key, `status`, Tune's `done`, ...: Reporter), and
  `epoch` only as the count of reports;
- `checkpoint`: the dict last handed to `report(checkpoint=...)`, given back when Tune restarts
  the trial (a failure under max_failures, or a resume); None on a fresh start.

FunctionConfig is such a trial's config (the counterpart of trainable.config.TrialConfig);
`tune_function` is the wrapper Tune runs (inside adapter.run_trial): it reports each call of
`report` with Tune's function API (tune.report with a Checkpoint), numbers the reports as
`epoch` (a restart continues from the checkpoint's), and ends the trial as the canonical loop
does when an objective is NaN or infinite (DIVERGED) or the function raises (ERROR).
"""

from __future__ import annotations

import functools
import math
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, Sequence, cast

from trainable.config import TrialConfig, plain
from trainable.errors import ConfigError, problem

TRAINABLE_KEY = "trainable"  #: the space file's top-level key, and the config key that carries the reference
# the driver's per trial: a free name of the space file cannot take them
DRIVER_KEYS = ("seed", "trial_number", "num_threads", "workers")
RESERVED = (TRAINABLE_KEY, *DRIVER_KEYS)
# what the wrapper adds to every report; the function's metrics may not use these names
FUNCTION_REPORT_COLUMNS = ["epoch", "epoch_seconds", "diverged"]
METRIC_NAMES = "metric_names"  #: report key listing the function's own metric names (results' columns)
CHECKPOINT_FILE = "state.pt"
CHECKPOINT_FORMAT = "function-1"


def is_function(config: Mapping[str, Any] | None) -> bool:
    """Whether a trial config (flat or as best.yaml holds it) is a function trainable's."""
    return isinstance(config, Mapping) and bool(config.get(TRAINABLE_KEY))


@dataclass(frozen=True)
class FunctionConfig:
    """A function trial's config: the reference, the free names, and what the driver sets per trial."""

    trainable: str  #: FILE.py:FUNCTION (absolute) or package.module:FUNCTION
    values: Mapping[str, Any] = field(default_factory=dict)  #: the space file's keys under their names
    seed: int = 0
    trial_number: int | None = None
    num_threads: int | None = None
    workers: int = 1  #: resources.workers: the processes the function runs on, data-parallel (docs/gpus.md)

    @property
    def epochs(self) -> int | None:
        """The reports a trial makes, if the space file says (a free key `epochs`): ASHA's max_t and COMPLETED."""
        epochs = self.values.get("epochs")
        return epochs if isinstance(epochs, int) and not isinstance(epochs, bool) else None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "FunctionConfig":
        rest = {k: v for k, v in values.items() if k not in RESERVED}
        return cls(values[TRAINABLE_KEY], rest, int(values.get("seed") or 0), values.get("trial_number"),
                   values.get("num_threads"), int(values.get("workers") or 1))

    def to_flat(self) -> dict[str, Any]:
        return {TRAINABLE_KEY: self.trainable, **plain(dict(self.values)), "seed": self.seed,
                "num_threads": self.num_threads, "trial_number": self.trial_number, "workers": self.workers}

    to_dict = to_flat  # free names are flat: nothing nests

    def for_function(self, rank: int = 0) -> dict[str, Any]:
        """What the user's function gets as `config`; with several workers also its `rank` and `world_size`
        (trainable/distributed.py: prepare_model, shard)."""
        workers = {"rank": rank, "world_size": self.workers} if self.workers > 1 else {}
        return {**plain(dict(self.values)), "seed": self.seed, "trial_number": self.trial_number, **workers}


def trial_config(values: Mapping[str, Any]) -> TrialConfig | FunctionConfig:
    """A trial's config of either kind, from a flat or nested mapping."""
    return FunctionConfig.from_mapping(values) if is_function(values) else TrialConfig.from_mapping(values)


def resolve_function(reference: str) -> Callable[..., None]:
    """The user's function; ConfigError (key `trainable`) if it does not import or take (config, report, checkpoint)."""
    import inspect

    from trainable.references import resolve

    function = resolve(reference, TRAINABLE_KEY)
    try:
        inspect.signature(function).bind({}, print, checkpoint=None)
    except (TypeError, ValueError):
        raise ConfigError([problem(TRAINABLE_KEY, "must take (config, report, checkpoint=None)", reference)]) from None
    return function


# ---- the trial's side ---------------------------------------------------------------------

class ContractError(Exception):
    """The function broke the contract above (what report takes, which names it may use): the same on every
    try, so the trial ends ERROR without Tune's restarts (experiment.max_failures), and a search whose first
    trials all end so stops (search/execution/progress.py)."""


class ReportMisuse(ContractError, TypeError):
    """report() called with what it does not take: a positional that is no dict, a metric that is no number,
    a checkpoint torch.load(weights_only=True) cannot read back."""


class MetricNotReported(ContractError, RuntimeError):
    """The first report lacks a metric the search needs: the trial ends ERROR with this message."""


class ReservedName(ContractError, ValueError):
    """A metric named like a column the run folder uses for itself: the trial ends ERROR with this message."""


class TooManyReports(ContractError, ValueError):
    """A report past the trial's `epochs`: the trial ends ERROR with this message. The searcher takes a
    trial's value at its `epochs`-th report (search/searching/ordered.py: the next trial is asked then, and
    takes the actor Tune would otherwise stop), so a later report could be better than the value optuna.journal
    holds for the trial: refused instead of left to disagree with results.parquet and best.yaml."""


class _Diverged(BaseException):
    """An objective is no longer finite: the wrapper ends the trial (DIVERGED), as the canonical loop does.

    A BaseException, as KeyboardInterrupt is: a function's own `except Exception` around its loop would
    otherwise catch it and go on reporting after the NaN (and its trial would end COMPLETED)."""


def tune_keys() -> frozenset[str]:
    """What Tune adds to (or reads from) every report: a metric of the same name would be overwritten, or
    would end the trial (`done`)."""
    from ray.tune import result

    return frozenset([*result.AUTO_RESULT_KEYS, result.DONE, result.TRIAL_ID, result.SHOULD_CHECKPOINT,
                      result.EXPERIMENT_TAG, result.TRIAL_INFO, result.TIMESTEPS_THIS_ITER,
                      result.EPISODES_THIS_ITER])


def save_state(folder: str | Path, epoch: int, state: Mapping[str, Any]) -> Path:
    """A function's checkpoint: its dict and the report count it was made at, readable with weights_only."""
    if not isinstance(state, Mapping):
        raise ReportMisuse(f"report(checkpoint=...) must be a dict of tensors and plain data, got {type(state).__name__}")
    import torch

    path = Path(folder) / CHECKPOINT_FILE
    torch.save({"format": CHECKPOINT_FORMAT, "epoch": epoch, "state": dict(state)}, path)
    # read back now, as a restart would (mmap: the tensors' bytes are not read), so it fails here, not then;
    # a restart loads in a fresh process, before the function runs: without the globals it may have allowed
    allowed = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()
    try:
        torch.load(path, weights_only=True, mmap=True, map_location="cpu")
    except Exception as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        # torch's long message: the line that names what it refused, without its advice to allow it
        first = next((line for line in lines if "Unsupported" in line), lines[0] if lines else "")
        first = first.split(". Please use", 1)[0]
        raise ReportMisuse(f"report(checkpoint=...) must be a dict of tensors and plain data that torch.load("
                        f"weights_only=True) reads back, and this one does not ({type(error).__name__}: {first}); "
                        "turn numpy arrays into tensors (torch.from_numpy) and objects into their state_dict()") from None
    finally:
        torch.serialization.add_safe_globals(allowed)
    return path


def load_state(folder: str | Path) -> dict[str, Any]:
    """{"epoch": k, "state": dict} back from a folder save_state wrote; CheckpointError if it does not read."""
    import torch

    from trainable.report import CheckpointError

    path = Path(folder) / CHECKPOINT_FILE
    try:
        saved = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as error:
        raise CheckpointError(f"{path}: cannot be read with torch.load(weights_only=True) "
                              f"({type(error).__name__}: {error})") from None
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a function trainable's checkpoint ({CHECKPOINT_FORMAT})")
    return {"epoch": int(saved["epoch"]), "state": saved["state"]}


def _number(name: str, value: Any) -> float:
    if hasattr(value, "item"):  # a one-element tensor or numpy scalar
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # more than one element: numpy's ValueError, torch's RuntimeError
            raise ReportMisuse(f"report({name}=...): a metric must be a number (or a one-element tensor), got "
                            f"{type(value).__name__} of shape {tuple(getattr(value, 'shape', ()))}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportMisuse(f"report({name}=...): a metric must be a number (or a one-element tensor), "
                        f"got {type(value).__name__}")
    return float(value)


class Reporter:
    """The `report` the user's function calls: checks, numbers and hands each report on.

    `send(metrics, epoch, state)` does the handing on: tune.report in a trial, a print in a replay.
    `metrics`: the names every report must hold (the objectives, then the constraints' metrics); the
    objectives' (`objectives`, default all of them) end the trial DIVERGED when one is not finite;
    None (a replay of a config without best.yaml's result): nothing to check. `reserved`: names the
    run folder uses for itself (the trial's config keys are always among them).
    """

    def __init__(self, metrics: str | Sequence[str] | None,
                 send: Callable[[dict[str, Any], int, Mapping[str, Any] | None], None], epoch: int = 0, *,
                 config: Mapping[str, Any] = {}, reserved: Collection[str] = (), objectives: int | None = None,
                 limit: int | None = None):
        self.metrics = None if metrics is None else (metrics,) if isinstance(metrics, str) else tuple(metrics)
        self.objectives = None if self.metrics is None else self.metrics[:objectives or len(self.metrics)]
        self.send, self.epoch, self.limit = send, epoch, limit  # limit: the trial's `epochs`, if set
        self.config = frozenset(config)
        self.reserved = frozenset(reserved) | {*FUNCTION_REPORT_COLUMNS, METRIC_NAMES, TRAINABLE_KEY,
                                               *DRIVER_KEYS} | self.config
        self.diverged = False
        self.last = self.began = time.time()

    def begin(self) -> None:
        """The function is called now: its first epoch starts here (what came before, such as a trial's other
        workers starting, is the trial's set-up, as the canonical loop counts it)."""
        self.last = self.began = time.time()

    def __call__(self, metrics: Mapping[str, Any] | None = None, /, checkpoint: Mapping[str, Any] | None = None,
                 **named: Any) -> None:
        if self.diverged:  # the function caught _Diverged and went on: nothing after the NaN counts
            raise _Diverged
        metrics = given_metrics(metrics, named)
        self._check_names(metrics)
        if self.limit is not None and self.epoch >= self.limit:
            raise TooManyReports(f"report(): this is report {self.epoch + 1}, past the trial's epochs "
                                 f"({self.limit}): with `epochs` set a trial makes at most `epochs` reports (the "
                                 "searcher takes its value at that report, ASHA counts its rungs in them); make "
                                 "one report per epoch, or set epochs to the number of reports")
        values = {k: _number(k, v) for k, v in metrics.items() if k != "epoch"}
        self.epoch += 1
        now = time.time()
        self.diverged = self.objectives is not None and not all(math.isfinite(values[m]) for m in self.objectives)
        row = {**values, "epoch": self.epoch, "epoch_seconds": now - self.last, "diverged": self.diverged,
               METRIC_NAMES: list(values)}
        self.send(row, self.epoch, checkpoint)
        self.last = time.time()
        if self.diverged:
            raise _Diverged

    def _check_names(self, metrics: Mapping[str, Any]) -> None:
        """A name the run folder uses for itself would overwrite it (a config key: best.yaml would replay a
        config that never ran; `done`: Tune would end the trial); `epoch` only as the count of reports."""
        if "epoch" in metrics:
            try:
                counted = _number("epoch", metrics["epoch"]) == self.epoch + 1
            except TypeError:
                counted = False
            if not counted:
                raise ReservedName(f"report(epoch={metrics['epoch']!r}): epoch must count the reports (1 on the "
                                   f"first, then 2, 3, ...; this is report {self.epoch + 1}): hpsearch numbers "
                                   "each report as epoch, which ASHA's rungs and results.parquet count; report "
                                   "another count under another name (e.g. step)")
        taken = [k for k in metrics if k in self.reserved and k != "epoch"]
        if taken:
            mine = [k for k in taken if k in self.config]
            why = (f"{', '.join(mine)} {'is a config key' if len(mine) == 1 else 'are config keys'} of this "
                   "trial (results.parquet and best.yaml hold the config under these names)") if mine else \
                "names the run folder, Tune or hpsearch use for their own columns"
            raise ReservedName(f"report(): a metric cannot be named {', '.join(taken)}: {why}; name the metric "
                               "otherwise")
        missing = [m for m in self.metrics or () if m not in metrics]
        if missing:
            raise MetricNotReported(f"experiment.metric: every metric the search needs ({', '.join(self.metrics or ())}) "
                                    f"must be among those the function reports ({', '.join(metrics) or 'none'}); "
                                    f"missing: {', '.join(missing)}")


def given_metrics(metrics: Any, named: Mapping[str, Any]) -> dict[str, Any]:
    """A report's metrics, given as one dict (Tune's `tune.report(metrics)`) or as keywords, or both."""
    if metrics is None:
        return dict(named)
    if not isinstance(metrics, Mapping):
        raise ReportMisuse(f"report(): the metrics go as one dict, as tune.report takes them, or as keywords, the "
                           f"checkpoint by name: report({{'loss': 0.1}}, checkpoint={{...}}); got a positional "
                           f"{type(metrics).__name__}")
    twice = sorted(set(metrics) & set(named))
    if twice:
        raise ReportMisuse(f"report(): {', '.join(map(str, twice))} given both in the dict and as a keyword; "
                           "give each metric once")
    strange = [k for k in metrics if not isinstance(k, str)]
    if strange:
        raise ReportMisuse(f"report(): a metric's name must be a string, got {strange[0]!r} "
                           f"({type(strange[0]).__name__}) in the dict")
    return {**metrics, **named}


def tune_function(config: dict[str, Any], *, data: Any = None, metrics: Sequence[str], objectives: int = 1,
                  reserved: Collection[str] = ()) -> None:
    """What Tune runs for a function trainable (through adapter.run_trial): the user's function, its
    reports sent with tune.report, each `checkpoint=` as a Tune Checkpoint.

    `metrics`: every name the search reads from a report, the first `objectives` of them its
    objectives; `reserved`: the run folder's own columns (search/store/results.py reserved_names)."""
    import ray
    import torch
    from ray import tune

    from trainable import adapter
    from trainable.report import PACKED, PHASE_COLUMNS, Phases, Placement

    trial = FunctionConfig.from_mapping(config)
    function = resolve_function(trial.trainable)
    if trial.num_threads:
        torch.set_num_threads(trial.num_threads)
    start = adapter.trial_start()
    device = adapter.trial_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    epoch, state = 0, None
    restored = tune.get_checkpoint()
    if restored is not None:  # Tune restarted this trial (a failure or a resume)
        saved = adapter.newest_readable_state(restored, load=load_state)
        if saved is not None:
            epoch, state = saved["epoch"], saved["state"]
    placement = Placement(node=ray.get_runtime_context().get_node_id()[:12], hostname=socket.gethostname(),
                          device=str(device), accelerator_ids=adapter.assigned_accelerators(),
                          world_size=trial.workers)
    first = [True]

    def send(row: dict[str, Any], epoch: int, checkpoint: Mapping[str, Any] | None) -> None:
        phases = Phases(ready_at=start.ready_at if first[0] else None,
                        started_at=start.started_at if first[0] else None, fetch_seconds=0.0,
                        setup_seconds=max(0.0, reporter.began - start.started_at) if first[0] else 0.0,
                        report_seconds=0.0, checkpoint_seconds=0.0)
        first[0] = False
        cuda = device.type == "cuda"
        row = {**row, **vars(placement), **{c: getattr(phases, c) for c in PHASE_COLUMNS},
               "gpu_memory_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20 if cuda else None,
               "gpu_memory_reserved_mb": torch.cuda.max_memory_reserved(device) / 2**20 if cuda else None,
               "finished_at": time.time()}
        with tempfile.TemporaryDirectory() as folder:
            if checkpoint is not None:
                save_state(folder, epoch, checkpoint)
            adapter.mark_report()
            # from_directory builds its own class; Ray annotates the result as ray.train's Checkpoint
            adapter.report(row, checkpoint=cast(tune.Checkpoint, tune.Checkpoint.from_directory(folder))
                           if checkpoint is not None else None)

    given = trial.for_function()
    reporter = Reporter(metrics, send, epoch, config={**given, **trial.to_flat()},
                        reserved=frozenset(reserved) | tune_keys() | {PACKED}, objectives=objectives,
                        limit=trial.epochs)
    # several workers: the others start from the same checkpoint, in the trial's process group (adapter.Workers)
    with adapter.Workers(trial.workers, config, (epoch, state), device, start,
                         functools.partial(run_rank, metrics=metrics, objectives=objectives)):
        try:
            reporter.begin()
            function(given, reporter, checkpoint=state)
        except _Diverged:
            return  # the last row says diverged: the trial ends DIVERGED, as the canonical loop's does
    if reporter.diverged:  # the function caught _Diverged itself (a bare except) and returned
        return
    if reporter.epoch == 0:  # Tune would end the whole search on its strict metric check: this trial ends ERROR
        raise MetricNotReported(f"experiment.metric: must be among the metrics the function reports (none: "
                                f"it returned without calling report), got {', '.join(metrics)}")


def run_rank(config: Mapping[str, Any], data: Any, saved: tuple[int, Any], world: Any, device: Any, *,
             metrics: Sequence[str], objectives: int) -> None:
    """A function trainable's worker of rank > 0 (adapter.RankWorker): the user's function from the trial's
    checkpoint, its reports checked as rank 0's are, and dropped: rank 0 reports and checkpoints."""
    import torch

    trial = FunctionConfig.from_mapping(config)
    function = resolve_function(trial.trainable)
    if trial.num_threads:
        torch.set_num_threads(trial.num_threads)
    epoch, state = saved
    given = trial.for_function(world.rank)
    reporter = Reporter(metrics, lambda row, epoch, checkpoint: None, epoch, config={**given, **trial.to_flat()},
                        objectives=objectives)
    try:
        function(given, reporter, checkpoint=state)
    except _Diverged:
        return


def function_trial(metrics: str | Sequence[str], objectives: int | None = None,
                   reserved: Collection[str] = ()) -> Callable[..., None]:
    """run_trial's trial_function for a search of a function trainable: `metrics` the objectives, then the
    constraints' other metrics (`objectives`: how many are objectives; all by default). The defaults
    are how release 0.1.0's driver calls it (one metric), which a run it made may still resume with."""
    import functools

    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    return functools.partial(tune_function, metrics=metrics, objectives=objectives or len(metrics),
                             reserved=frozenset(reserved))


def replay(config: Mapping[str, Any], metric: str | Sequence[str] | None) -> int:
    """`python -m trainable --config best.yaml` for a function trainable: the function once, each report printed."""
    trial = FunctionConfig.from_mapping(config)
    try:
        function = resolve_function(trial.trainable)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if trial.workers > 1:  # its numbers depend on the workers: one process would replay another run
        print(f"error: workers: this trial ran on {trial.workers} workers (resources.workers), and a function "
              f"trainable replays on one process only; run it again as a search of one trial with "
              f"resources.workers {trial.workers} (the canonical loop's best.yaml replays on {trial.workers} "
              "local processes)", file=sys.stderr)
        return 2
    print(f"trainable: {trial.trainable} | seed: {trial.seed}", flush=True)

    def send(row: dict[str, Any], epoch: int, checkpoint: Mapping[str, Any] | None) -> None:
        shown = " | ".join(f"{k} {row[k]:.4f}" for k in row[METRIC_NAMES])
        print(f"Epoch [{epoch}] | {shown} | {row['epoch_seconds']:.2f}s", flush=True)

    try:
        given = trial.for_function()
        function(given, Reporter(metric, send, config={**given, **trial.to_flat()}), checkpoint=None)
    except _Diverged:
        shown = metric if isinstance(metric, str) else ", ".join(metric or ())
        print(f"stopped: {shown} is no longer finite (diverged)", flush=True)
    return 0
