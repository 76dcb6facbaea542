"""OrderedSearch on its own (no Ray): trial n's config depends only on the seed and n."""

from __future__ import annotations

import functools
import random

import pytest

from search.definition.schema import OPTUNA_SAMPLERS as SAMPLERS
from search.definition.space import parse_space
from search.searching.ordered import OrderedSearch
from search.searching.searcher import suggest

SPACE = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                               "batch_size": {"distribution": "choice", "values": [32, 64]},
                               "momentum": {"distribution": "uniform", "low": 0.5, "high": 0.9}}})


def searcher(sampler: str, seed: int = 5, lag: int = 3) -> OrderedSearch:
    ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=seed)
    return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=seed, sampler=sampler, lag=lag)


def score(config) -> float:
    return -abs(config["lr"] - 0.05) - abs(config["momentum"] - 0.7) - (config["batch_size"] == 64) * 0.01


def run(s: OrderedSearch, order_seed: int, total: int = 14, stop_after: int | None = None) -> dict[int, dict]:
    """Drive the searcher as Tune would: ask while it gives configs, else finish a running trial.

    Which running trial finishes next is drawn with `order_seed`: the finishing order.
    """
    finish_order = random.Random(order_seed)
    running, configs, asked = [], {}, 0
    while len(configs) < total or running:
        if stop_after is not None and asked >= stop_after:
            return configs
        config = s.suggest(f"t{asked}") if len(configs) < total else None
        if config is not None:
            configs[config["trial_number"]] = config
            running.append((f"t{asked}", config))
            asked += 1
            continue
        assert running, "the searcher waits only while an earlier trial runs"
        trial_id, config = running.pop(finish_order.randrange(len(running)))
        for epoch in (1, 2):
            s.on_trial_result(trial_id, {"val_acc": score(config) * epoch / 2, "epoch": epoch})
        s.on_trial_complete(trial_id, {"val_acc": score(config)})
    return configs


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_any_finishing_order_gives_the_same_configs(sampler):
    first, second = run(searcher(sampler), order_seed=1), run(searcher(sampler), order_seed=2)
    assert sorted(first) == list(range(14))
    assert first == second
    assert len({round(c["lr"], 12) for c in first.values()}) > 10, "and they are a search, not one point"


def test_another_seed_gives_other_configs():
    assert run(searcher("tpe", seed=5), 1) != run(searcher("tpe", seed=6), 1)


def test_trial_n_waits_for_the_results_of_trials_up_to_n_minus_lag_minus_1():
    s = searcher("tpe", lag=2)
    assert s.suggest("a")["trial_number"] == 0 and s.suggest("b")["trial_number"] == 1
    assert s.suggest("c") is None, "two running: every slot is busy"
    s.on_trial_complete("b", {"val_acc": 0.5})
    assert s.suggest("c")["trial_number"] == 2, "trial 2 needs no result (2 - 2 - 1 < 0)"
    s.on_trial_complete("c", {"val_acc": 0.5})
    assert s.suggest("d") is None, "trial 3 needs trial 0's result"
    s.on_trial_complete("a", {"val_acc": 0.5})
    assert s.suggest("d")["trial_number"] == 3
    assert list(s.waits) == [3], "the wait is counted for trial 3"


def test_a_restored_searcher_continues_as_if_never_stopped(tmp_path):
    straight = run(searcher("tpe"), order_seed=3)
    s = searcher("tpe")
    partial = run(s, order_seed=3, stop_after=7)
    s.save(str(tmp_path / "state.json"))
    restored = searcher("tpe")
    restored.restore(str(tmp_path / "state.json"))
    # Tune restarts the unfinished trials with their configs and asks for the rest
    resumed = dict(partial)
    running = [(tid, partial[n]) for tid, n in restored.numbers.items() if n not in restored.finished]
    finish_order = random.Random(4)
    asked = len(restored.asked)
    while len(resumed) < 14 or running:
        config = restored.suggest(f"r{asked}") if len(resumed) < 14 else None
        if config is not None:
            resumed[config["trial_number"]] = config
            running.append((f"r{asked}", config))
            asked += 1
            continue
        trial_id, config = running.pop(finish_order.randrange(len(running)))
        for epoch in (1, 2):
            restored.on_trial_result(trial_id, {"val_acc": score(config) * epoch / 2, "epoch": epoch})
        restored.on_trial_complete(trial_id, {"val_acc": score(config)})
    assert resumed == straight


def at(max_concurrent: int, lag: int | None, sampler: str = "tpe") -> OrderedSearch:
    """The searcher make_searcher builds for this max_concurrent and experiment.lag."""
    from search.searching.searcher import lag_of

    space = parse_space({"experiment": {"max_concurrent": max_concurrent, "lag": lag},
                         "space": {d.name: d.to_raw() for d in SPACE.searched}})
    ask = functools.partial(suggest, searched=space.searched, experiment_seed=5)
    return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=5, sampler=sampler,
                         lag=max_concurrent, unseen=lag_of(space.experiment))


