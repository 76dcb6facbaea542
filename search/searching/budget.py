"""Budgets and targets: experiment.time_budget and experiment.stop_when end a search early, with exit 0.

One `Budget` holds a search's time_budget, targets and num_samples and records why it ended;
two Tune pieces are handed it:

- `BudgetedSearch`, a Searcher around the searcher (as Tune's ConcurrencyLimiter is), observes
  every result and returns Searcher.FINISHED once the budget is spent, a target reached or
  num_samples trials started, so Tune starts no new trial and runs to its end.
- `BudgetStop`, the run's Stopper, stops each running trial at its next report (its next epoch
  end). Such a trial ends TERMINATED in Tune's record with the epochs it reported, so
  results.parquet calls it STOPPED, as it calls a trial ASHA stopped; its value is what it
  reached at its last epoch, never more.

The reproducible searcher numbers trials in order and trial n depends only on the seed and n,
so the trials that ran are trials 0..k-1 of the same search without a budget.

The clock starts when Tune first asks for a trial; a resume gets a fresh budget, counted from
the resume's start, and takes experiment.time_budget, stop_when and num_samples from spec.yaml
as the resume rewrote it (search/execution/preflight.py). ENDED_FILE in the run folder says why the search
ended; the summary and `python -m search runs` read it.

Tune's resume brings the two back from different records: the searcher from tuner.pkl (its
state restored through set_state), the stopper from the controller's own snapshot (Tune 2.60
keeps the stopper in its runner state). So after a resume they hold two copies of the Budget:
the searcher's restarts and writes ENDED_FILE (with when its clock started); the stopper's
reads that once and from then on decides alone, on the same clock and the same targets.
Tune's SearchGenerator keeps its own count and `finished` flag and restores both on resume,
which would refuse the trials a resume adds; `Generator` asks the Budget instead (is_finished).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pandas as pd
import yaml
from ray import tune
from ray.tune.search import Searcher, SearchGenerator

from search.definition.objectives import Bound, names
from search.definition.schema import budget_seconds, stop_target
from search.definition.space import Space
from search.searching.failing import failing_note
from search.store.results import RESULTS_FILE
from search.store.run_folder import RunFolder, run_folder_name
from search.store.storage import Storage
from trainable.yaml_file import dump_yaml, read_yaml_mapping

# not .json: a resume copies the run folder's .json and .pkl files into Tune's staging folder, and
# Tune's later uploads of that folder would bring an old copy back over a newer one
ENDED_FILE = "ended.yaml"
#: the keys a --resume may change (--set, --more-trials, --num-samples); where the run is may change too
RESUME_KEYS = ("experiment.time_budget", "experiment.stop_when", "experiment.num_samples")
LOCATION_KEYS = ("experiment.storage_path", "experiment.name", "data.root")
#: a plain-number target on a metric that is no objective: lower is better for names ending so
LOWER_IS_BETTER = ("loss", "error")


# Searches ended from outside their searcher, by run folder path: search/execution/progress.py ends one whose
# first trials all failed alike (search/searching/failing.py). Tune restores a resumed search's callbacks,
# searcher and stopper from separate records, so the three share no object; the driver runs one search at a
# time in its process, and its fit() forgets the run's entry before Tune starts.
_ENDED_OUTSIDE: dict[str, dict[str, Any]] = {}


def end_search(folder: RunFolder, why: dict[str, Any]) -> None:
    """End the search of `folder` as a budget would: no trial starts after this, running ones stop at their
    next report; `why` is ENDED_FILE's record (its `ended_by` and what the summary says of it)."""
    _ENDED_OUTSIDE[folder.path] = why


def forget_ending(folder: RunFolder) -> None:
    _ENDED_OUTSIDE.pop(folder.path, None)


def direction(experiment, metric: str) -> str:
    """The op a plain-number target on `metric` means: the objective's mode if `metric` is one of
    experiment.metric's objectives, else lower-is-better by name (LOWER_IS_BETTER), else higher."""
    modes = dict(zip(names(experiment.metric), names(experiment.mode)))
    if metric in modes:
        return "<=" if modes[metric] == "min" else ">="
    return "<=" if metric.endswith(LOWER_IS_BETTER) else ">="


def targets_of(experiment) -> tuple[Bound, ...]:
    """experiment.stop_when as Bounds, reached when they hold, each with its direction (an explicit
    '<=' / '>=' wins)."""
    out = []
    for metric, given in (experiment.stop_when or {}).items():
        target = stop_target(given)
        assert target is not None  # a validated experiment's stop_when holds targets only (schema.stop_when_valid)
        op, value = target
        out.append(Bound(metric, op or direction(experiment, metric), value))
    return tuple(out)


def trial_number(result: dict) -> int | None:
    """A result's trial number: the stopper is given Tune's result, the searcher's on_trial_complete
    the same flattened ('config/trial_number')."""
    found = result.get("trial_number", result.get("config/trial_number"))
    return found if found is not None else (result.get("config") or {}).get("trial_number")


def describe(seconds: float) -> str:
    """90 -> '90s', 5400 -> '1.5h': the budget as the summary says it."""
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    return f"{seconds / 60:g}m" if seconds >= 600 else f"{seconds:g}s"


