"""Several objectives and constraints (docs/multi-objective.md): one search end to end (the rules, a trial's
point, the front and the searcher's study on their own: tests/units/definition/test_objectives.py)."""

from __future__ import annotations


import pandas as pd
import pytest

from search.definition.space import parse_space


@pytest.mark.slow
def test_a_search_with_two_objectives_a_constraint_conditional_keys_enqueued_configs_and_a_budget(
        ray_local, tmp_path, data_root, capsys):
    """Issue 18's whole space in one search: when:, two objectives, a constraint, two enqueued configs, a
    time budget (one it does not spend: test_budgets spends one); then the same search at another max_concurrent."""
    import math

    import optuna
    import yaml
    from optuna.storages.journal import JournalFileBackend

    from search.driver import run_search
    from trainable.__main__ import main as trainable_main

    sizes = {8: 784 * 8 + 8 + 8 * 10 + 10, 32: 784 * 32 + 32 + 32 * 10 + 10, 128: 784 * 128 + 128 + 128 * 10 + 10}
    enqueued = [{"optimizer": "sgd", "lr": 0.05, "model.hidden_sizes": [32]}, {"optimizer": "adamw", "lr": 0.002}]

    def space_at(max_concurrent: int):
        return parse_space({
            "experiment": {"name": "front", "num_samples": 6, "max_concurrent": max_concurrent, "seed": 7,
                           "storage_path": str(tmp_path), "metric": ["val_acc", "params"], "mode": ["max", "min"],
                           "constraints": ["params <= 60000"], "enqueue": enqueued, "time_budget": "10m",
                           "lag": 2},  # a lag that does not follow max_concurrent: the same trials at 3 and 2
            "resources": {"cpus": 0.5}, "training": {"epochs": 2},
            "data": {"root": str(data_root), "train_size": 500, "val_size": 200},
            "space": {"optimizer": {"distribution": "choice", "values": ["sgd", "adamw"]},
                      "momentum": {"distribution": "float", "low": 0.5, "high": 0.95, "when": {"optimizer": "sgd"}},
                      "lr": {"distribution": "float", "low": 0.001, "high": 0.3, "log": True},
                      "model.hidden_sizes": {"distribution": "choice", "values": [[8], [32], [128]]}}}, source="tests")

    outcome = run_search(space_at(3), name="front")
    run = tmp_path / "front"
    frame = pd.read_parquet(run / "results.parquet")
    assert sorted(frame["trial_number"].unique()) == list(range(6))
    # null exactly where the condition was false
    assert (frame["momentum"].isna() == (frame["optimizer"] == "adamw")).all()
    assert set(frame["optimizer"]) == {"sgd", "adamw"}
    # trials 0 and 1 are the enqueued configs, the rest of their keys drawn
    first = frame.sort_values("epoch").groupby("trial_number").first()
    assert (first.loc[0, "optimizer"], first.loc[0, "lr"], list(first.loc[0, "model.hidden_sizes"])) == ("sgd", 0.05, [32])
    assert (first.loc[1, "optimizer"], first.loc[1, "lr"]) == ("adamw", 0.002)
    assert set(frame["params"]) <= set(sizes.values()) and len(set(frame["params"])) > 1, "params varies"
    assert frame["latency_ms"].map(lambda v: math.isfinite(v) and v > 0).all()

    # recomputed from results.parquet alone: each trial at its last epoch, feasible, non-dominated
    last = frame.sort_values("epoch").groupby("trial_number").last()
    assert (last["feasible"] == (last["params"] <= 60000)).all(), "infeasible trials are marked"
    assert (frame.groupby("trial_number")["feasible"].nunique() == 1).all(), "on every row of a trial"
    feasible = last[last["params"] <= 60000]
    front = [n for n, t in feasible.iterrows()
             if not any(o["val_acc"] >= t["val_acc"] and o["params"] <= t["params"]
                        and (o["val_acc"] > t["val_acc"] or o["params"] < t["params"])
                        for _, o in feasible.iterrows())]
    pareto = yaml.safe_load((run / "pareto.yaml").read_text())
    assert [t["trial_number"] for t in pareto["trials"]] == front and front
    for entry in pareto["trials"]:
        assert entry["metrics"]["val_acc"] == last.loc[entry["trial_number"], "val_acc"]
        assert entry["config"]["model"]["hidden_sizes"] == [[k for k, v in sizes.items()
                                                             if v == entry["metrics"]["params"]][0]]
    assert not (run / "best.yaml").exists() and outcome.best is None
    assert "pareto.yaml" in outcome.summary and "no best.yaml" in outcome.summary
    assert f"replay one: python -m trainable --config {run}/pareto.yaml --pick N" in outcome.summary
    header = outcome.summary.split("Top trials by val_acc")[1].splitlines()[1].split()
    assert header[:6] == ["trial_number", "trial_id", "status", "epoch", "val_acc", "params"], "both objectives shown"

    study = optuna.load_study(study_name="front",
                              storage=optuna.storages.JournalStorage(JournalFileBackend(str(run / "optuna.journal"))))
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    assert sorted(t.number for t in study.best_trials) == front, "Optuna's own front of the journal agrees"
    constraints = {t.number: t.constraints["params <= 60000"] for t in study.trials}
    assert {n for n, v in constraints.items() if v > 0} == set(last.index[~last["feasible"].astype(bool)]), \
        "the journal holds each trial's constraint (optuna-dashboard greys infeasible trials)"
    assert 'id="pareto"' in (run / "report.html").read_text()

    # the replay of a front trial prints the epochs its record holds
    number = front[0]
    capsys.readouterr()
    assert trainable_main(["--config", str(run / "pareto.yaml"), "--data-root", str(data_root)]) == 2
    assert f"--pick: must name the trial to re-run when --config is a Pareto front (pareto.yaml; its trial_numbers: " \
           f"{front})" in capsys.readouterr().err, "not four unknown fields of a trial config"
    assert trainable_main(["--config", str(run / "pareto.yaml"), "--pick", str(number),
                           "--data-root", str(data_root)]) == 0
    printed = capsys.readouterr().out
    assert f"val_acc {last.loc[number, 'val_acc']:.4f}" in printed.splitlines()[-1]

    # `runs` and `compare` show it by its front: there is no best.yaml
    from search.cli import main as search_main

    assert search_main(["runs", "--storage-path", str(tmp_path)]) == 0
    assert f"{len(front)} on the Pareto front (val_acc, params)" in capsys.readouterr().out
    assert search_main(["export", str(run), "-o", str(tmp_path / "model.pt")]) == 2
    assert "searched several objectives, so it has a Pareto front (pareto.yaml)" in capsys.readouterr().err
    assert search_main(["export", str(run), "--trial", str(number), "-o", str(tmp_path / "model.pt")]) == 0

    # the same seed at another max_concurrent: the same trials, configs and metrics
    run_search(space_at(2), name="front-2")
    again = pd.read_parquet(tmp_path / "front-2" / "results.parquet")
    table = ["trial_number", "epoch", "optimizer", "momentum", "lr", "model.hidden_sizes", "params", "val_acc",
             "feasible"]
    pd.testing.assert_frame_equal(frame.sort_values(["trial_number", "epoch"])[table].reset_index(drop=True),
                                  again.sort_values(["trial_number", "epoch"])[table].reset_index(drop=True))
    assert search_main(["compare", str(run), str(tmp_path / "front-2")]) == 0
    compared = capsys.readouterr().out
    assert "experiment.max_concurrent" in compared and compared.count(f"{len(front)} on the Pareto front") == 2
