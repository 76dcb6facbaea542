"""Ray heads the tests start as a user would (`ray start --head`), the private ports they take, and how they
are stopped: by their own process group and the pids that name their temp dir, never `ray stop` (other Rays
run on this machine)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager, suppress
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")


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


@contextmanager
def own_head(prefix: str, *flags: str, port: int | None = None, env: dict[str, str] | None = None):
    """`ray start --head` as a user runs it, on private ports and its own temp dir; yields
    (GCS port, temp dir, dashboard port). Its own process group holds the head's daemons, Ray's client
    server (which names neither the temp dir nor a parent of ours) and the nodes an autoscaler starts,
    so the teardown stops exactly those."""
    folder = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: Ray's socket paths have a length limit
    port, dashboard = port or free_port(), free_port()
    env = {k: v for k, v in (env or os.environ).items() if k != "RAY_ADDRESS"}
    started = subprocess.Popen(
        [RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--temp-dir={folder}",
         f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={free_port()}",
         f"--ray-client-server-port={free_port()}", "--disable-usage-stats", *flags],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = started.communicate(timeout=120)
        assert started.returncode == 0, output[-3000:]
        yield port, Path(folder), dashboard
    finally:
        with suppress(ProcessLookupError):
            os.killpg(started.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
