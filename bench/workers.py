"""One MNIST config trained on 1 and on 2 workers (resources.workers), side by side in one run.

    .venv/bin/python bench/workers.py [--data-root DIR] [--epochs 3] [--threads 1]

Each row is `python -m trainable` with the same config and seed, `--workers N` (gloo on CPU; on a GPU node
one GPU per worker, nccl): the mean seconds of an epoch after the first (the first pays for warm-up), the
final val_acc and the command's wall time (interpreter, data, the workers' start). Each worker gets
`--threads` torch threads, so 2 workers use twice the cores of 1: on a machine with 2 cores that is all of
it. What a trial of N workers costs a search beyond its epochs is the start of N-1 Ray actors per trial
(the setup_seconds column of results.parquet; docs/gpus.md).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCH = re.compile(r"Epoch \[\s*(\d+)/\d+\].*val_acc ([0-9.]+).* \| ([0-9.]+)s$")


def run(workers: int, args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "trainable", "--workers", str(workers), "--epochs", str(args.epochs),
               "--num-threads", str(args.threads), "--batch-size", "128", "--lr", "0.05", "--seed", "0"]
    if args.data_root:
        command += ["--data-root", args.data_root]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    epochs = [EPOCH.search(line) for line in done.stdout.splitlines()]
    epochs = [m for m in epochs if m]
    seconds = [float(m[3]) for m in epochs[1:]] or [float(epochs[0][3])]
    return {"workers": workers, "epoch_s": statistics.mean(seconds), "val_acc": float(epochs[-1][2]), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    args = parser.parse_args()
    rows = [run(n, args) for n in (1, 2)]
    print(f"MNIST mlp [128], 50000 train / 10000 val, batch 128, {args.epochs} epochs, {args.threads} thread(s) "
          "per worker")
    print(f"{'workers':>7} {'s/epoch':>8} {'val_acc':>8} {'wall s':>7}")
    for r in rows:
        print(f"{r['workers']:>7} {r['epoch_s']:>8.2f} {r['val_acc']:>8.4f} {r['wall_s']:>7.1f}")
    print(f"epoch time at 2 workers / 1 worker: {rows[1]['epoch_s'] / rows[0]['epoch_s']:.2f}")


if __name__ == "__main__":
    main()
