"""Issue 37: your own training function as a first-class citizen, and nothing it reports misstated.

One search, shared by the file: a function with two objectives and a constraint, whose file imports a
module beside it, searched from another folder (the test's working directory is the repository),
with trials that run in Ray's worker processes (another folder again), one of which diverges, and
one that reports a metric the others do not; it reports one dict per epoch, as Tune's `tune.report` takes it.
Its pareto.yaml is checked against the front recomputed
from results.parquet alone and against the journal's own study; a front trial replays from a third folder.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import optuna
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from optuna.storages.journal import JournalFileBackend

from search.definition.space import parse_space

# beside the function: what `from shapes import ...` must find from any folder
SHAPES = """
def size_of(width):
    return 2 * width + 1
"""

FUNCTION = """
import math

import torch

from shapes import size_of


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    x = checkpoint["x"] if checkpoint else torch.zeros(())
    for epoch in range(start, config["epochs"]):
        noise = torch.randn((), generator=torch.Generator().manual_seed(config["seed"] + epoch))
        x = x + config["lr"] * (1 - x) + 0.01 * noise
        score = float(x) * 8 / config["width"]
        if config["trial_number"] == 1:  # would dominate every trial, then breaks on its last epoch
            score = 10.0 if epoch < config["epochs"] - 1 else math.nan
        extra = {"only_trial_two": 2.0} if config["trial_number"] == 2 else {}
        # one dict, as tune.report(metrics) takes it (issue 49 item 1)
        report({"score": score, "size": size_of(config["width"]), **extra}, checkpoint={"x": x, "epoch": epoch + 1})
"""


@pytest.fixture(scope="module")
def front_run(ray_local, tmp_path_factory):
    """The finished search (the project folder, the run folder)."""
    from search.driver import run_search

    root = tmp_path_factory.mktemp("own")
    project = root / "project"
    project.mkdir()
    (project / "shapes.py").write_text(SHAPES)
    (project / "train_fn.py").write_text(FUNCTION)
    raw = {"trainable": "train_fn.py:train",
           "experiment": {"name": "front", "num_samples": 6, "max_concurrent": 1, "seed": 3,
                          "storage_path": str(root / "runs"), "metric": ["score", "size"], "mode": ["max", "min"],
                          "constraints": ["size <= 40"], "reproducible": True, "report": False},
           "resources": {"cpus": 1},
           "training": {"epochs": 3},
           "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9},
                     "width": {"distribution": "choice", "values": [8, 16, 32]}}}
    (project / "space.yaml").write_text(yaml.safe_dump(raw))
    space = parse_space(raw, source=str(project / "space.yaml"))
    outcome = run_search(space, name="front")
    return project, Path(outcome.path), outcome


def point_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Each trial's last epoch whose objectives are both finite, recomputed here from the rows alone."""
    finite = frame[frame["score"].map(math.isfinite) & frame["size"].map(math.isfinite)]
    return finite.sort_values("epoch").groupby("trial_number").last()


def test_two_objectives_and_a_constraint_from_another_folder_give_the_recomputed_front(front_run):
    project, run, outcome = front_run
    frame = pd.read_parquet(run / "results.parquet")
    status = frame.groupby("trial_number")["status"].first()
    assert sorted(status.index) == list(range(6))
    assert status[1] == "DIVERGED" and (status.drop(1) == "COMPLETED").all(), \
        "every trial imported shapes.py beside the function, in Ray's workers"
    points = point_rows(frame)
    assert points.loc[1, "score"] == 10.0, "the diverged trial's point would dominate every other"
    candidates = points[(points["size"] <= 40) & (status[points.index] == "COMPLETED")]
    front = [n for n, t in candidates.iterrows()
             if not any(o["score"] >= t["score"] and o["size"] <= t["size"]
                        and (o["score"] > t["score"] or o["size"] < t["size"]) for _, o in candidates.iterrows())]
    pareto = yaml.safe_load((run / "pareto.yaml").read_text())
    assert [t["trial_number"] for t in pareto["trials"]] == front and front
    assert 1 not in front and all(t["status"] == "COMPLETED" for t in pareto["trials"])
    for entry in pareto["trials"]:
        assert entry["epoch"] == points.loc[entry["trial_number"], "epoch"]
        assert entry["metrics"]["score"] == points.loc[entry["trial_number"], "score"]
        assert list(entry["metrics"]) == ["score", "size", "only_trial_two"], "the function's names, not the loop's"
    assert list(pareto["constraints"]) == ["size <= 40"]
    study = optuna.load_study(study_name="front",
                              storage=optuna.storages.JournalStorage(JournalFileBackend(str(run / "optuna.journal"))))
    assert sorted(t.number for t in study.best_trials) == front, "the journal's own front agrees"
    assert study.trials[1].state == optuna.trial.TrialState.FAIL, "the diverged trial"
    infeasible = {t.number for t in study.trials if t.constraints.get("size <= 40", 0) > 0}
    assert infeasible == set(points.index[points["size"] > 40]), "the journal holds each trial's constraint"


