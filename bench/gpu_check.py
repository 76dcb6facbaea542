"""Packing trials on one GPU: trials per minute with 1, 2, 4 and 8 trials sharing it.

For a machine with one real CUDA GPU. Runs four short searches of spaces/mnist.yaml side by
side, `python -m search` each in its own process on a local Ray, with --gpus-per-trial 1, 0.5,
0.25 and 0.125 (twice as many trials as fit at once, so the GPU stays full), and prints:

- trials per minute over the training span (first epoch start to last epoch end, which
  leaves out Ray start-up and data loading) and its ratio to one trial per GPU;
- the most trials that ran on the GPU at once (from results.parquet);
- GPU memory per trial: the trials' own `gpu_memory_mb` (torch.cuda.max_memory_allocated,
  when the trainable reports it; else n/a) and, from nvidia-smi, the peak memory of each
  trial process (which includes its CUDA context, ~0.5 GB, that every packed trial pays);
- whether every trial ran on `cuda` (results.parquet's `device` column).

    python bench/gpu_check.py [--data-root DIR] [--epochs 2] [--train-size 10000]

Takes about 2-4 minutes, at most --budget-s (330 s). Exit codes: 0 done, or skipped without
a GPU ("no GPU: skipped"); 1 a search or a trial failed, time ran out, or a trial did not
run on cuda.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the project's packages

PACKINGS = (1, 2, 4, 8)  # trials per GPU


def find_gpu() -> str | None:
    """The GPU's name, or None when torch sees no CUDA device (the project's own device test)."""
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None or accelerator.type != "cuda":
        return None
    # the name from nvidia-smi: this process then holds no CUDA context of its own on the GPU
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        names = []
    return f"{names[0].strip() if names else 'CUDA GPU'} ({torch.cuda.device_count()} visible)"


class GpuMemoryPoller:
    """Peak GPU memory of each process (MiB) from nvidia-smi, sampled while a search runs."""

    def __init__(self, interval_s: float = 0.5):
        self.interval_s = interval_s
        self.peaks: dict[str, float] = {}
        self.available = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "GpuMemoryPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        own = str(os.getpid())
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                    capture_output=True, text=True, timeout=10).stdout
            except (OSError, subprocess.TimeoutExpired):
                self.available = False
                return
            for line in out.splitlines():
                pid, _, used = (part.strip() for part in line.partition(","))
                if pid != own and used.replace(".", "", 1).isdigit():
                    self.peaks[pid] = max(self.peaks.get(pid, 0.0), float(used))
            self._stop.wait(self.interval_s)

    def per_process(self) -> list[float]:
        return sorted(self.peaks.values())


def run_search(packing: int, cpus: float, args: argparse.Namespace, storage: Path,
               deadline: float) -> tuple[float, int, Path]:
    """One search with `packing` trials per GPU; returns (wall seconds, exit code, log file)."""
    name = f"pack{packing}"
    command = [
        sys.executable, "-m", "search", "--space", str(REPO / "spaces" / "mnist.yaml"),
        "--name", name, "--storage-path", str(storage),
        "--gpus-per-trial", f"{1 / packing:g}", "--cpus-per-trial", f"{cpus:g}",
        "--max-concurrent", str(packing), "--num-samples", str(2 * packing),
        "--epochs", str(args.epochs), "--set", f"data.train_size={args.train_size}",
        "--scheduler", "fifo", "--seed", "0",
    ]
    if args.data_root:
        command += ["--data-root", args.data_root]
    log = storage / f"{name}.log"
    start = time.perf_counter()
    with open(log, "w") as out:
        # its own session, so a timeout can end the search and the Ray processes it started
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
            code = 124
    return time.perf_counter() - start, code, log


def reported_gpu_memory(frame: pd.DataFrame, run_folder: Path) -> list[float]:
    """Each trial's peak `gpu_memory_mb`: from results.parquet if it has the column, else from
    the metrics Tune kept in each trial folder's result.json; [] when no trial reports it."""
    if "gpu_memory_mb" in frame.columns and frame["gpu_memory_mb"].notna().any():
        return sorted(frame.groupby("trial_id")["gpu_memory_mb"].max().dropna().tolist())
    peaks = []
    for result_file in run_folder.glob("*/result.json"):
        values = []
        for line in result_file.read_text().splitlines():
            try:
                value = json.loads(line).get("gpu_memory_mb")
            except json.JSONDecodeError:
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                values.append(value)
        if values:
            peaks.append(max(values))
    return sorted(peaks)


