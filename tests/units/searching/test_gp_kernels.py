"""The reproducible searcher's GP starts each fit where its last fit ended (search/searching/gp_kernels.py),
as one GPSampler does, and keeps those kernel parameters in its record, so a restored searcher suggests
what the uninterrupted one did."""

from __future__ import annotations

import functools
import math

import optuna
import pytest
from optuna.distributions import FloatDistribution

from search.definition.schema import Searched
from search.searching.gp_kernels import kernels_of, with_kernels
from search.searching.ordered import OrderedSearch
from search.searching.searcher import suggest

SEARCHED = tuple(Searched(f"x{i}", FloatDistribution(0.0, 1.0)) for i in range(3))
TRIALS = 17  # trials 0-9 from a Sobol sequence (ordered.GP_START), then 7 from the model, fit on trials 0 .. n-3 (lag 2)


def loss(config: dict) -> float:
    return sum((config[f"x{i}"] - 0.3 - 0.1 * i) ** 2 for i in range(3)) + 0.1 * math.sin(9 * config["x0"])


def searcher(seed: int = 3) -> OrderedSearch:
    ask = functools.partial(suggest, searched=SEARCHED, experiment_seed=seed)
    return OrderedSearch(ask, metric="loss", mode="min", experiment_seed=seed, sampler="gp", lag=2)


def drive(s: OrderedSearch, start: int = 0, stop: int = TRIALS, before_ask=None) -> dict[int, dict]:
    """Two at a time, the earlier trial finishing first; `before_ask(s)` runs before each suggestion."""
    configs, running = {}, []
    for n in range(start, stop):
        if before_ask:
            before_ask(s)
        config = s.suggest(f"t{n}")
        assert config is not None
        configs[n] = config
        running.append((f"t{n}", config))
        if len(running) == 2 or n == stop - 1:
            trial_id, done = running.pop(0)
            s.on_trial_result(trial_id, {"loss": loss(done), "epoch": 1})
            s.on_trial_complete(trial_id)
    return configs


@pytest.fixture(scope="module")
def uninterrupted() -> tuple[OrderedSearch, dict[int, dict]]:
    s = searcher()
    return s, drive(s)


def test_each_model_fit_is_recorded_after_the_startup_trials(uninterrupted):
    s, _ = uninterrupted
    assert sorted(s.kernels) == list(range(10, TRIALS))
    lengthscales, scale, noise = s.kernels[TRIALS - 1]["_gprs_cache_list"][0]
    assert len(lengthscales) == 3 and scale > 0 and noise > 0


def test_the_fits_start_from_the_last_one_and_that_changes_the_search(uninterrupted):
    _, configs = uninterrupted
    unchained = drive(searcher(), before_ask=lambda s: s.kernels.clear())  # every fit from Optuna's defaults
    assert [unchained[n] for n in range(11)] == [configs[n] for n in range(11)], \
        "the startup trials, and the first fit (from the defaults either way)"
    assert any(unchained[n] != configs[n] for n in range(11, TRIALS))


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_the_start_is_a_sobol_sequence_and_the_gp_takes_over_at_gp_start(uninterrupted):
    # random starts reached TPE's 50-trial result in 38 trials, Sobol starts in 26 (docs/search-quality.md)
    _, configs = uninterrupted
    sobol = optuna.samplers.QMCSampler(seed=3, scramble=True, warn_asynchronous_seeding=False)
    plain = optuna.create_study(sampler=sobol)
    plain.optimize(lambda t: loss({d.name: t.suggest_float(d.name, 0.0, 1.0) for d in SEARCHED}), n_trials=10)
    points = [[t.params[f"x{i}"] for i in range(3)] for t in plain.trials]
    assert [[configs[n][f"x{i}"] for i in range(3)] for n in range(10)] == points, "one study's Sobol points"


def test_a_searcher_restored_from_its_record_suggests_what_the_uninterrupted_one_did(uninterrupted, tmp_path):
    first = searcher()
    drive(first, stop=14)
    first.save_to_dir(str(tmp_path))
    restored = searcher()
    restored.restore_from_dir(str(tmp_path))
    assert restored.kernels == first.kernels
    _, configs = uninterrupted
    # trial 13 was left running when it was saved: finish it as the uninterrupted run did, then go on
    restored.on_trial_result("t13", {"loss": loss(configs[13]), "epoch": 1})
    restored.on_trial_complete("t13")
    rest = drive(restored, start=14)
    assert rest == {n: configs[n] for n in range(14, TRIALS)}


def test_kernels_round_trip_into_a_new_sampler():
    study = optuna.create_study(sampler=optuna.samplers.GPSampler(seed=0, n_startup_trials=3))
    for _ in range(5):
        trial = study.ask()
        study.tell(trial, (trial.suggest_float("x", 0, 1) - 0.4) ** 2)
    saved = kernels_of(study.sampler)
    fresh = with_kernels(optuna.samplers.GPSampler(seed=1), saved)
    assert kernels_of(fresh) == saved
    assert kernels_of(optuna.samplers.TPESampler()) is None
