"""Warm start on its own: experiment.enqueue's configs checked against the space, an earlier run's trials read
for --warm-start and told to the study (the searches that warm start: tests/searches/test_warm_start.py)."""

from __future__ import annotations

import json
import os
import pickle
import random
from pathlib import Path

import pandas as pd
import pytest

from search.store.run_folder import RunFolder
from search.searching.searcher import make_searcher
from search.definition.space import parse_space
from search.store.storage import Storage
from search.searching.warm_start import UNFINISHED, WARM_START_FILE, WarmStart, select, told
from trainable.errors import ConfigError
from trainable.seed import derive_seed


RAW = {"experiment": {"num_samples": 8, "max_concurrent": 3, "seed": 5,
                      "enqueue": [{"lr": 0.2}, {"lr": 0.02, "batch_size": 64}]},
       "space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                 "batch_size": {"distribution": "choice", "values": [32, 64]}}}


# an earlier run's trials, as warm_start.json holds them: good near lr 0.05
WARM = WarmStart("runs/earlier", "earlier", [{"number": k, "params": {"lr": lr, "batch_size": 32}, "value": v}
                                             for k, (lr, v) in enumerate([(0.05, 0.9), (0.04, 0.88), (0.25, 0.3),
                                                                          (0.012, 0.5), (0.06, 0.89)] * 3)])


def test_enqueued_values_are_checked_against_their_distributions():
    raw = {**RAW, "experiment": {"num_samples": 2, "enqueue": [{"lr": 0.5, "batch_size": 48}, {"momentum": 0.9},
                                                               {"lr": "x"}]}}
    with pytest.raises(ConfigError) as error:
        parse_space(raw)
    assert error.value.problems == [
        "experiment.enqueue: must hold at most experiment.num_samples (2) configs, got '3 configs'",
        "experiment.enqueue[0].lr: must be in [0.01, 0.3], got 0.5",
        "experiment.enqueue[0].batch_size: must be one of [32, 64], got 48",
        "experiment.enqueue[1].momentum: must be a searched key (lr, batch_size), got 0.9",
        "experiment.enqueue[2].lr: must be a number, got 'x'"]


def test_an_enqueued_value_its_own_configs_when_rules_out_is_refused_not_dropped():
    when = {"optimizer": {"distribution": "choice", "values": ["sgd", "adamw"]},
            "momentum": {"distribution": "float", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}},
            "beta1": {"distribution": "float", "low": 0.8, "high": 0.95, "when": {"optimizer": "adamw"}}}
    enqueue = [{"optimizer": "adamw", "momentum": 0.7}, {"optimizer": "sgd", "beta1": 0.85},
               {"optimizer": "sgd", "momentum": 0.6}, {"momentum": 0.6}]  # the last two can be drawn
    with pytest.raises(ConfigError) as error:
        parse_space({"experiment": {"num_samples": 4, "enqueue": enqueue}, "space": when})
    assert error.value.problems == [
        "experiment.enqueue[0].momentum: is drawn only when optimizer is one of ['sgd'], and this config sets "
        "optimizer to 'adamw', got 0.7",
        "experiment.enqueue[1].beta1: is drawn only when optimizer is one of ['adamw'], and this config sets "
        "optimizer to 'sgd', got 0.85"]


def drive(searcher, order_seed: int, total: int = 8, prefix: str = "t") -> dict[int, dict]:
    """Ask while the searcher gives configs (`total` of them), else finish a running trial drawn with `order_seed`."""
    finish = random.Random(order_seed)
    running, configs = [], {}
    while len(configs) < total or running:
        config = searcher.suggest(f"{prefix}{len(configs)}") if len(configs) < total else None
        if config is not None:
            running.append((f"{prefix}{len(configs)}", config))
            configs[config["trial_number"]] = config
            continue
        trial_id, config = running.pop(finish.randrange(len(running)))
        value = -abs(config["lr"] - 0.05)
        searcher.on_trial_result(trial_id, {"val_acc": value, "epoch": 1, "training_iteration": 1})
        searcher.on_trial_complete(trial_id, {"val_acc": value})
    return configs


def folder_with(tmp_path: Path, warm: WarmStart | None) -> RunFolder:
    folder = RunFolder(Storage.at(str(tmp_path)), "run")
    os.makedirs(folder.path)
    if warm is not None:
        (Path(folder.path) / WARM_START_FILE).write_text(json.dumps(warm.__dict__))
    return folder


