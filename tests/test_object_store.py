"""Runs on an object store, tried against a real S3 API (issue 51): moto's server on a free localhost port,
started and stopped here, and pyarrow's own S3 client; nothing of pyarrow or boto is mocked.

The commands run as a user runs them, in subprocesses whose environment holds the credentials (moto takes
any) and no AWS_ENDPOINT_URL: the endpoint comes in the URI's query, as pyarrow's and Ray's docs show it for
an S3-compatible store.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml

from search.execution.session import reachable
from tests.heads import free_port
from tests.helpers import TOY_FUNCTION

REPO = Path(__file__).resolve().parents[1]
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


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server with one bucket; its host:port."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test",
                          region="us-east-1", allow_bucket_creation=True).create_dir(BUCKET)
        yield endpoint


def uri(endpoint: str, path: str = "runs", bucket: str = BUCKET) -> str:
    return f"s3://{bucket}/{path}?endpoint_override={endpoint}&scheme=http"


def listed(endpoint: str, path: str) -> list[str]:
    fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="test", secret_key="test",
                           region="us-east-1")
    return [i.path for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{path}", allow_not_found=True))]


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


def space_file(folder: Path) -> Path:
    (folder / "toy.py").write_text(TOY_FUNCTION)
    space = folder / "space.yaml"
    space.write_text(yaml.safe_dump({
        "trainable": "toy.py:train",
        "experiment": {"name": "s3", "metric": "score", "mode": "max", "num_samples": 2, "max_concurrent": 1,
                       "seed": 4},
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
                                                                "optuna.journal", "report.html"}
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
