"""A real multi-node Ray cluster on this machine: a head and two workers that advertise GPUs.

No physical GPU is needed for Ray to schedule GPU resources: it hands trials GPU ids and
sets CUDA_VISIBLE_DEVICES; torch then finds no CUDA device and the trial trains on the CPU.
The driver joins the cluster with --address, as it would on a cluster made with `ray up`.
The trials are a toy training function (`trainable: toy.py:train`, docs/own-training-function.md):
Ray places, restarts and restores a function's trials as it does the canonical loop's, and the
toy can hold its trials where a test needs them (started together, or mid-way while a worker dies).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from ray.cluster_utils import Cluster

from search.store.results import COMPLETED
from tests.heads import RAY, free_port
from tests.helpers import SMALL, shut_down
from tests.searches.test_resume import wait_for
from trainable.report import unpacked

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster():
    # The head runs drivers only (no GPU). Each worker offers 2 GPUs but 1 CPU: with 0.5 CPU
    # per trial it holds 2 trials, so 4 concurrent trials need both workers (Ray packs
    # placement groups onto one node while it has room).
    # its own dashboard agent port: the job server's agent would otherwise share Ray's default
    # (52365) with any other Ray on this machine (the other test worker's, a CLI search's)
    # its own temporary folder, naming this cluster: Ray's job supervisor resolves the job's address
    # ("auto") from the ray_current_cluster file in the head's temporary folder, which `ray start --head`
    # writes and Cluster does not (it writes /tmp/ray's, naming whichever Ray started last there). With no
    # file Ray takes any Ray running on this machine: a job's search joined the other test worker's and
    # found no GPU. So the file is written here, as `ray start` would.
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths live under it
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": True, "temp_dir": temp,
                                      "dashboard_port": free_port(), "dashboard_agent_listen_port": free_port()})
    workers = [cluster.add_node(num_cpus=1, num_gpus=2, temp_dir=temp) for _ in range(2)]
    cluster.wait_for_nodes()
    (Path(temp) / "ray_current_cluster").write_text(cluster.address)
    cluster.workers = workers
    yield cluster
    shut_down(cluster)
    shutil.rmtree(temp, ignore_errors=True)


# A training function as a user would write it; each report checkpoints (state.pt in the trial's folder).
# Two holds, each a wait on a file (polled: the synchronisation itself), bounded so nothing hangs:
# `started` (a folder): each trial leaves a file there and waits until `together` trials have started,
#   so the first `together` trials provably hold their resources at the same time;
# `gate` (a file): after its first report a trial waits until the file exists, so the test can lose a
#   worker while trials are mid-way.
TOY = '''
import os
import random
import time


def wait_until(ready):
    deadline = time.monotonic() + 300
    while not ready() and time.monotonic() < deadline:
        time.sleep(0.1)


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    acc = checkpoint["acc"] if checkpoint else 0.0
    if config.get("started") and not checkpoint:
        os.makedirs(config["started"], exist_ok=True)
        open(os.path.join(config["started"], str(config["trial_number"])), "w").close()
        wait_until(lambda: len(os.listdir(config["started"])) >= config["together"])
    for epoch in range(start, config["epochs"]):
        if epoch == 1 and config.get("gate"):
            wait_until(lambda: os.path.exists(config["gate"]))
        acc += config["lr"] * (1 - acc) + random.Random(config["seed"] + epoch).gauss(0, 0.01)
        report(val_acc=acc, checkpoint={"acc": acc, "epoch": epoch + 1})
'''


def space_file(tmp_path: Path, *, resources: dict | None = None, training: dict | None = None, **experiment) -> Path:
    (tmp_path / "toy.py").write_text(TOY)
    raw = {"trainable": "toy.py:train",
           "experiment": {**SMALL["experiment"], "metric": "val_acc", "mode": "max", "num_samples": 8,
                          "max_concurrent": 4, "storage_path": str(tmp_path / "runs"), **experiment},
           "resources": resources or SMALL["resources"],
           "training": {"epochs": 2, **(training or {})},
           "space": SMALL["space"]}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def search_command(space: Path, address: str, name: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "search", "--space", str(space), "--address", address, "--name", name,
            "--gpus-per-trial", "0.5", "--cpus-per-trial", "0.5", *extra]


def trial_spans(frame: pd.DataFrame) -> pd.DataFrame:
    """Per trial: node, GPU id(s) and the wall-clock span of its epochs."""
    frame = frame.assign(started=frame["finished_at"] - frame["epoch_seconds"])
    return frame.groupby("trial_id").agg(node=("node", "first"), gpus=("accelerator_ids", "first"),
                                         start=("started", "min"), end=("finished_at", "max"))


def most_at_once_per_gpu(spans: pd.DataFrame) -> int:
    most = 0
    for _, group in spans.assign(gpu=spans["gpus"].str.split(",")).explode("gpu").groupby(["node", "gpu"]):
        for _, trial in group.iterrows():  # trials running at the moment this one started
            overlapping = group[(group["start"] <= trial["start"]) & (group["end"] > trial["start"])]
            most = max(most, len(overlapping))
    return most


def check_landed(run: Path, num_samples: int) -> pd.DataFrame:
    frame = pd.read_parquet(run / "results.parquet")
    assert frame["trial_id"].nunique() == num_samples
    assert set(frame["status"]) == {COMPLETED}
    assert (run / "best.yaml").exists()
    trial_folders = sorted(run.glob("trial_*"))
    assert len(trial_folders) == num_samples
    assert all(any(f.glob("checkpoint_*/state.pt")) for f in trial_folders), "checkpoints in the storage path"
    return frame


def test_fractional_gpus_pack_two_trials_per_gpu_across_workers(cluster, tmp_path):
    # packed as asked: 4 trials could spread over 4 GPUs;
    # the first 4 trials wait for each other: 4 at once need both workers (2 trials each)
    space = space_file(tmp_path, num_samples=4, resources={"gpus": 0.5, "cpus": 0.5, "spread": False},
                       training={"started": str(tmp_path / "started"), "together": 4})
    done = subprocess.run(search_command(space, cluster.address, "packed"),
                          cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    frame = check_landed(tmp_path / "runs" / "packed", 4)
    worker_ids = {w.node_id[:12] for w in cluster.workers}
    assert set(frame["node"]) == worker_ids, "trials ran on both workers, none on the GPU-less head"
    assert frame["accelerator_ids"].str.fullmatch(r"[01]").all(), "each trial got one of its node's 2 GPU ids"
    assert most_at_once_per_gpu(trial_spans(frame)) <= 2, "0.5 GPU per trial: at most two share a GPU"
    assert "GPUs: 0.5 per trial; at most" in done.stdout


def test_search_runs_as_a_ray_job(cluster, tmp_path):
    dashboard = "http://" + cluster.head_node.address_info["webui_url"]
    command = search_command(space_file(tmp_path, num_samples=1), "auto", "job")
    for _ in range(30):  # the head's job agent comes up after the node; Ray answers "try again later" till then
        done = subprocess.run([RAY, "job", "submit", "--address", dashboard, "--", *command],
                              cwd=REPO, capture_output=True, text=True, timeout=400)
        if "No available agent to submit job" not in done.stderr:
            break
        time.sleep(2)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert "succeeded" in done.stdout
    check_landed(tmp_path / "runs" / "job", 1)


def test_losing_a_worker_restarts_its_trials_from_checkpoints(cluster, tmp_path):
    # after its first epoch (checkpointed) each trial waits at `gate`, opened once the worker is lost
    gate = tmp_path / "worker-lost"
    # two at once: the lost worker holds one or both, and the other worker takes them on
    space = space_file(tmp_path, num_samples=6, max_concurrent=2, max_failures=3, training={"gate": str(gate)})
    run = tmp_path / "runs" / "lossy"
    command = search_command(space, cluster.address, "lossy", "--epochs", "4")
    # Tune copies result.json into the run folder with its snapshots (by default at most every
    # 10 s); every second here, so the test sees a trial mid-way before it ends
    out, err = tmp_path / "driver.out", tmp_path / "driver.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        driver = subprocess.Popen(command, cwd=REPO, stdout=stdout, stderr=stderr, text=True,
                                  env={**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1"})
    workers = {w.node_id[:12]: w for w in cluster.workers}

    def unfinished_trial_with_a_checkpoint():
        for result in run.glob("trial_*/result.json"):
            # Tune's record holds where a trial ran packed in one value (trainable/report.py)
            lines = [unpacked(json.loads(line)) for line in result.read_text().splitlines() if line.strip()]
            # result.json comes with Tune's snapshots, a second or more behind; the trial writes its
            # checkpoints (one per epoch, checkpoint_<epoch - 1>) itself, so its newest says how far it is
            indices = [p.name.rpartition("_")[2] for p in result.parent.glob("checkpoint_*")]
            newest = max((int(i) for i in indices if i.isdigit()), default=None)
            # two epochs still to go: the kill lands long before the trial could finish
            if lines and newest is not None and newest <= 1 and lines[-1]["node"] in workers:
                return lines[-1]["trial_id"], lines[-1]["node"]
        return None

    def search_saw_the_victim_fail():  # the driver's line for it (search/execution/progress.py)
        said = out.read_text().splitlines()
        return True if any(line.startswith(f"trial {victim} (#") and " failed and " in line for line in said) else None

    try:
        victim, node = wait_for(unfinished_trial_with_a_checkpoint, 300, "a running trial with a checkpoint")
        cluster.remove_node(workers[node], allow_graceful=False)  # kills its raylet and trial processes
        # the gate opens once the search has seen the victim fail: its process on the lost worker, held at
        # the gate till then, can no longer report (a trial there must not finish on a worker that is gone)
        wait_for(search_saw_the_victim_fail, 300, f"the driver to say trial {victim} failed")
        gate.touch()
        driver.wait(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, err.read_text()[-3000:]
    frame = check_landed(run, 6)
    rows = frame[frame["trial_id"] == victim].sort_values("epoch")
    epochs = list(rows["epoch"])
    # an epoch whose report was in flight when the worker died can be missing from the
    # results (it was trained and checkpointed; its metrics died with the worker)
    assert epochs == sorted(set(epochs)) and epochs[-1] == 4, "no epoch repeated, the trial finished"
    assert rows["node"].iloc[0] == node and rows["node"].iloc[-1] != node, \
        "the trial started on the lost worker and finished elsewhere"
    elsewhere = rows[rows["node"] != node]
    assert elsewhere["epoch"].min() > 1, "it resumed from a checkpoint, not from scratch"
