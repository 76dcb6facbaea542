"""slurm/ray_cluster.sh, the start logic of slurm/hpsearch.sbatch, with stand-in Slurm on this machine.

Slurm's variables are set by hand, and `srun` is a stand-in that runs its command here (a job
step on "the node" is a process on this machine). A dry run shows the commands for a 3-node
allocation; a real run on one node starts Ray's head with the GPUs Slurm's variables name,
runs the command against it, and leaves no process behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import suppress
from pathlib import Path

import pytest

from tests.heads import free_port, processes_of

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "ray_cluster.sh"
# srun's options, then the command: run the command here, on the one machine
FAKE_SRUN = """#!/bin/bash
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
    case "$1" in -w|-N|-n) shift 2;; *) shift;; esac
done
exec "$@"
"""


def slurm_env(nodes: str, gpus: int, cpus: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_ADDRESS", "HPSEARCH_"))}
    return {**env, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodes, "SLURM_GPUS_ON_NODE": str(gpus),
            "SLURM_CPUS_PER_TASK": str(cpus), **extra}


def test_a_dry_run_starts_the_head_on_the_first_node_and_workers_on_the_others():
    done = subprocess.run([str(SCRIPT), "python", "-m", "search", "--space", "spaces/mnist.yaml"],
                          env=slurm_env("gpu01,gpu02,gpu03", gpus=4, cpus=16, HPSEARCH_DRY_RUN="1"),
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    head = next(line for line in lines if "ray start --head" in line)
    assert head.startswith("srun --nodes=1 --ntasks=1 -w gpu01 ") and head.endswith("&")
    assert "--num-gpus=4" in head and "--num-cpus=16" in head
    workers = next(line for line in lines if "ray start --block --address=HEAD_IP:6379" in line)
    assert workers.startswith("srun --nodes=2 --ntasks=2 --ntasks-per-node=1 -w gpu02,gpu03 ")
    assert "--num-gpus=4" in workers
    # the search starts once all 3 nodes joined, and joins their cluster
    waits = [n for n, line in enumerate(lines) if line.endswith("slurm/wait_for_nodes.py HEAD_IP:6379 3")]
    assert waits and lines.index(workers) < waits[0] < len(lines) - 1
    assert lines[-1] == "python -m search --space spaces/mnist.yaml --address HEAD_IP:6379"


def test_outside_an_allocation_it_says_so():
    env = {k: v for k, v in slurm_env("x", 0, 1).items() if k != "SLURM_JOB_NODELIST"}
    done = subprocess.run([str(SCRIPT), "true"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "not inside a Slurm allocation" in done.stderr


@pytest.mark.slow
def test_on_one_node_the_head_offers_slurms_gpus_and_stops_with_the_command(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    folder = tempfile.mkdtemp(prefix="hp-sl-", dir="/tmp")  # Ray's temp dir: short, for its socket paths
    # private ports: other Rays run on this machine
    head_args = (f"--dashboard-port={free_port()} --dashboard-agent-listen-port={free_port()} "
                 f"--ray-client-server-port={free_port()} --node-manager-port={free_port()}")
    env = slurm_env(socket.gethostname(), gpus=2, cpus=1, HPSEARCH_RAY_PORT=str(free_port()),
                    HPSEARCH_RAY_TEMP=folder, HPSEARCH_RAY_HEAD_ARGS=head_args,
                    PATH=f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    # the command run against the cluster: it reports what the cluster offers and where it is
    probe = ("import sys, ray; ray.init(address=sys.argv[-1], log_to_driver=False); "
             "r = ray.cluster_resources(); print('GPU', r.get('GPU'), 'CPU', r.get('CPU'), 'at', sys.argv[-1])")
    try:
        done = subprocess.run([str(SCRIPT), sys.executable, "-c", probe], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        assert "GPU 2.0 CPU 1.0 at " in done.stdout, done.stdout
        assert "ray cluster at " in done.stdout
        assert not processes_of(folder), "the script left Ray processes running"
    finally:
        for pid in processes_of(folder):  # only if the script left some: stopped by pid
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
