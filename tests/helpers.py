"""Small spaces for tests: MNIST subsets, few epochs, so a search takes seconds on 2 cores."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import suppress
from pathlib import Path
from typing import Any

import yaml

from search.definition.space import Space, parse_space

REPO = Path(__file__).resolve().parents[1]

SMALL: dict[str, Any] = {
    # one trial at a time: a second slot costs each search a second trial process (about 6 CPU-seconds of
    # imports: torch, Ray Tune, torchmetrics); tests about trials running at once say max_concurrent: 2
    # and no report: its figures cost a search about 2 CPU-seconds of matplotlib; the tests of the report (and
    # those that read it) say report: true
    "experiment": {"name": "test", "num_samples": 4, "max_concurrent": 1, "seed": 7, "max_failures": 1,
                   "report": False},
    "resources": {"cpus": 1},
    "data": {"train_size": 2000, "val_size": 500},
    "training": {"epochs": 2},
    "model": {"hidden_sizes": [64]},
    "space": {
        "lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
        "batch_size": {"distribution": "choice", "values": [32, 64, 128]},
        "t_max": {"distribution": "randint", "low": 2, "high": 6},
        "clip_norm": {"distribution": "loguniform", "low": 0.5, "high": 5.0},
    },
}


# A training function as a user would write it (`trainable: FILE.py:FUNCTION`, docs/own-training-function.md),
# for tests about the driver rather than the MNIST loop: a number that learns toward 1, reported as score,
# val_acc and val_loss, checkpointed each epoch, in milliseconds.
TOY_FUNCTION = """
import torch


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    x = checkpoint["x"] if checkpoint else torch.zeros(())
    for epoch in range(start, config["epochs"]):
        noise = torch.randn((), generator=torch.Generator().manual_seed(config["seed"] + epoch))
        x = x + config["lr"] * (1 - x) + 0.01 * noise
        report(score=float(x), val_acc=float(x), val_loss=float(1 - x), checkpoint={"x": x, "epoch": epoch + 1})
