"""The runs at hand: `python -m search runs` lists a storage's runs, `python -m search compare A B` sets two side by side.

Each run is read from its own folder, never from Tune's state (that takes seconds a run): spec.yaml
(what it searches), results.parquet (its trials), best.yaml, ended.yaml (search/searching/budget.py) and
its lock (search/store/run_folder.py: held while a process searches it). A run's state:

- running: its lock is held;
- finished: every one of experiment.num_samples trials ended;
- ended by budget: experiment.time_budget ended it (ended.yaml), exit 0;
- target reached: a target of experiment.stop_when ended it (ended.yaml), exit 0;
- failed: trials ran, and none outside ERROR scored;
- interrupted: anything else (stopped, killed, or never got a trial through); --resume continues it.

A run whose results.parquet cannot be read (a folder with no part, a part that is not Parquet) is
listed all the same, its trials as 0, with `no results` and a note that says what is missing:
one damaged run never hides the others (`compare` refuses it, as `report` does).
"""

from __future__ import annotations

import fcntl
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import pandas as pd
import yaml

from search.definition.ranking import ranked
from search.definition.space import spec_differences
from search.outputs.pareto import PARETO_FILE
from search.searching.budget import read_ended
from search.store.results import ERROR, INTERRUPTED, RESULTS_FILE
from search.store.run_folder import BEST_FILE, LOCK_FILE, SPEC_FILE, NoResults, RunFolder
from search.store.storage import Storage, is_uri
from trainable.errors import ConfigError, problem
from trainable.yaml_file import Loader

RUNNING, FINISHED, ENDED, TARGET, FAILED, INTERRUPTED_RUN = ("running", "finished", "ended by budget", "target reached",
                                                             "failed", "interrupted")
#: ended.yaml's ended_by -> the state `runs` shows (search/searching/budget.py writes it)
ENDED_BY = {"time_budget": ENDED, "stop_when": TARGET, "failing": FAILED}


@dataclass(frozen=True)
class Run:
    """One run folder, as `runs` lists it."""

    name: str
    state: str
    done: int  #: trials that ended (not INTERRUPTED)
    total: int  #: experiment.num_samples
    metric: str  #: experiment.metric; several objectives: their names joined by ", "
    best: float | None  #: best.yaml's value of the metric (one objective)
    when: str  #: when its last trial ended (or its spec was written), local time
    several: bool = False  #: several objectives: a front in pareto.yaml, no best.yaml
    front: int | None = None  #: several objectives: the trials on pareto.yaml's front (None: no pareto.yaml yet)
    so_far: bool = False  #: `best` is the best epoch of the trials that ended, read while the search runs
    missing: str | None = None  #: why its results.parquet does not read (NoResults); None: it reads, or is not yet


