"""Recording the k-th finished trial in results.parquet: one part per trial vs one rewritten file.

When a trial ends, its rows are recorded. Two ways, timed side by side in one run:

  (a) new: results.parquet is a folder of per-trial parts; the k-th trial writes only its
      own part, `RunFolder.parts.write(space, trial_id, rows)`, beside the k-1 parts already
      there. Its cost should not depend on k.
  (b) old: results.parquet is one file; every trial's rows (all k trials) become one table
      that is written whole (`part_bytes(all_rows, schema)` + `Storage.write`), which is
      what rewriting the file after every finished trial costs. Its cost grows with k, so a
      search of n trials pays O(n^2) in total.

Both go through the same code (results_schema, the JSON-text conversion, pq.write_table,
Storage.write with its temporary file, fsync and rename), on the space of spaces/mnist.yaml,
with 5 epochs of rows per trial shaped like trainable.report.epoch_report and a distinct
seed/lr/batch_size/t_max/clip_norm per trial. Gathering the rows of earlier trials is not
timed for (b), so its figures are a lower bound on the old cost.

For each k, the k-1 earlier parts are put in place first (untimed), then trial k is
recorded REPS times each way, (a) and (b) interleaved with the order flipping every
repetition (a shared machine is noisy), and the medians are compared. Printed: a table
k | new ms | old ms | old/new, and the slope of log(time) against log(k) for each way
(new ~0: constant per trial; old ~1: linear per trial; at small k both pay the same fixed
cost per write, so the slope over the two largest k is printed too). Once, at the largest k,
`pandas.read_parquet` of the parts folder is checked to return k*5 rows.

    python bench/results_write.py [--ks 10,100,1000,3000] [--reps 7]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from search.store.results import RESULTS_FILE, part_bytes, results_schema, trial_rows  # noqa: E402
from search.store.run_folder import RunFolder  # noqa: E402
from search.definition.space import Space, parse_space  # noqa: E402
from search.store.storage import Storage  # noqa: E402
from trainable.report import REPORT_COLUMNS  # noqa: E402
from trainable.yaml_file import read_yaml_mapping  # noqa: E402

SPACE_FILE = REPO / "spaces" / "mnist.yaml"
EPOCHS = 5


def trial_id(i: int) -> str:
    return f"trial_{i:05d}"


def trial_config(space: Space, i: int, rng: random.Random) -> dict[str, Any]:
    """The space's defaults with the searched fields drawn per trial, as Tune would pass them."""
    flat = space.trial_defaults().to_flat()
    flat.update(seed=i, lr=math.exp(rng.uniform(math.log(0.01), math.log(0.3))),
                batch_size=rng.choice([64, 128, 256]), t_max=rng.randint(4, 10),
                clip_norm=math.exp(rng.uniform(math.log(0.5), math.log(10.0))))
    return flat


def reports(i: int, lr: float, rng: random.Random) -> list[dict[str, Any]]:
    """EPOCHS reports with epoch_report's keys, as a trial on a CPU would make them."""
    out, loss, now = [], 2.3, 1.7e9 + 60.0 * i
    for epoch in range(1, EPOCHS + 1):
        loss *= rng.uniform(0.3, 0.8)
        seconds = rng.uniform(4.0, 6.0)
        now += seconds
        out.append({"epoch": epoch, "train_loss": loss, "train_acc": 1 - loss / 3, "val_loss": loss * 1.1,
                    "val_acc": 1 - loss / 2.8, "epoch_lr": lr * (EPOCHS - epoch + 1) / EPOCHS,
                    "epoch_seconds": seconds, "diverged": False, "node": f"{i % 4:012x}",
                    "hostname": f"worker-{i % 4}", "device": "cpu", "accelerator_ids": "",
                    "gpu_memory_allocated_mb": None, "gpu_memory_reserved_mb": None, "finished_at": now})
    assert list(out[0]) == REPORT_COLUMNS
    return out


def all_trial_rows(space: Space, n: int) -> list[list[dict[str, Any]]]:
    """rows[i - 1]: trial i's rows, as trial_rows makes them when the trial has finished."""
    rng = random.Random(0)
    out = []
    for i in range(1, n + 1):
        config = trial_config(space, i, rng)
        out.append(trial_rows(trial_id(i), config, reports(i, config["lr"], rng), done=True, error=False))
    return out


