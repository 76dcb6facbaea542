"""A search under chaos still reproduces: on a 3-node Ray cluster (a head and two workers), a seeded chaos
loop in the test (the driver is a process of its own) SIGKILLs trial processes and whole worker nodes
(adding a node back each time) while the driver runs, and the run's results.parquet, optuna.journal and
best.yaml equal an undisturbed run's of the same seed, with FIFO and with reproducible ASHA (search/searching/halving.py).
The FIFO search keeps its run on S3 (moto's server, tests/searches/test_object_store.py), and the chaos also stalls
the storage writes there: the server stopped (SIGSTOP) for a second or three while the driver and the trials
write to it, then let go.

The trials are a toy training function (`trainable: toy.py:train`) whose values depend only on the trial's
config and epoch, and which checkpoints every epoch: a restart from a checkpoint reproduces the rest.
Each epoch costs a little time, so faults land mid-trial. The toy leaves the test two things to
synchronise on: `<chaos>/pids/<pid>`, one file per process that runs trials, holding the number of the
trial it runs or ran last (Tune reuses a trial's process for the next one), and
`<chaos>/reports`, one line per report made.
"""

from __future__ import annotations

import copy
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import pandas as pd
import psutil
import pytest
import yaml
from optuna.storages.journal import JournalFileBackend
from ray.cluster_utils import Cluster

from search.store.results import COMPLETED
from tests.heads import free_port
from tests.helpers import SMALL, assert_outputs_agree, shut_down
from tests.searches.test_object_store import ENV, download_run, make_bucket, moto_server, uri

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SEED = 51
TABLE = ["trial_number", "epoch", "status", "seed", "lr", "batch_size", "t_max", "clip_norm", "val_acc"]

TOY = '''
import os
import random
import time


def train(config, report, checkpoint=None):
    pids = os.path.join(config["chaos"], "pids")
    os.makedirs(pids, exist_ok=True)
    with open(os.path.join(pids, str(os.getpid())), "w") as mine:  # Tune reuses a process for the next trial
        mine.write(str(config["trial_number"]))
    start = checkpoint["epoch"] if checkpoint else 0
    acc = checkpoint["acc"] if checkpoint else 0.0
    rate = config["lr"] * config["clip_norm"] * (1 + config["t_max"] / 10) * 64 / config["batch_size"]
    for epoch in range(start, config["epochs"]):
        time.sleep(config["pace"])  # the epoch's work, simulated
        acc += min(rate, 1.0) * (1 - acc) + random.Random(config["seed"] * 1000 + epoch).gauss(0, 0.02)
        with open(os.path.join(config["chaos"], "reports"), "a") as log:
            log.write(f"{config['trial_number']} {epoch + 1} {os.getpid()}\\n")
        report(val_acc=acc, checkpoint={"acc": acc, "epoch": epoch + 1})
'''


@pytest.fixture(scope="module")
def cluster():
    # the trials on the workers write checkpoints to S3 too: moto takes any credentials, the SDK needs some
    before = {name: os.environ.get(name) for name in ENV if name.startswith("AWS_")}
    os.environ.update({name: ENV[name] for name in before})
    # The head offers no CPU: trials run on the two workers only (1 CPU each, 2 trials of 0.5 CPU), and
    # removing a worker always takes trials with it. A lost node is declared dead after 3 missed health
    # checks 0.5 s apart (Ray's defaults wait about 15 s), so the run goes on soon after a node kill.
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False,
                                      "dashboard_agent_listen_port": free_port(),
                                      "_system_config": {"health_check_period_ms": 500,
                                                         "health_check_failure_threshold": 3}})
    for _ in range(2):
        cluster.add_node(num_cpus=1, num_gpus=0)
    cluster.wait_for_nodes()
    yield cluster
    shut_down(cluster)
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server with one bucket: (its host:port, its process)."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        make_bucket(endpoint)
        port = endpoint.rsplit(":", 1)[1]
        [server] = [p for p in psutil.Process().children() if p.cmdline()[-2:] == ["-p", port]]
        yield endpoint, server


