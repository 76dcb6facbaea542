"""Ray's real autoscaler on this machine: a search starts with no worker, the autoscaler adds
GPU workers of cluster.yaml's type, every trial runs on them, and idle workers go away.

`RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=FILE` runs Ray's autoscaler (monitor.py,
the one `ray up` runs on a head) with the fake node provider, which starts each "node" as a
raylet on this machine. The config is written from cluster.yaml's node types: the head offers
no CPU or GPU, the GPU workers their CPU, GPU and max_workers (capped at 2 here), and
idle_timeout_minutes is shortened. Ray's fake GPUs need no physical GPU: trials train on the CPU.
ray.cluster_utils.AutoscalingCluster is not used: it runs `ray stop --force`, which would stop
every other Ray on the machine; this file stops only the processes it started (their group).
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider

from search.execution.capacity import AUTOSCALER_SETTING, has_autoscaler
from search.store.results import COMPLETED
from tests.helpers import SMALL
from tests.heads import free_port, own_head

REPO = Path(__file__).resolve().parents[2]
HEAD_TYPE = "ray.head.default"  # the fake provider tags its head with this type name
MAX_WORKERS = 2  # per GPU type: enough to show trials spread over workers, few raylets on 2 cores


class DistinctNodeIds(FakeMultiNodeProvider):
    """Ray's fake provider, with worker ids that differ in their first 12 hex digits.

    The fake provider numbers nodes at the end of a run of f's, so every node, the head too,
    would show as ffffffffffff in results.parquet's `node` column (a node id's first 12 digits).
    """

    def _next_hex_node_id(self) -> str:
        self._next_node_id += 1
        return f"{self._next_node_id:05d}".ljust(56, "a")


def autoscaling_config(cluster_yaml: Path, gcs_port: int, idle_minutes: float) -> dict:
    """cluster.yaml's head and GPU worker types for the fake provider, scaled to this machine."""
    cluster = yaml.safe_load(cluster_yaml.read_text())
    head = cluster["available_node_types"][cluster["head_node_type"]]
    types = {HEAD_TYPE: {"resources": dict(head["resources"]), "node_config": {}, "max_workers": 0}}
    for name, node in cluster["available_node_types"].items():
        if name != cluster["head_node_type"] and node["resources"].get("GPU", 0) >= 1:
            types[name] = {"resources": dict(node["resources"]), "node_config": {},
                           "min_workers": node.get("min_workers", 0),
                           "max_workers": min(node["max_workers"], MAX_WORKERS)}
    return {
        "cluster_name": "hpsearch-fake",
        "max_workers": sum(t.get("max_workers", 0) for t in types.values()),
        "idle_timeout_minutes": idle_minutes,
        "upscaling_speed": cluster.get("upscaling_speed", 1.0),
        "provider": {"type": "external", "module": "tests.searches.test_autoscaler.DistinctNodeIds",
                     "gcs_address": f"127.0.0.1:{gcs_port}",
                     # the fake nodes are processes here: no SSH updater, no launch hash to compare;
                     # they share one IP, so the autoscaler tells them apart (idle or not) by node id
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "use_node_id_as_ip": True},
        "auth": {"ssh_user": "ray"},
        "head_node_type": HEAD_TYPE,
        "available_node_types": types,
        **{key: [] for key in ("cluster_synced_files", "initialization_commands", "setup_commands",
                               "head_setup_commands", "worker_setup_commands", "head_start_ray_commands",
                               "worker_start_ray_commands")},
        "file_mounts": {},
        "file_mounts_sync_continuously": False,
    }


@pytest.fixture(scope="module")
def autoscaling_head():
    """A head started as `ray up` starts one: with the autoscaler, here on the fake provider."""
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    config = Path(tempfile.mkdtemp(prefix="hp-as-config-")) / "autoscaling.yaml"
    gcs_port = free_port()  # the provider's config names it, so it is chosen before the start
    config.write_text(yaml.safe_dump(autoscaling_config(REPO / "cluster.yaml", gcs_port, idle_minutes=0.1)))
    try:
        with own_head("hp-as-", "--num-cpus=0", "--num-gpus=0", f"--autoscaling-config={config}",
                      "--include-dashboard=false", port=gcs_port, env=env) as (port, folder, _):
            yield f"127.0.0.1:{port}", folder
    finally:
        shutil.rmtree(config.parent, ignore_errors=True)


