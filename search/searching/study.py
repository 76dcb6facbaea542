"""The search as an Optuna study, built from results rows: in memory for the report, and each
trial's entry in optuna.journal for `optuna-dashboard` (search/outputs/journal.py).

A trial's value is its best epoch's metric (the epoch best.yaml picks), as in OrderedSearch;
a trial without a finite metric, or that ended in ERROR, is FAIL (its epochs stay as
intermediate values), so the study's best is best.yaml's. Each trial carries `trial_number`,
`trial_id` and `seed` as user attributes, and its metric per epoch as intermediate values.

In optuna.journal (`live`) a trial is COMPLETE only when it ran all its epochs (status COMPLETED).
One a scheduler stopped early (STOPPED: asha, hyperband) is PRUNED, as Optuna's pruners leave one,
with its curve and its value (its best epoch: one score rule everywhere, where Optuna's `tell`
would keep its last); one whose metric broke (DIVERGED) is FAIL, as an objective that returns NaN
is. One exception keeps the study's best best.yaml's: Optuna's `best_trial` and `best_trials` read
COMPLETE trials only, and best.yaml counts every finished trial's finite epochs (a trial stopped
after a good epoch that then fell, say), so the trial that holds the run's best (`best_trials`:
best.yaml's trial, or pareto.yaml's front) is COMPLETE whatever its status, which its status user
attribute still says. Which trial that is needs every trial's results: the live journal writes
each trial as it ends by its own status, and the end of the search (which makes the journal
hold results.parquet, as a `--resume` does) turns the best into COMPLETE if it is not.
The report's study (`make_study`) keeps every scored trial COMPLETE: Optuna's plots draw COMPLETE
trials only, and the report shows every trial's value.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import optuna
import pandas as pd
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState, create_trial

from search.definition.objectives import objectives_of, pareto_front, point_row
from search.definition.ranking import best_candidates, best_value, score
from search.definition.schema import conditions, not_drawn
from search.definition.space import Space
from search.definition.status import DIVERGED, ERROR, INTERRUPTED, PENDING, RUNNING, STOPPED
from search.store.results import is_json, results_schema

JOURNAL_FILE = "optuna.journal"
# a trial that has not ended, as the journal holds it: the status user attribute -> Optuna's state
UNENDED = {RUNNING: TrialState.RUNNING, INTERRUPTED: TrialState.RUNNING, PENDING: TrialState.WAITING}


def _cell(value, json_column: bool):
    """A results cell as the trial config holds it (JSON-text columns decoded)."""
    return json.loads(value) if json_column and isinstance(value, str) else value


def frozen_trial(rows: Sequence[Mapping[str, Any]], space: Space, schema=None, *, live: bool = False,
                 best: bool = False) -> FrozenTrial:
    """One trial's rows (one per epoch, as results.parquet holds them: results.records, or a frame's
    to_dict("records")) as an Optuna trial; `schema`: results_schema(space), if held.

    By default a finished trial (the report's study). `live`: as optuna.journal holds it, where a
    trial not yet ended (status RUNNING or INTERRUPTED) is RUNNING with its curve so far, one
    not yet started (PENDING) is WAITING, one a scheduler stopped (STOPPED) is PRUNED and one that
    DIVERGED is FAIL, unless it is `best` (its id among best_trials' of the whole frame).
    """
    objectives = objectives_of(space.experiment)
    metric, mode = objectives.metrics[0], objectives.modes[0]
    first = rows[0]
    json_columns = {f.name for f in (schema or results_schema(space)) if is_json(f)}
    curve = {int(r["epoch"]): scored for r in rows
             if not pd.isna(r["epoch"]) and (scored := score(r[metric])) is not None}
    value = best_value(curve.values(), mode)
    # several objectives, constraints: the trial's point (search/definition/objectives.py) gives its values and constraints
    point = point_row(rows, objectives) if objectives.several or objectives.constraints else None
    values = (None if point is None else objectives.values(point)) if objectives.several else \
        None if value is None else [value]
    status = str(first["status"])
    if status == ERROR:  # it raised, as a failed Optuna trial does: never the best, as in best.yaml
        values = None
    state = TrialState.COMPLETE if values is not None else TrialState.FAIL
    if live and status == STOPPED and not best:
        state = TrialState.PRUNED  # its values kept: the dashboard shows what it reached
    if live and status == DIVERGED and not best:  # its metric broke: FAIL, as an objective returning NaN is
        state, values = TrialState.FAIL, None
    if live and status in UNENDED:
        state, values = UNENDED[status], None
    measured = {} if point is None else {m: score(point.get(m)) for m in objectives.measured}
    cells = {d.name: _cell(first[d.name], d.name in json_columns) for d in space.searched}
    drawn = [d for d in space.searched if d.name not in not_drawn(conditions(space.searched), cells)]  # `when:`
    return create_trial(
        state=state,
        values=values,
        constraints=objectives.constraint_values(point)
        if point is not None and objectives.constraints and state == TrialState.COMPLETE else None,
        params={d.name: d.param(cells[d.name]) for d in drawn},
        distributions={d.name: d.distribution for d in drawn},
        intermediate_values=curve or None,
        user_attrs={"trial_number": None if pd.isna(first["trial_number"]) else int(first["trial_number"]),
                    "trial_id": str(first["trial_id"]), "seed": int(first["seed"]), "status": status, **measured},
    )


def best_trials(frame: pd.DataFrame, space: Space) -> set[str]:
    """The ids of the trials that hold a run's best, as its outputs name them: best.yaml's trial (one
    objective: ranking.best_candidates' first, as finish.py picks it), or pareto.yaml's front (several)."""
    objectives = objectives_of(space.experiment)
    if objectives.several:
        return {str(i) for i in pareto_front(frame, objectives)["trial_id"]}
    scored = best_candidates(frame, objectives.metrics[0], objectives.modes[0])
    return set() if scored.empty else {str(scored["trial_id"].iloc[0])}


def make_study(frame: pd.DataFrame, space: Space, storage: optuna.storages.BaseStorage | None = None,
               name: str | None = None) -> optuna.Study:
    """A study of every trial in `frame`, in trial-number order."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                directions=objectives_of(space.experiment).directions)
    schema = results_schema(space)
    for rows in sorted(trial_records(frame, by_id=True), key=lambda rows: rows[0]["trial_number"]):
        study.add_trial(frozen_trial(rows, space, schema))
    return study


def trial_records(frame: pd.DataFrame, *, by_id: bool = False) -> list[list[dict[str, Any]]]:
    """Each trial's rows of a results frame as frozen_trial's records, in the frame's order (`by_id`:
    by trial id). One to_dict for the whole frame: one per trial takes about a millisecond each."""
    trials: dict[str, list[dict[str, Any]]] = {}
    for row in frame.to_dict("records"):
        trials.setdefault(row["trial_id"], []).append(row)
    return [trials[i] for i in sorted(trials)] if by_id else list(trials.values())


def journal(path: str) -> optuna.storages.JournalStorage:
    return optuna.storages.JournalStorage(JournalFileBackend(path))
