"""Warm start: enqueued configs (`experiment.enqueue`) and an earlier run's trials (`--warm-start`).

- `experiment.enqueue: [{lr: 0.05}, {lr: 0.1, batch_size: 64}]`: partial configs of searched
  keys, run first as trials 0..k-1 (Optuna's `Study.enqueue_trial`); the keys they leave out are
  drawn as usual. Each value must lie inside its key's distribution, checked with the space file.
- `experiment.warm_start: runs/<earlier>` (or `--warm-start`): the earlier run's finished trials
  are told to the new study before trial 0 (`Study.add_trial`), so TPE starts informed. The
  earlier run folder is only read. Only trials that ran a config today's search could run are
  told (`select`); the others are left out and counted by why: a value outside today's space, a
  key searched then that today's space fixes at another value (or no longer sets), a key searched
  today that the earlier run lacked. A key searched today that the earlier run fixed is told at
  that fixed value, if today's space could draw it. A different metric or mode is refused. What
  was told is fixed when the run starts, in the run folder's `warm_start.json` (WARM_START_FILE):
  a resume tells the same trials again, never twice, and the summary and the journal read them
  from there.

hpsearch's own trials still number from 0: in the searcher's study the warm-start trials come
first, so Optuna's number of trial n is n + (their count); `renumbered` hands the trial function
n. In optuna.journal they are a study of their own, `<run>.warm_start` (search/outputs/journal.py), so
that entry k of the run's study stays trial_number k.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState, create_trial

from search.definition.enqueue import outside
from search.definition.objectives import objectives_of, point_row
from search.definition.ranking import score
from search.definition.schema import Searched
from search.searching.study import frozen_trial
from search.store.results import INTERRUPTED, LOST, RESULTS_FILE, is_json, results_schema
from search.store.run_folder import NotARunFolder, open_run
from trainable.errors import ConfigError, problem

WARM_START_FILE = "warm_start.json"  #: in the new run folder: the trials told, and what was left out
FROM, NUMBER = "warm_start_from", "warm_start_trial_number"  #: user attributes of a told trial
UNFINISHED = "unfinished or without a finite value"  #: why an earlier trial that never scored is left out


# ---- --warm-start ---------------------------------------------------------------------------

@dataclass(frozen=True)
class WarmStart:
    """What a run was told of an earlier run: WARM_START_FILE's content."""

    source: str  #: experiment.warm_start as given (runs/<earlier>)
    run: str  #: the earlier run's name
    trials: list[dict[str, Any]] = field(default_factory=list)  #: {number, params (Optuna's), value[, constraints]}
    left_out: dict[str, int] = field(default_factory=dict)  #: why -> how many earlier trials

    def note(self) -> str:
        """The summary's line."""
        out = sum(self.left_out.values())
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(self.left_out.items(), key=lambda kv: -kv[1]))
        return (f"warm start: {len(self.trials)} trial(s) from {self.source} told to the study before trial 0 "
                f"(study {self.run}; earlier trial numbers in user attribute {NUMBER}); "
                f"{out} left out" + (f": {why}" if out else ""))


def _ran_with(value: Any) -> Any:
    """A results cell (or a config value) as plain data to compare: numpy scalars as Python's, NaN as None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_ran_with(v) for v in value]
    if isinstance(value, dict):
        return {k: _ran_with(v) for k, v in value.items()}
    return value


def fixed_now(name: str, value: Any) -> str:
    """Why an earlier trial is left out: it drew `name`, which today's space fixes at another `value`."""
    return f"{name} drew a value other than today's {value!r}"


def not_set_now(name: str) -> str:
    """Why an earlier trial is left out: it drew `name`, which today's trials are not given at all."""
    return f"{name} searched then, not set today"


