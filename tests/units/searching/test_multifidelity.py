"""What OrderedSearch tells its study about a trial that halving stopped short of its epochs (no Ray)."""

from __future__ import annotations

import functools
import random

import pytest
from optuna.trial import TrialState

from search.definition.space import parse_space
from search.searching.ordered import OrderedSearch
from search.searching.searcher import suggest

SPACE = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                               "momentum": {"distribution": "uniform", "low": 0.5, "high": 0.9}}})
EPOCHS, TRIALS, LAG = 4, 17, 3


def stopped_at(n: int) -> int:
    """The epoch trial n ends at, as halving's decisions make it: by n alone (they do not depend on order)."""
    return (1, 2, EPOCHS, EPOCHS)[n % 4]


def curve(n: int, epoch: int) -> float:
    return 0.5 + 0.01 * n + 0.1 * epoch


def searcher(multifidelity: str) -> OrderedSearch:
    ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=3)
    return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=3, sampler="tpe", lag=LAG,
                         multifidelity=multifidelity, epochs=EPOCHS)


def run(order_seed: int, multifidelity: str) -> OrderedSearch:
    """Drive the searcher as Tune does, trials finishing in an order drawn from `order_seed`, and each stop
    reaching it one of Tune's two ways, drawn too: STOP at the rung (the rung's result comes with
    on_trial_complete only) or PAUSE there first (on_trial_result, then on_trial_complete without a result)."""
    draw = random.Random(order_seed)
    s = searcher(multifidelity)
    running, asked = [], 0
    while asked < TRIALS or running:
        config = s.suggest(f"t{asked}") if asked < TRIALS else None
        if config is not None:
            running.append((f"t{asked}", config["trial_number"]))
            asked += 1
            continue
        trial_id, n = running.pop(draw.randrange(len(running)))
        last = stopped_at(n)
        for epoch in range(1, last):
            s.on_trial_result(trial_id, {"val_acc": curve(n, epoch), "epoch": epoch})
        result = {"val_acc": curve(n, last), "epoch": last}
        if last < EPOCHS and draw.random() < 0.5:  # paused at the rung, stopped later
            s.on_trial_result(trial_id, result)
            s.on_trial_complete(trial_id)
        else:
            s.on_trial_complete(trial_id, result)
    return s


def told(s: OrderedSearch, n: int) -> list[tuple]:
    """The study trial n is asked on, as (number, state, value, intermediate values): the kept one, checked
    against one built from the record."""
    s.suggest("extra")  # trial n = TRIALS: the kept study is brought to it
    kept = [(t.number, t.state, t.value, t.intermediate_values) for t in s._kept.study.get_trials(deepcopy=False)]
    built = [(t.number, t.state, t.value, t.intermediate_values) for t in s._built(n).study.get_trials(deepcopy=False)]
    assert kept[:n] == built[:n]
    return kept[:n - LAG]


def test_pruned_tells_a_stopped_trial_as_pruned_with_its_curve_the_same_for_any_order():
    first = told(run(1, "pruned"), TRIALS)
    for number, state, value, intermediate in first:
        last = stopped_at(number)
        if last < EPOCHS:
            assert state == TrialState.PRUNED
            assert intermediate == {e: pytest.approx(curve(number, e)) for e in range(1, last + 1)}
            assert value == pytest.approx(curve(number, last))
        else:
            assert (state, intermediate) == (TrialState.COMPLETE, {})
            assert value == pytest.approx(curve(number, EPOCHS))
    assert first == told(run(2, "pruned"), TRIALS)


def test_a_restored_searcher_tells_the_stopped_trials_the_same(tmp_path):
    s = run(1, "pruned")
    s.save(str(tmp_path / "searcher.json"))
    restored = searcher("pruned")
    restored.restore(str(tmp_path / "searcher.json"))
    assert told(restored, TRIALS) == told(s, TRIALS)


def test_final_tells_a_stopped_trial_its_rung_value_either_way_tune_stops_it():
    first = told(run(1, "final"), TRIALS)
    assert {state for _, state, _, _ in first} == {TrialState.COMPLETE}
    assert [value for _, _, value, _ in first] == [pytest.approx(curve(n, stopped_at(n))) for n, *_ in first]
    assert first == told(run(2, "final"), TRIALS)


def test_rung_fits_at_the_highest_epoch_enough_trials_reached():
    s = run(1, "rung")
    first = told(s, TRIALS)
    # 14 trials told: 10 (RUNG_POINTS) reached epoch 2, 6 of them all 4 epochs
    assert s._fidelity == 2
    for number, state, value, intermediate in first:
        if stopped_at(number) >= 2:
            assert (state, intermediate) == (TrialState.COMPLETE, {})
            assert value == pytest.approx(curve(number, 2))
        else:
            assert state == TrialState.PRUNED
    assert first == told(run(2, "rung"), TRIALS)
