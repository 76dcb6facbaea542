"""Optuna inside Tune, asked through a define-by-run function.

Define-by-run (rather than a Tune param space) lets each trial's seed come from the
experiment seed and Optuna's trial number, a counter that is part of the searcher's
saved state: a resumed search hands out the same seeds it would have without the stop.

Two searchers: `OrderedSearch` (search/ordered.py, `experiment.reproducible: true`, the
default), whose trial n depends only on the seed and n; and Tune's `OptunaSearch` behind a
ConcurrencyLimiter, which tells Optuna results as they arrive (reproducible only with
max_concurrent 1).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import optuna
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.optuna import OptunaSearch

from search.ordered import OrderedSearch, make_sampler
from search.space import Distribution, Space
from trainable.config import is_integer_field
from trainable.seed import derive_seed



def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def suggest(trial: optuna.Trial, searched: tuple[Distribution, ...], experiment_seed: int) -> dict[str, Any]:
    """Ask Optuna for every searched field; return the trial's seed and decoded choices.

    Returned values are constants that Tune adds to the trial config (overriding a
    captured suggestion of the same name).
    """
    constants: dict[str, Any] = {"seed": derive_seed(experiment_seed, trial.number), "trial_number": trial.number}
    for d in searched:
        if d.distribution == "choice":
            if all(_scalar(v) for v in d.values):
                trial.suggest_categorical(d.name, list(d.values))
            else:  # Optuna's categories must be scalars: ask for a label, pass the value on
                labels = {json.dumps(v): v for v in d.values}
                constants[d.name] = labels[trial.suggest_categorical(d.name, list(labels))]
        elif d.distribution == "randint":  # both bounds included, as Optuna's suggest_int
            trial.suggest_int(d.name, d.low, d.high)
        else:
            log = d.distribution == "loguniform"
            if is_integer_field(d.name):
                trial.suggest_int(d.name, d.low, d.high, log=log)
            else:
                trial.suggest_float(d.name, d.low, d.high, log=log)
    return constants


def make_searcher(space: Space) -> Searcher:
    """The search's searcher, seeded, at most `max_concurrent` trials at once."""
    experiment = space.experiment
    # a partial of a module-level function: Tune pickles the searcher into its state
    ask = functools.partial(suggest, searched=space.searched, experiment_seed=experiment.seed)
    if experiment.reproducible:
        searcher = OrderedSearch(ask, metric=experiment.metric, mode=experiment.mode,
                                 experiment_seed=experiment.seed, sampler=experiment.sampler,
                                 lag=experiment.max_concurrent)
    else:
        searcher = OptunaSearch(space=ask, metric=experiment.metric, mode=experiment.mode,
                                sampler=make_sampler(experiment.sampler, experiment.seed, 0))
    # Tune lets a searcher that is not a ConcurrencyLimiter have one pending trial at a time,
    # which starts trials one after another (tune_controller._get_max_pending_trials)
    return ConcurrencyLimiter(searcher, max_concurrent=experiment.max_concurrent)