class Budget:
    """A search's time_budget, targets and num_samples, the trials started, and why it ended."""

    def __init__(self, folder: RunFolder, experiment):
        self.folder = folder
        self.writes = True  # the copy that records ENDED_FILE (see the module docstring)
        self.stale = False
        self.trials_started = 0
        self.said_unreported: set[str] = set()  # target metrics a report lacked, said once each
        self._apply(experiment, started=None)

    def _apply(self, experiment, started: float | None) -> None:
        self.time_budget = None if experiment.time_budget is None else budget_seconds(experiment.time_budget)
        self.targets = targets_of(experiment)
        self.num_samples = experiment.num_samples
        self.started = started  # time.time() when the clock started
        self.ended: dict[str, Any] | None = None

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a resume, or Tune reading its record): the settings and clock are the last run's."""
        self.__dict__.update({"said_unreported": set(), **state})  # a Budget pickled before it had the set
        self.stale = True

    def restart(self) -> None:
        """A resume's searcher: spec.yaml's settings as the resume wrote it, and the clock starts now."""
        space, _ = self.folder.read_spec()
        self._apply(space.experiment, started=time.time())
        self.writes, self.stale = True, False
        self._write({"ended_by": None, "started_at": self.started})

    def follow(self) -> None:
        """A resume's stopper: the same settings and the clock the searcher started (ENDED_FILE)."""
        space, _ = self.folder.read_spec()
        started = (read_record(self.folder) or {}).get("started_at")
        self._apply(space.experiment, started=started if isinstance(started, (int, float)) else time.time())
        self.writes, self.stale = False, False

    def start(self) -> None:
        if self.started is None:
            self.started = time.time()

    def observe(self, result: dict | None = None) -> bool:
        """Check the clock and, given a trial's result, the targets; True once the search has ended."""
        if self.ended is None and self.folder.path in _ENDED_OUTSIDE:
            self._end(_ENDED_OUTSIDE[self.folder.path])
        if self.ended is None and self.time_budget is not None and self.started is not None:
            spent = time.time() - self.started
            if spent >= self.time_budget:
                self._end({"ended_by": "time_budget", "time_budget": self.time_budget, "after_seconds": spent})
        for target in self.targets:
            value = (result or {}).get(target.metric)
            if value is None and result and self.writes:
                self._unreported(target.metric, result)
            # a target holds only for a finite value, so only on a result that holds one
            if self.ended is None and result is not None and value is not None and target.holds(value):
                self._end({"ended_by": "stop_when", "metric": target.metric, "op": target.op, "target": target.bound,
                           "value": float(value),
                           "trial_number": trial_number(result),
                           "epoch": result.get("epoch")})
        return self.ended is not None

    def _unreported(self, metric: str, result: dict) -> None:
        """Say once that a trial's report lacks a target's metric: a function trainable's names are
        known only from its reports (the canonical loop's are checked before the search)."""
        number = trial_number(result)
        if metric in self.said_unreported or number is None:
            return
        self.said_unreported.add(metric)
        print(f"note: experiment.stop_when names {metric}, which trial #{number}'s report does not hold; that "
              f"target cannot end the search unless a later report holds it", file=sys.stderr, flush=True)

    @property
    def finished(self) -> bool:
        return self.ended is not None or self.trials_started >= self.num_samples

    def _end(self, why: dict[str, Any]) -> None:
        self.ended = {**why, "trials_started": self.trials_started, "num_samples": self.num_samples,
                      "at": time.strftime("%Y-%m-%d %H:%M:%S")}
        if self.writes:
            self._write(self.ended)

    def _write(self, record: dict[str, Any]) -> None:
        self.folder.storage.write(f"{self.folder.name}/{ENDED_FILE}", dump_yaml(record).encode())


class BudgetedSearch(Searcher):
    """The searcher, until the Budget ends the search: then Searcher.FINISHED."""

    def __init__(self, searcher: Searcher, budget: Budget):
        self.searcher = searcher  # the name Tune follows to save and restore the searchers inside
        self.budget = budget
        super().__init__(metric=searcher.metric, mode=searcher.mode)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict | None:
        if self.budget.stale:  # a resume that found no saved searcher state to set
            self.budget.restart()
        self.budget.start()
        if self.budget.observe() or self.budget.finished:
            # Ray's Searcher.suggest returns this str sentinel too, though its annotation says Optional[Dict]
            return Searcher.FINISHED  # type: ignore[return-value]
        config = self.searcher.suggest(trial_id)
        if config == Searcher.FINISHED:  # the searcher has no more trials to give
            self.budget.num_samples = self.budget.trials_started
        elif config is not None:
            self.budget.trials_started += 1
        return config

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.budget.observe(result)
        self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if result and not error:  # a trial BudgetStop stopped: its last result is told here
            self.budget.observe(result)
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def get_state(self) -> dict:
        return {"trials_started": self.budget.trials_started, "ended": self.budget.ended}

    def set_state(self, state: dict) -> None:
        """A resume: the trials started stand; the budget, targets and num_samples are spec.yaml's."""
        self.budget.restart()
        self.budget.trials_started = state.get("trials_started", 0)

    def save(self, checkpoint_path: str) -> None:
        self.searcher.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.searcher.restore(checkpoint_path)


