"""Budgets and targets: experiment.time_budget and experiment.stop_when end a search early, with exit 0.

Two Tune pieces share one record of why the search ended:

- `BudgetedSearch`, Tune's SearchGenerator over the searcher, starts no new trial once the
  budget is spent or a target reached: it says it is finished, so Tune runs to its end.
- `BudgetStop`, the run's Stopper, stops each running trial at its next report (its next epoch
  end). Such a trial ends TERMINATED in Tune's record with the epochs it reported, so
  results.parquet calls it STOPPED, as it calls a trial ASHA stopped; its value is what it
  reached at its last epoch, never more.

The reproducible searcher numbers trials in order and trial n depends only on the seed and n,
so the trials that ran are trials 0..k-1 of the same search without a budget.

The clock starts when Tune first asks for a trial; a resume gets a fresh budget and takes
experiment.time_budget, stop_when and num_samples from spec.yaml as the resume rewrote it
(search/preflight.py). ENDED_FILE in the run folder says why the search ended; the summary
and `python -m search runs` read it.
"""

from __future__ import annotations

import time
from typing import Any

import yaml
from ray import tune
from ray.tune.search import SearchGenerator, Searcher

from search.run_folder import RunFolder
from search.schema import budget_seconds
from search.space import Space

# not .json: a resume copies the run folder's .json and .pkl files into Tune's staging folder, and
# Tune's later uploads of that folder would bring an old copy back over a newer one
ENDED_FILE = "ended.yaml"
#: the keys a --resume may change (--set, --more-trials, --num-samples); where the run is may change too
RESUME_KEYS = ("experiment.time_budget", "experiment.stop_when", "experiment.num_samples")
LOCATION_KEYS = ("experiment.storage_path", "experiment.name", "data.root")


def reached(metric: str, value: float, target: float) -> bool:
    """A target is reached at or above it for an accuracy, at or below it for a loss."""
    return value <= target if metric.endswith("loss") else value >= target


def describe(seconds: float) -> str:
    """90 -> '90s', 5400 -> '1.5h': the budget as the summary says it."""
    if seconds >= 3600:
        return f"{seconds / 3600:g}h"
    return f"{seconds / 60:g}m" if seconds >= 600 else f"{seconds:g}s"


class BudgetedSearch(SearchGenerator):
    """Tune's SearchGenerator that stops asking for trials once the budget or a target ends the search."""

    def __init__(self, searcher: Searcher, folder: RunFolder, experiment):
        super().__init__(searcher)
        self.folder = folder
        self._apply(experiment)

    def _apply(self, experiment) -> None:
        self.time_budget = None if experiment.time_budget is None else budget_seconds(experiment.time_budget)
        self.stop_when = dict(experiment.stop_when or {})
        self.started: float | None = None  # time.monotonic() of the first ask in this process
        self.ended: dict[str, Any] | None = None

    def next_trial(self):
        LIVE[self.folder.path] = self  # the one Tune asks, for BudgetStop (see there)
        if self.started is None:
            self.started = time.monotonic()
        self.observe()
        return None if self.ended else super().next_trial()

    def observe(self, result: dict | None = None) -> bool:
        """Check the clock and, given a trial's result, the targets; True once the search has ended."""
        if self.ended is None and self.time_budget is not None and self.started is not None:
            spent = time.monotonic() - self.started
            if spent >= self.time_budget:
                self._end({"ended_by": "time_budget", "time_budget": self.time_budget, "after_seconds": spent})
        for metric, target in self.stop_when.items():
            value = (result or {}).get(metric)
            if self.ended is None and isinstance(value, (int, float)) and reached(metric, value, target):
                self._end({"ended_by": "stop_when", "metric": metric, "target": target, "value": float(value),
                           "trial_number": result.get("trial_number", (result.get("config") or {}).get("trial_number")),
                           "epoch": result.get("epoch")})
        return self.ended is not None

    def _end(self, why: dict[str, Any]) -> None:
        self.ended = {**why, "trials_started": self._counter, "num_samples": self._total_samples,
                      "at": time.strftime("%Y-%m-%d %H:%M:%S")}
        self._finished = True  # Tune starts no new trial and ends when the running ones have stopped
        self.folder.storage.write(f"{self.folder.name}/{ENDED_FILE}", yaml.safe_dump(self.ended, sort_keys=False).encode())

    def get_state(self) -> dict:
        return {**super().get_state(), "ended": self.ended}

    def set_state(self, state: dict) -> None:
        """A resume: Tune's saved count of trials stands; the budget, targets and num_samples are
        spec.yaml's as the resume wrote it, and the clock starts again."""
        super().set_state({k: v for k, v in state.items() if k != "ended"})
        space, _ = self.folder.read_spec()
        self._apply(space.experiment)
        self._total_samples = space.experiment.num_samples
        self._finished = False
        self.folder.storage.write(f"{self.folder.name}/{ENDED_FILE}", yaml.safe_dump({"ended_by": None}).encode())