def test_a_set_lag_gives_the_same_trials_at_any_max_concurrent():
    # 20 trials: TPE's 10 random ones, then trials asked on results (trial n on 0 .. n-4)
    assert run(at(2, lag=3), order_seed=1, total=20) == run(at(4, lag=3), order_seed=2, total=20)
    # the default lag follows max_concurrent: past the random start, the trials differ
    assert run(at(2, lag=None), order_seed=1, total=20) != run(at(4, lag=None), order_seed=1, total=20)


def ending_at_epochs(ends_at_epochs: bool) -> OrderedSearch:
    """Two slots, trial n asked on trials 0 .. n-2 (the defaults at max_concurrent 2), trials of 2 epochs."""
    ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=5)
    return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=5, sampler="tpe", lag=2, unseen=1,
                         epochs=2, ends_at_epochs=ends_at_epochs)


def test_a_waiting_trial_is_asked_at_the_last_epochs_report_of_the_trial_it_waits_for():
    # the canonical loop reports nothing after its last epoch, so its report finishes the trial;
    # Tune keeps the ended trial's actor only if the next trial is asked by then (search/searching/ordered.py)
    early, late = ending_at_epochs(True), ending_at_epochs(False)
    for s in (early, late):
        first = s.suggest("t0")
        second = s.suggest("t1")
        for epoch in (1, 2):  # trial 1 ends first
            s.on_trial_result("t1", {"val_acc": score(second) * epoch / 2, "epoch": epoch})
        s.on_trial_complete("t1", {"val_acc": score(second), "epoch": 2})
        assert s.suggest("t2") is None, "trial 2 waits for trial 0's result"
        s.on_trial_result("t0", {"val_acc": score(first) / 2, "epoch": 1})
        assert s.suggest("t2") is None, "epoch 1 of 2 is not trial 0's result"
        s.on_trial_result("t0", {"val_acc": score(first), "epoch": 2})
    asked = early.suggest("t2")
    assert asked is not None and asked["trial_number"] == 2
    assert late.suggest("t2") is None, "without ends_at_epochs only the trial's end lets trial 2 be asked"
    for s in (early, late):
        s.on_trial_complete("t0", {"val_acc": score(first), "epoch": 2})
    assert late.suggest("t2") == asked, "the same config as when asked after trial 0 ended"
    assert early.finished == late.finished


def run_two_slots(s: OrderedSearch, order_seed: int, total: int = 14) -> dict[int, dict]:
    """Drive the searcher as Tune does with two slots (ConcurrencyLimiter): ask while a slot is free,
    else a running trial reports its two epochs and, where a slot is free, Tune asks once more
    before it ends that trial. The finishing order is drawn with `order_seed`."""
    finish_order = random.Random(order_seed)
    running, configs = [], {}
    while len(configs) < total or running:
        config = s.suggest(f"t{len(configs)}") if len(configs) < total and len(running) < 2 else None
        if config is not None:
            running.append((f"t{len(configs)}", config))
            configs[config["trial_number"]] = config
            continue
        trial_id, config = running[finish_order.randrange(len(running))]
        for epoch in (1, 2):
            s.on_trial_result(trial_id, {"val_acc": score(config) * epoch / 2, "epoch": epoch})
        if len(configs) < total and len(running) < 2 and (early := s.suggest(f"t{len(configs)}")) is not None:
            running.append((f"t{len(configs)}", early))  # asked between the last report and the end
            configs[early["trial_number"]] = early
        running.remove((trial_id, config))
        s.on_trial_complete(trial_id, {"val_acc": score(config), "epoch": 2})
    return configs


def test_finishing_at_the_last_epoch_gives_the_same_search_past_tpes_startup():
    # 14 trials, 10 of them TPE's random start; any finishing order, asked early or at the end
    early = [run_two_slots(ending_at_epochs(True), order_seed) for order_seed in (1, 2, 3)]
    assert early[0] == early[1] == early[2] == run_two_slots(ending_at_epochs(False), order_seed=4)
    assert sorted(early[0]) == list(range(14))


