"""A parallel search that reproduces: trial n's config depends only on the seed and n.

Tune's OptunaSearch tells Optuna each result as it arrives, so with several trials at once
TPE sees results in whatever order trials happen to finish, and two runs of one seed differ.
OrderedSearch asks for trial n on a study that holds, for trial n alone:

- the results of trials 0 .. n-L-1 (L = max_concurrent), told in trial-number order;
- trials n-L .. n-1 as running, whatever they have done since (TPE's constant liar
  counts them as pending);
- a sampler seeded from (seed, n).

Before any of them, the study holds the warm-start trials (search/searching/warm_start.py), if any: an
earlier run's finished trials, the same for every n. Trial n < k of k enqueued configs
(`experiment.enqueue`) is asked with its config enqueued (Study.enqueue_trial), its other keys drawn.

So trial n waits only while one of trials 0 .. n-L-1 is unfinished; those waits are counted
(`waits`: trial number -> seconds) and reported.

Under successive halving (`rungs`: the epochs trials are judged at) most trials end at a low rung and a
few run on for many epochs; waiting for such a long trial held every other slot idle behind it, one
trial at a time (issue 49). So there trial n sees trial k of 0 .. n-L-1 up to a horizon, the highest
rung at or below grace_period * g / U epochs, g = n-U-k, U the trials unseen to n (`unseen`:
experiment.lag, max_concurrent - 1 by default): while the U other slots started g trials after it, each a
grace_period at least, trial k has had about that long. U, not max_concurrent: a search with a set lag
gives the same trials at any max_concurrent, as it always did. A trial that
ended by its horizon is told as above; one that runs past it is told PRUNED with its curve up to the
horizon, as a trial stopped there would be (RUNNING where the sampler reads no curve); trial n waits only
for a trial that has not yet reached its horizon (or, past its planned epochs, ended). Each of these
depends on n, k and the trial's own reports only, so on the seed. Such a study is built for the one
suggestion; the kept one serves whenever every trial trial n sees is told whole. A trial's value is its best epoch's metric
(the epoch best.yaml picks); a trial whose metric never was finite is FAIL to Optuna. A trial
that ended short of its epochs (stopped at a rung, diverged) is told as `multifidelity` says
(MULTIFIDELITY below): under halving, TPE gets it PRUNED with its curve (docs/schedulers.md).

With `ends_at_epochs` (every search builds it so: search/searching/searcher.py) a trial is
finished at its report of its last planned epoch, a step before Tune ends it. For the canonical
loop, which reports nothing after it, the value is the same either way; a function trainable
that reports past its `epochs` is told its best value up to them. What changes is when a waiting trial can be asked.
Tune decides whether to keep
an ended trial's actor for reuse when the trial ends, before it asks the searcher again, and keeps
one idle actor at most: a trial that ends while its successor waits for an earlier trial's result
parks its actor, and when that earlier trial then ended, its actor was stopped, although the
searcher could now suggest two trials. The next trial then waited for a new actor (seconds of
imports), and Tune gave it the first reused actor that came free instead, so the search went on
one trial at a time (bench/default_search.py: the default search took 78 s, now 55-61 s; a
function trainable's 20 trials of 1-3 s ran two at a time 46% of their span after a trial that
diverged ended early, bench/short_trials.py).
Asked at the earlier trial's last report, the waiting trial takes the parked actor, and the
earlier trial's actor is kept for the trial after it.

That study is kept in memory from one suggestion to the next, since trial n+1's study is
trial n's plus trial n, with trial n-L told: rebuilding it per suggestion cost O(n) storage
work each time, O(n^2) over a search of thousands of trials. What the searcher saves is the
plain record (what it asked and was told); the study is a cache of it, built again from the
record after a restore, and then equal to the one it would have kept.

The record is a JSON file of ours, `searcher.json` (RECORD_FILE), written into the folder Tune
saves its experiment state to, at each of Tune's snapshots: Tune uploads it to the run folder
with that state, so the two always describe the same moment, and a resume reads it back
(`restore_from_dir`). The study lives in an Optuna InMemoryStorage made here, used through
the storage's public methods only.
"""

