"""A soak under chaos: a long search on a 3-node Ray cluster with a fault every few seconds, against the same
search undisturbed. What the faults cost, and whether the run still equals the undisturbed one.

The cluster, the toy function and the faults are tests/searches/test_chaos.py's (a head without CPUs and two 1-CPU
workers; a trial's values depend only on its config and epoch, and it checkpoints every epoch; a fault is a
SIGKILL of a running trial's process or the loss of a worker node with every process on it, a new worker
added back). The test runs a handful of faults in about a minute; this runs them on a clock, one every
`--every` seconds, seeded, for as long as the search lasts. Both runs use one seed, 4 trials at once
(0.5 CPU each), trials of `--epochs` epochs of `--pace` seconds.

Printed: the faults injected (trial kills, node losses), the trials' restarts (the driver's "failed and"
lines), the epochs reported again (the toy's reports beyond results.parquet's rows: a restart from a
checkpoint older than its last report), the wall time of each
run and their ratio, and whether results.parquet, best.yaml and optuna.journal equal the undisturbed run's.

    .venv/bin/python bench/soak.py [--minutes 30] [--every 20] [--epochs 10] [--pace 0.5] [--seed 51]
    .venv/bin/python bench/soak.py --quick      # 2 minutes a run, a fault every 10 s
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the project's packages and its tests' helpers

import pandas as pd  # noqa: E402
import yaml  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tests.heads import free_port  # noqa: E402
from tests.helpers import SMALL  # noqa: E402
from tests.test_chaos import TOY, Chaos, best, journal, table  # noqa: E402

SLOTS = 4


def space_file(folder: Path, trials: int, epochs: int, pace: float, seed: int, scheduler: str) -> Path:
    (folder / "toy.py").write_text(TOY)
    raw = {"trainable": "toy.py:train",
           "experiment": {"name": "soak", "metric": "val_acc", "mode": "max", "num_samples": trials,
                          "max_concurrent": SLOTS, "seed": seed, "max_failures": 1000, "scheduler": scheduler,
                          "storage_path": str(folder / "runs")},
           "resources": {"cpus": 0.5},
           "training": {"epochs": epochs, "pace": pace, "chaos": str(folder / "chaos")},
           "space": SMALL["space"]}  # the keys tests/searches/test_chaos.py's table compares
    path = folder / "space.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def faults_on_a_clock(chaos: Chaos, every: float, seed: int) -> None:
    """A fault every `every` seconds (the schedule, seeded) while the driver runs: a trial's SIGKILL or, one
    time in four, a worker node's loss."""
    rng = random.Random(seed)
    while chaos.driver.poll() is None:
        due = time.monotonic() + every
        while time.monotonic() < due and chaos.driver.poll() is None:
            time.sleep(0.2)  # the fault schedule itself, not a wait for the search
        running = chaos.running(reported=True)
        if not running or chaos.driver.poll() is not None:
            continue
        number, pid, node = rng.choice(running)
        if rng.random() < 0.25:
            chaos.lose(node)
            chaos.done.append(("node", number))
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            chaos.done.append(("trial", number))


def one_run(cluster: Cluster, space: Path, name: str, every: float | None, seed: int) -> dict:
    chaos_folder = space.parent / "chaos"
    for file in [*chaos_folder.glob("pids/*"), chaos_folder / "reports"]:
        file.unlink(missing_ok=True)
    out = space.parent / f"{name}.out"
    started = time.perf_counter()
    with out.open("w") as stdout:
        driver = subprocess.Popen([sys.executable, "-m", "search", "--space", str(space), "--address",
                                   cluster.address, "--name", name], cwd=REPO, stdout=stdout,
                                  stderr=subprocess.STDOUT)
    chaos = Chaos(cluster, chaos_folder, driver, seed)
    try:
        if every is not None:
            faults_on_a_clock(chaos, every, seed)
        driver.wait()
    finally:
        if driver.poll() is None:
            driver.kill()
    wall = time.perf_counter() - started
    if driver.returncode != 0:
        raise SystemExit(f"{name}: the search exited {driver.returncode}; see {out}:\n{out.read_text()[-3000:]}")
    run = space.parent / "runs" / name
    frame = pd.read_parquet(run / "results.parquet")
    reports = (chaos_folder / "reports").read_text().splitlines()
    return {"wall": wall, "run": run, "frame": frame, "faults": chaos.done,
            "restarts": sum(" failed and " in line for line in out.read_text().splitlines()),
            "redone": len(reports) - len(frame)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30, help="the undisturbed run's length, about")
    parser.add_argument("--every", type=float, default=20, help="seconds between faults")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--pace", type=float, default=0.5, help="seconds an epoch takes")
    parser.add_argument("--seed", type=int, default=51)
    parser.add_argument("--scheduler", choices=("fifo", "asha"), default="fifo")
    parser.add_argument("--quick", action="store_true", help="2 minutes a run, a fault every 10 s")
    args = parser.parse_args()
    if args.quick:
        args.minutes, args.every = 2, 10
    # 4 at once, each trial epochs x pace seconds: the trials that fill the minutes
    trials = max(SLOTS, round(args.minutes * 60 * SLOTS / (args.epochs * args.pace)))
    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 0, "num_gpus": 0, "include_dashboard": False,
                                      "dashboard_agent_listen_port": free_port(),
                                      "_system_config": {"health_check_period_ms": 500,
                                                         "health_check_failure_threshold": 3}})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, num_gpus=0)
        cluster.wait_for_nodes()
        with tempfile.TemporaryDirectory(prefix="hpsearch-soak-") as folder:
            space = space_file(Path(folder), trials, args.epochs, args.pace, args.seed, args.scheduler)
            calm = one_run(cluster, space, "calm", None, args.seed)
            stormy = one_run(cluster, space, "stormy", args.every, args.seed)
            same = {"results.parquet": table(stormy["frame"]).equals(table(calm["frame"])),
                    "best.yaml": best(stormy["run"]) == best(calm["run"]),
                    "optuna.journal": journal(stormy["run"]) == journal(calm["run"])}
    finally:
        cluster.shutdown()
    kinds = [kind for kind, _ in stormy["faults"]]
    print(f"{trials} trials x {args.epochs} epochs of {args.pace:g} s, {SLOTS} at once, {args.scheduler}, "
          f"seed {args.seed}; a fault every {args.every:g} s\n")
    print("| | undisturbed | under faults |\n|---|---:|---:|")
    print(f"| wall | {calm['wall']:.0f} s | {stormy['wall']:.0f} s ({stormy['wall'] / calm['wall']:.2f}x) |")
    print(f"| faults: trial SIGKILLs, node losses | | {kinds.count('trial')}, {kinds.count('node')} |")
    print(f"| trial restarts (the driver's lines) | {calm['restarts']} | {stormy['restarts']} |")
    print(f"| epochs reported again (after a restart from an older checkpoint) | {calm['redone']} | {stormy['redone']} |")
    print(f"| rows in results.parquet | {len(calm['frame'])} | {len(stormy['frame'])} |")
    print("\nequal to the undisturbed run: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in same.items()))
    return 0 if all(same.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
