"""Function trainables (`trainable: FILE.py:FUNCTION`) in searches of a toy function: a restart from its
checkpoint, the same results again, contract errors ending a search, a finished run resumed without Ray; and
the driver of a plain function without torch, and a search's start without Python's cyclic collector (the
contract on its own, without Ray: tests/units/trainable/test_function_contract.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from search.definition.space import parse_space
from tests.conftest import REPO
from tests.helpers import toy_space_file
from search.store.run_folder import RunFolder
from search.store.tune_record import STATUSES_FILE, _saved_trials
from search.store.storage import Storage
from trainable.errors import ConfigError
from trainable.report import EPOCH_COLUMNS, PACKED_COLUMNS
from tests.units.trainable.test_function_contract import toy_space


# A function of plain Python (as a scikit-learn or XGBoost user's is): nothing of its own imports torch
PLAIN = """
def train(config, report, checkpoint=None):
    for epoch in range(config["epochs"]):
        report(score=config["lr"] * (epoch + 1))
"""


# In a fresh process: the driver's modules, the checks before Ray, the trainable handed to Tune and Tune's
# callbacks with the default TensorBoard logger; then tensorboardX writes an event, and torch still imports
DRIVER_OF_A_PLAIN_FUNCTION = """
import sys, yaml
from search.driver import run_search
from search.definition.space import parse_space
from search.execution.preflight import check_local_capacity, check_search
from search.execution.tuner import make_scheduler, tracker_callbacks
from trainable.adapter import tune_trial

space = parse_space(yaml.safe_load(open(sys.argv[1])), source=sys.argv[1])
check_search(space)
check_local_capacity(space)
space.kind.trainable(space, tune_trial)
[events] = tracker_callbacks(space, None)  # loggers: [tensorboard], the default
make_scheduler(space)
print(sorted(m for m in sys.modules if m.split(".")[0] == "torch")[:3])

from tensorboardX import SummaryWriter
with SummaryWriter(sys.argv[2]) as writer:
    writer.add_scalar("score", 0.5, 1)
import torch
print(type(events).__name__, float(torch.ones(2).sum()))
"""


def test_the_driver_of_a_search_of_a_plain_function_imports_no_torch(tmp_path):
    """torch's import is about 1.5 s of a driver's start, and a function of plain Python gives the driver no
    use for it: not the checks, the adapter, Tune's callbacks nor tensorboardX's (tuner.py
    tensorboardx_without_torch)."""
    (tmp_path / "plain.py").write_text(PLAIN)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"trainable": "plain.py:train", "training": {"epochs": 2},
                                     "experiment": {"metric": "score", "mode": "max", "scheduler": "asha",
                                                    "storage_path": str(tmp_path / "runs")},
                                     "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}))
    done = subprocess.run([sys.executable, "-c", DRIVER_OF_A_PLAIN_FUNCTION, str(space), str(tmp_path / "events")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    imported, after = done.stdout.strip().splitlines()
    assert imported == "[]", f"the driver imported {imported}"
    assert after == "EventFiles 2.0", "tensorboardX imported without torch, and torch imports after it"
    [written] = (tmp_path / "events").glob("events.out.tfevents.*")
    assert b"score" in written.read_bytes()


# The command's own entry (search/__main__.py calls run()), with Python's collections counted from its call: how
# many ran before the trials' start had frozen the start's objects (gc.get_freeze_count() still 0), and the collector's
# state at the exit handlers
COUNTED_COMMAND = """
import atexit, gc, sys
sys.argv = ["search", "--space", sys.argv[1], "--quiet"]
from search.cli import run
before_trials = []
gc.callbacks.append(lambda phase, info: phase == "start" and gc.get_freeze_count() == 0
                    and before_trials.append(info["generation"]))