from __future__ import annotations

import copy
import math
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import optuna
from optuna.storages import InMemoryStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial
from ray.tune.search import Searcher

from search.searching.gp_kernels import kernels_of, with_kernels
from search.definition.objectives import Objectives, first
from search.definition.ranking import best_value, score
from search.store.searcher_record import (RECORD, RECORD_FILE, by_number,  # noqa: F401  (its record's format)
                                          record_from_json, record_to_json)
from trainable.seed import derive_seed

# Pinned: Optuna 5 changed TPE's defaults, which silently changes every seeded search.
TPE_SETTINGS = {"multivariate": True, "constant_liar": True, "n_startup_trials": 10, "n_ei_candidates": 24}
GP_START = 10  # the GP's start-up trials, as Optuna's GPSampler's n_startup_trials
SAMPLER_STREAM = 1  # derive_seed stream of sampler seeds (stream 0 seeds the trials)
# How a trial that ended short of its epochs (stopped at a rung, diverged) is told to the study;
# bench/multifidelity.py measures them (docs/schedulers.md):
# - "final": COMPLETE with its best epoch's value, as a full trial (what hpsearch did before);
# - "pruned": PRUNED with its curve as intermediate values; TPE puts a pruned trial after every
#   complete one, pruned ones ranked by their last epoch, then their value there;
# - "rung": as BOHB: the model is fit at the highest epoch that RUNG_POINTS told trials reached,
#   each trial that reached it told with its best value up to it, the others PRUNED as above.
MULTIFIDELITY = ("final", "pruned", "rung")
RUNG_POINTS = TPE_SETTINGS["n_startup_trials"]  # trials at a fidelity before "rung" fits the model there
# how trial n sees an earlier trial under halving (OrderedSearch._sight)
WHOLE, UPTO, HIDDEN, WAIT = "whole", "upto", "hidden", "wait"
CACHES = ("_kept", "_told", "_settled", "_fidelity", "_space", "_longest")  # derived from the record, see _drop_caches


class _Made(FrozenTrial):
    """A trial that a build makes for its study alone. Optuna's storage deep-copies a trial it is given, in case the
    caller changes it later; a build keeps nothing of it (its dicts are copies of the record's, and Optuna's storage
    replaces a dict it changes), so a shallow copy is the same trial, and the deep copies were a large part of a
    suggestion under reproducible halving (docs/performance.md). The study holds a plain FrozenTrial."""

    __slots__ = ()

    @classmethod
    def of(cls, trial: FrozenTrial) -> FrozenTrial:
        trial.__class__ = cls
        return trial

    def __deepcopy__(self, memo: dict) -> FrozenTrial:
        copied: FrozenTrial = copy.copy(self)
        copied.__class__ = FrozenTrial
        return copied


class KeptStudy(NamedTuple):
    """The study kept between suggestions, with the storage we made for it and its key there."""

    study: optuna.Study
    storage: InMemoryStorage
    key: int  #: what the storage's create_new_study returned


