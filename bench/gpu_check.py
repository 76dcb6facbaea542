"""Trials per GPU, measured in steady state: 1, 2, 4 and 8 trials sharing one GPU, and auto.

For a machine with a real CUDA GPU (it uses one). Runs one search of spaces/mnist.yaml per
row, `python -m search` each in its own process on a local Ray: --gpus-per-trial 1, 0.5,
0.25 and 0.125 with as many trials at once, then --gpus-per-trial auto (the probe of
search/execution/gpu_probe.py picks trials per GPU; at most 8 at once). Each search runs at least
--trials-per-slot trials per slot (8) on the full split (50,000 training images), so a
slot's start-up (its trial actor, Ray's placement) is paid once per 8 trials. It prints:

- steady trials/min: trials that ended after the first wave (one per slot), over the time
  from the first wave's last end to the last trial's end: the start-up of each slot and the
  ramp-down left out; and its ratio to one trial per GPU;
- GPU util %: mean of nvidia-smi's utilization.gpu over the training span;
- the most trials that ran on the GPU at once (results.parquet);
- memory per trial: the trials' own gpu_memory_allocated_mb and gpu_memory_reserved_mb
  (torch's peaks) and, from nvidia-smi, each trial process's peak (CUDA context included).

Then, on a machine with two GPUs or more, one row of trials on 2 workers (resources.workers: 2,
one whole GPU each, DDP over nccl, one trial at a time): its steady rate over one trial on one GPU.
With one GPU it says why that row is not run (nccl takes a GPU per worker; docs/gpus.md).

    python bench/gpu_check.py [--data-root DIR] [--epochs 1] [--trials-per-slot 8]

Takes about 4-6 minutes on one H200, at most --budget-s (450 s). Exit codes: 0 done; 1 no
CUDA GPU, a search or a trial failed, time ran out, or a trial did not run on cuda.
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

PACKINGS = (1, 2, 4, 8, "auto")  # trials per GPU
AUTO_AT_ONCE = 8  # auto's search runs at most this many at once (its choice may be more)
WORKERS = 2  # the several-workers row: a trial on this many GPUs (issue 39)


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


class GpuPoller:
    """nvidia-smi sampled while a search runs: each process's peak memory (MiB) and the GPU's utilisation."""

    def __init__(self, gpu: str, interval_s: float = 0.5):
        self.gpu = gpu  # the index nvidia-smi knows it by
        self.interval_s = interval_s
        self.peaks: dict[str, float] = {}
        self.utilisation: list[tuple[float, float]] = []  # (unix time, percent)
        self.available = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "GpuPoller":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _query(self, *args: str) -> list[str]:
        return subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10).stdout.splitlines()

    def _run(self) -> None:
        own = str(os.getpid())
        while not self._stop.is_set():
            try:
                apps = self._query("--query-compute-apps=pid,used_memory")
                util = self._query("--query-gpu=utilization.gpu", f"--id={self.gpu}")
            except (OSError, subprocess.TimeoutExpired):
                self.available = False
                return
            for line in apps:
                pid, _, used = (part.strip() for part in line.partition(","))
                if pid != own and used.replace(".", "", 1).isdigit():
                    self.peaks[pid] = max(self.peaks.get(pid, 0.0), float(used))
            if util and util[0].strip().isdigit():
                self.utilisation.append((time.time(), float(util[0])))
            self._stop.wait(self.interval_s)

    def per_process(self) -> list[float]:
        return sorted(self.peaks.values())

    def mean_utilisation(self, start: float, end: float) -> float:
        during = [u for t, u in self.utilisation if start <= t <= end]
        return sum(during) / len(during) if during else math.nan


def run_search(name: str, flags: list[str], args: argparse.Namespace, storage: Path,
               deadline: float) -> tuple[float, int, Path]:
    """One search; returns (wall seconds, exit code, log file)."""
    command = [sys.executable, "-m", "search", "--space", str(REPO / "spaces" / "mnist.yaml"),
               "--name", name, "--storage-path", str(storage), *flags,
               "--epochs", str(args.epochs), "--scheduler", "fifo", "--seed", "0",
               "--set", "data.train_size=null"]
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


def steady_rate(frame: pd.DataFrame, slots: int) -> float:
    """Trials per minute after the first wave: (n - slots) trials over (last end - slots-th end)."""
    ends = sorted(frame.groupby("trial_id")["finished_at"].max().dropna())
    if len(ends) <= slots or ends[-1] <= ends[slots - 1]:
        return math.nan
    return (len(ends) - slots) / (ends[-1] - ends[slots - 1]) * 60


def training_span(frame: pd.DataFrame) -> tuple[float, float]:
    """(start of the first epoch, end of the last), unix seconds."""
    done = frame.dropna(subset=["finished_at", "epoch_seconds"])
    if done.empty:
        return math.nan, math.nan
    return float((done["finished_at"] - done["epoch_seconds"]).min()), float(done["finished_at"].max())


def row_of(label: str | int, slots: int, frame: pd.DataFrame, poller: "GpuPoller", gpus_per_trial: str) -> dict:
    """One row of the table from a search's results.parquet and the GPU's samples while it ran."""
    from search.outputs.summary import max_trials_per_gpu  # the project, imported only when it will run

    trials = frame.drop_duplicates("trial_id")
    start, end = training_span(frame)
    return {
        "trials/GPU": label,
        "gpus/trial": gpus_per_trial,
        "trials": f"{int((trials['status'] == 'COMPLETED').sum())}/{len(trials)}",
        "at once": max_trials_per_gpu(frame),
        "train span s": round(end - start, 1),
        "steady trials/min": steady_rate(frame, slots),
        "GPU util %": poller.mean_utilisation(start, end) if poller.available else math.nan,
        "alloc MiB/trial": describe(per_trial_peak(frame, "gpu_memory_allocated_mb")),
        "reserved MiB/trial": describe(per_trial_peak(frame, "gpu_memory_reserved_mb")),
        "process MiB/trial": describe(poller.per_process()) if poller.available else "n/a",
    }


def describe(values: list[float]) -> str:
    if not values:
        return "n/a"
    median = values[len(values) // 2]
    return f"{median:.0f} (max {max(values):.0f})"


def per_trial_peak(frame: pd.DataFrame, column: str) -> list[float]:
    return sorted(frame.groupby("trial_id")[column].max().dropna().tolist()) if column in frame else []


def format_table(rows: list[dict]) -> str:
    """The rows as one table, with each row's steady rate over the rate of one trial per GPU."""
    table = pd.DataFrame(rows)
    base = table.loc[table["trials/GPU"] == 1, "steady trials/min"]
    table.insert(table.columns.get_loc("steady trials/min") + 1, "vs 1/GPU",
                 table["steady trials/min"] / base.iloc[0] if len(base) else math.nan)
    return table.to_string(index=False, float_format=lambda v: f"{v:.2f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", help="MNIST folder (default: $HPSEARCH_DATA or ~/.cache/hpsearch)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per trial (default 1)")
    parser.add_argument("--trials-per-slot", type=int, default=8,
                        help="trials each slot runs in turn (default 8: start-up is paid once per 8)")
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop the remaining searches after this")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = find_gpu()
    if gpu is None:
        print("error: no CUDA GPU: torch sees no CUDA device, and bench/gpu_check.py measures trials on "
              "one real GPU. Run it on a machine with one (make gpu-check).", file=sys.stderr)
        return 1
    import torch

    # one GPU: with several, the search would spread trials over them and nothing would be packed
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpu_ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    cpu_count = os.cpu_count() or 1
    deadline = time.monotonic() + args.budget_s
    print(f"GPU: {gpu}, using one; {cpu_count} CPUs; {args.trials_per_slot} trials per slot, each "
          f"{args.epochs} epoch(s) of the full split; budget {args.budget_s:.0f} s", flush=True)

    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as folder:
        storage = Path(folder)
        for packing in PACKINGS:
            at_once = AUTO_AT_ONCE if packing == "auto" else packing
            # every trial at once must fit on the CPUs too (rounded down to 0.01 CPU)
            cpus = min(1.0, math.floor(cpu_count / at_once * 100) / 100)
            name = f"pack{packing}"
            if time.monotonic() >= deadline:
                print(f"{packing} per GPU: not run, out of time", flush=True)
                failed = True
                continue
            gpus = "auto" if packing == "auto" else f"{1 / packing:g}"
            flags = ["--gpus-per-trial", gpus, "--cpus-per-trial", f"{cpus:g}", "--max-concurrent", str(at_once),
                     "--num-samples", str(args.trials_per_slot * at_once)]
            with GpuPoller(os.environ["CUDA_VISIBLE_DEVICES"]) as poller:
                wall, code, log = run_search(name, flags, args, storage, deadline)
            results = storage / name / "results.parquet"
            if code != 0 or not results.exists():
                why = "timed out" if code == 124 else f"exit code {code}"
                tail = "\n".join(log.read_text().splitlines()[-25:])
                print(f"{packing} per GPU: search failed ({why}); last lines of its output:\n{tail}", flush=True)
                failed = True
                continue
            frame = pd.read_parquet(results)
            if packing == "auto":
                chosen = json.loads((storage / name / "gpu_probe.json").read_text())["choice"]["trials_per_gpu"]
                slots, label = min(chosen, at_once), f"auto ({chosen})"
            else:
                slots, label = packing, packing
            trials = frame.drop_duplicates("trial_id")
            devices = sorted(set(frame["device"].fillna("none").astype(str)))
            on_cuda = all(d.startswith("cuda") for d in devices)
            failed |= not on_cuda or bool((trials["status"] == "ERROR").any())
            rows.append(row_of(label, slots, frame, poller, f"{1 / slots:g}"))
            print(f"{label} per GPU: {len(trials)} trials in {wall:.0f} s (devices: {', '.join(devices)})",
                  flush=True)
            if not on_cuda:
                print(f"{label} per GPU: a trial did not run on cuda ({', '.join(devices)})", flush=True)

        failed |= workers_row(gpu_ids, args, storage, deadline, rows)

    if rows:
        print()
        print(format_table(rows))
        print("\nsteady trials/min: trials ended after the first wave over the time since; vs 1/GPU: that "
              "over the rate with one trial per GPU.\nGPU util %: nvidia-smi utilization.gpu, mean over the "
              "training span. alloc / reserved MiB/trial: median (max) of each trial's\n"
              "torch.cuda.max_memory_allocated / max_memory_reserved; process MiB/trial: median (max) peak "
              "per trial process from nvidia-smi, CUDA context included.")
    return 1 if failed else 0


