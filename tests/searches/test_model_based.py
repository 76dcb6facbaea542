"""Model-based searches reproduce: `sampler: auto` choosing its GP, `scheduler: bohb`, and MO-ASHA (asha with
several objectives ranked by non-dominated sorting) give one table at max_concurrent 1 and 4, with cpus 1 and
0.5, and a trial stopped at a rung is PRUNED in the journal. Then bohb and MO-ASHA on the canonical loop.

The searches run a toy training function (docs/own-training-function.md): each trial's metrics depend only on
its config and seed, so a table that differs means the searcher or the scheduler saw another order.
"""

from __future__ import annotations

import copy
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from search.definition.space import parse_space
from search.driver import run_search
from tests.helpers import small_space

pytestmark = pytest.mark.slow

# val_acc climbs at a rate set by the searched numbers; size grows with t_max: two objectives that pull apart
TOY = '''
import random


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    acc = checkpoint["acc"] if checkpoint else 0.0
    rate = config["lr"] * config["clip_norm"] * (1 + config["t_max"] / 10)
    for epoch in range(start, config["epochs"]):
        acc += min(rate, 1.0) * (1 - acc) + random.Random(config["seed"] * 1000 + epoch).gauss(0, 0.02)
        report(val_acc=acc, size=config["t_max"] * 10 + config["clip_norm"], checkpoint={"acc": acc, "epoch": epoch + 1})
'''
NUMERIC = {"lr": {"distribution": "float", "low": 0.01, "high": 0.3, "log": True},
           "clip_norm": {"distribution": "float", "low": 0.5, "high": 5.0, "log": True},
           "t_max": {"distribution": "int", "low": 2, "high": 6}}
KEYS = ["trial_number", "epoch", "status", "seed", "lr", "clip_norm", "t_max", "val_acc", "size"]


def toy_space(folder: Path, max_concurrent: int, cpus: float, epochs: int = 4, **experiment):
    (folder / "toy.py").write_text(TOY)
    (folder / "space.yaml").write_text("")  # a reference is relative to the space file
    raw = {"trainable": "toy.py:train",
           # lag 3 at both concurrencies: the same results seen by each trial, so the same trials (reproducibility.md)
           "experiment": {"name": "test", "metric": "val_acc", "mode": "max", "num_samples": 14, "lag": 3,
                          "max_concurrent": max_concurrent, "seed": 5, "max_failures": 0,
                          "storage_path": str(folder), "report": False, **experiment},
           "resources": {"cpus": cpus},
           "training": {"epochs": epochs},
           "space": copy.deepcopy(NUMERIC)}
    return parse_space(raw, source=str(folder / "space.yaml"))


def two_runs(tmp_path, label: str, **experiment):
    """One search at max_concurrent 1 with 1 CPU a trial, and at 4 with 0.5 (4 at once on ray_local's 2 CPUs)."""
    return [run_search(toy_space(tmp_path, mc, cpus, **experiment), name=f"{label}-{mc}")
            for mc, cpus in ((1, 1), (4, 0.5))]


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trial_number", "epoch"])[[k for k in KEYS if k in frame]].reset_index(drop=True)


def journal_states(run: Path) -> dict[int, TrialState]:
    study = optuna.load_study(study_name=run.name, storage=optuna.storages.JournalStorage(
        JournalFileBackend(str(run / "optuna.journal"))))
    return {t.user_attrs["trial_number"]: t.state for t in study.get_trials(deepcopy=False)}


def stopped(frame: pd.DataFrame) -> set[int]:
    return set(frame.loc[frame["status"] == "STOPPED", "trial_number"])


def test_auto_chooses_its_gp_and_reproduces(ray_local, tmp_path):
    first, second = two_runs(tmp_path, "auto", epochs=1)
    pd.testing.assert_frame_equal(table(first.results), table(second.results))
    spec = yaml.safe_load((tmp_path / "auto-4" / "spec.yaml").read_text())
    assert spec["experiment"]["sampler"] == "gp"
    assert spec["run"]["sampler_choice"] == "sampler auto: gp (3 numeric parameters, 14 trials)"
    assert "sampler auto: gp (3 numeric parameters, 14 trials)" in second.summary
    # trials 0-9 are a Sobol sequence (ordered.GP_START), then each trial is asked on the trials up to 3 below it:
    # the GP fit its model for trials 10-13, and its kernel parameters are in the searcher's record, where a
    # resume takes them from (gp_kernels.py)
    import json

    record = json.loads((tmp_path / "auto-4" / "searcher.json").read_text())
    assert sorted(record["kernels"], key=int) == ["10", "11", "12", "13"]