def test_a_front_trial_replays_from_a_third_folder(front_run, tmp_path):
    project, run, _ = front_run
    pareto = yaml.safe_load((run / "pareto.yaml").read_text())
    entry = pareto["trials"][0]
    elsewhere = tmp_path / "third"
    elsewhere.mkdir()
    replay = subprocess.run([sys.executable, "-m", "trainable", "--config", str(run / "pareto.yaml"),
                             "--pick", str(entry["trial_number"])], cwd=elsewhere, capture_output=True, text=True,
                            timeout=120)
    assert replay.returncode == 0, replay.stderr
    last = replay.stdout.strip().splitlines()[-1]
    assert f"score {entry['metrics']['score']:.4f}" in last and f"size {entry['metrics']['size']:.4f}" in last


def test_a_metric_only_one_trial_reported_is_a_column_of_the_whole_table(front_run):
    """Issue 37 item 3: pandas read the first part's columns and dropped the others' metrics."""
    _, run, _ = front_run
    frame = pd.read_parquet(run / "results.parquet")
    assert "only_trial_two" in frame.columns
    assert set(frame.loc[frame["only_trial_two"].notna(), "trial_number"]) == {2}
    assert len({tuple(pq.read_schema(part).names) for part in (run / "results.parquet").glob("*.parquet")}) == 1, \
        "one schema for every part"


def test_once_its_folder_is_gone_the_front_replays_and_the_run_resumes_from_the_run_folders_copy(front_run, tmp_path,
                                                                                               capsys):
    """Issue 49 item 4: a `ray job submit --working-dir .` run named Ray's temporary copy of the user's files;
    once the cluster stopped, the replay and --resume failed (exit 2, file not found). The run folder keeps a
    copy of the function and the files beside it (code.yaml, with their sha256)."""
    import shutil

    from search.cli import load_space
    from search.driver import run_search

    project, run, _ = front_run
    record = yaml.safe_load((run / "code.yaml").read_text())
    assert {Path(p).name for p in record} == {"train_fn.py", "shapes.py"}, "the function and the module it imports"
    moved = project.with_name("checkout-elsewhere")  # the same code at another path, as on a new cluster
    shutil.move(project, moved)
    try:
        entry = yaml.safe_load((run / "pareto.yaml").read_text())["trials"][0]
        replay = subprocess.run([sys.executable, "-m", "trainable", "--config", str(run / "pareto.yaml"),
                                 "--pick", str(entry["trial_number"])], cwd=tmp_path, capture_output=True, text=True,
                                timeout=120)
        assert replay.returncode == 0, replay.stderr
        assert f"note: {project / 'train_fn.py'} is gone (a cluster job's temporary copy?); the run folder's copy " \
               f"runs: {run / 'code'}" in replay.stderr
        assert f"score {entry['metrics']['score']:.4f}" in replay.stdout.strip().splitlines()[-1]
        resumed = run_search(load_space(str(moved / "space.yaml"), [("experiment.num_samples", 7)]), name="front",
                             resume=True)
        last = resumed.results[resumed.results["trial_number"] == 6]
        assert len(last) and set(last["status"]) == {"COMPLETED"}, "the added trial ran the run folder's copy"
        assert "is gone (a cluster job's temporary copy?)" in capsys.readouterr().err
    finally:
        shutil.move(moved, project)