"""


def toy_space_file(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    """SMALL's experiment and searched keys on TOY_FUNCTION (tmp_path/toy.py) instead of the MNIST loop, with
    `sections` merged in (section -> keys to set), written to tmp_path/space.yaml."""
    (tmp_path / "toy.py").write_text(TOY_FUNCTION)
    raw = {"trainable": "toy.py:train",
           "experiment": {**copy.deepcopy(SMALL["experiment"]), "metric": "val_acc", "mode": "max",
                          "storage_path": str(tmp_path / "runs")},
           "resources": copy.deepcopy(SMALL["resources"]),
           "training": {"epochs": SMALL["training"]["epochs"]},
           "space": copy.deepcopy(SMALL["space"])}
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def small_space(storage: Path, data_root: Path, **sections: dict[str, Any]) -> Space:
    """SMALL with `sections` merged in (section -> keys to set)."""
    raw = copy.deepcopy(SMALL)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    raw["experiment"]["storage_path"] = str(storage)
    raw["data"]["root"] = str(data_root)
    return parse_space(raw, source="tests")


def assert_outputs_agree(run: Path) -> None:
    """results.parquet, best.yaml and optuna.journal agree on the trials and on the best value.

    The promise after every fault (docs/stops-and-resume.md): the journal holds each ended trial
    of results.parquet once (an interrupted one only once it ends), and the best value of the
    journal's study, of best.yaml and of results.parquet's scoring rows (ERROR trials never best)
    is one number: a finished trial's (not ERROR, not INTERRUPTED). best.yaml may name a worse epoch only
    where its note says why (a checkpoint). The study's best trial is best.yaml's, and a trial a
    scheduler stopped is PRUNED there unless it is that best (search/searching/study.py).
    """
    import math

    import optuna
    import pandas as pd
    import yaml
    from optuna.storages.journal import JournalFileBackend
    from optuna.trial import TrialState

    frame = pd.read_parquet(run / "results.parquet")
    experiment = yaml.safe_load((run / "spec.yaml").read_text())["experiment"]
    metric, best_of = experiment["metric"], (max if experiment["mode"] == "max" else min)
    ended = frame[frame["status"] != "INTERRUPTED"]
    study = optuna.load_study(study_name=run.name,
                              storage=optuna.storages.JournalStorage(JournalFileBackend(str(run / "optuna.journal"))))
    journal = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    numbers = [t.user_attrs.get("trial_number", t.number) for t in journal]
    assert sorted(numbers) == sorted(set(ended["trial_number"])), (numbers, sorted(set(ended["trial_number"])))

    finite = frame[metric].map(lambda v: v is not None and math.isfinite(v))
    scoring = frame.loc[~frame["status"].isin(["ERROR", "INTERRUPTED"]) & finite, metric]
    best_path = run / "best.yaml"
    if scoring.empty:  # best.yaml, if any, is an interrupted or errored trial's and says so
        assert not [t for t in journal if t.state == TrialState.COMPLETE]
        if best_path.exists():
            assert "no trial has finished yet" in (note := yaml.safe_load(best_path.read_text())["result"].get(
                "note", "")) or "ended in ERROR" in note
        return
    best = best_of(scoring)
    assert study.best_value == best, (study.best_value, best)
    recorded = yaml.safe_load(best_path.read_text())["result"]
    if recorded[metric] != best:
        assert "checkpoint" in recorded.get("note", ""), (recorded, best)
    else:  # the study's best trial is best.yaml's (ties go to the earlier trial in both)
        assert study.best_trial.user_attrs["trial_number"] == recorded["trial_number"], (study.best_trial, recorded)
    # COMPLETE only for a trial that ran all its epochs, or for the one holding the best whatever its status
    # (Optuna's best reads COMPLETE trials only); a scheduler's stop is PRUNED, an error FAIL
    best_number = study.best_trial.user_attrs["trial_number"]
    for t in journal:
        status, number = t.user_attrs.get("status"), t.user_attrs.get("trial_number", t.number)
        if status == "ERROR":
            assert t.state == TrialState.FAIL, (number, status, t.state)
        elif status in ("STOPPED", "DIVERGED") and number != best_number:
            assert t.state == (TrialState.PRUNED if status == "STOPPED" else TrialState.FAIL), (number, status, t.state)


def assert_kept_checkpoints(run: Path, metric: str = "val_acc") -> None:
    """num_to_keep 1 (the default): each trial folder holds its best checkpoint by `metric` (max; of
    equal scores the newer) and its latest, nothing else, as its result.json names them.

    A folder without result.json is no trial of Tune's record: after a SIGKILL, a trial actor can
    still write checkpoints before Ray notices the driver is gone, with no driver to record them."""
    import json

    records = list(run.glob("trial_*/result.json"))
    assert records, f"no trial of Tune's record in {run}"
    for record in records:
        trial = record.parent
        reports = [json.loads(line) for line in record.read_text().splitlines()]
        saved = [(r[metric], i, r["checkpoint_dir_name"]) for i, r in enumerate(reports) if r.get("checkpoint_dir_name")]
        expected = {saved[-1][2], max(saved)[2]} if saved else set()
        assert {p.name for p in trial.glob("checkpoint_*")} == expected, trial.name


def stop_session(process: subprocess.Popen) -> None:
    """SIGKILL every process in `process`'s session (started with start_new_session=True): its Ray too."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def shut_down(cluster) -> None:
    """`cluster.shutdown()` (ray.cluster_utils), then this process's client of its own Ray's key-value store back.

    Ray's Cluster.shutdown resets the process's key-value client (it expects the process to be that cluster's
    driver) even where the process is connected to another Ray, conftest's `ray_local`: Tune's registry then
    kept every trainable in the process alone, and a later test of this worker that reads the registry
    (tests/units/execution/test_ray_internals.py) saw no store behind it."""
    import ray
    from ray.experimental import internal_kv

    cluster.shutdown()
    if ray.is_initialized() and not internal_kv._internal_kv_initialized():
        internal_kv._initialize_internal_kv(ray._private.worker.global_worker.gcs_client)


# A user's own model file and dataset function for the canonical loop, with no MNIST (tests/searches/test_user_code.py,
# the tests of what the command says): three Gaussian blobs in 6 dimensions, a dataset no download can provide.
BLOBS = """
    import torch

    def blobs(root, n=600, classes=3, with_test=True):
        g = torch.Generator().manual_seed(0)
        centers = torch.randn(classes, 6, generator=g) * 3
        def part(count):
            y = torch.randint(0, classes, (count,), generator=g)
            return centers[y] + torch.randn(count, 6, generator=g), y
        return part(n), None, (part(200) if with_test else None)
"""
MODEL = """
    from torch import nn

    def tiny(input_shape, num_classes, width=16):
        return nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], width), nn.ReLU(),
                             nn.Linear(width, num_classes))
"""


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def blob_space(tmp_path: Path, **sections) -> dict:
    """A canonical-loop space on BLOBS (a dataset function) and MODEL (a model file), both written in tmp_path."""
    write(tmp_path / "data.py", BLOBS)
    write(tmp_path / "net.py", MODEL)
    raw = {
        "experiment": {"name": "blobs", "num_samples": 3, "max_concurrent": 1, "seed": 1,
                       "storage_path": str(tmp_path / "runs")},
        "model": {"factory": "net.py:tiny"},
        "data": {"dataset": "data.py:blobs", "args": {"n": 600}, "val_size": 150},
        "training": {"epochs": 2, "optimizer": "adamw", "batch_size": 32},
        "space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.1},
                  "model.width": {"distribution": "choice", "values": [8, 32]}},
    }
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    return raw


def run_search_cli(space: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search", "--space", str(space), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
