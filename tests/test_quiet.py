"""Quiet by default: a search prints hpsearch's lines, not Ray's or Tune's misleading hints.

Tune would print `tensorboard --logdir /tmp/ray/session_.../driver_artifacts` (a temporary copy)
and, after Ctrl-C, `Tuner.restore(path=..., trainable=...)` beside hpsearch's own --resume
command; Ray warns about its auth token on every start. `search.restore` is the documented way
to Tune's Tuner of a run.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.helpers import SMALL

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, data_root):
    """`python -m search` on a small space, Ctrl-C (SIGINT) as soon as its first progress line shows."""
    root = tmp_path_factory.mktemp("quiet")
    space = {**SMALL, "experiment": {**SMALL["experiment"], "name": "quiet", "storage_path": str(root / "runs")},
             "data": {**SMALL["data"], "root": str(data_root)},
             "training": {"epochs": 10}}  # seconds of work left when the first epoch reports
    (root / "space.yaml").write_text(yaml.safe_dump(space))
    command = [sys.executable, "-m", "search", "--space", str(root / "space.yaml"), "--name", "quiet"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if "done] trial" in line and process.poll() is None:
            process.send_signal(signal.SIGINT)
            break
    rest, _ = process.communicate(timeout=600)
    return process.returncode, "".join(lines) + rest, root / "runs" / "quiet"


def test_a_search_prints_no_ray_hint_into_tmp_nor_tunes_restore_and_no_warning_twice(interrupted):
    code, output, run = interrupted
    assert code == 130, output[-3000:]
    assert "--resume --name quiet" in output, "hpsearch's own resume command"
    # the plain (non-terminal) progress line says how long the search has run and how long it has to go
    progress = next(line for line in output.splitlines() if "done] trial" in line)
    assert re.search(r"\| elapsed \d+:\d\d \| ETA (\d+:)?\d+:\d\d$", progress), progress
    assert "/tmp/ray" not in output and "tensorboard --logdir" not in output, output
    assert "Tuner.restore" not in output, output
    assert "Token authentication is enabled" not in output, output
    assert "A new study created" not in output, output  # Optuna's, once per study the searcher builds
    warnings = [line for line in output.splitlines() if "warn" in line.lower()]
    twice = [line for line, n in collections.Counter(warnings).items() if n > 1]
    assert not twice, twice


def test_search_restore_gives_tunes_tuner_of_a_run(interrupted, ray_local):
    import search

    code, _, run = interrupted
    grid = search.restore(str(run)).get_results()
    reported = sorted(Path(result.path).name.removeprefix("trial_") for result in grid if result.metrics)
    frame = pd.read_parquet(run / "results.parquet").dropna(subset=["epoch"])
    assert set(frame["trial_id"]) <= set(reported), "Tune's record of every trial in results.parquet"


def test_quiet_drops_only_the_records_it_names():
    """Each filter of `quiet`, on the logger Ray and Tune log it with: dropped; another record there still shows."""
    script = """if True:
        import logging
        from search.execution.session import quiet
        quiet()
        logging.getLogger("ray.tune.analysis.experiment_analysis").warning("Failed to fetch metrics for 2 trial(s):")
        logging.getLogger("ray.tune.tune").error("Trials did not complete: [t1]")
        logging.getLogger("ray.tune.logger.logger").warning("Remote file not found: /runs/x/trial_1/result.json")
        import ray.tune.utils.util as util  # Tune's own warn_if_slow, which says so only a minute after its start
        util.START_OF_TIME -= 120
        with util.warn_if_slow("process_trial_result", threshold=1e-9):
            pass
        logging.getLogger("ray.tune.execution.tune_controller").warning(
            "Processing trial results took 0.600 s, which may be a performance bottleneck. Please consider ...")
        logging.getLogger("ray.tune.analysis.experiment_analysis").warning("a warning that is news")
    """
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = done.stderr.strip().splitlines()
    assert len(shown) == 1 and shown[0].endswith("a warning that is news"), shown
