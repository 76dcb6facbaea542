"""Early stopping side by side: FIFO, reproducible ASHA, Ray's ASHA, reproducible Hyperband and PBT.

    python bench/early_stopping.py [--data-root DIR] [--seeds 3] [--quick] [--schedulers fifo,asha,hyperband]

Runs one space once per scheduler and seed, interleaved, each run a whole `python -m search`
command timed from outside. The issue's setting is 32 trials x 10 epochs of the MNIST MLP at 4
at once (the default); --quick is 8 trials x 4 epochs on a 5,000-image subset, one seed.
Prints per scheduler: best val_acc (mean over seeds), the trial-epochs spent, the trial-epochs
spent until FIFO's final best was reached within 0.1% (of the same seed; "-" if never), and
the wall time; then the trial-epoch ratio to FIFO (the issue's goal: <= 0.5 for the same best).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SCHEDULERS = {  # label -> (scheduler, reproducible)
    "fifo": ("fifo", True),
    "asha (reproducible)": ("asha", True),
    "asha (Ray's, by arrival)": ("asha", False),
    "hyperband (reproducible)": ("hyperband", True),
    "pbt (Ray's, synchronous)": ("pbt", True),
}
SHORT = dict(zip(("fifo", "asha", "asha-ray", "hyperband", "pbt"), SCHEDULERS))  #: --schedulers' names


def run(label: str, seed: int, settings: list[str], storage: Path) -> dict:
    scheduler, reproducible = SCHEDULERS[label]
    name = f"{scheduler}-{'r' if reproducible else 'a'}-{seed}"
    command = [sys.executable, "-m", "search", "--space", "spaces/mnist.yaml", "--name", name, "--seed", str(seed),
               "--storage-path", str(storage), "--scheduler", scheduler,
               "--set", f"experiment.reproducible={str(reproducible).lower()}", *settings]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    frame = pd.read_parquet(storage / name / "results.parquet").sort_values("finished_at")
    return {"frame": frame, "best": float(frame["val_acc"].max()), "epochs": len(frame), "wall": wall}


def epochs_to_reach(frame: pd.DataFrame, target: float) -> int | None:
    """Trial-epochs trained (in the order they finished) until one reached `target`."""
    reached = (frame["val_acc"] >= target).to_numpy().nonzero()[0]
    return int(reached[0]) + 1 if len(reached) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="8 trials x 4 epochs on 5,000 images, one seed")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--schedulers", default=",".join(SHORT),
                        help=f"which to run, of {', '.join(SHORT)} (fifo always runs: the reference)")
    args = parser.parse_args()
    wanted = {"fifo", *args.schedulers.split(",")}
    if wanted - set(SHORT):
        parser.error(f"--schedulers: unknown {', '.join(sorted(wanted - set(SHORT)))} (known: {', '.join(SHORT)})")
    chosen = [label for short, label in SHORT.items() if short in wanted]
    trials, epochs = (8, 4) if args.quick else (32, 10)
    settings = ["--num-samples", str(trials), "--max-concurrent", "4", "--epochs", str(epochs),
                "--cpus-per-trial", "0.5", "--set", "experiment.grace_period=1",
                "--set", "experiment.reduction_factor=2"]
    if args.quick:
        settings += ["--set", "data.train_size=5000", "--set", "data.val_size=1000"]
    if args.data_root:
        settings += ["--data-root", args.data_root]
    seeds = 1 if args.quick else args.seeds
    runs: dict[str, list[dict]] = {label: [] for label in chosen}
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(seeds):
            labels = chosen if seed % 2 == 0 else list(reversed(chosen))
            for label in labels:
                runs[label].append(run(label, seed, settings, Path(folder)))
                r = runs[label][-1]
                print(f"seed {seed} {label:>26}: best {r['best']:.4f}, {r['epochs']} trial-epochs, "
                      f"wall {r['wall']:.1f} s", flush=True)
    print(f"\nspaces/mnist.yaml, {trials} trials x {epochs} epochs, 4 at once, {seeds} seed(s):\n")
    print("| scheduler | best val_acc | trial-epochs | trial-epochs to FIFO's best (-0.1%) | wall | "
          "trial-epochs / FIFO's |")
    print("|---|---|---|---|---|---|")
    fifo_epochs = statistics.mean(r["epochs"] for r in runs["fifo"])
    for label, results in runs.items():
        to_target = [epochs_to_reach(r["frame"], fifo["best"] - 0.001) for r, fifo in zip(results, runs["fifo"])]
        reached = [e for e in to_target if e is not None]
        mean_epochs = statistics.mean(r["epochs"] for r in results)
        print(f"| {label} | {statistics.mean(r['best'] for r in results):.4f} | {mean_epochs:.0f} | "
              f"{statistics.mean(reached) if reached else '-'} ({len(reached)}/{len(results)} reached) | "
              f"{statistics.mean(r['wall'] for r in results):.1f} s | {mean_epochs / fifo_epochs:.2f} |")


if __name__ == "__main__":
    main()