def training_span(frame: pd.DataFrame) -> float:
    """Seconds from the first epoch's start to the last epoch's end, over all trials."""
    done = frame.dropna(subset=["finished_at", "epoch_seconds"])
    if done.empty:
        return math.nan
    return float(done["finished_at"].max() - (done["finished_at"] - done["epoch_seconds"]).min())


def describe(values: list[float]) -> str:
    if not values:
        return "n/a"
    median = values[len(values) // 2]
    return f"{median:.0f} (max {max(values):.0f})"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", help="MNIST folder (default: $HPSEARCH_DATA or ~/.cache/hpsearch)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-size", type=int, default=10_000)
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop the remaining searches after this")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = find_gpu()
    if gpu is None:
        print("no GPU: skipped (torch sees no CUDA device; bench/gpu_check.py needs one real GPU)")
        return 0
    from search.summary import max_trials_per_gpu  # the project, imported only when it will run

    # one GPU: with several, Ray would spread trials over them and nothing would be packed
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    cpu_count = os.cpu_count() or 1
    deadline = time.monotonic() + args.budget_s
    print(f"GPU: {gpu}, using one; {cpu_count} CPUs; each trial {args.epochs} epochs x "
          f"{args.train_size} images; budget {args.budget_s:.0f} s", flush=True)

    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as folder:
        storage = Path(folder)
        for packing in PACKINGS:
            # all `packing` trials must fit on the CPUs at once too (rounded down to 0.01 CPU)
            cpus = min(1.0, math.floor(cpu_count / packing * 100) / 100)
            if time.monotonic() >= deadline:
                print(f"{packing} per GPU: not run, out of time", flush=True)
                failed = True
                continue
            with GpuMemoryPoller() as poller:
                wall, code, log = run_search(packing, cpus, args, storage, deadline)
            results = storage / f"pack{packing}" / "results.parquet"
            if code != 0 or not results.exists():
                why = "timed out" if code == 124 else f"exit code {code}"
                tail = "\n".join(log.read_text().splitlines()[-25:])
                print(f"{packing} per GPU: search failed ({why}); last lines of its output:\n{tail}", flush=True)
                failed = True
                continue
            frame = pd.read_parquet(results)
            trials = frame.drop_duplicates("trial_id")
            devices = sorted(set(frame["device"].fillna("none").astype(str)))
            on_cuda = all(d.startswith("cuda") for d in devices)
            failed |= not on_cuda or bool((trials["status"] == "ERROR").any())
            span = training_span(frame)
            completed = int((trials["status"] == "COMPLETED").sum())
            rows.append({
                "trials/GPU": packing,
                "gpus/trial": f"{1 / packing:g}",
                "cpus/trial": f"{cpus:g}",
                "trials": f"{completed}/{len(trials)}",
                "at once": max_trials_per_gpu(frame),
                "wall s": round(wall, 1),
                "train span s": round(span, 1),
                "trials/min": len(trials) / span * 60 if span > 0 else math.nan,
                "alloc MiB/trial": describe(reported_gpu_memory(frame, storage / f"pack{packing}")),
                "process MiB/trial": describe(poller.per_process()) if poller.available else "n/a",
                "device": ",".join(devices),
                "on cuda": on_cuda,
            })
            print(f"{packing} per GPU: {len(trials)} trials in {wall:.0f} s (devices: {', '.join(devices)})",
                  flush=True)

    if rows:
        all_cuda = all([r.pop("on cuda") for r in rows])
        table = pd.DataFrame(rows)
        base = table.loc[table["trials/GPU"] == 1, "trials/min"]
        table.insert(table.columns.get_loc("trials/min") + 1, "vs 1/GPU",
                     table["trials/min"] / base.iloc[0] if len(base) else math.nan)
        print()
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        print("\ntrials/min: trials over the training span; vs 1/GPU: that rate over the rate with "
              "one trial per GPU.\nalloc MiB/trial: median (max) of torch.cuda.max_memory_allocated "
              "per trial (n/a: the trainable does not report gpu_memory_mb);\nprocess MiB/trial: "
              "median (max) peak per trial process from nvidia-smi, CUDA context included.")
        print(f"every trial ran on cuda: {'yes' if all_cuda else 'NO'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
