"""Nothing lost, nothing silent: stops, damaged files and hostile input, each tried as a user would."""

from __future__ import annotations

import copy
import gzip
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from search.store.results import COMPLETED, INTERRUPTED
from search.definition.ranking import ranked
from tests.helpers import SMALL, assert_kept_checkpoints, assert_outputs_agree, toy_space_file
from tests.searches.test_resume import wait_for
from tests.units.trainable.test_trainable_data import write_idx
from trainable.data import RAW_FILES, load_dataset
from trainable.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]


def space_file(tmp_path: Path, data_root: Path, **sections) -> Path:
    raw = copy.deepcopy(SMALL)
    raw["experiment"].update(storage_path=str(tmp_path / "runs"))
    raw["data"].update(root=str(data_root))
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def search_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "search", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def no_traceback(done: subprocess.CompletedProcess) -> bool:
    return "Traceback" not in done.stderr and "Traceback" not in done.stdout


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory, data_root):
    """One finished search (2 trials x 2 epochs of the MNIST loop, on 500 examples) whose run folder tests
    copy and damage: the loop's, since best.yaml's test metrics come from its checkpoints.

    Run in-process (on the session's Ray), from its space file as the command reads it: what the
    tests check is the run folder it leaves, not the command that made it."""
    from search.cli import load_space
    from search.driver import run_search

    base = tmp_path_factory.mktemp("finished")
    space = space_file(base, data_root, experiment={"num_samples": 2}, data={"train_size": 500})
    done = run_search(load_space(str(space), []), name="done")
    assert done.succeeded and not done.interrupted, done.summary
    return space, base / "runs" / "done"


def resume_in_process(space: Path, capsys, name: str = "done") -> tuple[str, str]:
    """`--resume --name NAME` of a (copied) run, in this process (on the session's Ray): the tests
    using it are about what a resume derives from a damaged or stopped folder, not the command. The search
    must return as one the command exits 0 for; (stdout with its summary, stderr) it printed."""
    from search.cli import load_space
    from search.driver import run_search

    capsys.readouterr()  # only what the resume prints
    outcome = run_search(load_space(str(space), []), name=name, resume=True)
    printed = capsys.readouterr()
    assert outcome.succeeded and not outcome.interrupted, outcome.summary  # the command's exit 0
    out, err = printed.out + "\n" + outcome.summary, printed.err  # the command prints the summary
    assert "Traceback" not in out and "Traceback" not in err, err[-2000:]
    return out, err


def copy_run(finished, tmp_path: Path, name: str = "done") -> tuple[Path, Path]:
    """The finished run at the same storage path (Tune's records point there), as a fresh copy."""
    space, run = finished
    raw = yaml.safe_load(space.read_text())
    raw["experiment"]["storage_path"] = str(tmp_path / "runs")
    copied = tmp_path / "space.yaml"
    copied.write_text(yaml.safe_dump(raw))
    shutil.copytree(run, tmp_path / "runs" / name, symlinks=True)
    spec = tmp_path / "runs" / name / "spec.yaml"  # the copy is the run now: it says where it lives
    spec.write_text(spec.read_text().replace(str(run), str(tmp_path / "runs" / name)))
    return copied, tmp_path / "runs" / name


# ---- results lost or recorded falsely ----

