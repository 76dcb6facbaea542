"""Joining a cluster: a `ray start --head` cluster of Ray 2.60 wants token authentication, and the
message says what to set instead of only "cannot join"."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).parent / "ray")
JOIN = "from search.execution.session import start_ray; import sys, ray; start_ray(sys.argv[1], 30); print('joined'); ray.shutdown()"
CLI_LIKE = ("import sys\nfrom search.execution.session import start_ray\nfrom trainable.errors import ConfigError\n"
            "try:\n    start_ray(sys.argv[1], 30)\nexcept ConfigError as error:\n    print(error); sys.exit(2)\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_of(folder: str) -> list[int]:
    """Pids whose command line names `folder` (the head's temp dir), and their children."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if folder.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent in pids:
                children.append(int(entry.name))
    return pids + children


@pytest.fixture
def head():
    """A head started as a user would (`ray start --head`), stopped by its process group and the pids it started.

    The group: Ray's client server (`ray.util.client.server`, started by `ray start --head`) names neither the
    temp dir nor a parent of ours, and outlived the test by minutes when only processes_of stopped the head."""
    folder = tempfile.mkdtemp(prefix="hp-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    started = subprocess.Popen([RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                                "--num-cpus=1", f"--temp-dir={folder}", "--include-dashboard=false",
                                f"--ray-client-server-port={free_port()}", "--disable-usage-stats"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               start_new_session=True)
    try:
        output, _ = started.communicate(timeout=120)
        assert started.returncode == 0, output[-2000:]
        yield f"127.0.0.1:{port}"
    finally:
        try:
            os.killpg(started.pid, signal.SIGKILL)  # every daemon `ray start` began, the client server too
        except ProcessLookupError:
            pass
        for pid in processes_of(folder):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_token_cluster_says_what_to_set_and_joins_once_it_is_set(head):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    refused = subprocess.run([sys.executable, "-c", CLI_LIKE, head], capture_output=True, text=True, env=env,
                             cwd=REPO, timeout=120)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "--address: cannot join a Ray cluster there" in refused.stdout
    assert "RAY_AUTH_MODE=token" in refused.stdout
    wrong = subprocess.run([sys.executable, "-c", CLI_LIKE, head], capture_output=True, text=True, cwd=REPO,
                           env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}, timeout=180)
    assert wrong.returncode == 2, wrong.stderr[-2000:]
    assert "the token this client sends (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) is not the " \
           "head's" in wrong.stdout
    joined = subprocess.run([sys.executable, "-c", JOIN, head], capture_output=True, text=True,
                            env={**env, "RAY_AUTH_MODE": "token"}, cwd=REPO, timeout=120)
    assert joined.returncode == 0 and "joined" in joined.stdout, joined.stderr[-2000:]
