"""Optuna inside Tune, asked through a define-by-run function.

Define-by-run (rather than a Tune param space) lets each trial's seed come from the
experiment seed and Optuna's trial number, a counter that is part of the searcher's
saved state: a resumed search hands out the same seeds it would have without the stop.

Two searchers: `OrderedSearch` (search/searching/ordered.py, `experiment.reproducible: true`, the
default), whose trial n depends only on the seed and n; and Tune's `OptunaSearch` behind a
ConcurrencyLimiter, which tells Optuna results as they arrive (reproducible only with
max_concurrent 1).
"""

from __future__ import annotations

import functools
from typing import Any

import optuna
from optuna.storages import InMemoryStorage
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.optuna import OptunaSearch

from search.definition.enqueue import enqueued_params
from search.definition.objectives import HALVING, objectives_of
from search.definition.schema import Searched
from search.definition.space import Space, max_epochs
from search.searching import warm_start
from search.searching.choice import resolved
from search.searching.halving import rung_epochs
from search.searching.ordered import OrderedSearch, make_sampler
from search.store.run_folder import RunFolder
from trainable.seed import derive_seed


def suggest(trial: optuna.Trial, searched: tuple[Searched, ...], experiment_seed: int) -> dict[str, Any]:
    """Ask Optuna for every searched field whose `when:` holds; return the trial's seed and every drawn value.

    Fields are asked in the space section's order, so a condition's key is decided before the
    fields it gates; a field not asked is absent, the trial config keeps its default (results:
    null). Returned values are constants that Tune adds to the trial config, overriding Optuna's
    param of the same name: a choice's value rather than its label.
    """
    drawn: dict[str, Any] = {}
    for d in searched:
        if d.holds(drawn):
            drawn[d.name] = d.ask(trial)
    return {"seed": derive_seed(experiment_seed, trial.number), "trial_number": trial.number, **drawn}


def lag_of(experiment) -> int:
    """experiment.lag, or its default: trial n is asked on the results of trials 0 .. n-lag-1.

    max_concurrent - 1 by default: when a slot frees, one of the last max_concurrent trials has
    ended, so trial n-max_concurrent's result is the latest one a reproducible searcher can wait
    for without holding slots long (bench/quality.py: 0.049 against 0.068 mean regret at 50
    trials, seeds 0-4, for the lag max_concurrent of before, docs/search-quality.md). A lag that does not
    follow max_concurrent gives the same trials at any max_concurrent (docs/reproducibility.md).
    """
    return max(0, experiment.max_concurrent - 1) if experiment.lag is None else experiment.lag


def make_searcher(space: Space, folder: RunFolder | None = None) -> Searcher:
    """The search's searcher, seeded, at most `max_concurrent` trials at once; it starts with the
    enqueued configs and, for a run in `folder` with a warm start, the earlier run's trials (search/searching/warm_start.py)."""
    space = resolved(space)  # sampler: auto, where the driver has not chosen already (search/searching/choice.py)
    experiment = space.experiment
    # a partial of a module-level function: Tune pickles the searcher into its state
    ask = functools.partial(suggest, searched=space.searched, experiment_seed=experiment.seed)
    objectives = objectives_of(experiment)
    warm = warm_start.told(warm_start.settle(space, folder) if folder else None, space.searched)
    enqueued = enqueued_params(experiment.enqueue, space.searched, space.kind.typed_key)
    if warm:  # told first, they take Optuna's numbers 0..len-1: the trials still number from 0
        ask = functools.partial(warm_start.renumbered, ask=ask, first=len(warm))
    # a space with `when:` keys keeps the pinned TPE settings: group=True (each branch modelled
    # jointly) did no better on a conditional problem (bench/conditional_tpe.py, docs/conditional.md)
    searcher: Searcher  # OrderedSearch, or Tune's OptunaSearch
    if experiment.reproducible:
        # under halving, TPE is told a stopped trial as PRUNED with its curve (search/searching/ordered.py MULTIFIDELITY):
        # as good as or better than telling its value as a full trial's, and BOHB's model at a rung did
        # no better (bench/multifidelity.py, docs/schedulers.md). CMA-ES and GP would not see a PRUNED
        # trial at all, so they keep "final"
        halving, tpe = experiment.scheduler in HALVING, experiment.sampler == "tpe"
        # bohb: the model fit at the highest rung that holds RUNG_POINTS results (ordered.py "rung"), any sampler
        multifidelity = "rung" if experiment.scheduler == "bohb" else "pruned" if halving and tpe else "final"
        searcher = OrderedSearch(ask, metric=objectives.metrics[0], mode=objectives.modes[0],
                                 experiment_seed=experiment.seed, sampler=experiment.sampler,
                                 lag=experiment.max_concurrent, unseen=lag_of(experiment), enqueued=enqueued,
                                 warm=warm, objectives=objectives, multifidelity=multifidelity,
                                 epochs=space.trial_defaults().epochs,
                                 # a trial is finished at its report of its last planned epoch (the canonical
                                 # loop's last; a function's `epochs` report), so the trial waiting for it takes
                                 # an actor Tune would otherwise stop (ordered.py). A function that reports past
                                 # its `epochs` is told its best value up to them: still a function of the seed
                                 ends_at_epochs=True,
                                 # under halving, trial n sees a trial that runs on past its rungs up to a rung
                                 # it has surely reached: a slot does not wait for a long trial (ordered.py). A
                                 # function may leave epochs unsaid (None): 0, as space.schedule_problems counts it
                                 rungs=rung_epochs(experiment.scheduler, experiment.grace_period,
                                                   max_epochs(space.searched, space.trial_defaults().epochs or 0),
                                                   experiment.reduction_factor) if halving else ())
    else:  # Tune's OptunaSearch loads the study made here, with the warm start told and the configs enqueued;
        # several objectives: it tells each trial's last result (the point, search/definition/objectives.py)
        storage = InMemoryStorage()
        study = optuna.create_study(storage=storage, study_name="optuna", directions=objectives.directions)
        study.add_trials(warm)
        for params in enqueued:
            study.enqueue_trial(params)
        metric, mode = (list(objectives.metrics), list(objectives.modes)) if objectives.several else \
            (objectives.metrics[0], objectives.modes[0])
        searcher = OptunaSearch(space=ask, metric=metric, mode=mode,
                                sampler=make_sampler(experiment.sampler, experiment.seed, 0),
                                storage=storage, study_name="optuna")
    # Tune lets a searcher that is not a ConcurrencyLimiter have one pending trial at a time,
    # which starts trials one after another (tune_controller._get_max_pending_trials)
    return ConcurrencyLimiter(searcher, max_concurrent=experiment.max_concurrent)