def select(frame, earlier_space, space) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The earlier run's finished trials that fit today's space (by trial_number), each with today's
    experiment.constraints measured on it where there are any, and why others did not fit.

    A trial fits when it ran a config today's search could run: each key searched today has a value
    it could draw now, and each key the earlier run searched that today's space does not has the
    value today's trials get (fixed in the file, or the trial config's default)."""
    objectives = objectives_of(space.experiment)
    schema = results_schema(earlier_space)
    json_columns = {f.name for f in schema if is_json(f)}

    def cell_of(row, name: str) -> Any:
        cell = row[name] if name in frame.columns else None
        return json.loads(cell) if name in json_columns and isinstance(cell, str) else cell

    # Searched then, not today: today's trials all run with one value of it (or, a function's key or a
    # factory's keyword no longer in the file, with a default only the user's code knows). A trial that
    # drew another value did not run today's space: told as if it had, it would misstate the study.
    searched_now = {d.name for d in space.searched}
    now = space.trial_defaults().to_flat()
    kept: list[dict[str, Any]] = []
    left_out: dict[str, int] = {}
    groups = sorted(frame.groupby("trial_id"), key=lambda kv: kv[1]["trial_number"].iloc[0])
    for _, rows in groups:
        first = rows.iloc[0]
        why = None
        earlier = frozen_trial(rows.to_dict("records"), earlier_space, schema)
        if earlier.state != TrialState.COMPLETE or first["status"] in (INTERRUPTED, LOST) \
                or pd.isna(first["trial_number"]):
            why = UNFINISHED
        then: dict[str, Any] = {}  # the keys the earlier run drew for it, as its `when:` conditions read them
        for d in earlier_space.searched:
            if why:
                break
            if not d.holds(then):  # a `when:` key the earlier run did not draw for it: it did not apply
                continue
            then[d.name] = ran = cell_of(first, d.name)
            if d.name in searched_now:
                continue
            if d.name not in now:
                why = not_set_now(d.name)
            elif _ran_with(ran) != _ran_with(now[d.name]):
                why = fixed_now(d.name, _ran_with(now[d.name]))
        params: dict[str, Any] = {}
        drawn: dict[str, Any] = {}
        for d in space.searched:
            if why:
                break
            if not d.holds(drawn):  # a `when:` key today's space would not draw for this trial: not asked
                continue
            # a key searched today that the earlier run fixed: its column holds the value every trial of
            # that run had (every config key has a column), a point today's space holds if it could draw it
            cell = cell_of(first, d.name)
            missing = cell is None or (isinstance(cell, float) and math.isnan(cell) and not
                                       (d.is_choice and None in d.values))
            try:
                params[d.name] = None if missing else d.param(cell)
            except (TypeError, ValueError):
                params[d.name] = cell
            drawn[d.name] = cell
            if missing:
                why = f"without {d.name}"
            elif reason := outside(d, params[d.name]):
                why = f"{d.name} {reason.removeprefix('must be ')}"
        constraints = None
        if not why and objectives.constraints:
            # told as feasible without them (Optuna scores a trial with no constraints as feasible), so
            # each earlier trial carries today's constraints, measured at its point as this run's trials are
            point = point_row(rows.to_dict("records"), objectives)
            absent = [c.metric for c in objectives.constraints if point is None or score(point.get(c.metric)) is None]
            if absent:
                why = f"without {absent[0]} (experiment.constraints)"
            else:
                assert point is not None  # without a point every constraint is absent
                constraints = objectives.constraint_values(point)
        if why:
            left_out[why] = left_out.get(why, 0) + 1
        else:
            kept.append({"number": int(first["trial_number"]), "params": params, "value": earlier.value,
                         **({"constraints": constraints} if constraints is not None else {})})
    return kept, left_out


def read(space) -> WarmStart | None:
    """The earlier run of experiment.warm_start, read (never written) and checked; None without one.

    ConfigError (exit 2, before anything starts): not a run folder, no results.parquet, another
    metric or mode.
    """
    source = space.experiment.warm_start
    if source is None:
        return None
    key = "experiment.warm_start"
    try:
        folder = open_run(source)
        earlier, _ = folder.read_spec()
    except (NotARunFolder, ConfigError) as error:
        raise ConfigError([problem(key, f"must be an earlier run folder of hpsearch ({error})", source)]) from None
    then, now = earlier.experiment, space.experiment
    if (then.metric, then.mode) != (now.metric, now.mode):
        raise ConfigError([problem(key, f"must be a run with this search's metric and mode ({now.metric}, "
                                        f"{now.mode}); it searched {then.metric}, {then.mode}", source)])
    try:
        frame = pd.read_parquet(f"{folder.path}/{RESULTS_FILE}")
    except (OSError, ValueError) as error:
        raise ConfigError([problem(key, f"must be a run with a readable {RESULTS_FILE} ({error})", source)]) from None
    trials, left_out = select(frame, earlier, space)
    return WarmStart(source, folder.name, trials, left_out)


def settle(space, folder) -> WarmStart | None:
    """The warm start of the run in `folder`: as saved there, or read now and saved (a new run's first build)."""
    saved = load(folder)
    if saved is not None or space.experiment.warm_start is None:
        return saved
    warm = read(space)
    assert warm is not None  # read gives None only without experiment.warm_start, returned above
    folder.storage.write(f"{folder.name}/{WARM_START_FILE}", json.dumps(asdict(warm), indent=1).encode())
    return warm


def load(folder) -> WarmStart | None:
    """The warm start saved in a run folder, or None."""
    data = folder.storage.read(f"{folder.name}/{WARM_START_FILE}")
    return None if data is None else WarmStart(**json.loads(data))


def told(warm: WarmStart | None, searched: Sequence[Searched]) -> list[FrozenTrial]:
    """The warm start's trials as Optuna's, in earlier trial-number order, each marked by user attributes."""
    if warm is None:
        return []
    distributions = {d.name: d.distribution for d in searched}
    return [create_trial(state=TrialState.COMPLETE, value=t["value"], params=t["params"],
                         distributions={name: distributions[name] for name in t["params"]},
                         user_attrs={FROM: warm.run, NUMBER: t["number"]}, constraints=t.get("constraints"))
            for t in warm.trials]


def summary_line(folder) -> str:
    """The summary's warm-start line (with its leading newline), or "" for a run without one."""
    warm = load(folder)
    return "" if warm is None else f"\n{warm.note()}"


# ---- numbering ----------------------------------------------------------------------------

class Renumbered:
    """An Optuna trial whose `number` is hpsearch's trial number: Optuna's less the warm-start trials
    told before it. Everything else is the trial's."""

    def __init__(self, trial: optuna.Trial, first: int):
        self._trial, self.number = trial, trial.number - first

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trial, name)


def renumbered(trial: optuna.Trial, *, ask: Callable[[Any], dict[str, Any]], first: int) -> dict[str, Any]:
    """`ask` (search/searcher.suggest) on `trial` numbered from hpsearch's 0; module-level, so Tune can pickle it."""
    return ask(Renumbered(trial, first))
