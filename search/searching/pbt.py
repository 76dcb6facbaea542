"""Population based training (`scheduler: pbt`): Ray Tune's PopulationBasedTraining over the
canonical loop's hyperparameters that can change mid-run (lr, momentum, weight_decay, clip_norm).

Every `perturbation_interval` epochs the population is ranked by the metric; each trial in the
bottom `quantile_fraction` continues from the checkpoint of a trial in the top one, with that
trial's config perturbed (each searched value of MUTABLE times 0.8 or 1.2, or drawn again with
probability 0.25; a choice moves to a neighbouring value). How it is wired here:

- The initial population is drawn up front by the reproducible searcher (search/searching/ordered.py,
  with no results yet): trial n's first config and seed depend only on the seed and n. Ray's PBT
  refuses a searcher, so Tune gets them as a param space: a grid over trial_number, each other
  key taken from that trial's draw.
- Synchronous PBT (Ray's `synch=True`): trials wait for each other at every perturbation epoch,
  so a trial always copies a checkpoint of the same epoch it is at, and its rows number epochs
  1..epochs once each. There is no perturbation at a trial's last epoch (it ends there).
- Searched keys that cannot change mid-run (batch_size, t_max, model.*) stay as drawn; a trial
  that copies another takes those of the copied trial with its weights (it must: the model is
  that trial's). Perturbed values are clipped into the searched range.
- Ray's exploit copies the whole config of the copied trial; the trial's own trial_number and
  seed are put back, so a row's trial is the trial that trained it.
- Where a trial's weights come from (the seed that drew them, and per epoch the trial and the
  values that trained them) travels in its checkpoint (trainable/loop.py Run.lineage);
  best.yaml replays it as `seed`, the first epoch's values and `schedule:` (replay_config).

Not reproducible under another finishing order (nor from run to run): Ray draws which top
trial to copy, and the perturbations, from Python's global random. The summary says so.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, cast

from optuna.distributions import CategoricalDistribution, IntDistribution
from ray import tune
from ray.tune.experiment import Trial
from ray.tune.schedulers import PopulationBasedTraining, TrialScheduler

from search.definition.objectives import first
from search.definition.schema import Searched
from search.definition.space import Space
from search.searching.choice import resolved
from search.searching.ordered import OrderedSearch
from search.searching.searcher import suggest
from trainable.config import MUTABLE, SCHEDULE_KEY

IDENTITY = ("trial_number", "seed")  # what a trial keeps when it copies another


def initial_population(space: Space) -> list[dict[str, Any]]:
    """Each trial's searched values, seed and trial_number, drawn as OrderedSearch draws them with no results yet."""
    experiment = resolved(space).experiment  # sampler: auto (search/searching/choice.py)
    ask = functools.partial(suggest, searched=space.searched, experiment_seed=experiment.seed)
    # first: pbt has one objective (objectives.py refuses several), so metric and mode are already one name each
    searcher = OrderedSearch(ask, metric=first(experiment.metric), mode=first(experiment.mode),
                             experiment_seed=experiment.seed, sampler=experiment.sampler, lag=experiment.num_samples)
    # lag num_samples: every slot is free and no trial waits for a result, so none is None
    return cast("list[dict[str, Any]]", [searcher.suggest(f"initial-{n}") for n in range(experiment.num_samples)])


def _drawn(config: dict[str, Any], *, population: list[dict[str, Any]], key: str) -> Any:
    # the config dict, as Tune calls it: the spec form (spec.config.trial_number) warns it is deprecated
    return population[config["trial_number"]][key]


def population_space(space: Space, fixed: Mapping[str, Any]) -> dict[str, Any]:
    """Tune's param space for the population: one trial per trial_number, in order, with its drawn values."""
    population = initial_population(space)
    keys = [k for k in population[0] if k != "trial_number"]
    # module-level function in a partial: Tune pickles the param space with its state
    return {**fixed, "trial_number": tune.grid_search(list(range(len(population)))),
            **{k: tune.sample_from(functools.partial(_drawn, population=population, key=k)) for k in keys}}


def mutations(searched: tuple[Searched, ...]) -> dict[str, Any]:
    """Ray's hyperparam_mutations for the searched keys PBT may change: a range as a Tune domain, a choice as its list."""
    out = {}
    for d in searched:
        if d.name not in MUTABLE:
            continue
        dist = d.distribution
        if isinstance(dist, CategoricalDistribution):
            out[d.name] = list(d.values)
        elif isinstance(dist, IntDistribution):
            out[d.name] = tune.lograndint(dist.low, dist.high + 1) if dist.log else \
                tune.qrandint(dist.low, dist.high, dist.step)
        elif dist.step is not None:
            out[d.name] = tune.quniform(dist.low, dist.high, dist.step)
        else:
            out[d.name] = (tune.loguniform if dist.log else tune.uniform)(dist.low, dist.high)
    return out