def monitor_log(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.glob("session_*/logs/monitor.log"))


@pytest.mark.slow
def test_a_search_on_an_autoscaling_cluster_runs_every_trial_on_added_workers(autoscaling_head, tmp_path, data_root):
    address, folder = autoscaling_head
    raw = copy.deepcopy(SMALL)
    raw["experiment"].update(num_samples=3, max_concurrent=2, storage_path=str(tmp_path / "runs"))
    raw["resources"] = {"cpus": 1, "gpus": 1}  # a whole GPU each: 2 trials at once need 2 workers
    raw["data"].update(root=str(data_root), train_size=300, val_size=100)
    raw["training"].update(epochs=1)
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(raw))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}  # `ray start --head` of Ray 2.60 wants the token
    env.pop(AUTOSCALER_SETTING, None)  # the cluster itself says an autoscaler is there
    # the first 2 trials wait for each other before they train, so they provably run at once
    # (a trial of 300 images would otherwise end before the second worker is up)
    done = subprocess.run([sys.executable, str(REPO / "tests" / "barrier_driver.py"), str(tmp_path / "space.yaml"),
                           address, "scaled", str(tmp_path / "started"), "2"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    frame = pd.read_parquet(tmp_path / "runs" / "scaled" / "results.parquet")
    assert frame["trial_id"].nunique() == 3 and set(frame["status"]) == {COMPLETED}
    assert not frame["node"].str.startswith("fff").any(), "a trial ran on the head (the fake head's id is f's)"
    assert frame["node"].nunique() >= 2, "trials ran on at least 2 workers the autoscaler added"
    assert "GPUs: 1 per trial; at most 1 trial(s) ran on one GPU at once" in done.stdout
    assert "no node holds a trial yet; an autoscaler adds them" in done.stdout, "the summary says why 1 GPU"

    # idle workers go away after idle_timeout_minutes (6 s here); the autoscaler checks every second
    workers = set(frame["node"])
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        log = monitor_log(folder)
        removed = {node[:12] for node in re.findall(r"Terminating the node with id (\w+) and ip \w+\. \(idle\)", log)}
        if workers <= removed:
            break
        time.sleep(1)  # polling the log the autoscaler writes; there is no event to wait on
    assert workers <= removed, log[-3000:]


@pytest.mark.parametrize("setting, expected", [("1", True), ("0", False)])
def test_the_autoscaler_setting_overrides_detection(monkeypatch, setting, expected):
    """HPSEARCH_AUTOSCALER=1 for a provider Ray cannot see; =0 to refuse a search no node can hold."""
    monkeypatch.setenv(AUTOSCALER_SETTING, setting)
    assert has_autoscaler() is expected


LOCAL_CHECK = """
import json, ray
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
from search.execution.capacity import autoscaler_status, has_autoscaler
types, version = autoscaler_status()
print(json.dumps({"types": None if types is None else sorted(types), "version": version,
                  "has": has_autoscaler(private=False)}))
ray.shutdown()
"""


def test_a_local_ray_has_no_autoscaler(tmp_path):
    """ray.init's head runs Ray's read-only monitor: node types node_<id>, no autoscaler v2 version.

    In a process of its own, with a Ray of its own and none of the other tests' settings (a token
    cluster's RAY_AUTH_MODE, a Ray shut down or joined elsewhere by an earlier test of this worker)."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "HPSEARCH_"))}
    env["HOME"] = str(tmp_path)  # no ~/ray_bootstrap_config.yaml
    done = subprocess.run([sys.executable, "-c", LOCAL_CHECK], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["types"] is not None, "the local Ray's autoscaler record reads (None: it could not be read)"
    assert all(name.startswith("node_") for name in said["types"]) and said["version"] in (None, "", "0")
    assert said["has"] is False