def is_held(folder: RunFolder) -> bool:
    """Whether a process searches the run now: it holds the flock on .lock (released when it ends, even by SIGKILL)."""
    if is_uri(folder.path):
        return False  # object stores have no lock (docs/stops-and-resume.md)
    try:
        fd = os.open(os.path.join(folder.path, LOCK_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # a shared lock we took goes with the descriptor


def read_yaml(folder: RunFolder, name: str) -> dict[str, Any]:
    data = folder.storage.read(f"{folder.name}/{name}")
    try:
        loaded = yaml.load(data.decode("utf-8"), Loader=Loader) if data else None
    except (ValueError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def best_result(folder: RunFolder) -> dict[str, Any]:
    """best.yaml's `result` mapping ({} where there is none, or it is damaged)."""
    result = read_yaml(folder, BEST_FILE).get("result")
    return result if isinstance(result, dict) else {}


def read_results(folder: RunFolder) -> tuple[pd.DataFrame | None, str | None]:
    """The run's results (None where there are none to read) and, where they exist but do not read,
    what is missing: a run that has not ended a trial yet has no results.parquet, and is not damaged."""
    try:
        return folder.parts.read_all(), None
    except NoResults as error:
        return None, (str(error) if folder.storage.exists(folder.name, RESULTS_FILE) else None)


def read_run(folder: RunFolder) -> Run | None:
    """The run in `folder`; None if it holds no readable spec.yaml (not a run folder, or a damaged one)."""
    spec = read_yaml(folder, SPEC_FILE)
    experiment = spec.get("experiment")
    if not isinstance(experiment, dict):
        return None
    try:
        total = int(experiment.get("num_samples", 0))
    except (TypeError, ValueError):
        return None
    metric = experiment.get("metric", "val_acc")
    several, front = isinstance(metric, list), None
    if several:  # several objectives: a front in pareto.yaml, not one best
        metric = ", ".join(map(str, metric))
        trials_on_front = read_yaml(folder, PARETO_FILE).get("trials")
        front = len(trials_on_front) if isinstance(trials_on_front, list) else None
    frame, missing = read_results(folder)
    trials = frame.drop_duplicates("trial_id", keep="last") if frame is not None else pd.DataFrame()
    done = int((trials["status"] != INTERRUPTED).sum()) if len(trials) else 0
    best = best_result(folder).get(metric)
    if is_held(folder):
        state = RUNNING
    elif (ended := read_ended(folder)) is not None and (not len(trials) or (trials["status"] != INTERRUPTED).all()):
        state = ENDED_BY.get(str(ended["ended_by"]), ENDED)
    elif len(trials) and done == len(trials) and (trials["status"] == ERROR).all():
        state = FAILED
    elif done >= total and (not len(trials) or (trials["status"] != INTERRUPTED).all()):
        state = FINISHED
    else:
        state = INTERRUPTED_RUN
    stamp: float | None
    if frame is not None and "finished_at" in frame and frame["finished_at"].notna().any():
        stamp = float(frame["finished_at"].max())
    else:
        stamp = None if is_uri(folder.path) else os.path.getmtime(os.path.join(folder.path, SPEC_FILE))
    when = "-" if stamp is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp))
    so_far = best is None and state == RUNNING and not several and frame is not None
    if so_far:  # best.yaml comes at the search's end: until then, the ended trials' best feasible epoch
        best = best_so_far(frame, metric, experiment.get("mode", "max"))
    return Run(folder.name, state, done, total, metric, best if isinstance(best, (int, float)) else None, when,
               several, front, so_far=so_far, missing=missing)


def best_so_far(frame: pd.DataFrame, metric: str, mode: str) -> float | None:
    """The best scoring `metric` of the rows outside ERROR that met the constraints (None if none)."""
    best = ranked(frame, metric, mode, feasible=True, without=(ERROR,))
    return None if best.empty else float(best[metric].iloc[0])


def list_runs(storage: Storage) -> list[Run]:
    """Every run folder under the storage, newest first by name's time, then by name."""
    runs = [read_run(RunFolder(storage, name)) for name in storage.list_dirs()]
    return sorted((r for r in runs if r is not None), key=lambda r: (r.when, r.name), reverse=True)


def format_runs(runs: list[Run], where: str) -> str:
    if not runs:
        return f"No runs under {where}"
    table = pd.DataFrame([{"name": r.name, "state": r.state, "trials": f"{r.done}/{r.total}", "best": best_text(r),
                           "when": r.when} for r in runs])
    notes = "".join(f"\nnote: {r.missing}" for r in runs if r.missing)
    return f"Runs under {where}:\n" + table.to_string(index=False) + notes


def best_text(run: Run) -> str:
    """The `best` column of `runs` and `compare`: the best value, or the front's size."""
    if run.missing:
        return "no results"
    if run.several:
        return "-" if run.front is None else f"{run.front} on the Pareto front ({run.metric})"
    if run.best is None or not math.isfinite(run.best):
        return "-"
    return f"{run.metric} {run.best:.4f}" + (" (so far)" if run.so_far else "")


def compare(a: RunFolder, b: RunFolder) -> str:
    """Two runs' spec differences and best trials, side by side."""
    specs = [read_yaml(a, SPEC_FILE), read_yaml(b, SPEC_FILE)]
    runs = [read_run(a), read_run(b)]
    for folder, run in zip((a, b), runs):
        if run is None:
            raise ConfigError([problem("RUN", f"{folder.path}/{SPEC_FILE} is missing or cannot be read: not a "
                                              "run folder (or a damaged one)", folder.path)])
        if run.missing:  # its trials and states would be a guess: say what is missing, as report does
            raise NoResults(run.missing)
    rows = [{"key": k, a.name: repr(x), b.name: repr(y)}
            for k, x, y in spec_differences(*({k: v for k, v in spec.items() if k != "run"} for spec in specs))]
    lines = [f"Spec differences ({len(rows)}):",
             pd.DataFrame(rows).to_string(index=False) if rows else "  (none: the same search)", "", "Best trials:"]
    entries = [read_yaml(folder, BEST_FILE) for folder in (a, b)]
    results = [result if isinstance(result := entry.pop("result", None), dict) else {} for entry in entries]
    # every test metric either best.yaml holds a value of (test_r2_score of a regression; none of a function's
    # run), in best.yaml's order: a null one (test_acc of a regression) is no figure of that run
    tests = list(dict.fromkeys(k for result in results for k, v in result.items()
                               if str(k).startswith("test_") and v is not None))
    best = {}
    for folder, run, entry, result in zip((a, b), runs, entries, results):
        assert run is not None  # the first loop raised on a run that does not read
        shown = ("trial_number", "epoch", run.metric, *tests) if not run.several else ()  # no best.yaml
        best[folder.name] = {"state": run.state, "trials": f"{run.done}/{run.total}", "best": best_text(run),
                             **{f"result.{k}": result.get(k) for k in shown},
                             **{k: v for k, v in sorted(flat(entry).items())}}
    table = pd.DataFrame(best)
    lines.append(table.fillna("-").to_string())
    return "\n".join(lines)


def flat(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """best.yaml's config as section.key -> value, for one row per key."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = repr(value) if isinstance(value, (list, tuple)) else value
    return out
