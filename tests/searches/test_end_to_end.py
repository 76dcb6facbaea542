"""Searches end to end as a user runs them: an asynchronous search, a search on `file://`
storage (claim, resume, report), and `--resume` without `--name` among runs of several spaces.

Real local Ray (the `ray_local` fixture), real Optuna, MNIST subsets of 1000 examples.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from search.driver import run_search
from search.store.results import COMPLETED, ERROR
from search.store.storage import Storage
from search.searching.study import JOURNAL_FILE, journal
from tests.helpers import small_space
from trainable.errors import ConfigError

from search.store.run_folder import run_folder_name

REPO = Path(__file__).resolve().parents[2]
TINY = {"data": {"train_size": 1000, "val_size": 300}, "training": {"epochs": 1}}


# ---- reproducible: false ----

@pytest.fixture(scope="module")
def asynchronous(ray_local, tmp_path_factory, data_root):
    space = small_space(tmp_path_factory.mktemp("runs"), data_root, **TINY,
                        experiment={"reproducible": False, "num_samples": 3, "max_concurrent": 2})
    return space, run_search(space, name="async")


@pytest.mark.slow
def test_an_asynchronous_search_runs_to_the_end_and_says_it_was_asynchronous(asynchronous):
    space, outcome = asynchronous
    run = Path(outcome.path)
    frame = pd.read_parquet(run / "results.parquet")
    assert frame["trial_id"].nunique() == 3 and set(frame["status"]) == {COMPLETED}
    assert sorted(frame["trial_number"].unique()) == [0, 1, 2]
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert best["result"]["val_acc"] == frame["val_acc"].max()
    assert not outcome.interrupted
    assert "Search: asynchronous (experiment.reproducible: false)" in outcome.summary
    assert "Top trials by val_acc (max), 3 trials: 3 completed" in outcome.summary


# ---- storage given as a file:// URI ----

def failing_trial_number(number: int):
    """The real trainable, except that trial `number` fails (a closure: Ray pickles it by value)."""

    def trial(config, **data):
        from trainable.adapter import tune_trial

        if config["trial_number"] == number:
            raise RuntimeError(f"trial #{number} fails on purpose")
        tune_trial(config, **data)

    return trial


@pytest.fixture(scope="module")
def on_uri_storage(ray_local, tmp_path_factory, data_root):
    """A search on file:// storage whose trial #1 fails, then its resume, which reruns it."""
    root = tmp_path_factory.mktemp("uri") / "runs"
    space = small_space(f"file://{root}", data_root, **TINY,
                        experiment={"num_samples": 2, "max_concurrent": 2, "max_failures": 0})
    first = run_search(space, name="remote", trainable=failing_trial_number(1))
    resumed = run_search(space, name="remote", resume=True)
    return root, space, first, resumed


@pytest.mark.slow
def test_a_search_on_file_uri_storage_claims_its_folder_and_writes_its_outputs_there(on_uri_storage):
    root, space, first, _ = on_uri_storage
    run = root / "remote"
    assert first.path == f"file://{run}"
    assert (run / "spec.yaml").is_file(), "the claim wrote the spec"
    frame = first.results.drop_duplicates("trial_id").set_index("trial_number")["status"]
    assert frame.to_dict() == {0: COMPLETED, 1: ERROR}
    assert "Failed: " in first.summary and "trial #1 fails on purpose" in first.summary
    failed = next(r for r in first.results.itertuples() if r.status == ERROR).trial_id
    assert f"Failed: file://{run}/trial_{failed}: " in first.summary, "where the user finds error.txt, scheme included"
    # and a second search with that name is refused: the folder is claimed
    with pytest.raises(ConfigError, match="already holds a search"):
        run_folder_name(space, Storage.at(f"file://{root}"), "remote", resume=False)


@pytest.mark.slow
def test_a_search_on_file_uri_storage_resumes_and_reruns_the_failed_trial(on_uri_storage):
    root, _, first, resumed = on_uri_storage
    run = root / "remote"
    frame = pd.read_parquet(run / "results.parquet")
    assert frame["trial_id"].nunique() == 2 and set(frame["status"]) == {COMPLETED}
    kept = first.results[first.results["status"] == COMPLETED]
    columns = ["trial_number", "epoch", "seed", "lr", "val_acc"]
    # the trials that completed before the resume are kept as they were
    pd.testing.assert_frame_equal(
        frame[frame["trial_number"].isin(kept["trial_number"])].sort_values("trial_number")[columns]
        .reset_index(drop=True), kept.sort_values("trial_number")[columns].reset_index(drop=True), check_dtype=False)
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert best["result"]["val_acc"] == frame["val_acc"].max()
    # the re-run names best.yaml where it is, which python -m trainable reads (issue 51)
    assert f"python -m trainable --config file://{run / 'best.yaml'}" in (run / "best.yaml").read_text()
    assert not resumed.interrupted and "Top trials by val_acc (max), 2 trials: 2 completed" in resumed.summary


@pytest.mark.slow
def test_a_search_on_file_uri_storage_copies_its_journal_into_the_run_folder(on_uri_storage):
    root, _, _, resumed = on_uri_storage
    run = root / "remote"
    study = optuna.load_study(study_name="remote", storage=journal(str(run / JOURNAL_FILE)))
    frame = resumed.results.drop_duplicates("trial_number")
    assert [t.number for t in study.trials] == sorted(frame["trial_number"]), "trial k is trial_number k"
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * len(frame), "the rerun trial listed once"


@pytest.mark.slow
def test_a_search_with_report_false_draws_none_and_the_report_command_it_names_draws_it_on_uri_storage(
        on_uri_storage):
    root, _, _, resumed = on_uri_storage
    run = root / "remote"
    assert not (run / "report.html").exists() and not (run / "report").exists(), "experiment.report: false"
    said = next(line for line in resumed.summary.splitlines() if line.startswith("Report: "))
    assert said == f"Report: none (experiment.report is false); draw it with: python -m search report {resumed.path}"
    command = said.split("draw it with: ")[1].split()
    done = subprocess.run([sys.executable, *command[1:]], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{resumed.path}/report.html"
    assert (run / "report.html").is_file() and len(list((run / "report").glob("*.png"))) == 6


# ---- --resume without --name ----

@pytest.mark.parametrize("folders, newest", [
    (["mnist-20261101-090000", "mnist-large-20261201-090000", "mnist-20261130-101500"], "mnist-20261130-101500"),
    (["mnist-20261130-101500", "mnist-20261130-101500-2", "mnist-large-20261201-090000"], "mnist-20261130-101500-2"),
    (["mnist-20261130-101500-2", "mnist-20261130-101500-10", "mnist-20261130-101459"], "mnist-20261130-101500-10"),
    (["mnist-20261130-101500", "mnist-20261201-090000-copy", "mnist-notes", "mnist-large-20261202-090000"],
     "mnist-20261130-101500"),
], ids=["another space's newer run", "a -2 suffix", "-10 after -2", "names not of the pattern"])
def test_resume_without_a_name_picks_the_newest_run_of_this_space(tmp_path, folders, newest):
    for folder in folders:
        (tmp_path / folder).mkdir()
    (tmp_path / "mnist-20261231-235959.txt").write_text("a file, not a run")
    space = small_space(tmp_path, tmp_path, experiment={"name": "mnist"})
    assert run_folder_name(space, Storage.at(str(tmp_path)), None, resume=True) == newest