atexit.register(lambda: print("collections", before_trials, gc.isenabled(), gc.get_freeze_count()))
run()
"""


@pytest.mark.slow
def test_a_search_starts_without_the_cyclic_collector_and_runs_its_trials_with_it(tmp_path):
    """The start imports Ray, Tune, Optuna, pandas and the user's module: with the collector on, six full
    collections (0.5 s of the driver) scanned what those imports made; off until the trials start, then one
    collection and the start's objects frozen (search/execution/collector.py)."""
    space = toy_space_file(tmp_path, experiment={"num_samples": 2, "max_concurrent": 2}, training={"epochs": 1})
    done = subprocess.run([sys.executable, "-c", COUNTED_COMMAND, str(space)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("collections"))
    assert line == "collections [2] True 0", "one full collection before the trials, the collector on at the end"


@pytest.mark.slow
def test_a_toy_function_searches_restarts_from_its_checkpoint_and_reproduces(ray_local, tmp_path, capsys):
    from search.driver import run_search

    (tmp_path / "fail-once").write_text("")
    first = run_search(parse_space(toy_space(tmp_path, max_concurrent=1), source=str(tmp_path / "space.yaml")),
                       name="one")
    frame = first.results
    assert (frame["status"] == "COMPLETED").all() and sorted(frame["trial_number"].unique()) == [0, 1, 2, 3]
    assert not (tmp_path / "fail-once").exists(), "trial 1 failed once"
    restarted = frame[frame["trial_number"] == 1].sort_values("epoch")
    assert list(restarted["epoch"]) == [1, 2, 3] and list(restarted["resumed_from"]) == [0, 0, 2]
    run = Path(first.path)
    best = yaml.safe_load((run / "best.yaml").read_text())
    assert best["result"]["score"] == frame["score"].max() and "test_acc" not in best["result"]
    assert best["trainable"].endswith("toy.py:train") and "lr" in best
    assert (run / "report.html").exists() and (run / "optuna.journal").exists()
    # export has no model to rebuild: it says so (not a checkpoint "format" mismatch)
    from search.outputs.export import chosen_checkpoint
    from search.store.run_folder import open_run

    with pytest.raises(ConfigError, match=r"RUN: is a search of your own training function .*toy.py:train"):
        chosen_checkpoint(open_run(str(run)))

    again = run_search(parse_space(toy_space(tmp_path, max_concurrent=3), source=str(tmp_path / "space.yaml")),
                       name="three").results
    columns = ["trial_number", "epoch", "lr", "seed", "score"]
    table = lambda f: f.sort_values(["trial_number", "epoch"])[columns].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(table(frame), table(again))
    assert not math.isnan(again["score"].iloc[0])

    # a finished run resumes (with another space file: a note, not a crash on the `trainable:` string)
    assert "(#1) failed and restarts from its last checkpoint (experiment.max_failures): RuntimeError: killed " \
           "once" in capsys.readouterr().out, "said once, as it happened"
    resumed = run_search(parse_space(toy_space(tmp_path, max_concurrent=3), source=str(tmp_path / "space.yaml")),
                         name="one", resume=True)
    pd.testing.assert_frame_equal(table(resumed.results), table(frame))
    assert "differs from the stored spec of this run in experiment.max_concurrent;" in capsys.readouterr().err
    # and `compare` lists the two runs' differences
    from search.store.run_folder import RunFolder
    from search.outputs.runs import compare
    from search.store.storage import Storage

    storage = Storage.at(str(tmp_path / "runs"))
    text = compare(RunFolder(storage, "one"), RunFolder(storage, "three"))
    assert "Spec differences (1):" in text and "experiment.max_concurrent" in text


SOMETIMES_SILENT = '''
def train(config, report, checkpoint=None):
    if config["trial_number"] == 0:
        return  # an early return before the first report (an empty loop, a bug): only this trial fails
    for epoch in range(config["epochs"]):
        report(score=config["lr"] * (epoch + 1))
'''


@pytest.mark.slow
def test_a_function_that_returns_without_a_report_fails_its_trial_not_the_search(ray_local, tmp_path, capsys):
    from search.driver import run_search

    raw = toy_space(tmp_path, max_concurrent=1, num_samples=2, max_failures=1)  # writes the toy's toy.py
    (tmp_path / "toy.py").write_text(SOMETIMES_SILENT)
    outcome = run_search(parse_space(raw, source=str(tmp_path / "space.yaml")), name="silent")
    status = outcome.results.drop_duplicates("trial_number", keep="last").set_index("trial_number")["status"]
    assert status.to_dict() == {0: "ERROR", 1: "COMPLETED"}
    assert ("experiment.metric: must be among the metrics the function reports (none: it returned without "
            "calling report), got score") in outcome.summary
    said = capsys.readouterr().out  # no restart: the same on every try (issue 49 item 2)
    assert "(#0) failed and ended in ERROR (not restarted: it broke the function's contract" in said
    assert "restarts from" not in said
    # the trial without a report adds none of the canonical loop's columns (best.yaml had them as NaN)
    loops_own = set(EPOCH_COLUMNS) - {"epoch", "epoch_seconds"}
    assert not loops_own & set(outcome.results.columns)
    best = yaml.safe_load((Path(outcome.path) / "best.yaml").read_text())["result"]
    assert best["trial_number"] == 1 and not loops_own & set(best)
    assert not [k for k, v in best.items() if isinstance(v, float) and math.isnan(v)]


# Tune's own report style, with the metric as the only positional: the same contract error on every trial
POSITIONAL = '''
def train(config, report, checkpoint=None):
    report(config["lr"])
'''


@pytest.mark.slow
def test_a_search_whose_first_trials_all_break_the_contract_stops_after_three_without_restarts(ray_local, tmp_path,
                                                                                             capsys):
    """Issue 49 item 2: a deterministic error was restarted max_failures times on every trial, for minutes."""
    from search.driver import run_search

    raw = toy_space(tmp_path, max_concurrent=1, num_samples=8, max_failures=2)
    (tmp_path / "toy.py").write_text(POSITIONAL)
    outcome = run_search(parse_space(raw, source=str(tmp_path / "space.yaml")), name="positional")
    assert not outcome.succeeded  # the command exits 3
    status = outcome.results.drop_duplicates("trial_number", keep="last").set_index("trial_number")["status"]
    assert status.to_dict() == {0: "ERROR", 1: "ERROR", 2: "ERROR"}, "no trial starts after the third"
    errors = sorted(Path(outcome.path).glob("*/error.txt"))
    assert len(errors) == 3 and all(e.read_text().count("Failure # ") == 1 for e in errors), "none restarted"
    said = capsys.readouterr().out
    assert "restarts from" not in said and said.count("got a positional float") == 1, said
    assert "(#1) failed and ended in ERROR (not restarted: it broke the function's contract, as it would on " \
           "every try): the same error as trial #0" in said
    assert "stopping the search: its first 3 trials failed with the same error and none succeeded" in said
    summary = outcome.summary
    assert summary.count("got a positional float") == 2, summary  # the Failed line and the Ended line
    assert "Failed: 3 trials with the same error: " in summary
    assert ("Ended: ended after its first 3 trials (#0, #1, #2) all failed with the same error and none succeeded, "
            "so no more were started (3 of 8 trials ran): ") in summary


NO_CHECKPOINTS = '''
def train(config, report, checkpoint=None):
    for epoch in range(config["epochs"]):
        report(score=config["lr"] * (epoch + 1))
'''


@pytest.mark.slow
def test_a_finished_search_of_a_function_that_keeps_no_checkpoint_resumes_without_starting_ray(ray_local, tmp_path,
                                                                                           capsys):
    """best.yaml's checkpoint is null where the function saved none: --resume of the finished run says so from
    the run folder (it started Ray and ran Tune's restore again: 37 s at 1,000 no-op trials)."""
    from search.driver import run_search

    raw = toy_space(tmp_path, max_concurrent=1, num_samples=2, max_failures=0)
    (tmp_path / "toy.py").write_text(NO_CHECKPOINTS)
    space = parse_space(raw, source=str(tmp_path / "space.yaml"))
    outcome = run_search(space, name="plain")
    best = yaml.safe_load((Path(outcome.path) / "best.yaml").read_text())["result"]
    assert best["checkpoint"] is None
    assert best["note"] == (f"epoch {best['epoch']} of trial #{best['trial_number']}: it kept no checkpoint (its function's "
                            "report(checkpoint=...), num_to_keep); its config replays without one")
    # export says so, and sends nobody to --trial N, which has no checkpoint to export either
    from search.cli import main

    capsys.readouterr()
    assert main(["export", outcome.path, "-o", str(tmp_path / "best.pt")]) == 2
    assert (f"no other epoch of trial #{best['trial_number']} kept one that reads either, so --trial "
            f"{best['trial_number']} cannot export it") in capsys.readouterr().err
    # where each trial ran and where its slot time went reach results.parquet, and Tune keeps no running
    # statistics of them (trainable/report.py PACKED: 1.5 KB of the driver's memory per number per trial)
    [state] = Path(outcome.path).glob("experiment_state-*.json")
    analysed = [set(json.loads(metadata)["metric_analysis"]) for _, metadata in json.loads(state.read_text())["trial_data"]]
    assert len(analysed) == 2 and all("score" in a and not a & set(PACKED_COLUMNS) for a in analysed), analysed
    first_rows = outcome.results.sort_values("epoch").groupby("trial_id").head(1)
    assert first_rows[["node", "hostname", "device", "world_size", "ready_at", "started_at", "finished_at"]].notna().all(
        axis=None), first_rows.T
    # Tune's statuses as the end read them: the resume reads them there, not Tune's record (20 s at 10,000 trials)
    folder = RunFolder(Storage.at(str(tmp_path / "runs")), "plain")
    statuses = json.loads((Path(outcome.path) / STATUSES_FILE).read_text())["statuses"]
    assert statuses == {t: status for t, (status, _) in folder.record.saved_trials().items()} and len(statuses) == 2
    _saved_trials.cache_clear()
    again = run_search(space, name="plain", resume=True)
    assert "Search plain is finished: all 2 of experiment.num_samples 2 trials ended (2 completed)" in again.summary
    assert "(Ray was not started)" in again.summary
    assert _saved_trials.cache_info().misses == 0, "the resume read Tune's record"
    # without Tune's tuner.pkl there is nothing to restore: the record answers, and says so
    tuner = Path(outcome.path) / "tuner.pkl"
    kept = tuner.read_bytes()
    tuner.unlink()
    with pytest.raises(ConfigError, match="no saved experiment state of Tune"):
        folder.check_record()
    tuner.write_bytes(kept)
    # a snapshot of Tune's after the end (a resume that ran) makes statuses.json stale: the record answers
    state.write_text(state.read_text() + " ")
    assert folder.record.saved_statuses() == statuses and _saved_trials.cache_info().misses == 1
