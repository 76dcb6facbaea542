"""The search service against a plain Ray Tune script, on the same work, side by side.

Both sides run 8 trials x 2 epochs, 2 at a time with 1 CPU each, on MNIST split
50,000 train / 10,000 validation (the same images on both sides), the MLP (128,) of spaces/mnist.yaml,
SGD with momentum 0.9, and Optuna's seeded TPE over the space of spaces/mnist.yaml
(lr, batch_size, t_max, clip_norm):

- service: `python -m search --space spaces/mnist.yaml --num-samples 8 --epochs 2
  --max-concurrent 2 --cpus-per-trial 1 ...`; the driver loads MNIST once and trials
  read it from the object store as one in-memory tensor;
- naive: `python bench/naive_tune.py ...`, a Ray docs style script where every trial
  builds its own torchvision dataset with per-sample transforms and a DataLoader.

Each side also says where its time went (imports, Ray's start, the trials, the end: search/outputs/phases.py;
the naive script counts its own the same way), printed per run and as rows of the table.
Each side is its own subprocess, timed from outside (wall time as a user sees it,
Ray start-up and imports included). With --rounds N they alternate, the order flipping
every round. Printed: both wall times, naive/service (target >= 6x; >= 8x on a warm cluster), both best val_acc
(target: service >= naive) and the service's overhead share, 1 - sum(epoch_seconds) /
(wall x 2 slots): the part of its wall time not spent training.
What bounds each side (bench/commands.py): the core-seconds the machine was busy during the
command, the share of its cores that kept busy, and the same work packed on every core with none
idle, a floor that only less CPU work can lower; and the core-seconds a new Python process spends
importing a trial's modules, which the driver and every trial actor pay once.

    .venv/bin/python bench/search.py --data-root /tmp/data [--rounds 1] [--warm] [--keep]

With --warm, a third side runs the service against a warm local cluster: `ray start --head`
once before the rounds (2 CPUs, its own temp dir and ports, RAY_AUTH_MODE=token as Ray 2.60's
head wants), then `python -m search ... --address 127.0.0.1:PORT` each round, as a user running
many small searches would (docs/performance.md). The head is stopped by its process group at
the end, never by `ray stop`, which would stop every Ray on the machine.

Reading the figures: both sides draw the same 8 configs (same TPE seed and space) and
differ only in weight init and shuffling, so best val_acc differences of about 0.001 are
seed noise; the mean of the trials' best val_acc is printed too. Ray runs trials at
nice 15, so any other work on the machine slows trials first: the 1-minute load
average is printed for every run. The exit code is 0 whenever both sides ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)  # bench.commands; nothing here imports the search package
from bench.commands import Timed, cores, import_core_seconds, least_work, timed  # noqa: E402
WORK = dict(num_samples=8, epochs=2, max_concurrent=2, cpus_per_trial=1)  # flags of both commands
# The rest of the work, pinned on the service's command line (--set) so that an edit to
# spaces/mnist.yaml or to the trial defaults cannot make the two sides train different
# things. bench/naive_tune.py hard-codes the same values; the bench checks that both
# sides drew the same configs.
PINNED = {
    "model.factory": "mlp",
    "model.hidden_sizes": [128],
    "training.optimizer": "sgd",
    "training.momentum": 0.9,
    "training.weight_decay": 0.0,
    "data.dataset": "mnist",
    "data.train_size": 50_000,
    "data.val_size": 10_000,
    "data.split_seed": 0,
    "experiment.seed": 0,
    "experiment.scheduler": "fifo",
    "experiment.reproducible": False,  # Tune's OptunaSearch, as the naive side uses
    "space.lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
    "space.batch_size": {"distribution": "choice", "values": [64, 128, 256]},
    "space.t_max": {"distribution": "randint", "low": 4, "high": 10},
    "space.clip_norm": {"distribution": "loguniform", "low": 0.5, "high": 10.0},
}
SEARCHED = ["lr", "batch_size", "t_max", "clip_norm"]


@dataclass
class Measure:
    run: Timed  #: wall time, load and busy cores, from outside
    best_val_acc: float
    mean_val_acc: float  #: mean over trials of each trial's best val_acc
    training_s: float  #: sum of epoch_seconds over all trials
    configs: list[tuple]  #: the searched values of every trial, sorted
    phases: dict[str, float]  #: where the command's time went, as the command measured it (search/outputs/phases.py)

    @property
    def wall_s(self) -> float:
        return self.run.wall_s

    def overhead_share(self, slots: int) -> float:
        return max(0.0, 1 - self.training_s / (self.wall_s * slots))


def flags(**values) -> list[str]:
    return [part for key, value in values.items() for part in ("--" + key.replace("_", "-"), str(value))]


def sorted_configs(configs) -> list[tuple]:
    """Searched values per trial, rounded (Parquet and JSON keep floats slightly differently)."""
    return sorted(tuple(round(float(c[k]), 9) for k in SEARCHED) for c in configs)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def warm_cluster():
    """`ray start --head` as a user starts it once on a workstation; yields its address. Its own
    process group holds the head's daemons, so the end stops exactly those."""
    folder = tempfile.mkdtemp(prefix="hp-warm-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = free_port()
    ray = str(Path(sys.executable).parent / "ray")
    started = subprocess.Popen(
        [ray, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", f"--temp-dir={folder}",
         f"--num-cpus={WORK['max_concurrent'] * WORK['cpus_per_trial']}", "--num-gpus=0", "--include-dashboard=false",
         f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
         "--disable-usage-stats"],
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = started.communicate(timeout=120)
        if started.returncode != 0:
            sys.exit(f"ray start --head failed:\n{output[-3000:]}")
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def run_service(folder: Path, data_root: str, address: str | None = None) -> tuple[Measure, str]:
    pinned = [part for key, value in PINNED.items() for part in ("--set", f"{key}={json.dumps(value)}")]
    name = "warm" if address else "bench"
    joined = ["--address", address] if address else []
    command = [sys.executable, "-m", "search", "--space", "spaces/mnist.yaml", *flags(**WORK), *pinned,
               "--storage-path", str(folder), "--name", name, "--data-root", data_root, *joined]
    log = folder / f"{name}.log"
    # a head made by `ray start --head` (Ray 2.60) admits only clients with token authentication on
    run = timed(command, log, {**os.environ, "RAY_AUTH_MODE": "token"} if address else None)
    results = pd.read_parquet(folder / name / "results.parquet")
    # the service's own summary line ("Wall time ... outside training ... (NN%)"), for reference
    summary = next((line for line in log.read_text().splitlines()
                    if line.startswith("Wall time")), "(no summary line)")
    per_trial = results.groupby("trial_id")["val_acc"].max()
    configs = sorted_configs(results.drop_duplicates("trial_id").to_dict("records"))
    timing = yaml.safe_load((folder / name / "timing.yaml").read_text())
    return Measure(run, float(per_trial.max()), float(per_trial.mean()), float(results["epoch_seconds"].sum()),
                   configs, timing["phases"]), summary


def run_naive(folder: Path, data_root: str) -> Measure:
    out = folder / "naive.json"
    command = [sys.executable, "bench/naive_tune.py", *flags(**WORK), "--storage-path", str(folder / "naive"),
               "--data-root", data_root, "--out", str(out)]
    run = timed(command, folder / "naive.log")
    result = json.loads(out.read_text())
    if result["errors"]:
        sys.exit(f"naive: {result['errors']} trial(s) failed; see {folder / 'naive.log'}")
    return Measure(run, result["best_val_acc"], statistics.mean(result["trial_best_val_acc"]),
                   sum(result["epoch_seconds"]), sorted_configs(result["configs"]), result["timing"]["phases"])


def rounds(count: int, base: Path, data_root: str, address: str | None, slots: int, naive: bool) -> list[dict]:
    """Each round runs every side once, the order flipping every round; one row per round."""
    rows = []
    for round_ in range(1, count + 1):
        folder = base / f"round{round_}"
        folder.mkdir()
        order = ["service"] + (["naive"] if naive else []) + (["warm"] if address else [])
        if round_ % 2 == 0:
            order.reverse()
        measured = {}
        for side in order:
            print(f"round {round_}: {side} ...", flush=True)
            if side == "naive":
                measured[side] = run_naive(folder, data_root)
            else:
                measured[side], summary = run_service(folder, data_root, address if side == "warm" else None)
                print(f"  {side} says: {summary}")
            m = measured[side]
            print(f"  {m.wall_s:.1f} s, best val_acc {m.best_val_acc:.4f}, "
                  f"training {m.training_s:.1f} trial-s, load {m.run.load[0]:.1f} -> {m.run.load[1]:.1f}", flush=True)
            if m.run.busy_core_s is not None:
                print(m.run.cpu_lines())
            print("  phases: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in m.phases.items()) + " s")
        service = measured["service"]
        row = {"round": round_, "order": ",".join(order), "service s": service.wall_s}
        if "naive" in measured:
            naive = measured["naive"]
            row.update({"naive s": naive.wall_s, "naive/service": naive.wall_s / service.wall_s})
        if "warm" in measured:
            row.update({"warm s": measured["warm"].wall_s, "service/warm": service.wall_s / measured["warm"].wall_s})
            if "naive" in measured:
                row["naive/warm"] = naive.wall_s / measured["warm"].wall_s
        for side, m in measured.items():
            row.update({f"{side} val_acc": m.best_val_acc, f"{side} mean val_acc": m.mean_val_acc,
                        f"{side} overhead": m.overhead_share(slots),
                        f"{side} train s/epoch": m.training_s / (WORK["num_samples"] * WORK["epochs"])})
            if m.run.busy_core_s is not None:
                row.update({f"{side} busy core-s": m.run.busy_core_s, f"{side} busy share": m.run.busy_share,
                            f"{side} packed s": m.run.packed_s})
                row.update({f"{side} CPU {kind} s": seconds for kind, seconds in m.run.processes.items()})
        # same TPE draws (same space, same order) on every side
        row["same configs"] = all(m.configs == service.configs for m in measured.values())
        if not row["same configs"]:
            print("  the sides drew different configs: compare PINNED with bench/naive_tune.py")
        for side, m in measured.items():
            row.update({f"{side} {name} s": seconds for name, seconds in m.phases.items()})
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("HPSEARCH_DATA"),
                        help="folder holding MNIST/raw (default: $HPSEARCH_DATA)")
    parser.add_argument("--rounds", type=int, default=1, help="service and naive runs each, alternating")
    parser.add_argument("--keep", action="store_true", help="keep the run folders and logs")
    parser.add_argument("--warm", action="store_true", help="also run the service on a warm local cluster")
    parser.add_argument("--no-naive", dest="naive", action="store_false",
                        help="leave the Ray-docs-style script out (with --warm: fresh Ray against warm only)")
    args = parser.parse_args()
    if not args.data_root:
        parser.error("pass --data-root or set HPSEARCH_DATA")
    data_root = str(Path(args.data_root).expanduser().resolve())
    slots = WORK["max_concurrent"]
    base = Path(tempfile.mkdtemp(prefix="bench-search-"))
    # what every new process of the service pays before its first step: the driver once, each trial actor once
    trial_imports = import_core_seconds("trainable.adapter")
    print(f"a new process importing a trial's modules (trainable.adapter): {trial_imports:.1f} core-s", flush=True)

    with warm_cluster() if args.warm else contextlib.nullcontext() as address:
        rows = rounds(args.rounds, base, data_root, address, slots, args.naive)
    table = pd.DataFrame(rows)
    if len(rows) > 1:
        medians = table.drop(columns=["round", "order", "same configs"]).median().to_dict()
        table = pd.concat([table, pd.DataFrame([{"round": "median", "order": "", **medians,
                                                 "same configs": table["same configs"].all()}])],
                          ignore_index=True)
    formats = {"same configs": "{}"}
    for column in table.columns:
        if column.endswith(("/service", "/warm")):
            formats[column] = "{:.2f}x"
        elif column.endswith("val_acc"):
            formats[column] = "{:.4f}"
        elif column.endswith(("overhead", "busy share")):
            formats[column] = "{:.0%}"
        elif column.endswith("s/epoch"):
            formats[column] = "{:.2f}"
    formats.update({c: "{:.1f}" for c in table.columns if c.endswith(" s") and c not in formats})  # the phases
    shown = table.copy()
    for column, fmt in formats.items():
        shown[column] = [fmt.format(v) for v in table[column]]
    print(f"\n{WORK['num_samples']} trials x {WORK['epochs']} epochs, {slots} at a time, "
          f"{WORK['cpus_per_trial']} CPU each; wall = the whole command; "
          f"overhead = 1 - sum(epoch_seconds) / (wall x {slots})")
    print(shown.T.to_string(header=False))

    final = table.iloc[-1]
    if "naive/service" in table:
        print(f"\nnaive/service >= 6x: {'met' if final['naive/service'] >= 6 else 'MISSED'} ({final['naive/service']:.2f}x)")
        # to 4 places, the resolution of 10,000 validation images: the service's accuracy is a float32
        acc_ok = round(final["service val_acc"], 4) >= round(final["naive val_acc"], 4)
        print(f"service val_acc >= naive: {'met' if acc_ok else 'MISSED'} "
              f"({final['service val_acc']:.4f} vs {final['naive val_acc']:.4f})")
    if "naive/warm" in table:
        print(f"naive/warm (the service on a warm local cluster) >= 8x: "
              f"{'met' if final['naive/warm'] >= 8 else 'MISSED'} ({final['naive/warm']:.2f}x)")
    if "service/warm" in table:
        print(f"service/warm (what a warm local cluster saves): {final['service/warm']:.2f}x")
    for side, goal in (("service", 6), ("warm", 8)):
        if f"{side} packed s" in table and "naive s" in table:
            # what bounds a missed goal: when the CPU work alone, packed on every core, takes longer than the
            # goal allows, only less work (fewer or lighter processes) can meet it, not less waiting; and the
            # least work any such command does is its training plus the stack's imports in each new process
            wanted, packed = final["naive s"] / goal, final[f"{side} packed s"]
            print(f"{side}: {goal}x needs {wanted:.1f} s; its CPU work ({final[f'{side} busy core-s']:.1f} core-s, "
                  f"{final[f'{side} busy share']:.0%} busy) packed on {cores()} cores takes {packed:.1f} s: "
                  + ("bound by CPU work" if packed > wanted else "within reach of less waiting"))
            kinds = {c.removeprefix(f"{side} CPU ").removesuffix(" s"): final[c] for c in table.columns
                     if c.startswith(f"{side} CPU ")}
            print(least_work(kinds, trial_imports, wanted))
    print(f"a trial process's imports: {trial_imports:.1f} core-s each; the driver's phases: "
          f"imports {final['service imports s']:.1f} s, the first trial's start {final['service first_trial s']:.1f} s")
    print(f"service overhead share: {final['service overhead']:.0%}")

    if args.keep:
        print(f"run folders and logs: {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