def make_sampler(name: str, experiment_seed: int, number: int,
                 tpe_settings: Mapping[str, Any] = TPE_SETTINGS, *, told: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler that asks for trial `number`; its randomness is a function of (seed, number).

    `told`: how many trials a warm start told the study, where a sampler is made per trial (OrderedSearch);
    None: one sampler asks for every trial of a study (Tune's OptunaSearch)."""
    seed = derive_seed(experiment_seed, number, stream=SAMPLER_STREAM)
    if name == "nsga2":  # for several objectives (search/definition/objectives.py); reads the trials' constraints too
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, **tpe_settings)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "qmc":  # one scrambled sequence for the whole search; trial n takes its n-th point
        return optuna.samplers.QMCSampler(seed=experiment_seed, scramble=True, warn_asynchronous_seeding=False)
    if name == "cmaes":  # its state travels in the trials' system attrs, kept per trial number below
        return optuna.samplers.CmaEsSampler(seed=seed, n_startup_trials=1, warn_independent_sampling=False)
    if name == "gp" and told is not None:
        # GP_START trials from one scrambled Sobol sequence (less the warm start's), then the GP on whatever trial
        # n sees: a Sobol start covers the box where random points clump (measured: docs/search-quality.md)
        if number + told < GP_START:  # a `when:` key is drawn at random, as the GP draws it, without a warning
            return optuna.samplers.QMCSampler(seed=experiment_seed, scramble=True, warn_asynchronous_seeding=False,
                                              warn_independent_sampling=False)
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=1)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=GP_START)
    raise ValueError(f"unknown sampler {name!r}")  # validated in the space file