def workers_row(gpu_ids: list[str], args: argparse.Namespace, storage: Path, deadline: float,
                rows: list[dict]) -> bool:
    """The row of trials on WORKERS workers, a whole GPU each, one trial at a time; True if it failed."""
    label = f"{WORKERS} workers"
    if len(gpu_ids) < WORKERS:
        print(f"{label}: not run: a trial of {WORKERS} workers needs {WORKERS} GPUs (nccl takes one per worker), "
              f"this machine shows {len(gpu_ids)}", flush=True)
        return False
    if time.monotonic() >= deadline:
        print(f"{label}: not run, out of time", flush=True)
        return True
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids[:WORKERS])
    flags = ["--gpus-per-trial", "1", "--cpus-per-trial", "1", "--max-concurrent", "1",
             "--num-samples", str(args.trials_per_slot), "--set", f"resources.workers={WORKERS}"]
    with GpuPoller(gpu_ids[0]) as poller:  # rank 0's GPU
        wall, code, log = run_search("workers", flags, args, storage, deadline)
    results = storage / "workers" / "results.parquet"
    if code != 0 or not results.exists():
        tail = "\n".join(log.read_text().splitlines()[-25:])
        print(f"{label}: search failed (exit code {code}); last lines of its output:\n{tail}", flush=True)
        return True
    frame = pd.read_parquet(results)
    rows.append(row_of(label, 1, frame, poller, str(WORKERS)))
    print(f"{label}: {frame['trial_id'].nunique()} trials in {wall:.0f} s (world sizes: "
          f"{sorted(set(frame['world_size'].dropna().astype(int)))})", flush=True)
    return bool((frame.drop_duplicates("trial_id")["status"] == "ERROR").any()) or \
        not (frame["world_size"] == WORKERS).all()


if __name__ == "__main__":
    sys.exit(main())
