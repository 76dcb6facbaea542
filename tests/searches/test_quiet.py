"""Quiet by default: a search prints hpsearch's lines, not Ray's or Tune's misleading hints.

Tune would print `tensorboard --logdir /tmp/ray/session_.../driver_artifacts` (a temporary copy)
and, after Ctrl-C, `Tuner.restore(path=..., trainable=...)` beside hpsearch's own --resume
command; Ray warns about its auth token on every start. `search.restore` is the documented way
to Tune's Tuner of a run. With `--quiet` (`search.run(quiet=True)`) progress is one line per
finished trial; a function trainable's search warns about nothing (Tune's TensorBoard logger did).
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

from tests.helpers import SMALL, TOY_FUNCTION

REPO = Path(__file__).resolve().parents[2]

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


# a finished trial's --quiet line: [k/n done] trial #N (id) STATUS, E/EPOCHS epochs, best METRIC V | best ... | ETA ...
TRIAL_LINE = re.compile(r"^\[\s*(\d+)/(\d+) done\] trial #(\d+) \((\w+)\) ([A-Z]+), (\d+)/(\d+) epochs, "
                        r"best val_acc (\d\.\d{4}) \| best \d\.\d{4} \| elapsed \d+:\d\d \| ETA (\d+:)?(\d+:\d\d|\?)$")


def toy_space(root: Path, trials: int, epochs: int) -> Path:
    """TOY_FUNCTION (a function trainable) searched over lr, with Tune's TensorBoard logger (the default loggers)."""
    (root / "toy.py").write_text(TOY_FUNCTION)
    path = root / "space.yaml"
    path.write_text(yaml.safe_dump({
        "trainable": "toy.py:train",
        "experiment": {"name": "toy", "metric": "val_acc", "mode": "max", "num_samples": trials,
                       "max_concurrent": 1, "seed": 5, "storage_path": str(root / "runs")},
        "resources": {"cpus": 1},
        "training": {"epochs": epochs},
        "space": {"lr": {"distribution": "loguniform", "low": 0.05, "high": 0.9}}}))
    return path


@pytest.fixture(scope="module")
def quiet_function_search(tmp_path_factory):
    """`python -m search --quiet` on a function trainable: 3 trials x 3 epochs, stdout and stderr apart."""
    root = tmp_path_factory.mktemp("quiet-function")
    command = [sys.executable, "-m", "search", "--space", str(toy_space(root, 3, 3)), "--name", "toy", "--quiet"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return done.stdout, done.stderr, root / "runs" / "toy"


def test_quiet_prints_one_line_per_finished_trial_with_its_status_epochs_and_best(quiet_function_search):
    out, _, run = quiet_function_search
    frame = pd.read_parquet(run / "results.parquet")
    progress = [line for line in out.splitlines() if "done] trial" in line]
    assert len(progress) == 3, out
    seen = {}
    for line in progress:
        matched = TRIAL_LINE.match(line)
        assert matched, line
        done, total, number, trial_id, status, epochs, of, best = matched.groups()[:8]
        assert total == "3" and (epochs, of) == ("3", "3") and status == "COMPLETED", line
        rows = frame[frame["trial_id"] == trial_id]
        assert int(number) == rows["trial_number"].iloc[0] and best == f"{rows['val_acc'].max():.4f}", line
        seen[int(done)] = trial_id
    assert sorted(seen) == [1, 2, 3] and len(set(seen.values())) == 3, "each trial once, counted as it ended"
    assert out.count("done]") == 3, "no line per epoch"


def test_a_function_search_says_no_tensorboardx_warning_and_still_writes_event_files(quiet_function_search):
    out, err, run = quiet_function_search
    both = (out + err).lower()
    assert "tensorboardx" not in both and "tbxloggercallback" not in both, err
    assert "invalid value" not in both, err
    trials = sorted(run.glob("trial_*"))
    assert len(trials) == 3
    for trial in trials:
        [events] = trial.glob("events.out.tfevents.*")  # loggers: [tensorboard], the default
        assert b"ray/tune/val_acc" in events.read_bytes(), f"the metric is in {trial.name}'s event file"


def test_a_function_search_names_no_test_metric_it_does_not_have(quiet_function_search):
    out, _, _ = quiet_function_search
    best = next(line for line in out.splitlines() if line.startswith("Best: trial #"))
    assert "test_" not in best and "n/a" not in best, best
    assert re.search(r"val_acc \d\.\d{4} \(seed \d+\)$", best), best


def test_search_run_quiet_prints_a_line_per_trial(ray_local, tmp_path, capsys):
    """The Python API's `quiet`, the CLI's --quiet by the same name (the default's line per epoch: test_faults waits on it)."""
    import search

    search.run(toy_space(tmp_path, 2, 2), name="quiet", quiet=True)
    quiet = [line for line in capsys.readouterr().out.splitlines() if "done] trial" in line]
    assert len(quiet) == 2 and all(TRIAL_LINE.match(line) for line in quiet), quiet


def test_search_run_refuses_a_quiet_that_is_not_a_bool():
    import search
    from trainable.errors import ConfigError

    with pytest.raises(ConfigError, match=r"quiet: must be True or False, as the --quiet flag, got 'yes'"):
        search.run({"space": {}}, quiet="yes")