def halving_run(rungs: tuple[int, ...], speed_seed: int, total: int = 24, epochs: int = 12) -> tuple[dict, float]:
    """Two slots on a virtual clock, as Tune runs a halving search: each epoch takes a time drawn with
    `speed_seed`; a trial stops at a rung unless its lr is small (a stand-in for the scheduler's decisions,
    which depend only on the trials' values, as OrderedHalving's do). Returns the configs by trial number and
    the slot time left idle while trials were still to start."""
    ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=5)
    s = OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=5, sampler="tpe", lag=2, unseen=1,
                      multifidelity="pruned", epochs=epochs, ends_at_epochs=True, rungs=rungs)
    speeds, clock, idle = random.Random(speed_seed), 0.0, 0.0
    running: list[list] = []  # [due, trial id, config, epoch]
    configs: dict[int, dict] = {}
    while True:
        while len(running) < 2 and len(configs) < total and (config := s.suggest(f"t{len(configs)}")) is not None:
            configs[config["trial_number"]] = config
            running.append([clock + speeds.uniform(0.5, 1.5), f"t{config['trial_number']}", config, 1])
        if not running:
            return configs, idle
        running.sort(key=lambda r: r[0])
        due, trial_id, config, epoch = running[0]
        if len(configs) < total:
            idle += (2 - len(running)) * (due - clock)
        clock = due
        result = {"val_acc": score(config) * epoch / epochs, "epoch": epoch}
        s.on_trial_result(trial_id, result)
        survives = {1: 0.08, 3: 0.03}.get(epoch, 1.0)  # most stop at epoch 1, a few at 3, the rest run on
        if epoch == epochs or (epoch in rungs and config["lr"] > survives):
            s.on_trial_complete(trial_id, result)
            running.pop(0)
        else:
            running[0][0], running[0][3] = clock + speeds.uniform(0.5, 1.5), epoch + 1


def test_under_halving_a_slot_does_not_wait_for_a_long_trial_and_the_configs_still_reproduce():
    """Issue 49 item 3: trial n waited for trial n-2 to end, so while one trial ran its 40 epochs the other
    slot ran nothing: 2 at once 25% of the time. Seen up to a rung it has surely reached, it waits rarely."""
    first, idle = halving_run((1, 3, 9), speed_seed=1)
    second, _ = halving_run((1, 3, 9), speed_seed=2)
    assert sorted(first) == list(range(24)) and first == second, "the same configs whatever the timing"
    for seed in (1, 3):  # every earlier trial seen whole, the wait of before: a slot idle for epochs
        _, idle = halving_run((1, 3, 9), speed_seed=seed)
        _, idle_whole = halving_run((), speed_seed=seed)
        assert idle_whole > 1.0 and idle_whole > 10 * idle, (seed, idle, idle_whole)
    assert len({round(c["lr"], 12) for c in first.values()}) > 20


def test_a_suggestion_seen_up_to_a_horizon_leaves_no_stale_kept_study_behind():
    """Under halving, a suggestion that sees an earlier trial only up to a rung is asked in a study built for it
    alone. The kept study lacked that trial, so the next suggestion that kept it told trials it did not hold:
    `KeyError: No trial with trial number 2` (found by tests/searches/test_chaos.py: 2 at once, trial 0 ran all its
    epochs while the next ones stopped at the first rung). Each config must also equal a fresh searcher's."""
    def halving_searcher() -> OrderedSearch:
        ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=5)
        return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=5, sampler="tpe", lag=2, unseen=1,
                             multifidelity="pruned", epochs=4, ends_at_epochs=True, rungs=(1, 2))

    def report(s: OrderedSearch, trial_id: str, config: dict, epochs: int) -> None:
        for epoch in range(1, epochs + 1):
            s.on_trial_result(trial_id, {"val_acc": score(config) * epoch / 4, "epoch": epoch})
        s.on_trial_complete(trial_id, {"val_acc": score(config) * epochs / 4})

    def drive(fresh_study_each_time: bool) -> list[dict]:
        s = halving_searcher()

        def ask(n: int) -> dict:
            if fresh_study_each_time:
                s._drop_caches()  # derived again from the record: what a kept study must agree with
            return s.suggest(f"t{n}")

        configs = [ask(0), ask(1)]  # both seen whole: the kept study holds trials 0 and 1
        report(s, "t0", configs[0], 4)  # trial 0 runs all 4 epochs: trial 2 sees it only up to rung 1
        configs.append(ask(2))
        for n in (1, 2, 3):  # the next trials stop at the first rung
            report(s, f"t{n}", configs[n], 1)
            configs.append(ask(n + 2))  # trial 5 sees every earlier trial whole: the kept study's turn
        return configs

    kept = drive(fresh_study_each_time=False)
    assert [c["trial_number"] for c in kept] == list(range(6))
    assert kept == drive(fresh_study_each_time=True)


def test_a_built_study_holds_plain_trials_that_share_no_dict_with_the_record():
    """A study built for a suggestion is handed trials without Optuna's deep copy (ordered.py _Made): it must hold
    plain FrozenTrials equal to the record's, and the record changed in place afterwards must leave them as they were."""
    from optuna.trial import FrozenTrial

    s = searcher("tpe", lag=1)
    run(s, order_seed=0, total=6)
    trials = s._built(6).study.get_trials(deepcopy=False)
    assert [type(t) for t in trials] == [FrozenTrial] * 6, "Optuna's own type in the study, as a deep copy gives"
    for trial, (params, distributions, system_attrs) in zip(trials, s.asked):
        assert trial.params == params and trial.distributions == distributions
        assert trial.params is not params and trial.distributions is not distributions \
            and trial.system_attrs is not system_attrs
    learning_rate = trials[0].params["lr"]
    s.asked[0][0]["lr"] = -1.0  # the record changed in place
    assert trials[0].params["lr"] == learning_rate
