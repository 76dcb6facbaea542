"""Runs on an object store, tried against a real S3 API (issue 51): moto's server on a free localhost port,
started and stopped here, and pyarrow's own S3 client; nothing of pyarrow or boto is mocked.

The commands run as a user runs them, in subprocesses whose environment holds the credentials (moto takes
any) and no AWS_ENDPOINT_URL: the endpoint comes in the URI's query, as pyarrow's and Ray's docs show it for
an S3-compatible store.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import optuna
import pandas as pd
import pyarrow.fs as pafs
import pytest
import yaml
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from search.execution.session import reachable
from search.store.results import COMPLETED
from search.store.run_folder import RunFolder
from search.store.storage import Storage
from tests.heads import free_port
from tests.helpers import TOY_FUNCTION, assert_outputs_agree, stop_session
from tests.searches.test_resume import wait_for

REPO = Path(__file__).resolve().parents[2]
# the test extra's moto, beside this Python (a `moto_server` earlier on PATH may be another install's)
MOTO = str(Path(sys.executable).parent / "moto_server")
BUCKET = "hpsearch-runs"
ENV = {**{k: v for k, v in os.environ.items() if k != "AWS_ENDPOINT_URL"},
       "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def moto_server(log: Path, env: dict[str, str] | None = None):
    """moto's S3 server on a free localhost port, stopped after; its host:port."""
    port = free_port()
    with log.open("w") as out:
        server = subprocess.Popen([MOTO, "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, **(env or {})})
    try:
        assert reachable(f"127.0.0.1:{port}", 60), log.read_text()[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(30)


def make_bucket(endpoint: str, bucket: str = BUCKET) -> None:
    pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test",
                      region="us-east-1", allow_bucket_creation=True).create_dir(bucket)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server with one bucket; its host:port."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        make_bucket(endpoint)
        yield endpoint


def uri(endpoint: str, path: str = "runs", bucket: str = BUCKET) -> str:
    return f"s3://{bucket}/{path}?endpoint_override={endpoint}&scheme=http"


def client(endpoint: str) -> pafs.S3FileSystem:
    """pyarrow's own S3 client of the test's bucket, as a user's script would make it."""
    return pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test",
                             region="us-east-1")


def listed(endpoint: str, path: str) -> list[str]:
    return [i.path for i in client(endpoint).get_file_info(pafs.FileSelector(f"{BUCKET}/{path}", allow_not_found=True))]


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def space_file(folder: Path) -> Path:
    (folder / "toy.py").write_text(TOY_FUNCTION)
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump({
        "trainable": "toy.py:train",
        "experiment": {"name": "s3", "metric": "score", "mode": "max", "num_samples": 2, "max_concurrent": 1,
                       "seed": 4, "report": False},  # the S3 search test draws it with the `report` command
        "resources": {"cpus": 1}, "training": {"epochs": 2},
        "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}))
    return space


@pytest.mark.parametrize("case", ["no bucket", "no server", "unknown option"])
def test_bad_object_storage_exits_2_before_ray_and_claims_nothing(s3, tmp_path, case):
    """A missing bucket was an OSError traceback from the run folder's claim; an endpoint in the URI's query
    was `Invalid S3 connection scheme`, and the failed start left the run folder claimed."""
    storage, words = {
        "no bucket": (uri(s3, bucket="no-such-bucket"), "bucket 'no-such-bucket' does not exist at http://"),
        "no server": (uri(f"127.0.0.1:{free_port()}"), "cannot reach the object store at http://127.0.0.1:"),
        "unknown option": (uri(s3) + "&max_retries=1", "a storage URI's query may set endpoint_override, region, "
                                                        "scheme"),
    }[case]
    done = command("-m", "search", "--space", str(space_file(tmp_path)), "--storage-path", storage, "--name", "x",
                   cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"experiment.storage_path: {words}" in done.stderr and "Started a local Ray" not in done.stderr
    assert listed(s3, "runs") == [], "nothing claimed"


def test_credentials_the_store_refuses_exit_2_and_say_so(tmp_path):
    """moto checks credentials once told to (INITIAL_NO_AUTH_ACTION_COUNT=0): the AWS SDK's 403 was said as
    "cannot reach the object store", which sent a user to look at the network."""
    with moto_server(tmp_path / "moto.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "0"}) as endpoint:
        done = command("-m", "search", "--space", str(space_file(tmp_path)), "--storage-path", uri(endpoint),
                       "--name", "x", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"experiment.storage_path: the object store at http://{endpoint} refused access to bucket " \
           f"'{BUCKET}': check the credentials" in done.stderr, done.stderr
    assert "Started a local Ray" not in done.stderr


@pytest.mark.slow
def test_a_search_on_s3_with_the_endpoint_in_its_uri_and_the_commands_that_read_it(s3, tmp_path):
    """The run on the bucket; its summary's re-run line works as printed (it named a best.yaml not on this
    machine), and `runs`, `report` and `python -m trainable --config s3://...` read the run."""
    done = command("-m", "search", "--space", str(space_file(tmp_path)), "--storage-path", uri(s3), "--name", "s3run",
                   "--quiet", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert {Path(p).name for p in listed(s3, "runs/s3run")} >= {"results.parquet", "best.yaml", "spec.yaml",
                                                                "optuna.journal"}
    rerun = next(line for line in done.stdout.splitlines() if "re-run: " in line).split("re-run: ", 1)[1]
    assert rerun == f"python -m trainable --config s3://{BUCKET}/runs/s3run/best.yaml?endpoint_override={s3}" \
                    f"&scheme=http"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    replay = subprocess.run([sys.executable if word == "python" else word for word in shlex.split(rerun)],
                            cwd=elsewhere, env=ENV, capture_output=True, text=True, timeout=300)
    best = next(line for line in done.stdout.splitlines() if line.startswith("Best: "))
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert best.split("score ")[1].split()[0] in replay.stdout, (best, replay.stdout)
    runs = command("-m", "search", "runs", "--storage-path", uri(s3), cwd=elsewhere)
    assert runs.returncode == 0 and "s3run finished    2/2" in runs.stdout, runs.stdout + runs.stderr
    report = command("-m", "search", "report", uri(s3, "runs/s3run"), cwd=elsewhere)
    assert report.returncode == 0 and f"s3://{BUCKET}/runs/s3run/report.html" in report.stdout, report.stderr
    assert "report.html" in {Path(p).name for p in listed(s3, "runs/s3run")}, "drawn by the command, on the bucket"
    compared = command("-m", "search", "compare", uri(s3, "runs/s3run"), uri(s3, "runs/s3run"), cwd=elsewhere)
    assert compared.returncode == 0 and best.split("score ")[1].split()[0] in compared.stdout, \
        compared.stdout + compared.stderr
    exported = command("-m", "search", "export", uri(s3, "runs/s3run"), "-o", "best.pt", cwd=elsewhere)
    assert exported.returncode == 0 and (elsewhere / "best.pt").stat().st_size > 0, exported.stderr[-3000:]
    # a second search on the bucket, checked, then warm-started from the first run's URI: told its 2 trials
    checked = command("-m", "search", "check", "--space", str(space_file(tmp_path)), "--storage-path", uri(s3),
                      "--warm-start", uri(s3, "runs/s3run"), cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr[-3000:]
    warm = command("-m", "search", "--space", str(space_file(tmp_path)), "--storage-path", uri(s3), "--name", "warm",
                   "--warm-start", uri(s3, "runs/s3run"), "--set", "experiment.num_samples=1", "--quiet",
                   cwd=tmp_path)
    assert warm.returncode == 0 and "warm start: 2 trial(s) from " in warm.stdout + warm.stderr, warm.stdout[-3000:] + warm.stderr[-3000:]


# ---- a driver SIGKILLed mid-search on S3, resumed from another machine (issue 51, item 2) ----

# The toy function at about half a second an epoch: its 6 trials of 2 epochs, 2 at a time, last long enough
# for the driver to be killed between them (in milliseconds, the search would end before any kill)
SLOW_TOY = TOY_FUNCTION + """

import time

_toy = train


def train(config, report, checkpoint=None):
    def slow_report(**values):
        time.sleep(0.5)
        report(**values)

    _toy(config, slow_report, checkpoint)
"""


def modified(endpoint: str, path: str) -> dict[str, float]:
    """Each file under `path` in the bucket (relative to it) -> when it was last written (unix time)."""
    infos = client(endpoint).get_file_info(pafs.FileSelector(f"{BUCKET}/{path}", allow_not_found=True, recursive=True))
    return {i.path[len(f"{BUCKET}/{path}/"):]: i.mtime.timestamp() for i in infos if i.type == pafs.FileType.File}


def parts_in_bucket(endpoint: str, run: str) -> list[str]:
    return [p for p in listed(endpoint, f"runs/{run}/results.parquet") if p.endswith(".parquet")]


def snapshot_in_part(folder: RunFolder) -> str | None:
    """What in the bucket is not of one moment of the search, or None: Tune uploads each snapshot file by file,
    in the background, while its num_to_keep (Tune's or the driver's) deletes checkpoints."""
    try:
        trials = folder.record.analysis().trials
    except ValueError:  # no state yet, or one being written
        return None
    if {t.trial_id for t in trials} != set(folder.record.searcher_state().get("numbers", {})):
        return "Tune's state and the searcher's record hold other trials"
    gone = [t.checkpoint.path for t in trials if t.status != "TERMINATED" and t.checkpoint
            and t.checkpoint.filesystem.get_file_info(t.checkpoint.path).type == pafs.FileType.NotFound]
    return f"Tune's state names checkpoints no longer there: {gone}" if gone else None


def paused_at_a_kill_point(driver: subprocess.Popen, endpoint: str, folder: RunFolder) -> bool:
    """Whether the bucket holds two results parts and Tune's snapshot in part (or five parts), the driver paused
    (SIGSTOP) while the bucket is looked at, so that what is seen is what a kill then leaves; else it goes on."""
    parts = len(parts_in_bucket(endpoint, folder.name))
    if parts < 2:
        return False
    driver.send_signal(signal.SIGSTOP)
    if parts >= 5 or snapshot_in_part(folder):
        return True
    driver.send_signal(signal.SIGCONT)
    return False


def download_run(endpoint: str, run: str, into: Path) -> Path:
    """The run folder as the bucket holds it, copied to `into`/<run> (its name: the journal's study)."""
    local = into / run
    pafs.copy_files(f"{BUCKET}/runs/{run}", str(local), source_filesystem=client(endpoint),
                    destination_filesystem=pafs.LocalFileSystem())
    return local


def in_own_session(args: list[str], *, timeout: float, **popen) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own, whose processes (the command's Ray too) are all stopped after."""
    process = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, **popen)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        stop_session(process)
        process.wait()
    return subprocess.CompletedProcess(args, process.returncode, out, err)


@pytest.mark.slow
def test_a_driver_killed_on_s3_resumes_on_another_machine_with_every_trial_once(s3, tmp_path, monkeypatch):
    """The driver SIGKILLed once two results parts are in the bucket and Tune's upload of a snapshot is under
    way (or once five are, if none was caught so), then `--resume` from another folder with an empty cache (a
    new head machine: no local journal, no Ray session, nothing but the bucket). A user's run ended with a trial
    missing and another's rows twice (5 trials of 2, 2, 2, 2 and 4 rows), or with rows lost and repeated (2, 2,
    1, 3, 2, 2): the resume read Tune's files of different moments. Tune snapshots at every step here
    (TUNE_GLOBAL_CHECKPOINT_S=0), so that its upload is under way most of the time, as it was when Tune's
    num_to_keep forced a snapshot after every checkpoint."""
    (tmp_path / "toy.py").write_text(SLOW_TOY)
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "trainable": "toy.py:train",
        "experiment": {"name": "s3", "metric": "score", "mode": "max", "num_samples": 6, "max_concurrent": 2,
                       "seed": 4, "report": False},
        "resources": {"cpus": 1}, "training": {"epochs": 2},
        "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}))
    run, epochs = "killed", [1, 2]
    search = [sys.executable, "-m", "search", "--space", str(space), "--storage-path", uri(s3), "--name", run,
              "--quiet"]
    first_cache, second_cache, elsewhere = tmp_path / "cache-a", tmp_path / "cache-b", tmp_path / "elsewhere"
    for folder in (first_cache, second_cache, elsewhere):
        folder.mkdir()
    for name, value in {**ENV, "AWS_ENDPOINT_URL": f"http://{s3}"}.items():  # for the code's own helpers, here
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    bucket_run = RunFolder(Storage(f"s3://{BUCKET}/runs"), run)

    # its own session, so everything it starts (its Ray too) can be stopped by its group id
    with (tmp_path / "driver.log").open("w") as log:
        driver = subprocess.Popen(search, cwd=tmp_path, start_new_session=True, stdout=log, stderr=subprocess.STDOUT,
                                  env={**ENV, "XDG_CACHE_HOME": str(first_cache), "TUNE_GLOBAL_CHECKPOINT_S": "0"})
    try:
        wait_for(lambda: True if driver.poll() is not None or paused_at_a_kill_point(driver, s3, bucket_run) else None,
                 240, "two results parts in the bucket and Tune's upload under way")
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        stop_session(driver)  # what the killed driver had started
    at_kill = modified(s3, f"runs/{run}")
    before = pd.read_parquet(download_run(s3, run, tmp_path / "at-kill") / "results.parquet")
    torn = f"the bucket at the kill: {snapshot_in_part(bucket_run) or 'one moment of the search'}"

    resumed = in_own_session([*search, "--resume"], cwd=elsewhere, timeout=240,
                             env={**ENV, "XDG_CACHE_HOME": str(second_cache)})
    assert resumed.returncode == 0, (torn, resumed.stderr[-3000:])
    folder = download_run(s3, run, tmp_path / "after")
    frame = pd.read_parquet(folder / "results.parquet")
    rows = frame.groupby("trial_number")["epoch"].apply(sorted).to_dict()
    assert rows == {n: epochs for n in range(6)}, (torn, rows, resumed.stderr[-3000:])
    assert frame.groupby("trial_number")["trial_id"].nunique().eq(1).all() and frame["trial_id"].nunique() == 6
    assert set(frame["status"]) == {COMPLETED}
    # what was in the bucket at the kill is kept as it was (a trial run again gives the same rows)
    columns = ["trial_number", "epoch", "seed", "lr", "score"]
    kept = frame[frame["trial_number"].isin(before["trial_number"])].sort_values(["trial_number", "epoch"])
    pd.testing.assert_frame_equal(kept[columns].reset_index(drop=True),
                                  before.sort_values(["trial_number", "epoch"])[columns].reset_index(drop=True))
    # the bound (docs/stops-and-resume.md): what the kill lost is what ended after Tune's last snapshot
    # (tune_state.zip), and that ran again with the same rows; a trial whose part was written before it stays
    assert "tune_state.zip" in at_kill, sorted(at_kill)
    ended_before = {p.split("/")[1].removesuffix(".parquet") for p, when in at_kill.items()
                    if p.startswith("results.parquet/") and p.endswith(".parquet") and when < at_kill["tune_state.zip"]}
    assert ended_before <= set(frame["trial_id"]), (ended_before, resumed.stderr[-3000:])
    # the journal in the run folder holds every trial once, each COMPLETE; best.yaml is the best of them
    study = optuna.load_study(study_name=run, storage=JournalStorage(JournalFileBackend(str(folder / "optuna.journal"))))
    assert sorted(t.user_attrs["trial_number"] for t in study.trials) == list(range(6))
    assert {t.state.name for t in study.trials} == {"COMPLETE"}
    assert_outputs_agree(folder)