def space_file(folder: Path, scheduler: str, storage_path: str | None = None) -> Path:
    """8 trials x 4 epochs of the toy, 4 at once (0.5 CPU each: both workers), SMALL's keys searched."""
    (folder / "toy.py").write_text(TOY)
    raw = {"trainable": "toy.py:train",
           "experiment": {"name": "chaos", "metric": "val_acc", "mode": "max", "num_samples": 8,
                          "max_concurrent": 4, "seed": SEED, "max_failures": 20, "scheduler": scheduler,
                          "reproducible": True, "storage_path": storage_path or str(folder / "runs"), "report": False},
           "resources": {"cpus": 0.5},
           "training": {"epochs": 4, "pace": 0.3, "chaos": str(folder / "chaos")},
           "space": copy.deepcopy(SMALL["space"])}
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@dataclass
class Chaos:
    """Seeded faults while the driver runs, at most `most` of them and none after `seconds`: SIGKILL a
    running trial's process, remove a worker node that runs a trial (its raylet and every process it
    started, killed) and add a new worker in its place, or (given the `store`'s process) stall the storage
    writes: the S3 server stopped for 1-3 s. After each fault it waits for the search to make a few more
    reports (the toy's log), so the next fault lands on the run as it goes on."""

    cluster: Cluster
    folder: Path  # the toy's chaos folder
    driver: subprocess.Popen
    seed: int
    most: int = 5
    seconds: float = 90
    store: psutil.Process | None = None  # the S3 server whose writes a stall stops
    done: list[tuple[str, int]] = field(default_factory=list)  # (trial | node, trial number)

    def run(self) -> None:
        rng = random.Random(self.seed)
        deadline = time.monotonic() + self.seconds
        # one of each first (else the test would prove nothing), then as the seed says
        first = ["trial", "node", *(["stall"] if self.store else [])]
        kinds = first + [rng.choice(first) for _ in range(self.most - len(first))]
        for kind in kinds:
            if time.monotonic() > deadline or self.driver.poll() is not None:
                return
            # a trial at least one epoch in (a checkpoint to restart from), or any running one
            victim = self._wait(lambda: self.running(reported=True), deadline)
            if victim is None:
                return
            number, pid, node = rng.choice(victim)
            if kind == "trial":
                os.kill(pid, signal.SIGKILL)
            elif kind == "node":
                self.lose(node)
            else:
                self.stall(rng.uniform(1, 3))
            self.done.append((kind, number))
            enough = self._reports() + rng.randint(2, 5)
            self._wait(lambda enough=enough: True if self._reports() >= enough else None, deadline)

    def _wait(self, condition, deadline: float):
        while time.monotonic() < deadline and self.driver.poll() is None:
            value = condition()
            if value is not None:
                return value
            time.sleep(0.1)
        return None

    def _reports(self) -> int:
        log = self.folder / "reports"
        return len(log.read_text().splitlines()) if log.exists() else 0

    def _raylets(self) -> dict[int, object]:
        """Raylet pid -> worker node, for the workers of this cluster (the head runs no trial)."""
        return {node.all_processes["raylet"][0].process.pid: node for node in self.cluster.worker_nodes}

    def running(self, reported: bool):
        """[(trial number, pid, worker node)] of the live trial processes of this cluster, or None."""
        raylets = self._raylets()
        reported_by = set()
        if reported and (self.folder / "reports").exists():
            lines = [line.split() for line in (self.folder / "reports").read_text().splitlines()]
            reported_by = {int(words[2]) for words in lines if len(words) == 3}  # the last line may be half written
        running = []
        for file in (self.folder / "pids").glob("*") if (self.folder / "pids").exists() else []:
            pid, number = int(file.name), int(file.read_text() or -1)
            if reported and pid not in reported_by:
                continue
            try:  # a trial process is a child of a worker's raylet: only this cluster's processes are killed
                node = raylets.get(psutil.Process(pid).ppid())
            except psutil.NoSuchProcess:
                continue
            if node is not None:
                running.append((number, pid, node))
        return running or None

    def stall(self, seconds: float) -> None:
        """Every write to the store waits `seconds` (the server stopped: its connections stay open), then goes on."""
        assert self.store is not None
        self.store.suspend()
        try:
            time.sleep(seconds)  # the fault's length, not a wait for anything
        finally:
            self.store.resume()

    def lose(self, node) -> None:
        raylet = psutil.Process(node.all_processes["raylet"][0].process.pid)
        started = raylet.children(recursive=True)
        self.cluster.remove_node(node, allow_graceful=False)
        for process in started:  # a node lost takes all its processes: none goes on writing checkpoints
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.cluster.add_node(num_cpus=1, num_gpus=0)
        self.cluster.wait_for_nodes(timeout=60)