class Generator(SearchGenerator):
    """Tune's SearchGenerator, finished when the Budget says so (not by its own restored count)."""

    searcher: BudgetedSearch  # budgeted() hands it one; SearchGenerator declares a plain Searcher

    def is_finished(self) -> bool:
        return self.searcher.budget.finished


class BudgetStop(tune.Stopper):
    """Stops each running trial at its next report once the Budget has ended the search."""

    def __init__(self, budget: Budget):
        self.budget = budget

    def __call__(self, trial_id: str, result: dict) -> bool:
        if self.budget.stale:  # Tune's copy of the stopper after a resume
            self.budget.follow()
        return self.budget.observe(result)

    def stop_all(self) -> bool:
        return False  # running trials end at their epoch end, not mid-epoch


def budgeted(searcher: Searcher, folder: RunFolder, space: Space) -> tuple[Generator, BudgetStop]:
    """The search algorithm and the stopper of a search, one Budget handed to both (a resume may
    add a budget, so always both)."""
    budget = Budget(folder, space.experiment)
    return Generator(BudgetedSearch(searcher, budget)), BudgetStop(budget)


def read_record(folder: RunFolder) -> dict[str, Any] | None:
    """ENDED_FILE as written, or None."""
    data = folder.storage.read(f"{folder.name}/{ENDED_FILE}")
    try:
        record = yaml.safe_load(data) if data else None
    except yaml.YAMLError:
        return None
    return record if isinstance(record, dict) else None


def read_ended(folder: RunFolder) -> dict[str, Any] | None:
    """ENDED_FILE's record when a budget or a target ended the run's last search, else None."""
    ended = read_record(folder)
    return ended if ended and ended.get("ended_by") else None


def ended_note(ended: dict[str, Any] | None, trials: int) -> str | None:
    """The summary's line on why the search ended early: 'ended by time_budget 60s after 7 of 1000 trials'."""
    if not ended:
        return None
    if ended["ended_by"] == "failing":
        return failing_note(ended, trials)
    if ended["ended_by"] == "time_budget":
        spent = ended.get("after_seconds")
        how = f"ended by time_budget {describe(ended['time_budget'])}" + (
            f" (noticed {spent:.1f} s after the search's start)" if isinstance(spent, (int, float)) else "")
        more = "--resume with --more-trials N or --set experiment.time_budget=..."
    else:
        target = f"{ended['op']} {ended['target']:g}" if ended.get("op") else f"{ended['target']:g}"
        how = (f"ended by stop_when {ended['metric']}: {target} (trial #{ended['trial_number']} reached "
               f"{ended['value']:.4f} at epoch {ended['epoch']})")
        # the target holds on a resume: the next trial that reaches it ends the search again
        more = (("--resume --set experiment.stop_when=null (or a target further off)"
                 if trials < ended["num_samples"] else "--resume with --more-trials N and --set "
                 "experiment.stop_when=null (or a target further off)"))
    return (f"{how} after {trials} of {ended['num_samples']} trials; running trials stopped at their next epoch "
            f"end (status STOPPED). More: {more}")


def more_trials_base(space: Space, name: str | None) -> int:
    """What --more-trials N adds N to, for the run a --resume continues: its stored experiment.num_samples;
    where a budget or a target ended its last search first, the trials it holds (num_samples was then a
    ceiling, and N more than it would run every trial up to it first)."""
    storage = Storage.at(space.experiment.storage_path)
    folder = RunFolder(storage, run_folder_name(space, storage, name, resume=True))
    stored = folder.read_spec()[0].experiment.num_samples
    if read_ended(folder) is None:
        return stored
    try:
        held = pd.read_parquet(f"{folder.path}/{RESULTS_FILE}", columns=["trial_id"])["trial_id"].nunique()
    except (OSError, ValueError):  # no results to count: the ceiling, as without an ending
        return stored
    return min(stored, held)


def resume_changes(space: Space, stored: Space) -> dict[str, Any]:
    """The RESUME_KEYS that this command sets to values other than spec.yaml's: those a resume takes.

    Asked for by a flag or --set (space.asked), that is: a key whose value only the space file changed
    since the run started is not (spec.yaml decides; the resume notes the difference).
    """
    now, then = space.experiment.model_dump(), stored.experiment.model_dump()
    in_file = None
    if space.source.endswith((".yaml", ".yml")):
        try:
            in_file = {**type(space.experiment)().model_dump(), **read_yaml_mapping(space.source).get("experiment", {})}
        except Exception:  # an unreadable file: the stored spec names it; only the flags count then
            in_file = None
    keys = [key.removeprefix("experiment.") for key in RESUME_KEYS]
    # a flag's value counts even where it equals the file's (--set experiment.stop_when=null, a file without one)
    return {key: now[key] for key in keys if now[key] != then[key] and (
        f"experiment.{key}" in space.asked or in_file is None or now[key] != in_file.get(key))}