def test_a_function_file_that_imports_beside_it_resolves_from_any_folder(tmp_path, monkeypatch):
    """Issue 37 item 6: `No module named ...` when the search did not start in the function's folder."""
    from trainable.function import resolve_function

    project = tmp_path / "p"
    project.mkdir()
    (project / "helper_beside.py").write_text("VALUE = 41\n")
    (project / "fn.py").write_text(textwrap.dedent("""
        from helper_beside import VALUE

        def train(config, report, checkpoint=None):
            report(score=VALUE + 1)
    """))
    monkeypatch.chdir(tmp_path)  # not the function's folder
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), ".")])
    assert resolve_function(f"{project / 'fn.py'}:train").__module__.startswith("hpsearch_user_")


PARTIAL = """
import torch


def train(config, report, checkpoint=None):
    for epoch in range(config["epochs"]):
        score = config["lr"] * (epoch + 1)
        if config["trial_number"] == 3:  # a metric named like a config key: it would rewrite the config
            report(score=score, lr=123.0)
        # only trial 0 checkpoints: best.yaml named the best epoch with a checkpoint, not the best
        report(score=score, checkpoint={"epoch": epoch + 1} if config["trial_number"] == 0 else None)
"""


@pytest.fixture(scope="module")
def partial_run(ray_local, tmp_path_factory):
    from search.driver import run_search

    root = tmp_path_factory.mktemp("partial")
    (root / "fn.py").write_text(PARTIAL)
    raw = {"trainable": "fn.py:train",
           "experiment": {"name": "partial", "num_samples": 4, "max_concurrent": 1, "seed": 5, "metric": "score",
                          "mode": "max", "storage_path": str(root / "runs"), "report": False},
           "resources": {"cpus": 1}, "training": {"epochs": 2},
           "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}
    (root / "space.yaml").write_text(yaml.safe_dump(raw))
    outcome = run_search(parse_space(raw, source=str(root / "space.yaml")), name="partial")
    return Path(outcome.path), outcome


def test_best_is_the_best_value_whether_or_not_its_epoch_has_a_checkpoint(partial_run):
    """Issue 37 item 2: best.yaml, the Best: line, `runs` and `compare` named the best epoch with a checkpoint."""
    run, outcome = partial_run
    frame = pd.read_parquet(run / "results.parquet")
    scored = frame[frame["status"] != "ERROR"]
    top = scored.loc[scored["score"].idxmax()]
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert top["trial_number"] != 0, "the test needs a best trial without checkpoints"
    assert (best["result"]["trial_number"], best["result"]["epoch"], best["result"]["score"]) == (
        top["trial_number"], top["epoch"], top["score"])
    assert best["result"]["checkpoint"] is None and "kept no checkpoint" in best["result"]["note"]
    assert f"#{top['trial_number']}" in next(line for line in outcome.summary.splitlines() if line.startswith("Best"))


def test_a_metric_named_like_a_config_key_ends_its_trial_and_leaves_the_config_as_it_ran(partial_run):
    """Issue 37 item 1: `lr=123.0` became the trial's lr in results.parquet and best.yaml."""
    run, outcome = partial_run
    frame = pd.read_parquet(run / "results.parquet")
    three = frame[frame["trial_number"] == 3]
    assert set(three["status"]) == {"ERROR"} and (three["lr"] < 1).all()
    assert (frame["lr"] < 1).all(), "no row holds the reported 123"
    error = next((run).glob("trial_*/error.txt"))
    assert "a metric cannot be named lr: lr is a config key of this trial" in error.read_text()
    assert "a metric cannot be named lr" in outcome.summary


def test_best_yaml_of_a_function_replays_from_a_third_folder(partial_run, tmp_path):
    """best.yaml's trial, its epochs printed by `python -m trainable` started in a folder that is neither the
    function's nor the search's; its best epoch prints best.yaml's value."""
    run, _ = partial_run
    best = yaml.safe_load((run / "best.yaml").read_text())["result"]
    replay = subprocess.run([sys.executable, "-m", "trainable", "--config", str(run / "best.yaml")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert replay.returncode == 0, replay.stderr
    line = next(l for l in replay.stdout.splitlines() if l.startswith(f"Epoch [{best['epoch']}]"))
    assert f"score {best['score']:.4f}" in line