def search(cluster: Cluster, space: Path, name: str, chaos_seed: int | None = None, s3=None):
    """Run the search on the cluster; with chaos_seed, under Chaos; with `s3` ((endpoint, server): the space's
    storage_path is its bucket), stalls of the store among the faults, and the run copied here after.
    Returns (the run folder, here, and the faults)."""
    chaos_folder = space.parent / "chaos"
    if chaos_folder.exists():
        for file in [*chaos_folder.glob("pids/*"), chaos_folder / "reports"]:
            file.unlink(missing_ok=True)
    out, err = space.parent / f"{name}.out", space.parent / f"{name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        driver = subprocess.Popen([sys.executable, "-m", "search", "--space", str(space), "--address",
                                   cluster.address, "--name", name], cwd=REPO, stdout=stdout, stderr=stderr,
                                  env={**os.environ, **{k: v for k, v in ENV.items() if k.startswith("AWS_")}})
    chaos = None
    try:
        if chaos_seed is not None:  # in this thread: Ray starts a node from the main thread only
            chaos = Chaos(cluster, chaos_folder, driver, chaos_seed, store=s3[1] if s3 else None)
            chaos.run()
        driver.wait(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, (out.read_text()[-2000:], err.read_text()[-3000:])
    run = download_run(s3[0], name, space.parent / "runs") if s3 else space.parent / "runs" / name
    return run, (chaos.done if chaos else [])


def table(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["trial_number", "epoch"])[TABLE].reset_index(drop=True)


def journal(run: Path) -> list[tuple]:
    """Per finished trial of the run's optuna.journal: (trial number, state, value, params), sorted."""
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(run / "optuna.journal")))
    study = optuna.load_study(study_name=run.name, storage=storage)
    return sorted((t.user_attrs.get("trial_number", t.number), t.state.name, t.value, sorted(t.params.items()))
                  for t in study.get_trials(deepcopy=False) if t.state.is_finished())


def best(run: Path) -> dict:
    result = yaml.safe_load((run / "best.yaml").read_text())["result"]
    return {key: result[key] for key in ("trial_number", "epoch", "val_acc")}


@pytest.mark.parametrize("scheduler,storage", [("fifo", "s3"), ("asha", "local")])
def test_a_search_under_chaos_equals_the_undisturbed_run(cluster, request, tmp_path, scheduler, storage):
    s3 = request.getfixturevalue("s3") if storage == "s3" else None
    space = space_file(tmp_path, scheduler, uri(s3[0]) if s3 else None)
    calm, _ = search(cluster, space, "calm", s3=s3)
    stormy, faults = search(cluster, space, "stormy", chaos_seed=SEED, s3=s3)
    print(f"{scheduler} on {storage}: faults injected {faults}")
    kinds = {kind for kind, _ in faults}
    assert kinds == ({"trial", "node", "stall"} if s3 else {"trial", "node"}), f"one of each at least: {faults}"

    calm_frame, stormy_frame = pd.read_parquet(calm / "results.parquet"), pd.read_parquet(stormy / "results.parquet")
    for frame in (calm_frame, stormy_frame):
        assert sorted(frame["trial_number"].unique()) == list(range(8)), "every trial"
        assert not frame.duplicated(["trial_number", "epoch"]).any(), "no epoch counted twice"
        for _, epochs in frame.groupby("trial_number")["epoch"]:
            assert sorted(epochs) == list(range(1, max(epochs) + 1)), "no epoch missing"
    if scheduler == "fifo":
        assert set(calm_frame["status"]) == {COMPLETED}
        assert (calm_frame.groupby("trial_number")["epoch"].max() == 4).all()
    else:
        assert (calm_frame.groupby("trial_number")["epoch"].max() < 4).any(), "ASHA stopped some trials early"
    ends = [{int(n): (int(rows["epoch"].max()), rows["status"].iloc[-1]) for n, rows in frame.groupby("trial_number")}
            for frame in (stormy_frame, calm_frame)]
    assert ends[0] == ends[1], f"each trial's last epoch and status, stormy then calm: {ends}"
    pd.testing.assert_frame_equal(table(stormy_frame), table(calm_frame))
    assert best(stormy) == best(calm)
    assert journal(stormy) == journal(calm)
    assert_outputs_agree(stormy)