# run folder path -> the BudgetedSearch that Tune asks in this process. A resumed Tuner brings back
# its stopper and its search algorithm as separate copies, so the stopper looks the search up here
LIVE: dict[str, BudgetedSearch] = {}


class BudgetStop(tune.Stopper):
    """Stops each running trial at its next report once the search has ended (BudgetedSearch)."""

    def __init__(self, folder: RunFolder):
        self.path = folder.path

    def __call__(self, trial_id: str, result: dict) -> bool:
        search = LIVE.get(self.path)
        return search is not None and search.observe(result)

    def stop_all(self) -> bool:
        return False  # running trials end at their epoch end, not mid-epoch


def budgeted(searcher: Searcher, folder: RunFolder, space: Space) -> tuple[BudgetedSearch, BudgetStop]:
    """The search algorithm and the stopper of a search (a resume may add a budget, so always both)."""
    search = BudgetedSearch(searcher, folder, space.experiment)
    return search, BudgetStop(folder)


def read_ended(folder: RunFolder) -> dict[str, Any] | None:
    """ENDED_FILE's record when a budget or a target ended the run's last search, else None."""
    data = folder.storage.read(f"{folder.name}/{ENDED_FILE}")
    try:
        ended = yaml.safe_load(data) if data else None
    except yaml.YAMLError:
        return None
    return ended if isinstance(ended, dict) and ended.get("ended_by") else None


def ended_note(ended: dict[str, Any] | None, trials: int) -> str | None:
    """The summary's line on why the search ended early: 'ended by time_budget 60s after 7 of 1000 trials'."""
    if not ended:
        return None
    if ended["ended_by"] == "time_budget":
        how = f"ended by time_budget {describe(ended['time_budget'])}"
    else:
        how = (f"ended by stop_when {ended['metric']}: {ended['target']:g} (trial #{ended['trial_number']} reached "
               f"{ended['value']:.4f} at epoch {ended['epoch']})")
    return (f"{how} after {trials} of {ended['num_samples']} trials; running trials stopped at their next epoch "
            f"end (status STOPPED). More: --resume with --more-trials N or --set experiment.time_budget=...")


def stored_num_samples(space: Space, name: str | None) -> int:
    """experiment.num_samples in the spec.yaml of the run a --resume continues (--more-trials adds to it)."""
    from search.preflight import run_folder_name
    from search.storage import Storage

    storage = Storage.at(space.experiment.storage_path)
    folder = RunFolder(storage, run_folder_name(space, storage, name, resume=True))
    return folder.read_spec()[0].experiment.num_samples


def resume_changes(space: Space, stored: Space) -> dict[str, Any]:
    """The RESUME_KEYS that this command sets to values other than spec.yaml's: those a resume takes.

    Asked for by a flag or --set, that is: a key whose value only the space file changed since the
    run started is not (spec.yaml decides; the resume notes the difference).
    """
    from trainable.yaml_file import read_yaml_mapping

    now, then = space.experiment.model_dump(), stored.experiment.model_dump()
    in_file = None
    if space.source.endswith((".yaml", ".yml")):
        try:
            in_file = {**type(space.experiment)().model_dump(), **read_yaml_mapping(space.source).get("experiment", {})}
        except Exception:  # an unreadable file: the stored spec names it; only the flags count then
            in_file = None
    keys = [key.removeprefix("experiment.") for key in RESUME_KEYS]
    return {key: now[key] for key in keys
            if now[key] != then[key] and (in_file is None or now[key] != in_file.get(key))}