@pytest.fixture(scope="module")
def bohb(ray_local, tmp_path_factory):
    """16 trials of bohb, at max_concurrent 1 and 4, and the folder they ran in."""
    folder = tmp_path_factory.mktemp("bohb")
    return (*two_runs(folder, "bohb", scheduler="bohb", num_samples=16), folder)


def test_bohb_stops_the_same_trials_and_prunes_them_in_the_journal(bohb):
    first, second, tmp_path = bohb
    pd.testing.assert_frame_equal(table(first.results), table(second.results))
    assert stopped(first.results), "some trials stopped at a rung"
    assert "sampler auto: tpe (bohb" in second.summary and "bohb: reproducible" in second.summary
    states = journal_states(tmp_path / "bohb-4")
    best = second.results.loc[second.results["val_acc"].idxmax(), "trial_number"]
    assert {n for n, s in states.items() if s == TrialState.PRUNED} == stopped(second.results) - {best}


def test_mo_asha_ranks_rungs_by_fronts_reproduces_and_prunes_in_the_journal(ray_local, tmp_path):
    first, second = two_runs(tmp_path, "mo", scheduler="asha", metric=["val_acc", "size"], mode=["max", "min"],
                             constraints=["size <= 60"], num_samples=10)
    pd.testing.assert_frame_equal(table(first.results), table(second.results))
    assert stopped(first.results), "some trials stopped at a rung"
    run = tmp_path / "mo-4"
    states = journal_states(run)
    front = {entry["trial_number"] for entry in yaml.safe_load((run / "pareto.yaml").read_text())["trials"]}
    assert {n for n, s in states.items() if s == TrialState.PRUNED} == stopped(second.results) - front
    halving = yaml.safe_load((run / "halving.json").read_text())
    # each rung value is the objectives signed to maximise, then the constraints' total violation
    value = next(v for rungs in halving["values"].values() for v in rungs.values() if v is not None)
    assert len(value) == 3 and value[2] >= 0


def test_bohb_and_mo_asha_on_the_canonical_loop(ray_local, tmp_path, data_root):
    space = small_space(tmp_path, data_root,
                        experiment={"num_samples": 4, "max_concurrent": 2, "scheduler": "bohb", "grace_period": 1,
                                    "metric": ["val_acc", "params"], "mode": ["max", "min"]},
                        training={"epochs": 3}, data={"train_size": 600, "val_size": 200})
    outcome = run_search(space, name="canonical")
    frame = outcome.results
    assert sorted(frame["trial_number"].unique()) == [0, 1, 2, 3]
    assert stopped(frame), "a trial stopped at a rung"
    assert (tmp_path / "canonical" / "pareto.yaml").exists()
    assert "bohb: reproducible" in outcome.summary


def test_the_simulator_runs_the_trials_and_stops_of_a_ray_search(bohb):
    """bench/schedules.py's simulator, on the toy's own curves, against the Ray search of the same space."""
    from bench.schedules import simulate

    _, ray_run, folder = bohb
    namespace: dict = {}
    exec(TOY, namespace)

    def metrics(config, epoch):
        reports = []
        namespace["train"](config, lambda checkpoint=None, **metrics: reports.append(metrics))
        return reports[epoch - 1]

    sim = simulate(toy_space(folder, 4, 0.5, scheduler="bohb", num_samples=16), metrics)
    frame = ray_run.results
    ran = {int(n): {k: rows[k].iloc[0] for k in ("seed", *NUMERIC)} for n, rows in frame.groupby("trial_number")}
    assert ran == {n: {k: config[k] for k in ("seed", *NUMERIC)} for n, config in sim.configs.items()}
    assert sim.last_epoch == {int(n): int(e) for n, e in frame.groupby("trial_number")["epoch"].max().items()}
    assert sim.stopped == stopped(frame) and sim.stopped
