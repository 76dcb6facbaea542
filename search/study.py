"""The search as an Optuna study, built from results rows: in memory for the report, in the
run folder's optuna.journal for `optuna-dashboard`.

A trial's value is its best epoch's metric (the epoch best.yaml picks), as in OrderedSearch;
a trial without a finite metric is FAIL. Each trial carries `trial_number`, `trial_id` and
`seed` as user attributes, and its metric per epoch as intermediate values.
"""

from __future__ import annotations

import json
import math
from typing import Any

import optuna
import pandas as pd
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from search.results import best_of, score
from search.searcher import _scalar
from search.space import Distribution, Space
from trainable.config import is_integer_field

JOURNAL_FILE = "optuna.journal"


def optuna_distribution(d: Distribution) -> BaseDistribution:
    """The Optuna distribution `search.searcher.suggest` asks `d` with."""
    if d.distribution == "choice":
        values = list(d.values) if all(_scalar(v) for v in d.values) else [json.dumps(v) for v in d.values]
        return CategoricalDistribution(values)
    log = d.distribution == "loguniform"
    if d.distribution == "randint" or is_integer_field(d.name):
        return IntDistribution(int(d.low), int(d.high), log=log)
    return FloatDistribution(float(d.low), float(d.high), log=log)


def _param(d: Distribution, value: Any) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, float) and math.isnan(value) and d.distribution == "choice" and None in d.values:
        value = None  # a null choice in a float column reads back as NaN
    if d.distribution == "choice" and not all(_scalar(v) for v in d.values):
        return json.dumps(value if not isinstance(value, str) else json.loads(value))
    return int(value) if isinstance(optuna_distribution(d), IntDistribution) else value


def frozen_trial(rows: pd.DataFrame, space: Space) -> FrozenTrial:
    """One trial's rows (one per epoch) as a finished Optuna trial."""
    metric, mode = space.experiment.metric, space.experiment.mode
    first = rows.iloc[0]
    curve = {int(r["epoch"]): score(r[metric]) for _, r in rows.iterrows()
             if not pd.isna(r["epoch"]) and score(r[metric]) is not None}
    value = best_of(curve.values(), mode)
    return create_trial(
        state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
        value=value,
        params={d.name: _param(d, first[d.name]) for d in space.searched},
        distributions={d.name: optuna_distribution(d) for d in space.searched},
        intermediate_values=curve if value is not None else None,
        user_attrs={"trial_number": None if pd.isna(first["trial_number"]) else int(first["trial_number"]),
                    "trial_id": str(first["trial_id"]), "seed": int(first["seed"]), "status": str(first["status"])},
    )


def make_study(frame: pd.DataFrame, space: Space, storage: optuna.storages.BaseStorage | None = None,
               name: str | None = None) -> optuna.Study:
    """A study of every trial in `frame`, in trial-number order."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                direction="maximize" if space.experiment.mode == "max" else "minimize")
    for _, rows in sorted(frame.groupby("trial_id"), key=lambda kv: kv[1]["trial_number"].iloc[0]):
        study.add_trial(frozen_trial(rows, space))
    return study


def journal(path: str) -> optuna.storages.JournalStorage:
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(path))
