"""The price of a reproducible parallel search: OrderedSearch against Tune's asynchronous OptunaSearch.

    python bench/reproducible.py [--data-root DIR] [--seeds 5] [--space spaces/mnist.yaml]

Runs the default space (16 trials x 5 epochs, 2 at a time) once per seed in each mode,
interleaved (reproducible, asynchronous, reproducible, ...), each run a whole
`python -m search` command timed from outside. Prints, per mode: best val_acc as mean +- sd
over the seeds, the mean wall time, the share of slot time the reproducible mode's slots
waited for earlier results; then the wall ratio (goal: <= 1.10x).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def run(space: str, seed: int, reproducible: bool, storage: Path, data_root: str | None) -> dict:
    name = f"{'repro' if reproducible else 'async'}-{seed}"
    command = [sys.executable, "-m", "search", "--space", space, "--name", name, "--seed", str(seed),
               "--storage-path", str(storage), "--set", f"experiment.reproducible={str(reproducible).lower()}"]
    if data_root:
        command += ["--data-root", data_root]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    frame = pd.read_parquet(storage / name / "results.parquet")
    waited = re.search(r"waited for earlier results, ([\d.]+) s in all \((\d+)% of slot time\)", done.stdout)
    return {"best": frame["val_acc"].max(), "wall": wall,
            "wait_share": float(waited.group(2)) / 100 if waited else 0.0,
            "configs": frame.sort_values("trial_number")[["trial_number", "lr"]].drop_duplicates().values.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="spaces/mnist.yaml")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--data-root", default=None)
    args = parser.parse_args()
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.seeds):
            for reproducible in (True, False) if seed % 2 == 0 else (False, True):
                result = run(args.space, seed, reproducible, Path(folder), args.data_root)
                runs[reproducible].append(result)
                print(f"seed {seed} {'reproducible' if reproducible else 'asynchronous':>12}: "
                      f"best val_acc {result['best']:.4f}, wall {result['wall']:.1f} s, "
                      f"waiting {100 * result['wait_share']:.0f}%", flush=True)
    print(f"\n{args.space}, {args.seeds} seeds, each mode run once per seed, interleaved:\n")
    print("| mode | best val_acc (mean +- sd) | wall (mean) | slot time waiting |")
    print("|---|---|---|---|")
    for reproducible, label in ((True, "reproducible (OrderedSearch)"), (False, "asynchronous (OptunaSearch)")):
        best = [r["best"] for r in runs[reproducible]]
        print(f"| {label} | {statistics.mean(best):.4f} +- {statistics.stdev(best) if len(best) > 1 else 0:.4f} | "
              f"{statistics.mean(r['wall'] for r in runs[reproducible]):.1f} s | "
              f"{100 * statistics.mean(r['wait_share'] for r in runs[reproducible]):.1f}% |")
    ratio = statistics.mean(r["wall"] for r in runs[True]) / statistics.mean(r["wall"] for r in runs[False])
    print(f"\nwall ratio reproducible / asynchronous: {ratio:.2f}x (goal <= 1.10x)")


if __name__ == "__main__":
    main()
