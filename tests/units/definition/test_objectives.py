"""Several objectives and constraints on their own (docs/multi-objective.md): the space file's rules, a trial's
point, feasibility, the front (a search with them: tests/searches/test_multi_objective.py)."""

from __future__ import annotations

import functools
import random

import pandas as pd
import pytest

from search.definition.objectives import non_dominated, objectives_of, pareto_front, parse_constraint
from search.searching.ordered import OrderedSearch
from search.searching.searcher import suggest
from search.definition.space import parse_space
from trainable.errors import ConfigError


LR = {"lr": {"distribution": "float", "low": 0.01, "high": 0.3, "log": True}}


def problems_of(experiment: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_space({"experiment": experiment, "space": LR})
    return str(caught.value)


def test_a_list_of_metrics_with_a_mode_each_and_constraints_parse():
    space = parse_space({"experiment": {"metric": ["val_acc", "params"], "mode": ["max", "min"],
                                        "constraints": ["params <= 200000", "latency_ms>=0.5"]}, "space": LR})
    objectives = objectives_of(space.experiment)
    assert objectives.several and objectives.directions == ["maximize", "minimize"]
    assert [str(c) for c in objectives.constraints] == ["params <= 200000", "latency_ms >= 0.5"]
    one = parse_space({"experiment": {"metric": "val_loss", "mode": "min", "constraints": ["params <= 10"]},
                       "space": LR})
    assert one.experiment.metric == "val_loss" and not objectives_of(one.experiment).several


def test_each_broken_rule_is_said_with_its_key():
    text = problems_of({"metric": ["val_acc", "params"], "mode": "max", "scheduler": "pbt", "sampler": "cmaes",
                        "constraints": ["params < 3", "speed <= 2", "params <= x", 3, "params <= 1e3"]})
    assert "experiment.mode: must have one mode per metric (2: val_acc, params), got 'max'" in text
    for i, value in enumerate(["'params < 3'", "'speed <= 2'", "'params <= x'", "3"]):
        assert f"experiment.constraints[{i}]: must read 'METRIC <= NUMBER' or 'METRIC >= NUMBER'" in text
        assert f"got {value}" in text
    assert "experiment.constraints[4]" not in text
    assert "experiment.scheduler: must be fifo, asha, hyperband or bohb with several objectives" in text
    # MO-ASHA ranks its rungs in the reproducible searcher's order; Ray's ASHA ranks by one metric
    assert "experiment.scheduler: asha with several objectives needs experiment.reproducible: true" in problems_of(
        {"metric": ["val_acc", "params"], "mode": ["max", "min"], "scheduler": "asha", "reproducible": False})
    assert parse_space({"experiment": {"metric": ["val_acc", "params"], "mode": ["max", "min"],
                                       "scheduler": "hyperband"}, "space": LR}).experiment.scheduler == "hyperband"
    assert "experiment.sampler: must not be cmaes with several objectives" in text
    assert "experiment.metric: must be a metric" in problems_of({"metric": ["val_acc", "val_acc"]})
    assert "experiment.constraints: need experiment.reproducible: true" in problems_of(
        {"reproducible": False, "constraints": ["params <= 5"]})


def test_a_constraint_reads_as_optuna_wants_it():
    at_most, at_least = parse_constraint("params <= 100"), parse_constraint(" val_acc >= 0.9 ")
    assert at_most.violation(90) == -10 and at_most.violation(110) == 10
    assert at_least.violation(0.95) < 0 < at_least.violation(0.5)
    assert at_most.violation(None) == float("inf"), "a metric not measured breaks its constraint"


def test_the_front_holds_exactly_the_non_dominated_points():
    points = [(0.9, 100), (0.8, 50), (0.85, 120), (0.9, 100), (0.7, 50), (0.95, 300)]
    assert non_dominated(points, ["max", "min"]) == [0, 1, 3, 5], "equal points both stay; dominated ones go"


def rows(trial: int, epochs: list[tuple[float, int]], status: str = "COMPLETED") -> list[dict]:
    return [{"trial_id": f"t{trial}", "trial_number": trial, "status": status, "epoch": e + 1, "val_acc": acc,
             "params": params} for e, (acc, params) in enumerate(epochs)]


def test_a_trials_point_is_its_last_epoch_with_several_objectives_and_infeasible_ones_are_never_on_the_front():
    space = parse_space({"experiment": {"metric": ["val_acc", "params"], "mode": ["max", "min"],
                                        "constraints": ["params <= 1000"]}, "space": LR})
    frame = pd.DataFrame(rows(0, [(0.99, 500), (0.5, 500)]) + rows(1, [(0.8, 400), (0.9, 400)])
                         + rows(2, [(0.95, 2000), (0.99, 2000)]) + rows(3, [(0.95, 100)], status="ERROR")
                         + rows(4, [(0.6, 300)]))
    front = pareto_front(frame, objectives_of(space.experiment))
    # trial 0's point is its last epoch (0.5 at 500 params), dominated by trial 1; trial 2 breaks the
    # constraint; trial 3 errored
    assert front["trial_number"].tolist() == [1, 4]
    assert front["val_acc"].tolist() == [0.9, 0.6]


def test_an_empty_front_says_why_and_offers_no_replay(tmp_path):
    import yaml

    from search.outputs.pareto import write_pareto
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage

    space = parse_space({"experiment": {"metric": ["val_acc", "params"], "mode": ["max", "min"],
                                        "constraints": ["params <= 100"]}, "space": LR})
    folder = RunFolder(Storage.at(str(tmp_path)), "none")
    folder.claim()
    frame = pd.DataFrame(rows(0, [(0.9, 500)]) + rows(1, [(0.8, 400)]))
    line = write_pareto(folder, space, frame, objectives_of(space.experiment))
    assert "0 feasible non-dominated trial(s) of 2: no trial met experiment.constraints (params <= 100)" in line
    assert "replay" not in line and "--pick" not in line
    assert yaml.safe_load((tmp_path / "none" / "pareto.yaml").read_text())["trials"] == []


def test_export_of_a_run_where_no_trial_met_the_constraints_says_so(tmp_path, capsys):
    from search.cli import main
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage

    space = parse_space({"experiment": {"constraints": ["params <= 100"]}, "space": LR})
    folder = RunFolder(Storage.at(str(tmp_path)), "none")
    folder.claim()
    folder.write_spec(space)
    frame = pd.DataFrame(rows(0, [(0.9, 500)]) + rows(1, [(0.8, 400)])).assign(feasible=False)
    frame.to_parquet(tmp_path / "none" / "results.parquet")
    assert main(["export", str(tmp_path / "none"), "-o", str(tmp_path / "x.pt")]) == 2
    assert "has no best.yaml (no trial met experiment.constraints (params <= 100)); pass --trial N" \
        in capsys.readouterr().err


def test_the_summary_lists_infeasible_trials_after_the_feasible_ones_and_marks_them():
    from search.outputs.summary import format_table

    frame = pd.DataFrame({"trial_id": ["a", "b", "c"], "trial_number": [0, 1, 2], "status": ["COMPLETED"] * 3,
                          "epoch": [1, 1, 1], "val_acc": [0.9, 0.8, 0.7], "params": [400000, 100000, 400000],
                          "feasible": [False, True, False], "lr": [0.1, 0.1, 0.2]})
    lines = format_table(frame, "val_acc", "max", ["lr"], also=("params",)).splitlines()
    assert lines[0].split() == ["trial_number", "trial_id", "status", "epoch", "val_acc", "params", "feasible", "lr"]
    assert [line.split()[0] for line in lines[1:]] == ["#1", "#0", "#2"]
    # and the header says so, where some trial broke them
    from search.outputs.summary import Timing, format_summary

    def header(frame) -> str:
        return format_summary(frame, None, Timing(10.0, 5.0, 1), metric="val_acc", mode="max", searched=["lr"],
                              gpus_per_trial=0, rerun="").splitlines()[1]

    assert header(frame).startswith("Top trials by val_acc (max) among those that met experiment.constraints, "
                                    "then the others, 3 trials")
    assert header(frame.assign(feasible=True)).startswith("Top trials by val_acc (max), 3 trials")


def test_infeasible_trials_are_never_best_with_one_objective():
    from search.definition.objectives import feasible_only, mark_feasible

    objectives = objectives_of(parse_space({"experiment": {"constraints": ["params <= 1000"]}, "space": LR})
                               .experiment)
    marked = [*mark_feasible(rows(0, [(0.99, 5000)]), objectives), *mark_feasible(rows(1, [(0.7, 10)]), objectives)]
    assert [r["feasible"] for r in marked] == [False, True]
    assert feasible_only(pd.DataFrame(marked))["trial_number"].tolist() == [1]
    assert list(feasible_only(pd.DataFrame(marked).iloc[0:0]).columns) == list(marked[0]), "none: an empty table"


MULTI = parse_space({"experiment": {"metric": ["val_acc", "params"], "mode": ["max", "min"],
                                    "constraints": ["params <= 60000"]},
                     "space": {**LR, "model.hidden_sizes": {"distribution": "choice",
                                                            "values": [[16], [32], [64], [128]]}}})


def drive(order_seed: int, lag: int = 3, total: int = 14, sampler: str = "tpe", restore_at: int | None = None,
          tmp_path=None) -> dict[int, dict]:
    """An OrderedSearch of MULTI driven as Tune would, trials finishing in an order drawn from order_seed;
    restore_at: save the searcher after that many suggestions and continue with a restored one."""
    def make():
        ask = functools.partial(suggest, searched=MULTI.searched, experiment_seed=7)
        return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=7, sampler=sampler, lag=lag,
                             objectives=objectives_of(MULTI.experiment))
    s, order, running, configs = make(), random.Random(order_seed), [], {}
    while len(configs) < total or running:
        if restore_at is not None and len(configs) == restore_at:
            s.save(str(tmp_path / "state.json"))
            s = make()
            s.restore(str(tmp_path / "state.json"))
            restore_at = None
        config = s.suggest(f"t{len(configs)}") if len(configs) < total else None
        if config is not None:
            configs[config["trial_number"]] = config
            running.append((f"t{config['trial_number']}", config))
            continue
        trial_id, config = running.pop(order.randrange(len(running)))
        params = 784 * config["model.hidden_sizes"][0] * 2
        for epoch in (1, 2):
            s.on_trial_result(trial_id, {"epoch": epoch, "val_acc": 1 - abs(config["lr"] - 0.05) / epoch,
                                         "params": params})
        s.on_trial_complete(trial_id, {})
    return configs


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])
def test_the_searcher_asks_the_same_trials_in_any_finishing_order_and_after_a_restore(sampler, tmp_path):
    first = drive(1, sampler=sampler)
    assert drive(2, sampler=sampler) == first
    assert drive(3, sampler=sampler, restore_at=8, tmp_path=tmp_path) == first
    assert len({c["model.hidden_sizes"][0] for c in first.values()}) > 1
