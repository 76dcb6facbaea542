"""A parallel search that reproduces: trial n's config depends only on the seed and n.

Tune's OptunaSearch tells Optuna each result as it arrives, so with several trials at once
TPE sees results in whatever order trials happen to finish, and two runs of one seed differ.
OrderedSearch asks for trial n on a study rebuilt for it alone:

- the results of trials 0 .. n-L-1 (L = max_concurrent), told in trial-number order;
- trials n-L .. n-1 as running, whatever they have done since (TPE's constant liar
  counts them as pending);
- a sampler seeded from (seed, n).

So trial n waits only while one of trials 0 .. n-L-1 is unfinished; those waits are counted
(`waits`: trial number -> seconds) and reported. A trial's value is its best epoch's metric
(the epoch best.yaml picks); a trial whose metric never was finite is FAIL to Optuna.
"""

from __future__ import annotations

import pickle
import time
import warnings
from typing import Any, Callable

import optuna
from optuna.trial import TrialState, create_trial
from ray.tune.search import Searcher

from search.results import best_of, score
from search.space import SAMPLERS  # the names the space file accepts
from trainable.seed import derive_seed
# Pinned: Optuna 5 changed TPE's defaults, which silently changes every seeded search.
TPE_SETTINGS = {"multivariate": True, "constant_liar": True, "n_startup_trials": 10, "n_ei_candidates": 24}
SAMPLER_STREAM = 1  # derive_seed stream of sampler seeds (stream 0 seeds the trials)


def make_sampler(name: str, experiment_seed: int, number: int) -> optuna.samplers.BaseSampler:
    """The sampler that asks for trial `number`; its randomness is a function of (seed, number)."""
    seed = derive_seed(experiment_seed, number, stream=SAMPLER_STREAM)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **TPE_SETTINGS)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":  # one scrambled sequence for the whole search; trial n takes its n-th point
        return optuna.samplers.QMCSampler(seed=experiment_seed, scramble=True, warn_asynchronous_seeding=False)
    if name == "cmaes":  # its state travels in the trials' system attrs, kept per trial number below
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=1, warn_independent_sampling=False)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=TPE_SETTINGS["n_startup_trials"])
    raise ValueError(f"unknown sampler {name!r}")  # validated in the space file


class OrderedSearch(Searcher):
    """Tune searcher: reproducible suggestions at up to `lag` trials at once."""

    def __init__(self, ask: Callable[[optuna.Trial], dict[str, Any]], *, metric: str, mode: str,
                 experiment_seed: int, sampler: str, lag: int):
        super().__init__(metric=metric, mode=mode)
        self.ask, self.experiment_seed, self.sampler, self.lag = ask, experiment_seed, sampler, lag
        self.numbers: dict[str, int] = {}  # Tune trial id -> trial number
        # by number: params, distributions, system attrs (where a sampler such as CMA-ES keeps its state)
        self.asked: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []
        self.curves: dict[int, dict[int, float]] = {}  # number -> epoch -> metric
        self.finished: dict[int, float | None] = {}  # number -> value (None: no finite metric, or an error)
        self.study_attrs: dict[str, Any] = {}  # the study's system attrs after the last ask (QMC's point counter)
        self.waits: dict[int, float] = {}  # number -> seconds its slot waited for earlier results
        self._waiting_since: float | None = None

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        n = len(self.asked)
        running = n - len(self.finished)
        if running >= self.lag:
            return None  # every slot is busy
        if any(k not in self.finished for k in range(n - self.lag)):
            self._waiting_since = self._waiting_since or time.monotonic()
            return None  # an earlier result that trial n must see is still out
        if self._waiting_since is not None:
            self.waits[n] = time.monotonic() - self._waiting_since
            self._waiting_since = None
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # one "study created" line per trial is noise
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # qmc, gp: "experimental"
            study = optuna.create_study(direction="maximize" if self.mode == "max" else "minimize",
                                        sampler=make_sampler(self.sampler, self.experiment_seed, n))
        for key, value in self.study_attrs.items():  # Study has no public setter for these
            study._storage.set_study_system_attr(study._study_id, key, value)
        for k in range(n):
            params, distributions, system_attrs = self.asked[k]
            if k < n - self.lag:
                value = self.finished[k]
                study.add_trial(create_trial(
                    state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
                    value=value, params=params, distributions=distributions, system_attrs=system_attrs,
                    intermediate_values=self.curves.get(k, {}) if value is not None else None))
            else:
                study.add_trial(create_trial(state=TrialState.RUNNING, params=params, distributions=distributions,
                                             system_attrs=system_attrs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            trial = study.ask()
            constants = self.ask(trial)
        asked = study.trials[-1]
        self.study_attrs = dict(study._storage.get_study_system_attrs(study._study_id))
        self.asked.append((dict(asked.params), dict(asked.distributions), dict(asked.system_attrs)))
        self.numbers[trial_id] = n
        return {**trial.params, **constants}

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        value = score(result.get(self.metric))
        if trial_id in self.numbers and value is not None and result.get("epoch") is not None:
            self.curves.setdefault(self.numbers[trial_id], {})[int(result["epoch"])] = value

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.numbers:
            return
        n = self.numbers[trial_id]
        self.finished[n] = None if error else best_of(self.curves.get(n, {}).values(), self.mode)

    def save(self, checkpoint_path: str) -> None:
        state = {k: v for k, v in self.__dict__.items() if k != "_waiting_since"}
        with open(checkpoint_path, "wb") as f:
            pickle.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))
        self._waiting_since = None