class OrderedSearch(Searcher):
    """Tune searcher: reproducible suggestions at up to `lag` trials at once.

    `tpe_settings` replaces TPE_SETTINGS (the sampler "tpe" only): the knobs that bound
    TPE's cost per suggestion at thousands of trials (bench/tpe_scale.py). `unseen` (default
    `lag`): trial n is asked on the results of trials 0 .. n-unseen-1, the rest running to it.
    Fewer unseen trials give trial n more results and fewer liars, and make a slot wait more
    often: whenever trial n-unseen-1 is still running when a later trial ends. At lag 1,
    unseen 0 never waits (docs/search-quality.md measures both).
    """

    # the caches (CACHES), declared here since methods above _drop_caches, which sets them, read them
    _kept: KeptStudy | None
    _told: int
    _settled: int
    _fidelity: int | None
    _space: optuna.search_space.IntersectionSearchSpace | None
    _longest: int | None

    def __init__(self, ask: Callable[[optuna.Trial], dict[str, Any]], *, metric: str, mode: str,
                 experiment_seed: int, sampler: str, lag: int, tpe_settings: Mapping[str, Any] | None = None,
                 enqueued: Sequence[Mapping[str, Any]] = (), warm: Sequence[FrozenTrial] = (),
                 objectives: Objectives | None = None, unseen: int | None = None,
                 multifidelity: str = "final", epochs: int | None = None, ends_at_epochs: bool = False,
                 rungs: Sequence[int] = ()):
        super().__init__(metric=first(metric), mode=first(mode))
        # several objectives or constraints (search/definition/objectives.py): a trial's point, not its best epoch
        self.objectives = objectives or Objectives((metric,), (mode,))
        self.ask, self.experiment_seed, self.sampler, self.lag = ask, experiment_seed, sampler, lag
        # settings, like the rest of the constructor's: pickled with the searcher, not in the record
        self.enqueued = [dict(params) for params in enqueued]  # trial n < len: Optuna's params it starts from
        self.warm = list(warm)  # told before trial 0; Optuna's number of trial n is n + len(warm)
        self.unseen = lag if unseen is None else unseen  # trials n-unseen .. n-1 are running to trial n
        self.tpe_settings = dict(TPE_SETTINGS if tpe_settings is None else tpe_settings)
        if multifidelity not in MULTIFIDELITY:
            raise ValueError(f"multifidelity: one of {MULTIFIDELITY}, got {multifidelity!r}")
        # how a trial that ended short of its epochs is told (MULTIFIDELITY); `epochs`: a trial's
        # epochs when its config does not search them
        self.multifidelity, self.epochs = multifidelity, epochs
        # a trial's report of its last planned epoch is its last (the canonical loop): it is finished there
        self.ends_at_epochs = ends_at_epochs
        # the rung epochs of a halving search: trials are seen up to a horizon (module docstring); (): whole
        self.rungs = tuple(sorted(rungs))
        self.numbers: dict[str, int] = {}  # Tune trial id -> trial number
        # by number: params, distributions, system attrs (where a sampler such as CMA-ES keeps its state)
        self.asked: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []
        self.curves: dict[int, dict[int, float]] = {}  # number -> epoch -> metric
        # number -> value, with several objectives their list (None: no finite metric, or an error)
        self.finished: dict[int, float | list[float] | None] = {}
        self.study_attrs: dict[str, Any] = {}  # the study's system attrs after the last ask (QMC's point counter)
        self.waits: dict[int, float] = {}  # number -> seconds its slot waited for earlier results
        # number -> (unix time the suggestion was made, seconds it took): results.parquet's
        # suggest_seconds, and where queue_seconds starts
        self.suggested: dict[int, tuple[float, float]] = {}
        # number -> epoch -> the objectives.measured metrics (several objectives or constraints only)
        self.measures: dict[int, dict[int, list[float | None]]] = {}
        self.planned: dict[int, int] = {}  # number -> the epochs it was to run (multifidelity only)
        # number -> the GP's kernel parameters its suggestion fit (gp only): the next fit starts there (gp_kernels.py)
        self.kernels: dict[int, dict[str, list]] = {}
        self._waiting_since: float | None = None
        self._drop_caches()

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        n = len(self.asked)
        running = n - len(self.finished)
        if running >= self.lag:
            return None  # every slot is busy
        if self._must_wait(n):
            self._waiting_since = self._waiting_since or time.monotonic()
            return None  # an earlier result that trial n must see is still out
        if self._waiting_since is not None:
            self.waits[n] = time.monotonic() - self._waiting_since
            self._waiting_since = None
        asking = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # qmc, gp: "experimental"
            kept = self._study_for(n)
            study = kept.study
            study.sampler = with_kernels(self._with_kept_space(
                make_sampler(self.sampler, self.experiment_seed, n, self.tpe_settings, told=len(self.warm))),
                self._kernels_before(n))
            try:
                if n < len(self.enqueued):
                    study.enqueue_trial(self.enqueued[n])  # the one waiting trial: ask() takes it
                trial = study.ask()
                constants = self.ask(trial)
            except BaseException:
                self._drop_caches()  # the study holds a half-asked trial n, which would shift every later number
                raise
        # a copy of the asked trial alone (study.trials[-1] would deep-copy every trial), so the
        # record shares no object with the study; the running trials are the last `lag` or fewer
        asked = copy.deepcopy(next(t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                                   if t.number == trial.number))
        self.study_attrs = copy.deepcopy(kept.storage.get_study_system_attrs(kept.key))
        if (fitted := kernels_of(study.sampler)) is not None:
            self.kernels[n] = fitted
        self.asked.append((dict(asked.params), dict(asked.distributions), dict(asked.system_attrs)))
        self.numbers[trial_id] = n
        if (self.multifidelity != "final" or self.ends_at_epochs or self.rungs) and \
                (epochs := constants.get("epochs") or self.epochs):
            self.planned[n] = int(epochs)
            self._longest = None if self._longest is None else max(self._longest, self.planned[n])
        self.suggested[n] = (time.time(), time.perf_counter() - asking)
        return {**trial.params, **constants}

    def _kernels_before(self, n: int) -> dict[str, list] | None:
        """The GP kernel parameters of the latest fit for a trial below n (gp_kernels.py), or None."""
        latest = max((k for k in self.kernels if k < n), default=None)
        return None if latest is None else self.kernels[latest]

    def _must_wait(self, n: int) -> bool:
        """Whether a result trial n must see is still out: one of trials 0 .. n-L-1 unfinished, or under
        halving, one that has not yet reached its horizon (or ended by it)."""
        end = n - self.unseen
        if not self._result_out_before(end):
            return False
        if not self.rungs:
            return True
        return any(self._sight(n, k)[0] == WAIT for k in range(self._settled, end) if k not in self.finished)

    def _horizon(self, n: int, k: int) -> int | None:
        """The epoch up to which trial n sees trial k under halving: the highest rung at or below
        grace_period * g / U, g = n-U-k, U = unseen (0: none yet); None: all of it (past its planned epochs)."""
        planned = self.planned.get(k)
        bound = self.rungs[0] * (n - self.unseen - k) / max(1, self.unseen)
        if planned is None or bound >= planned:
            return None
        return max((r for r in self.rungs if r <= bound and r < planned), default=0)

    def _sight(self, n: int, k: int) -> tuple[str, int | None]:
        """How trial n sees trial k < n-L: (WHOLE, None) told as it ended, (UPTO, h) PRUNED at horizon h,
        (HIDDEN, None) running, or (WAIT, None) not yet known; a function of n, k and k's reports only."""
        horizon = self._horizon(n, k) if self.rungs else None
        reached = max(self.curves.get(k, {}), default=0)
        if k in self.finished and (horizon is None or reached <= horizon):
            return WHOLE, None
        if horizon is None or (horizon > 0 and reached < horizon and k not in self.finished):
            return WAIT, None
        # a curve is all a PRUNED trial tells, and only TPE reads it (one objective, no constraints)
        if horizon == 0 or self.multifidelity == "final" or self.objectives.several or self.objectives.constraints \
                or not any(e <= horizon for e in self.curves.get(k, {})):
            return HIDDEN, None
        return UPTO, horizon

    def _result_out_before(self, end: int) -> bool:
        """Whether one of trials 0 .. end-1 is unfinished; amortised O(1) per suggestion, not a scan of all n."""
        while self._settled < end and self._settled in self.finished:  # results are never taken back
            self._settled += 1
        return self._settled < end

    def _study_for(self, n: int) -> KeptStudy:
        """The kept study, brought to what trial n must see: trials 0 .. n-L-1 told, the rest running.

        Results are told with Study.tell by trial number. Tell also calls the sampler's
        after_trial, which a study built from the record never saw; for the five samplers here
        (no constraints) it does nothing, so both studies are the same. Trials are told in
        trial-number order, as the build adds them, so the best trial (ties to the earlier) and
        the trial list read the same either way. A PRUNED trial (MULTIFIDELITY) has its curve as
        intermediate values either way: Trial.report before the tell, create_trial's in a build.
        """
        sights = self._sights(n)
        fidelity = self._fidelity_for(n, sights)
        if any(how != WHOLE for how, _ in sights.values()):  # seen up to horizons: built for this one suggestion
            # trial n is asked in that study, not in the kept one, which then lacks it: a later suggestion
            # that kept it would tell trials it does not hold (KeyError) or ask under the wrong number
            self._kept = None
            return self._built(n, sights, fidelity)
        if self._kept is not None and fidelity != self._fidelity:
            self._drop_caches()  # "rung" moved up: every told trial's value changes, build it again
        if self._kept is None:
            self._fidelity = fidelity
            self._kept, self._told = self._built(n, sights, fidelity), max(0, n - self.unseen)
        for k in range(self._told, n - self.unseen):
            self._tell(self._kept, k)
            self._told = k + 1
        return self._kept

    def _sights(self, n: int) -> dict[int, tuple[str, int | None]]:
        """How trial n sees each trial it does not wait for that is not yet told whole for good (_sight)."""
        if not self.rungs:
            return {}
        if self._longest is None:
            self._longest = max(self.planned.values(), default=0)
        # past this many trials back, the horizon is past every trial's planned epochs: told whole
        reach = math.ceil(self._longest * max(1, self.unseen) / self.rungs[0]) + 1
        sights = {k: self._sight(n, k) for k in range(max(0, n - self.unseen - reach), max(0, n - self.unseen))}
        return {k: sight for k, sight in sights.items() if sight[0] != WHOLE}

    def _built(self, n: int, sights: Mapping[int, tuple[str, int | None]] = {}, fidelity: int | None = None) -> KeptStudy:
        """A study made from the record for trial n, as every suggestion made it before the study was kept;
        `sights`: how n sees the trials not told whole (halving), `fidelity`: "rung"'s epoch (found here if None)."""
        if fidelity is None:
            fidelity = self._fidelity_for(n, sights)
        # one "study created" line per build is noise; set only when it is not already, since setting it costs
        # 1.5-2 ms (the logging module clears the level cache of every logger there is, Ray's and Tune's too)
        if optuna.logging.get_verbosity() != optuna.logging.WARNING:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = InMemoryStorage()
        key = storage.create_new_study([StudyDirection.MAXIMIZE if m == "max" else StudyDirection.MINIMIZE
                                        for m in self.objectives.modes], study_name="ordered")
        for name, value in self.study_attrs.items():  # Study has no public setter for these; the storage has
            storage.set_study_system_attr(key, name, value)
        study = optuna.load_study(study_name="ordered", storage=storage,
                                  sampler=optuna.samplers.RandomSampler())  # replaced before each ask
        study.add_trials(self.warm)
        for k in range(n):
            # copies: the study holds these dicts as they are (_Made), and the record's must not change with it
            params, distributions, system_attrs = (dict(d) for d in self.asked[k])
            how, horizon = sights.get(k, (WHOLE, None))
            if k < n - self.unseen and how != HIDDEN:
                state, value, curve = self._outcome(k, fidelity, upto=horizon)  # a curve of its own
                point = self._point(k)  # made anew
                study.add_trial(_Made.of(create_trial(
                    state=state, values=None if value is None else value if isinstance(value, list) else [value],
                    intermediate_values=curve, params=params, distributions=distributions, user_attrs=point or {},
                    system_attrs=system_attrs,
                    constraints=self._constraints(point, value))))
            else:
                study.add_trial(_Made.of(create_trial(state=TrialState.RUNNING, params=params,
                                                      distributions=distributions, system_attrs=system_attrs)))
        return KeptStudy(study, storage, key)

    def _tell(self, kept: KeptStudy, k: int) -> None:
        """Trial k, running in the study, gets its result: as create_trial made it in a build."""
        state, value, curve = self._outcome(k, self._fidelity)
        number, point = k + len(self.warm), self._point(k)
        trial = optuna.Trial(kept.study, kept.storage.get_trial_id_from_study_id_trial_number(kept.key, number))
        # as create_trial made them in a build: the point's metrics, and the constraints (TPE, NSGA-II and
        # GP read a finished trial's constraints; Optuna 5 replaced constraints_func by set_constraint)
        for name, measured in (point or {}).items():
            trial.set_user_attr(name, measured)
        for name, violation in (self._constraints(point, value) or {}).items():
            trial.set_constraint(name, violation)
        for epoch, measured in curve.items():
            trial.report(measured, epoch)
        if state == TrialState.COMPLETE:
            kept.study.tell(number, value)
        else:  # a PRUNED trial's value is its last intermediate value, as create_trial was given it
            kept.study.tell(number, state=state)

    def _outcome(self, k: int, fidelity: int | None, upto: int | None = None) -> tuple[TrialState, Any, dict[int, float]]:
        """How finished trial k is told: its state, its value(s), its curve as intermediate values (PRUNED only).
        `fidelity`: "rung"'s epoch; `upto`: trial k as seen up to that epoch (UPTO): PRUNED there, as a trial
        stopped there is, or at "rung"'s fidelity when it reached it."""
        if upto is not None:
            curve = {e: v for e, v in self.curves.get(k, {}).items() if e <= upto}
            if fidelity is not None and max(curve) >= fidelity:
                return TrialState.COMPLETE, best_value((v for e, v in curve.items() if e <= fidelity), self.mode), {}
            return TrialState.PRUNED, curve[max(curve)], dict(sorted(curve.items()))
        value, curve = self.finished[k], self.curves.get(k, {})
        if value is None:
            return TrialState.FAIL, None, {}
        last = max(curve, default=None)
        if self.multifidelity == "final" or last is None or self.objectives.several:
            return TrialState.COMPLETE, value, {}
        if fidelity is not None and last >= fidelity:  # "rung": its value at the model's fidelity
            return TrialState.COMPLETE, best_value((v for e, v in curve.items() if e <= fidelity), self.mode), {}
        if last < self.planned.get(k, last):
            return TrialState.PRUNED, curve[last], dict(sorted(curve.items()))
        return TrialState.COMPLETE, value, {}

    def _fidelity_for(self, n: int, sights: Mapping[int, tuple[str, int | None]] = {}) -> int | None:
        """"rung": the epoch trial n's model is fit at, the highest that RUNG_POINTS of the trials told
        to it reached (None before there are that many, or for another multifidelity); a trial seen up to a
        horizon (`sights`) reached the horizon."""
        if self.multifidelity != "rung":
            return None
        lasts = []
        for k in range(max(0, n - self.unseen)):
            how, horizon = sights.get(k, (WHOLE, None))
            if how == UPTO:
                lasts.append(horizon)
            elif how == WHOLE and self.finished.get(k) is not None and self.curves.get(k):
                lasts.append(max(self.curves[k]))
        lasts.sort(reverse=True)
        return lasts[RUNG_POINTS - 1] if len(lasts) >= RUNG_POINTS else None

    def _point(self, k: int) -> dict[str, float | None] | None:
        """Trial k's point: its objectives.measured metrics at its point epoch; None without constraints
        and several objectives (its value is all there is), or without a point."""
        curve = {e: dict(zip(self.objectives.measured, v)) for e, v in self.measures.get(k, {}).items()}
        epoch = self.objectives.point_epoch(curve)
        return None if epoch is None else curve[epoch]

    def _constraints(self, point: Mapping[str, Any] | None, value: Any) -> dict[str, float] | None:
        """A finished trial's constraints as Optuna holds them: 'params <= 200000' -> its violation."""
        if not self.objectives.constraints or value is None or point is None:
            return None
        return self.objectives.constraint_values(point)

    def _with_kept_space(self, sampler: optuna.samplers.BaseSampler) -> optuna.samplers.BaseSampler:
        """`sampler` with the kept study's intersection search space, when it is TPE's.

        A fresh seeded sampler per trial number also brought a fresh IntersectionSearchSpace, which
        read every trial of the study again: about a fifth of a suggestion's time at 7,000 trials
        (bench/many_trials.py, under py-spy). Kept with the study, it reads only the trials from the
        first unfinished one on; the space it gives is the same, since the study's trials are only
        added, and told in number order. `_search_space` is TPESampler's own attribute (Optuna 4 and
        5): where a release renames it, each sampler computes its own, as before, only slower.
        """
        space = getattr(sampler, "_search_space", None)
        if not isinstance(space, optuna.search_space.IntersectionSearchSpace):
            return sampler
        if self._space is None:
            self._space = space
        else:
            sampler._search_space = self._space  # type: ignore[attr-defined]  # the sampler's own, found by getattr above
        return sampler

    def _drop_caches(self) -> None:
        """Forget what is derived from the record; it is derived again when next needed."""
        self._kept = None
        self._told = 0  # trials 0 .. _told-1 have their results in the study
        self._settled = 0  # trials 0 .. _settled-1 are finished
        self._fidelity = None  # "rung": the epoch the kept study's values are at
        self._space = None  # the kept study's, for TPE
        self._longest = None  # the most epochs a trial was planned to run (halving's horizons)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        value = score(result.get(self.metric))
        if trial_id in self.numbers and value is not None and result.get("epoch") is not None:
            self.curves.setdefault(self.numbers[trial_id], {})[int(result["epoch"])] = value
            self._drop_caches_if_told(self.numbers[trial_id])
        if trial_id in self.numbers and result.get("epoch") is not None and self._measuring:
            self.measures.setdefault(self.numbers[trial_id], {})[int(result["epoch"])] = \
                [score(result.get(m)) for m in self.objectives.measured]
        n = self.numbers.get(trial_id)
        if self.ends_at_epochs and n is not None and n not in self.finished and n in self.planned \
                and result.get("epoch") is not None and int(result["epoch"]) >= self.planned[n]:
            self._finish(n)  # its last report: the module's docstring says why now

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self.numbers:
            return
        n = self.numbers[trial_id]
        if self.ends_at_epochs and n in self.finished:
            return  # finished at its last epoch's report: its value stands, whatever ends its actor after it
        if result and not error:
            # a scheduler's STOP: Tune gives the stopping epoch's result here only, not to on_trial_result
            # (a trial paused at the rung first had it there), so both ways the curve holds it
            self.on_trial_result(trial_id, result)
        self._finish(n, error)

    def _finish(self, n: int, error: bool = False) -> None:
        """Trial n's value, as Optuna is told it: its best epoch's metric, None for an error."""
        self.finished[n] = None if error else best_value(self.curves.get(n, {}).values(), self.mode)
        if self.objectives.several and not error:  # the point's values: its last epoch's (objectives.py)
            point = self._point(n)
            self.finished[n] = None if point is None else self.objectives.values(point)
        self._drop_caches_if_told(n)

    @property
    def _measuring(self) -> bool:
        return self.objectives.several or bool(self.objectives.constraints)

    def _drop_caches_if_told(self, n: int) -> None:
        # Tune does not report on a trial after it completes; if it ever did, the next
        # suggestion builds the study again from the record, which holds the news.
        if n < self._told:
            self._drop_caches()

    def save(self, checkpoint_path: str) -> None:
        """Write the record to `checkpoint_path` as JSON (record_to_json)."""
        with open(checkpoint_path, "w", encoding="utf-8") as f:
            f.write(record_to_json({key: getattr(self, key) for key in RECORD}))

    def restore(self, checkpoint_path: str) -> None:
        """Take the record saved at `checkpoint_path`; what is derived from it is built again when needed."""
        with open(checkpoint_path, encoding="utf-8") as f:
            record = record_from_json(f.read())
        for key in RECORD:
            setattr(self, key, record[key])
        self._waiting_since = None
        self._drop_caches()

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        """Tune's call at each snapshot: the record as `<checkpoint_dir>/searcher.json`, replaced whole.

        `checkpoint_dir` is the folder Tune writes its experiment state to and then uploads to
        the run folder; one file name for every session, so the run folder holds one record.
        """
        temporary = os.path.join(checkpoint_dir, f".{RECORD_FILE}.{uuid.uuid4().hex}.tmp")
        try:
            self.save(temporary)
            os.replace(temporary, os.path.join(checkpoint_dir, RECORD_FILE))
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        """Tune's call on resume: the record from `<checkpoint_dir>/searcher.json`."""
        path = os.path.join(checkpoint_dir, RECORD_FILE)
        if not os.path.exists(path):
            raise RuntimeError(f"{path} is missing: no record of this search's searcher to resume from")
        self.restore(path)

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its searcher (tuner.pkl); the study is rebuilt from the record on demand
        return {key: value for key, value in self.__dict__.items() if key not in CACHES}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("tpe_settings", dict(TPE_SETTINGS))  # a searcher pickled before it had them
        self.__dict__.setdefault("enqueued", [])
        self.__dict__.setdefault("warm", [])
        self.__dict__.setdefault("objectives", Objectives((self.metric,), (self.mode,)))
        self.__dict__.setdefault("measures", {})
        self.__dict__.setdefault("unseen", self.lag)
        self.__dict__.setdefault("multifidelity", "final")
        self.__dict__.setdefault("epochs", None)
        self.__dict__.setdefault("planned", {})
        self.__dict__.setdefault("ends_at_epochs", False)
        self.__dict__.setdefault("kernels", {})
        self.__dict__.setdefault("rungs", ())  # a searcher pickled before horizons: it waits as it did
        self._drop_caches()