class ClipToRange:
    """Ray's explore step multiplies by 0.8 or 1.2 without bounds: put each value back in its searched range."""

    def __init__(self, searched: tuple[Searched, ...]):
        self.ranges = {d.name: d.distribution for d in searched
                       if d.name in MUTABLE and not isinstance(d.distribution, CategoricalDistribution)}

    def __call__(self, config: dict[str, Any]) -> dict[str, Any]:
        for name, dist in self.ranges.items():
            value = min(max(config[name], dist.low), dist.high)
            if dist.step is not None:  # onto the grid, still inside the range
                value = dist.low + round((value - dist.low) / dist.step) * dist.step
                value = min(value, dist.high)
            config[name] = int(round(value)) if isinstance(dist, IntDistribution) else float(value)
        return config


class PopulationTraining(PopulationBasedTraining):
    """Ray's synchronous PBT, with each trial's identity kept and no perturbation at a trial's last epoch."""

    def __init__(self, *, metric: str, mode: str, perturbation_interval: int, quantile_fraction: float,
                 searched: tuple[Searched, ...]):
        super().__init__(time_attr="epoch", metric=metric, mode=mode, perturbation_interval=perturbation_interval,
                         quantile_fraction=quantile_fraction, hyperparam_mutations=mutations(searched),
                         custom_explore_fn=ClipToRange(searched), synch=True, log_config=False)
        self.identity: dict[str, dict[str, Any]] = {}  # Tune trial id -> its trial_number and seed

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        super().on_trial_add(tune_controller, trial)
        self.identity.setdefault(trial.trial_id, {k: trial.config.get(k) for k in IDENTITY})

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        epoch = result.get("epoch")
        if epoch is None or result.get("diverged") or int(epoch) >= int(trial.config.get("epochs", math.inf)):
            return TrialScheduler.CONTINUE  # its last report: the trial ends, nothing to copy into it
        decision = super().on_trial_result(tune_controller, trial, result)
        self._keep_identities(tune_controller)
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        super().on_trial_complete(tune_controller, trial, result)
        self._perturb_if_stuck(tune_controller)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        super().on_trial_error(tune_controller, trial)
        self._perturb_if_stuck(tune_controller)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        super().on_trial_remove(tune_controller, trial)
        self._perturb_if_stuck(tune_controller)

    def _keep_identities(self, tune_controller) -> None:
        for trial in tune_controller.get_trials():
            own = self.identity.get(trial.trial_id)
            if own and any(trial.config.get(k) != v for k, v in own.items()):
                trial.set_config({**trial.config, **own})

    def _perturb_if_stuck(self, tune_controller) -> None:
        """Ray's synchronous PBT perturbs when the last live trial reaches the perturbation epoch. If that
        trial ended instead (diverged, an error), the others would wait for it forever: the perturbation
        is made now, as if the last of them had just reported."""
        live = tune_controller.get_live_trials()
        if not live or any(t.status != Trial.PAUSED for t in live) or self.choose_trial_to_run(tune_controller):
            return
        waiting = live[0]
        super().on_trial_result(tune_controller, waiting, waiting.last_result)
        self._keep_identities(tune_controller)

    def debug_string(self) -> str:
        return f"Population based training (synchronous): {super().debug_string()}"


def make_pbt(space: Space) -> PopulationTraining:
    experiment = space.experiment
    return PopulationTraining(metric=first(experiment.metric), mode=first(experiment.mode),  # one objective, as above
                              perturbation_interval=experiment.perturbation_interval,
                              quantile_fraction=experiment.quantile_fraction, searched=space.searched)


def replay_config(config: dict[str, Any], lineage: Mapping[str, Any] | None) -> dict[str, Any]:
    """best.yaml's config for a checkpoint with this lineage (trainable/loop.py Run.lineage).

    The seed that drew the weights, the values of the first epoch, and `schedule:`: each epoch
    from which the values, or the trial training the weights, changed. Unchanged when the
    weights are the trial's own with one set of values (every scheduler but pbt).
    """
    epochs = (lineage or {}).get("epochs") or []
    if lineage is None or not epochs or epochs[0]["epoch"] != 1:  # none kept, or a checkpoint older than lineages
        return config
    schedule = [dict(entry) for before, entry in zip(epochs, epochs[1:])
                if any(entry[k] != before[k] for k in ("trial_number", *MUTABLE))]
    out = {**config, "seed": lineage["seed"], **{k: epochs[0][k] for k in MUTABLE}}
    if schedule:
        out[SCHEDULE_KEY] = schedule
    return out


def summary_note(seed: int) -> str:
    """The summary's Search: line for pbt: what reproduces and what does not."""
    return (f"Search: pbt: trial n's first config depends only on the seed ({seed}) and n; which "
            "trials copy which at a perturbation, and the perturbed values, are Ray's random draws, so a rerun "
            "differs; best.yaml replays its trial's weights with `schedule:`")