@pytest.mark.slow
def test_a_damaged_experiment_state_refuses_to_resume_and_keeps_every_row(finished, tmp_path):
    space, run = copy_run(finished, tmp_path)
    before = pd.read_parquet(run / "results.parquet")
    [state] = run.glob("experiment_state-*.json")
    state.write_bytes(state.read_bytes()[: len(state.read_bytes()) // 3])  # truncated mid-write
    done = search_cli("--space", str(space), "--name", "done", "--resume")
    assert done.returncode == 2 and no_traceback(done), done.stderr[-2000:]
    assert "cannot be read" in done.stderr and "resuming would start the search over" in done.stderr
    after = pd.read_parquet(run / "results.parquet")
    pd.testing.assert_frame_equal(after.sort_values(["trial_id", "epoch"]).reset_index(drop=True),
                                  before.sort_values(["trial_id", "epoch"]).reset_index(drop=True))


@pytest.mark.slow
def test_a_copied_run_folder_is_refused_not_resumed_into_the_original(finished, tmp_path):
    space, run = finished
    shutil.copytree(run, tmp_path / "runs" / "copy")
    raw = yaml.safe_load(space.read_text())
    raw["experiment"]["storage_path"] = str(tmp_path / "runs")
    moved = tmp_path / "space.yaml"
    moved.write_text(yaml.safe_dump(raw))
    done = search_cli("--space", str(moved), "--name", "copy", "--resume")
    assert done.returncode == 2 and no_traceback(done)
    assert f"this run was started at {run}" in done.stderr


@pytest.mark.slow
def test_a_corrupt_best_checkpoint_keeps_the_best_and_says_its_checkpoint_does_not_read(finished, tmp_path, capsys):
    space, run = copy_run(finished, tmp_path)
    best = yaml.safe_load((run / "best.yaml").read_text())["result"]
    frame = pd.read_parquet(run / "results.parquet")
    row = frame[(frame["trial_id"] == best["trial_id"]) & (frame["epoch"] == best["epoch"])]
    [checkpoint] = [p for p in (run / f"trial_{best['trial_id']}").glob("checkpoint_*")
                    if int(p.name.split("_")[1]) == best["epoch"] - 1]
    (checkpoint / "state.pt").write_bytes(b"\x00" * 100)
    resume_in_process(space, capsys)  # derives the outputs again
    again = yaml.safe_load((run / "best.yaml").read_text())["result"]
    # the best is the best value (issue 37), not the next best row whose checkpoint reads
    assert "its checkpoint does not read" in again["note"] and str(checkpoint / "state.pt") in again["note"]
    assert (again["trial_id"], again["epoch"], again["val_acc"]) == (best["trial_id"], best["epoch"],
                                                                     row["val_acc"].iloc[0])
    assert again["test_acc"] is None and again["checkpoint"] is None


def test_a_best_yaml_older_than_the_last_trials_is_derived_again_on_resume(finished, tmp_path, capsys):
    # a stop between results.parquet and best.yaml at a resume's end: every trial has its rows, but
    # best.yaml is the one of before the resume, the best of fewer trials
    space, run = copy_run(finished, tmp_path)
    best = yaml.safe_load((run / "best.yaml").read_text())
    trials = best["result"]["trials"]
    assert trials == pd.read_parquet(run / "results.parquet")["trial_id"].nunique()
    stale = {**best, "result": {**best["result"], "trials": trials - 1, "val_acc": 0.1}}
    (run / "best.yaml").write_text(yaml.safe_dump(stale))
    out, _ = resume_in_process(space, capsys)
    assert "is finished" not in out, "not taken for finished: derived again"
    again = yaml.safe_load((run / "best.yaml").read_text())["result"]
    assert again["trials"] == trials and again["val_acc"] == best["result"]["val_acc"]


@pytest.mark.slow
def test_a_corrupt_results_part_is_rebuilt_from_tunes_records_and_said(finished, tmp_path, capsys):
    space, run = copy_run(finished, tmp_path)
    before = pd.read_parquet(run / "results.parquet")
    part = sorted((run / "results.parquet").glob("*.parquet"))[0]
    part.write_bytes(b"garbage")
    _, err = resume_in_process(space, capsys)
    assert f"{part} is unreadable" in err and "rebuilt from Tune's records" in err
    after = pd.read_parquet(run / "results.parquet")
    columns = ["trial_id", "epoch", "seed", "lr", "val_acc"]
    pd.testing.assert_frame_equal(after.sort_values(["trial_id", "epoch"])[columns].reset_index(drop=True),
                                  before.sort_values(["trial_id", "epoch"])[columns].reset_index(drop=True))


def test_an_unreadable_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    from ray import tune

    from trainable.adapter import newest_readable_state
    from trainable.config import TrialConfig
    from trainable.report import save_checkpoint

    trial = tmp_path / "trial_x"
    for epoch in range(3):
        (trial / f"checkpoint_00000{epoch}").mkdir(parents=True)
        save_checkpoint(trial / f"checkpoint_00000{epoch}", TrialConfig(), (1, 28, 28), 10,
                        {"epoch": epoch + 1, "model": {"w": torch.ones(1)}})
    (trial / "checkpoint_000002" / "state.pt").write_bytes(b"cut sho")
    (trial / "checkpoint_000003").mkdir()  # newer than Tune's record (a killed driver wrote it): never used
    save_checkpoint(trial / "checkpoint_000003", TrialConfig(), (1, 28, 28), 10, {"epoch": 4, "model": {}})
    state = newest_readable_state(tune.Checkpoint(str(trial / "checkpoint_000002")))
    assert state["epoch"] == 2, "the newest readable earlier one: epoch 2, not the corrupt 3 nor the unknown 4"
    (trial / "checkpoint_000001" / "state.pt").unlink()
    (trial / "checkpoint_000000" / "state.pt").write_bytes(b"")
    assert newest_readable_state(tune.Checkpoint(str(trial / "checkpoint_000002"))) is None


@pytest.mark.slow
def test_two_searches_with_one_name_give_one_search_and_one_refusal(tmp_path):
    # the user's training function (TOY_FUNCTION): the race for the name is the driver's, not the training loop's
    space = toy_space_file(tmp_path, experiment={"num_samples": 2}, training={"epochs": 1})
    command = [sys.executable, "-m", "search", "--space", str(space), "--name", "same"]
    first, second = (subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(2))
    outputs = [p.communicate(timeout=300) for p in (first, second)]
    codes = sorted(p.returncode for p in (first, second))
    assert codes == [0, 2], [o[1][-2000:] for o in outputs]
    refused = next(err for (out, err), p in zip(outputs, (first, second)) if p.returncode == 2)
    assert "already holds a search" in refused and "Traceback" not in refused
    # two trials checkpoint at once: Tune's advice on CheckpointConfig(num_to_keep), which hpsearch
    # sets and the user cannot, stays out of the search's output (on local storage Tune no longer
    # forces the snapshots it is about, search/store/retention.py; session.quiet hides it where it does)
    ran = next(out + err for (out, err), p in zip(outputs, (first, second)) if p.returncode == 0)
    assert "Experiment state snapshotting" not in ran, ran[-3000:]
    frame = pd.read_parquet(tmp_path / "runs" / "same" / "results.parquet")
    assert frame["trial_id"].nunique() == 2, "the one search's trials, nobody else's"


@pytest.mark.parametrize("name", ["../outside", "/tmp/absolute", "name\n", "a/b", ".."])
def test_run_names_that_leave_the_storage_path_are_refused(tmp_path, name):
    space = space_file(tmp_path, tmp_path / "data")
    done = search_cli("--space", str(space), "--name", name)
    assert done.returncode == 2 and no_traceback(done)
    assert "--name: must be letters, digits" in done.stderr
    assert not (tmp_path / "outside").exists() and not (tmp_path / "runs").exists()


# ---- interruptions and hangs ----

# An MLP whose second epoch does not end while the file `hold` exists: the search is stopped
# mid-epoch, and the stop must not wait for that epoch (Tune would, up to ~15 s; session.quick_stop).
# The held trial waits without spinning (a trial process of the stopped search is not left burning a core).
HELD_MLP = """
import os
import threading

import torch.nn as nn

HOLD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hold")


class Held(nn.Module):
    def __init__(self, input_shape, num_classes, hidden_sizes=(32,)):
        super().__init__()
        width = hidden_sizes[0]
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, width), nn.ReLU(), nn.Linear(width, num_classes))
        self.validated = False

    def forward(self, x):
        if not self.training:
            self.validated = True  # an epoch's validation: the next training batch is epoch 2's
        if self.training and self.validated and os.path.exists(HOLD):
            threading.Event().wait()  # the trial's hang: only the test's stop ends it
        return self.net(x)
"""


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_search_exits_130_marks_unfinished_trials_and_resumes(tmp_path, data_root, stop, capsys, request):
    (tmp_path / "held.py").write_text(HELD_MLP)
    (tmp_path / "hold").write_text("")
    # two held at once and one not started; 2 epochs: the second is held; the least data the loop takes
    space = space_file(tmp_path, data_root, experiment={"num_samples": 3, "max_concurrent": 2},
                       model={"factory": "held.py:Held"},
                       training={"epochs": 2}, data={"train_size": 256, "val_size": 128})
    run = tmp_path / "runs" / "stopped"
    driver = subprocess.Popen([sys.executable, "-m", "search", "--space", str(space), "--name", "stopped"],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # the driver's progress lines say when a trial has reported an epoch but not its last (Tune
    # copies result.json into the run folder only with its snapshots, so the folder can lag)
    lines, errors = [], []
    readers = [threading.Thread(target=into.extend, args=(stream,), daemon=True)
               for stream, into in ((driver.stdout, lines), (driver.stderr, errors))]
    for reader in readers:
        reader.start()
    wait_for(lambda: True if any("epoch 1/2 " in line for line in list(lines)) or driver.poll() is not None
             else None, 300, "a trial held in its second epoch")
    assert driver.poll() is None, "".join(errors)[-3000:]
    driver.send_signal(stop)
    driver.wait(timeout=120)  # with the epoch still held: the stop did not wait for it
    assert (tmp_path / "hold").exists()
    for reader in readers:
        reader.join(timeout=30)
    out, err = "".join(lines), "".join(errors)
    assert driver.returncode == 130, err[-3000:]
    assert f"--storage-path {tmp_path / 'runs'} --resume --name stopped" in out and "Interrupted:" in out
    frame = pd.read_parquet(run / "results.parquet")
    assert (frame["status"] == INTERRUPTED).any() or frame["trial_id"].nunique() < 3
    assert "STOPPED" not in set(frame["status"]), "an interrupted trial is not one the scheduler stopped"
    assert "Tuner.restore" not in err + out, "hpsearch's resume command only, not Tune's"
    assert "Stop signal received" not in err + out, "nor Tune's advice to press Ctrl-C again (issue 49 item 10)"
    assert_outputs_agree(run)
    if stop == signal.SIGTERM:
        return  # the driver turns SIGTERM into SIGINT (search/execution/session.py): from here on, one path

    (tmp_path / "hold").unlink()
    # the stop is the command's (its exit 130 and what it prints); the resume, in this process on the session's
    # Ray, is about what the stopped run folder lets it continue
    request.getfixturevalue("ray_local")  # only this variant needs it
    resume_in_process(space, capsys, name="stopped")
    frame = pd.read_parquet(run / "results.parquet")
    assert frame["trial_id"].nunique() == 3 and set(frame["status"]) == {COMPLETED}
    assert (frame.groupby("trial_id")["epoch"].apply(sorted).map(lambda e: e == [1, 2])).all()
    assert_outputs_agree(run)
    assert_kept_checkpoints(run)  # the held trials' checkpoints from before the stop are ranked too


def blobs_space(tmp_path: Path) -> Path:
    """A space file on 60 random points of a dataset function: no MNIST, for tests that end before any trial."""
    (tmp_path / "blobs.py").write_text("import torch\n\ndef blobs(root):\n"
                                       "    return (torch.randn(60, 4), torch.arange(60) % 2), None\n")
    return space_file(tmp_path, tmp_path / "data",
                      data={"dataset": "blobs.py:blobs", "train_size": None, "val_size": 10})


def test_an_unreachable_address_gives_up_within_the_bound(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    space = blobs_space(tmp_path)
    done = search_cli("--space", str(space), "--address", f"127.0.0.1:{port}", "--connect-timeout", "2",
                      timeout=120)
    assert done.returncode == 2 and no_traceback(done), done.stderr[-2000:]
    assert f"no Ray cluster answered at 127.0.0.1:{port} within 2 s" in done.stderr


def test_an_address_that_answers_http_is_refused_at_once(tmp_path):
    """The dashboard's port (8265) given as --address: Ray would retry it for about 14 minutes."""
    from http.server import BaseHTTPRequestHandler, HTTPServer

    server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)  # answers every request with an HTTP error
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        space = blobs_space(tmp_path)
        done = search_cli("--space", str(space), "--address", address, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 2 and no_traceback(done), done.stderr[-2000:]
    assert "--address: answers HTTP there (Ray's dashboard, or another web server), not Ray's GCS" in done.stderr


def test_a_corrupt_test_part_is_found_before_any_trial(tmp_path, data_root):
    root = tmp_path / "data"
    shutil.copytree(data_root / "MNIST" / "raw", root / "MNIST" / "raw",
                    ignore=shutil.ignore_patterns("t10k-*"))  # only the packed files: torchvision unpacks them
    for name in RAW_FILES:
        unpacked = root / "MNIST" / "raw" / name
        if unpacked.exists():
            unpacked.unlink()
    packed = (data_root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").read_bytes()
    (root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte.gz").write_bytes(packed[: len(packed) // 2])
    shutil.copy(data_root / "MNIST" / "raw" / "t10k-images-idx3-ubyte.gz", root / "MNIST" / "raw")
    space = space_file(tmp_path, root)
    done = search_cli("--space", str(space), "--name", "x")
    assert done.returncode == 2 and no_traceback(done), done.stderr[-2000:]
    assert "t10k-labels-idx1-ubyte.gz" in done.stderr and "corrupt or truncated" in done.stderr
    assert not (tmp_path / "runs").exists(), "found before the run folder was even claimed"


@pytest.mark.parametrize("storage, words", [
    ("a_file", "is a file, not a folder"),
    ("nosuchscheme://bucket/path", "not a storage URI pyarrow can open"),
    ("/proc/hpsearch-runs", "cannot make a folder and write in it there"),  # issue 49 item 9: a traceback
])
def test_bad_storage_paths_exit_2_before_ray(tmp_path, storage, words):
    (tmp_path / "a_file").write_text("")
    target = str(tmp_path / storage) if "://" not in storage else storage
    space = space_file(tmp_path, tmp_path / "data", experiment={"storage_path": target})
    done = search_cli("--space", str(space))
    assert done.returncode == 2 and no_traceback(done), done.stderr[-2000:]
    assert "experiment.storage_path" in done.stderr and words in done.stderr
    assert "Started a local Ray" not in done.stderr


def test_a_min_free_mb_beyond_the_disk_is_refused_before_ray_and_a_check_leaves_no_folder(tmp_path):
    """Issue 49 item 12: found only by the disk guard, after Ray had started."""
    from search.store.storage import Storage, check_storage

    target = tmp_path / "not" / "yet"
    check_storage(Storage.at(str(target)), min_free_mb=100)
    assert not (tmp_path / "not").exists(), "the check makes the folder to try it, then removes it"
    with pytest.raises(ConfigError, match=r"experiment.min_free_mb: must be below the size of the disk the run "
                                          r"folder is on \([\d,]+ MB at .*\): the search stops as soon as less than "
                                          r"it is free, got 1000000000.0"):
        check_storage(Storage.at(str(target)), min_free_mb=1e9)


# ---- input that validation let through ----

@pytest.mark.parametrize("sets, words", [
    (["resources.cpus=0.000001"], "resources.cpus: must be a number in [0.01, 1024]"),
    (["experiment.scheduler=asha", "experiment.grace_period=5"], "experiment.grace_period: must be <= the epochs"),
    (["experiment.seed=18446744073709551616"], "experiment.seed: must be an integer in [0, 2**32)"),
    (["training.batch_size=1180591620717411303424"], "batch_size: must be in [1, 2**24]"),
    (["model.depth=99999999999999999999"], "model.depth: must be plain data"),
    (["training.weight_decay=1e9"], "training.weight_decay: must be in [0, 10]"),
    (["model.hidden_sizes=[1000000000]"], "hidden_sizes must be a non-empty list of integers in [1, 65536]"),
])
def test_values_that_used_to_crash_later_are_refused_up_front(tmp_path, sets, words):
    space = blobs_space(tmp_path)  # the loop on a dataset function: model.* is checked on its data, not MNIST's
    done = search_cli("--space", str(space), *[a for s in sets for a in ("--set", s)])
    assert done.returncode == 2 and no_traceback(done), done.stderr[-2000:]
    assert words in done.stderr
    assert not (tmp_path / "runs").exists()


def test_labels_outside_the_classes_are_caught_at_load(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for part, n in (("train", 50), ("t10k", 10)):
        labels = rng.integers(0, 10, n)
        labels[3] = 12
        write_idx(raw / f"{part}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{part}-labels-idx1-ubyte", labels)
    with pytest.raises(DataError, match=r"labels must lie in \[0, 10\), got 1 outside it \(e.g. 12\)"):
        load_dataset("mnist", tmp_path)


def test_a_corrupt_gz_is_named_not_blamed_on_a_download(tmp_path, data_root):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in RAW_FILES:
        shutil.copy(data_root / "MNIST" / "raw" / f"{name}.gz", raw)
    packed = (raw / "train-labels-idx1-ubyte.gz").read_bytes()
    (raw / "train-labels-idx1-ubyte.gz").write_bytes(packed[:-20])
    assert gzip.decompress(packed)  # the original is fine; only the copy is cut
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz in .* is corrupt or truncated"):
        load_dataset("mnist", tmp_path)


def test_automatic_names_taken_in_the_same_second_get_a_suffix_given_names_do_not(tmp_path):
    from search.execution.preflight import claim
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage
    from trainable.errors import ConfigError

    folder = RunFolder(Storage.at(str(tmp_path)), "mnist-20261130-101500")
    names = [claim(folder, automatic=True).name for _ in range(3)]
    assert names == ["mnist-20261130-101500", "mnist-20261130-101500-2", "mnist-20261130-101500-3"]
    with pytest.raises(ConfigError, match="already holds a search"):
        claim(folder, automatic=False)


def test_a_search_where_no_trial_started_ranks_no_row_instead_of_crashing():
    # every trial's actor cancelled before it ran (seen on a loaded cluster): results have no row;
    # pandas reads an empty object mask as a column list, which crashed the summary with KeyError
    frame = pd.DataFrame({"trial_number": pd.Series([], dtype="int64"), "val_acc": pd.Series([], dtype="float64")})
    assert ranked(frame, "val_acc", "max").empty
    assert list(ranked(frame, "val_acc", "max").columns) == ["trial_number", "val_acc"]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU here: its own Ray can get one")
def test_a_local_search_on_a_ray_up_head_refuses_gpus_its_own_ray_cannot_get(tmp_path):
    """`ray up`'s head holds ~/ray_bootstrap_config.yaml; a search there without --address starts a Ray
    of its own, which no autoscaler grows: a GPU request fails at once, as on any machine without GPUs."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "ray_bootstrap_config.yaml").write_text("cluster_name: hpsearch\n")
    space = toy_space_file(tmp_path, resources={"gpus": 0.5})  # the driver's refusal: no MNIST needed
    env = {k: v for k, v in os.environ.items() if k not in ("HPSEARCH_AUTOSCALER", "RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-m", "search", "--space", str(space), "--name", "boot"], cwd=REPO,
                          capture_output=True, text=True, timeout=240, env={**env, "HOME": str(home)})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "each trial asks for 1 CPU and 0.5 GPU, but no node" in done.stderr and no_traceback(done)
