"""OrderedSearch keeps one study across suggestions and still suggests what a study rebuilt per suggestion did.

The rebuild is the oracle: `RebuildingSearch` is OrderedSearch's suggest as it was before the
study was kept (O(n) storage work per suggestion), copied here unchanged. bench/tpe_scale.py
times it against the kept study.
"""

from __future__ import annotations

import functools
import json
import pickle
import random
import warnings

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from search.store.searcher_record import RECORD, RECORD_FILE
from search.searching.ordered import OrderedSearch, make_sampler
from search.searching.searcher import suggest
from search.searching.gp_kernels import kernels_of, with_kernels
from search.definition.schema import OPTUNA_SAMPLERS as SAMPLERS
from search.definition.space import parse_space

SPACE = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                               "batch_size": {"distribution": "choice", "values": [32, 64]},
                               "momentum": {"distribution": "uniform", "low": 0.5, "high": 0.9},
                               "t_max": {"distribution": "randint", "low": 1, "high": 8}}})


class RebuildingSearch(OrderedSearch):
    """The reference: a new study per suggestion, holding every earlier trial."""

    def suggest(self, trial_id: str) -> dict | None:
        n = len(self.asked)
        running = n - len(self.finished)
        if running >= self.lag:
            return None
        if any(k not in self.finished for k in range(n - self.lag)):
            return None
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        storage = optuna.storages.InMemoryStorage()  # ours, so its public methods reach the study's attrs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study = optuna.create_study(storage=storage, direction="maximize" if self.mode == "max" else "minimize",
                                        # the GP's fit starts where the last one ended, as in OrderedSearch (gp_kernels.py)
                                        sampler=with_kernels(make_sampler(self.sampler, self.experiment_seed, n,
                                                                          told=len(self.warm)),
                                                             self._kernels_before(n)))
        study_id = storage.get_study_id_from_name(study.study_name)
        for key, value in self.study_attrs.items():
            storage.set_study_system_attr(study_id, key, value)
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
        self.study_attrs = dict(storage.get_study_system_attrs(study_id))
        if (fitted := kernels_of(study.sampler)) is not None:
            self.kernels[n] = fitted
        self.asked.append((dict(asked.params), dict(asked.distributions), dict(asked.system_attrs)))
        self.numbers[trial_id] = n
        return {**trial.params, **constants}


def made(kind: type[OrderedSearch], sampler: str, seed: int = 11, lag: int = 4) -> OrderedSearch:
    ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=seed)
    return kind(ask, metric="val_acc", mode="max", experiment_seed=seed, sampler=sampler, lag=lag)


def quality(config: dict) -> float:
    return (-abs(config["lr"] - 0.05) - abs(config["momentum"] - 0.7) - 0.01 * abs(config["t_max"] - 5)
            - (config["batch_size"] == 64) * 0.01)


def finish(s: OrderedSearch, trial_id: str, config: dict, outcome: str, epochs: int) -> None:
    """Tell `s` how a trial went: its epochs' metrics, then its end (an error, or no finite metric)."""
    for epoch in range(1, epochs + 1):
        value = float("nan") if outcome == "nan" else quality(config) * (0.5 + epoch / (2 * epochs))
        s.on_trial_result(trial_id, {"val_acc": value, "epoch": epoch})
    s.on_trial_complete(trial_id, {"val_acc": quality(config)}, error=outcome == "error")


def lockstep(pair: list[OrderedSearch], order_seed: int, total: int = 60, swap=None) -> dict[int, dict]:
    """Drive both searchers with one sequence of events; every suggestion must be the same.

    Trials finish in an order drawn with `order_seed`, after 1 to 3 epochs, some with an error
    or a NaN metric (FAIL to Optuna). `swap(pair, asked)` may replace a searcher between events.
    """
    draw = random.Random(order_seed)
    running, configs, asked = [], {}, 0
    while len(configs) < total or running:
        if swap is not None:
            pair = swap(pair, asked)
        suggestions = [s.suggest(f"t{asked}") if len(configs) < total else None for s in pair]
        assert suggestions[0] == suggestions[1], f"suggestion {asked}: {suggestions}"
        if suggestions[0] is not None:
            configs[suggestions[0]["trial_number"]] = suggestions[0]
            running.append((f"t{asked}", suggestions[0]))
            asked += 1
            continue
        trial_id, config = running.pop(draw.randrange(len(running)))
        outcome = draw.choices(["ok", "error", "nan"], weights=[8, 1, 1])[0]
        epochs = draw.randint(1, 3)
        for s in pair:
            finish(s, trial_id, config, outcome, epochs)
    assert pair[0].asked == pair[1].asked, "every trial's params, distributions and system attrs"
    assert pair[0].study_attrs == pair[1].study_attrs, "QMC's counter"
    return configs


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_kept_study_suggests_what_a_rebuilt_one_did(sampler):
    # GP fits its model per suggestion, about 1 s each at 60 trials here: 14 GP suggestions after its 10 startup ones
    total = 24 if sampler == "gp" else 60
    configs = lockstep([made(RebuildingSearch, sampler), made(OrderedSearch, sampler)], order_seed=7, total=total)
    assert sorted(configs) == list(range(total))


@pytest.mark.parametrize("sampler", ["tpe", "cmaes", "qmc"])
def test_a_restored_or_unpickled_searcher_continues_the_same(sampler, tmp_path):
    done = set()

    def swap(pair, asked):
        reference, kept = pair
        if asked == 25 and "save" not in done:  # what Tune's snapshot writes: searcher.json
            done.add("save")
            kept.save_to_dir(str(tmp_path))
            assert set(json.loads((tmp_path / RECORD_FILE).read_text())) == set(RECORD), "the record, no study"
            kept = made(OrderedSearch, sampler)
            kept.restore_from_dir(str(tmp_path))
        if asked == 40 and "pickle" not in done:  # Tune pickles its searcher too (tuner.pkl)
            done.add("pickle")
            pickled = pickle.dumps(kept)
            assert b"optuna.study" not in pickled, "the kept study is rebuilt, not pickled"
            kept = pickle.loads(pickled)
        return [reference, kept]

    lockstep([made(RebuildingSearch, sampler), made(OrderedSearch, sampler)], order_seed=8, swap=swap)
    assert done == {"save", "pickle"}


def test_an_ask_that_raises_leaves_no_half_asked_trial_behind():
    pair = [made(RebuildingSearch, "tpe"), made(OrderedSearch, "tpe")]
    for t in range(12):
        config = pair[0].suggest(f"t{t}")
        assert pair[1].suggest(f"t{t}") == config
        for s in pair:
            finish(s, f"t{t}", config, "ok", 2)
    kept = pair[1]
    ask = kept.ask
    # batch_size asked as an int range, after trials asked it as a choice: Optuna refuses
    clash = parse_space({"space": {"batch_size": {"distribution": "randint", "low": 16, "high": 64}}})
    kept.ask = functools.partial(suggest, searched=clash.searched, experiment_seed=11)
    with pytest.raises(ValueError):
        kept.suggest("t12")
    kept.ask = ask
    assert kept.suggest("t12") == pair[0].suggest("t12")