def prefill(folder: Path, space: Space, rows: list[list[dict[str, Any]]], upto: int) -> None:
    """Parts 1..upto that are missing, written plainly (no fsync, no temporary file): untimed set-up."""
    schema = results_schema(space)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, upto + 1):
        path = folder / f"{trial_id(i)}.parquet"
        if not path.exists():
            path.write_bytes(part_bytes(rows[i - 1], schema))
    os.sync()  # flush them now, or the first timed fsync pays for writing them out


def time_new(run: RunFolder, space: Space, k: int, rows: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    run.parts.write(space, trial_id(k), rows)
    return time.perf_counter() - start


def time_old(storage: Storage, space: Space, all_rows: list[dict[str, Any]]) -> float:
    start = time.perf_counter()
    storage.write(f"old/{RESULTS_FILE}", part_bytes(all_rows, results_schema(space)))
    return time.perf_counter() - start


def slope(ks: list[int], seconds: list[float]) -> float:
    """Least-squares slope of log(seconds) against log(k)."""
    x = [math.log(k) for k in ks]
    y = [math.log(s) for s in seconds]
    mx, my = statistics.fmean(x), statistics.fmean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="10,100,1000,3000", help="trial counts k, comma-separated")
    parser.add_argument("--reps", type=int, default=7, help="timed repetitions per way and k (median)")
    args = parser.parse_args()
    ks = sorted(int(k) for k in args.ks.split(","))

    with tempfile.TemporaryDirectory(prefix="results_write_") as base:
        space = parse_space(read_yaml_mapping(SPACE_FILE), source=str(SPACE_FILE))  # loads no data
        storage = Storage.at(base)
        run = RunFolder(storage, "new")
        parts = Path(run.path) / RESULTS_FILE

        started = time.perf_counter()
        rows = all_trial_rows(space, ks[-1])
        print(f"space {SPACE_FILE.name}: {len(results_schema(space))} columns, {EPOCHS} rows per trial; "
              f"rows for {ks[-1]} trials made in {time.perf_counter() - started:.1f} s; "
              f"median of {args.reps} per cell (+1 untimed warm-up), on {os.cpu_count()} CPUs\n")

        medians = {}
        for k in ks:
            prefill(parts, space, rows, k - 1)
            flat = [row for trial in rows[:k] for row in trial]
            time_new(run, space, k, rows[k - 1])  # warm-up: both then replace an existing file
            time_old(storage, space, flat)
            new, old = [], []
            for rep in range(args.reps):
                if rep % 2 == 0:
                    new.append(time_new(run, space, k, rows[k - 1]))
                    old.append(time_old(storage, space, flat))
                else:
                    old.append(time_old(storage, space, flat))
                    new.append(time_new(run, space, k, rows[k - 1]))
            medians[k] = (statistics.median(new), statistics.median(old))

        k = ks[-1]
        frame = pd.read_parquet(parts)
        assert len(frame) == k * EPOCHS, (len(frame), k * EPOCHS)
        assert frame["trial_id"].nunique() == k
        assert len(pd.read_parquet(storage.join("old", RESULTS_FILE))) == k * EPOCHS

        print(f"{'k':>6} | {'new ms':>8} | {'old ms':>8} | {'old/new':>7}")
        print(f"{'-' * 6}-+-{'-' * 8}-+-{'-' * 8}-+-{'-' * 7}")
        for k, (new, old) in medians.items():
            print(f"{k:>6} | {new * 1e3:>8.2f} | {old * 1e3:>8.2f} | {old / new:>6.1f}x")
        new, old = [m[0] for m in medians.values()], [m[1] for m in medians.values()]
        print(f"\ngrowth, slope of log(time) vs log(k): new {slope(ks, new):.2f}, old {slope(ks, old):.2f}"
              f"  (0: constant per trial, 1: linear)")
        if len(ks) > 2:  # at small k both pay the same fixed cost per write; the tail shows the growth
            print(f"  over the two largest k ({ks[-2]}, {ks[-1]}): new {slope(ks[-2:], new[-2:]):.2f}, "
                  f"old {slope(ks[-2:], old[-2:]):.2f}")
        print(f"checked: pandas.read_parquet(results.parquet/) of {ks[-1]} parts -> {len(frame)} rows "
              f"= {ks[-1]} x {EPOCHS}")
        print(f"total {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
