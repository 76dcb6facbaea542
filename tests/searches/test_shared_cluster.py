"""One Ray cluster shared by several people's searches, each submitted as a Ray job.

Two `ray job submit --working-dir . -- python -m search ...` at once on one local cluster both
finish, in separate run folders, each within its own max_concurrent; and the capacity check
says so when others hold what a trial needs.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import ray
import yaml

from search.execution.capacity import check_capacity
from search.store.results import COMPLETED
from search.definition.schema import Resources
from tests.helpers import SMALL
from tests.heads import RAY, own_head

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def shared_head():
    """A head with 2 CPUs and Ray's job server, started as a user would; stopped by its process group.
    Yields (the job server's address, the cluster's address)."""
    # as from an activated venv: a job's `python` is the venv's, which has the project's dependencies
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    with own_head("hp-sh-", "--num-cpus=2", "--num-gpus=0", "--include-dashboard=true",
                  "--dashboard-host=127.0.0.1", env=env) as (port, _, dashboard):
        yield f"http://127.0.0.1:{dashboard}", f"127.0.0.1:{port}"


# Run in a process of its own: the test process may hold the session's local Ray. Prints what a
# finished search could have left on a long-lived cluster: live actors, objects in the store (each
# with the process that holds it), and resources not given back.
# Ray frees a finished driver's objects after the driver has gone, so the probe asks again for up
# to a minute until they are freed; what is still there then stays. Ray's own job agent (the
# DashboardAgent process) keeps references to its job-status calls for a while after the jobs end,
# past a minute on a loaded machine: those are Ray's, not a search's, so they do not count.
LEFT_OVER = """
import json, sys, time, ray
from ray.util.state import list_actors, list_objects
ray.init(address=sys.argv[1], logging_level="ERROR")

def holder(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as cmdline:
            return cmdline.read().replace("\\0", " ").strip()[:120]
    except OSError:
        return "gone"

deadline = time.monotonic() + 60
while True:
    left = {
        "actors": [a.class_name for a in list_actors(address=sys.argv[2], filters=[("state", "=", "ALIVE")])],
        "objects": [f"{o.reference_type} held by pid {o.pid} ({holder(o.pid)})"
                    for o in list_objects(address=sys.argv[2]) if not holder(o.pid).startswith("ray::DashboardAgent")],
        "held": {k: v - ray.available_resources().get(k, 0) for k, v in ray.cluster_resources().items()
                 if k in ("CPU", "GPU") and v != ray.available_resources().get(k, 0)},
    }
    if not any(left.values()) or time.monotonic() > deadline:
        break
    time.sleep(1)
print(json.dumps(left))
"""


def left_over(address: str, dashboard: str) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    probe = subprocess.run([sys.executable, "-c", LEFT_OVER, address, dashboard], env=env, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0, probe.stderr[-3000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


def most_at_once(frame: pd.DataFrame) -> int:
    """The most trials of one search that trained at the same moment (spans of their epochs)."""
    spans = frame.assign(start=frame["finished_at"] - frame["epoch_seconds"]).groupby("trial_id").agg(
        start=("start", "min"), end=("finished_at", "max"))
    return max(((spans["start"] <= s) & (spans["end"] > s)).sum() for s in spans["start"])


@pytest.mark.slow
def test_two_searches_submitted_at_once_both_finish_in_their_own_folders_and_leave_nothing_behind(
        shared_head, tmp_path, data_root):
    job_server, address = shared_head
    raw = copy.deepcopy(SMALL)
    raw["experiment"].update(num_samples=3, max_concurrent=1, storage_path=str(tmp_path / "runs"))
    raw["data"].update(root=str(data_root), train_size=300, val_size=100)
    raw["training"].update(epochs=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # the job server of a Ray 2.60 head wants the token too

    def submit(name: str) -> subprocess.Popen:
        return subprocess.Popen([RAY, "job", "submit", "--address", job_server, "--working-dir", str(REPO), "--",
                                 "python", "-m", "search", "--space", str(tmp_path / "space.yaml"),
                                 "--address", "auto", "--name", name],
                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    for _ in range(30):  # the head's job agent comes up after the node; Ray answers "try again later" till then
        probe = subprocess.run([RAY, "job", "list", "--address", job_server], env=env, capture_output=True, text=True)
        if probe.returncode == 0:
            break
        time.sleep(2)
    jobs = {name: submit(name) for name in ("alice", "bob")}
    outputs = {name: job.communicate(timeout=400)[0] for name, job in jobs.items()}
    for name, job in jobs.items():
        assert job.returncode == 0 and "succeeded" in outputs[name], outputs[name][-3000:]
        frame = pd.read_parquet(tmp_path / "runs" / name / "results.parquet")
        assert frame["trial_id"].nunique() == 3 and set(frame["status"]) == {COMPLETED}, name
        assert most_at_once(frame) <= 1, f"{name}: more trials at once than its max_concurrent"
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["alice", "bob"]
    # a long-lived cluster runs search after search: none may leave actors, data or resources behind
    assert left_over(address, job_server) == {"actors": [], "objects": [], "held": {}}


@pytest.mark.slow
def test_the_capacity_check_says_when_others_hold_the_resources(ray_local, capsys):
    @ray.remote(num_cpus=2)
    class Holder:  # another search's trials, holding both of the local Ray's CPUs
        def ready(self) -> bool:
            return True

    holder = Holder.remote()
    try:
        ray.get(holder.ready.remote())
        assert check_capacity(Resources(cpus=1)) == 2, "trials at once count the nodes, not the moment"
        err = capsys.readouterr().err
        assert "note: resources: other jobs on this cluster hold 2 of 2 CPU" in err, err
        assert "0 of the 2 trial(s) the nodes hold at once can start now" in err
    finally:
        ray.kill(holder)