@pytest.mark.parametrize("reproducible", [True, False])
def test_enqueued_configs_are_trials_0_and_1_and_the_warm_start_informs_the_rest(tmp_path, reproducible):
    space = parse_space({**RAW, "experiment": {**RAW["experiment"], "reproducible": reproducible,
                                               **({} if reproducible else {"max_concurrent": 1})}})
    warm = drive(make_searcher(space, folder_with(tmp_path / "warm", WARM)), order_seed=1)
    cold = drive(make_searcher(space, folder_with(tmp_path / "cold", None)), order_seed=1)
    for configs in (warm, cold):
        assert sorted(configs) == list(range(8)), "the run's own trials number from 0"
        assert [configs[n]["seed"] for n in range(8)] == [derive_seed(5, n) for n in range(8)]
        assert configs[0]["lr"] == 0.2 and (configs[1]["lr"], configs[1]["batch_size"]) == (0.02, 64)
    assert [warm[n]["lr"] for n in range(2, 8)] != [cold[n]["lr"] for n in range(2, 8)], "the study was told"


def test_any_finishing_order_and_a_restore_give_the_same_warm_started_trials(tmp_path):
    space = parse_space(RAW)
    folder = folder_with(tmp_path, WARM)
    straight = drive(make_searcher(space, folder), order_seed=1)
    assert drive(make_searcher(space, folder), order_seed=2) == straight
    # a resume: Tune unpickles the searcher (with its warm trials) and restores its record
    searcher = make_searcher(space, folder).searcher
    assert drive(searcher, order_seed=3, total=4) == {n: straight[n] for n in range(4)}
    searcher.save(str(tmp_path / "record.json"))
    restored = pickle.loads(pickle.dumps(searcher))
    restored.restore(str(tmp_path / "record.json"))
    assert drive(restored, order_seed=4, total=4, prefix="r") == {n: straight[n] for n in range(4, 8)}


def rows(number, status, lr, batch_size, val_acc=0.9):
    return {"trial_id": f"t{number}", "trial_number": number, "status": status, "epoch": 1, "val_acc": val_acc,
            "seed": number, "lr": lr, "batch_size": batch_size, "momentum": 0.9}  # fixed then: a column still


def test_earlier_trials_outside_todays_space_are_left_out_and_counted():
    earlier = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                                     "batch_size": {"distribution": "choice", "values": [32, 64, 128]}}})
    today = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.1},
                                   "batch_size": {"distribution": "choice", "values": [32, 64]}}})
    frame = pd.DataFrame([rows(0, "COMPLETED", 0.05, 32), rows(1, "COMPLETED", 0.2, 32),
                          rows(2, "COMPLETED", 0.06, 128), rows(3, "INTERRUPTED", 0.05, 64),
                          rows(4, "ERROR", 0.05, 64), rows(5, "STOPPED", 0.02, 64, 0.7),
                          rows(6, "COMPLETED", 0.03, 64, float("nan"))])
    kept, left_out = select(frame, earlier, today)
    assert kept == [{"number": 0, "params": {"lr": 0.05, "batch_size": 32}, "value": 0.9},
                    {"number": 5, "params": {"lr": 0.02, "batch_size": 64}, "value": 0.7}]
    assert left_out == {"lr in [0.01, 0.1]": 1, "batch_size one of [32, 64]": 1, UNFINISHED: 3}
    note = WarmStart("runs/x", "x", kept, left_out).note()
    assert note.startswith("warm start: 2 trial(s) from runs/x") and "5 left out: 3 unfinished" in note
    searched_more = parse_space({"space": {**{d.name: d.to_raw() for d in today.searched},
                                           "momentum": {"distribution": "float", "low": 0.5, "high": 0.9}}})
    # searched today, fixed then: every trial of that run ran at the value its column holds (0.9), a point
    # today's space can draw, so it is told at that value; where today's space cannot, it is left out
    more_kept, more_left_out = select(frame, earlier, searched_more)
    assert [k["params"] for k in more_kept] == [{**k["params"], "momentum": 0.9} for k in kept]
    assert more_left_out == left_out
    narrower = parse_space({"space": {**{d.name: d.to_raw() for d in searched_more.searched},
                                      "momentum": {"distribution": "float", "low": 0.5, "high": 0.8}}})
    assert select(frame, earlier, narrower)[1] == {"momentum in [0.5, 0.8]": 2, **left_out}
    # a function's key the earlier run never set has no value there: not a point of today's space
    assert select(frame.drop(columns="momentum"), earlier, searched_more)[1] == {"without momentum": 2, **left_out}


def test_earlier_trials_that_drew_another_value_than_today_fixes_are_left_out_and_counted():
    earlier = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                                     "batch_size": {"distribution": "choice", "values": [32, 64, 128]}}})
    today = parse_space({"training": {"batch_size": 64},
                         "space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}})
    frame = pd.DataFrame([rows(0, "COMPLETED", 0.05, 32), rows(1, "COMPLETED", 0.2, 64, 0.8),
                          rows(2, "STOPPED", 0.06, 128), rows(3, "INTERRUPTED", 0.05, 64),
                          rows(4, "COMPLETED", 0.03, 64, 0.7)])
    kept, left_out = select(frame, earlier, today)
    # only the trials that ran batch_size 64 ran a config of today's space
    assert kept == [{"number": 1, "params": {"lr": 0.2}, "value": 0.8},
                    {"number": 4, "params": {"lr": 0.03}, "value": 0.7}]
    assert left_out == {"batch_size drew a value other than today's 64": 2, UNFINISHED: 1}
    assert "3 left out: 2 batch_size drew a value other than today's 64, 1 unfinished" in \
        WarmStart("runs/x", "x", kept, left_out).note()
    # fixed today at a value none drew: nothing is told
    assert select(frame, earlier, parse_space({"training": {"batch_size": 16}, "space": {
        "lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}}))[0] == []
    # a function's key no longer in today's file: its trials run with a default only the user's code knows
    function = {"trainable": "train.py:train", "training": {"epochs": 1},
                "space": {"lr": {"distribution": "float", "low": 0.01, "high": 0.3}}}
    then = parse_space({**function, "space": {**function["space"],
                                              "units": {"distribution": "int", "low": 1, "high": 4}}})
    own = pd.DataFrame([{**rows(0, "COMPLETED", 0.05, 32), "units": 2}, {**rows(1, "COMPLETED", 0.1, 32), "units": 3}])
    assert select(own, then, parse_space(function)) == ([], {"units searched then, not set today": 2})
    units_fixed = parse_space({**function, "training": {"epochs": 1, "units": 3}})
    assert [k["number"] for k in select(own, then, units_fixed)[0]] == [1]


def test_a_key_fixed_today_that_the_earlier_run_drew_only_under_a_condition_is_compared_only_where_drawn():
    when = {"optimizer": {"distribution": "choice", "values": ["sgd", "adamw"]},
            "momentum": {"distribution": "float", "low": 0.5, "high": 0.99, "when": {"optimizer": "sgd"}},
            "lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}
    earlier = parse_space({"space": when})
    today = parse_space({"training": {"momentum": 0.9},
                         "space": {"optimizer": when["optimizer"], "lr": when["lr"]}})
    frame = pd.DataFrame([{**rows(0, "COMPLETED", 0.05, 32), "optimizer": "adamw", "momentum": None},
                          {**rows(1, "COMPLETED", 0.05, 32), "optimizer": "sgd", "momentum": 0.9},
                          {**rows(2, "COMPLETED", 0.05, 32), "optimizer": "sgd", "momentum": 0.6}])
    kept, left_out = select(frame, earlier, today)
    assert [k["number"] for k in kept] == [0, 1], "adamw drew no momentum: it did not apply"
    assert left_out == {"momentum drew a value other than today's 0.9": 1}


def test_an_earlier_trial_without_a_key_its_condition_left_out_is_kept():
    conditional = {"space": {"optimizer": {"distribution": "choice", "values": ["sgd", "adamw"]},
                             "momentum": {"distribution": "float", "low": 0.5, "high": 0.99,
                                          "when": {"optimizer": "sgd"}},
                             "lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}}
    space = parse_space(conditional)
    frame = pd.DataFrame([{**rows(0, "COMPLETED", 0.05, 32), "optimizer": "adamw", "momentum": None},
                          {**rows(1, "COMPLETED", 0.05, 32), "optimizer": "sgd", "momentum": 0.9}])
    kept, left_out = select(frame, space, space)
    assert [k["number"] for k in kept] == [0, 1]
    assert kept[0]["params"] == {"optimizer": "adamw", "lr": 0.05}
    assert left_out == {}


def test_earlier_trials_carry_todays_constraints_measured_on_them():
    # told without constraints, Optuna scores a trial as feasible: TPE would be drawn to configs that break them
    earlier = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}})
    today = parse_space({"experiment": {"constraints": ["params <= 100"]},
                         "space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3}}})
    frame = pd.DataFrame([{**rows(0, "COMPLETED", 0.05, 32, 0.8), "params": 25350.0},
                          {**rows(1, "COMPLETED", 0.02, 32, 0.7), "params": 90.0}])
    kept, left_out = select(frame, earlier, today)
    assert [(k["number"], k["constraints"]) for k in kept] == [(0, {"params <= 100": 25250.0}),
                                                               (1, {"params <= 100": -10.0})]
    assert left_out == {}
    warm = told(WarmStart("runs/x", "x", kept, left_out), today.searched)
    assert [t.constraints for t in warm] == [{"params <= 100": 25250.0}, {"params <= 100": -10.0}]
    # an earlier run that did not report what a constraint measures cannot say whether its trials met it
    assert select(frame.drop(columns="params"), earlier, today) == ([], {"without params (experiment.constraints)": 2})
    assert "constraints" not in select(frame, earlier, earlier)[0][0], "no constraints today: none told"
