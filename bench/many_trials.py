"""Ten thousand trials: the whole command's cost per trial against plain Ray Tune, and what the end costs.

Both sides run N trials of a user function that does no work and reports once, 2 at a time with
1 CPU each (issue 38's "no-op trials"):

- service: `python -m search --space space.yaml` on a space naming that function
  (`trainable: noop.py:train`), every other default of a space file (the reproducible TPE
  searcher, TensorBoard event files, a progress line per report, to a log file);
- plain: this file with --plain: Tune + OptunaSearch (the same seeded TPE) behind a
  ConcurrencyLimiter, reuse_actors, Tune's default loggers, the same function with a `report`
  that is tune.report.

Each side is a subprocess, timed from outside (start-up and end included); the sides alternate
which runs first from one N to the next. Also measured, per N:

- the driver's peak resident memory (VmHWM of the command's own process, read from /proc while it
  runs; Ray's processes are not the driver);
- the service's end, from its timing.yaml: results.parquet and the journal, best.yaml's test
  accuracy, the report (Ray's shutdown apart), and its share of the command;
- what it left: results.parquet's rows and size, optuna.journal's size, report.html's size;
- `--resume` of the finished run: its wall time and exit code (a finished run is said without
  starting Ray).

    .venv/bin/python bench/many_trials.py [--sizes 100 1000 10000]    # about 30 minutes on 2 cores
    .venv/bin/python bench/many_trials.py --quick                     # 20 trials: about a minute
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)  # else bench/search.py hides the search package from the plain side

SLOTS = 2
NOOP = '''
def train(config, report, checkpoint=None):
    report(val_acc=config["lr"])
'''
END = ("results", "test", "report")  # timing.yaml's phases after the trials (search/outputs/phases.py)


def plain(n: int, folder: Path) -> None:
    """The plain Tune side, in its own process."""
    import importlib.util

    import ray
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from search.searching.ordered import make_sampler

    spec = importlib.util.spec_from_file_location("noop", folder / "noop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = module.train

    def trial(config):
        function(config, lambda **metrics: tune.report(metrics))

    ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=SLOTS)
    try:
        tuner = tune.Tuner(
            tune.with_resources(trial, {"cpu": 1}),
            param_space={"lr": tune.loguniform(0.001, 0.5)},
            tune_config=tune.TuneConfig(metric="val_acc", mode="max", num_samples=n, reuse_actors=True,
                                        search_alg=ConcurrencyLimiter(OptunaSearch(sampler=make_sampler("tpe", 0, 0)),
                                                                      max_concurrent=SLOTS)),
            run_config=tune.RunConfig(name="plain", storage_path=str(folder / "plain"), verbose=0),
        )
        grid = tuner.fit()
        if grid.errors or len(grid) != n:
            raise SystemExit(f"plain Tune: {len(grid)} trials, {len(grid.errors)} errors")
    finally:
        ray.shutdown()


class PeakMemory:
    """The peak resident memory of one process (VmHWM), read from /proc until it ends."""

    def __init__(self, pid: int):
        self.pid, self.peak_kb = pid, 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return  # ended (and reaped)
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kb = max(self.peak_kb, int(line.split()[1]))
            if "State:\tZ" in status:
                return
            time.sleep(0.5)

    def mib(self) -> float:
        self._thread.join(timeout=5)
        return self.peak_kb / 1024


def timed(command: list[str], log: Path) -> tuple[float, int, float]:
    """(wall seconds, exit code, the process's peak memory in MiB)."""
    start = time.perf_counter()
    with log.open("w") as handle:
        process = subprocess.Popen(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT)
        memory = PeakMemory(process.pid)
        code = process.wait()
    return time.perf_counter() - start, code, memory.mib()


def service_space(n: int, folder: Path) -> Path:
    from trainable.yaml_file import dump_yaml

    space = {
        "trainable": "noop.py:train",
        "experiment": {"name": "many", "metric": "val_acc", "mode": "max", "num_samples": n,
                       "max_concurrent": SLOTS, "seed": 0, "storage_path": str(folder / "runs")},
        "resources": {"cpus": 1},
        "training": {"epochs": 1},
        "space": {"lr": {"distribution": "float", "low": 0.001, "high": 0.5, "log": True}},
    }
    path = folder / "space.yaml"
    path.write_text(dump_yaml(space))
    return path


def run_side(side: str, n: int, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "noop.py").write_text(NOOP)
    log = folder / f"{side}.log"
    if side == "plain":
        wall, code, memory = timed([sys.executable, __file__, "--plain", str(n), "--folder", str(folder)], log)
        if code != 0:
            raise SystemExit(f"plain at N={n} failed (exit {code}); see {log}:\n{log.read_text()[-3000:]}")
        return {"wall": wall, "memory_mib": memory}
    import pandas as pd
    import yaml

    space = service_space(n, folder)
    wall, code, memory = timed([sys.executable, "-m", "search", "--space", str(space), "--name", "service"], log)
    if code != 0:
        raise SystemExit(f"service at N={n} failed (exit {code}); see {log}:\n{log.read_text()[-3000:]}")
    run = folder / "runs" / "service"
    phases = yaml.safe_load((run / "timing.yaml").read_text())["phases"]
    frame = pd.read_parquet(run / "results.parquet")
    again, again_code, _ = timed([sys.executable, "-m", "search", "--space", str(space), "--name", "service",
                                  "--resume"], folder / "resume.log")
    said = [line for line in (folder / "resume.log").read_text().splitlines() if line.strip()]

    def size(name: str) -> float:
        return (run / name).stat().st_size / 2**20 if (run / name).exists() else math.nan

    return {"wall": wall, "memory_mib": memory, "end": sum(phases[p] for p in END), "shutdown": phases["shutdown"],
            "trials_phase": phases["trials"], "rows": len(frame), "trials": frame["trial_id"].nunique(),
            "completed": int((frame.drop_duplicates("trial_id")["status"] == "COMPLETED").sum()),
            "results_mib": size("results.parquet"), "journal_mib": size("optuna.journal"),
            "report_mib": size("report.html"), "resume_s": again, "resume_code": again_code,
            "resume_said": said[0] if said else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--quick", action="store_true", help="20 trials: about a minute")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    parser.add_argument("--plain", type=int, help=argparse.SUPPRESS)  # internal: run the plain side
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain:
        plain(args.plain, Path(args.folder))
        return 0
    sizes = [20] if args.quick else args.sizes

    folder = Path(tempfile.mkdtemp(prefix="hpsearch-many-"))
    results: dict[int, dict[str, dict]] = {}
    try:
        for i, n in enumerate(sizes):
            order = ("service", "plain") if i % 2 == 0 else ("plain", "service")  # which runs first alternates
            results[n] = {side: run_side(side, n, folder / f"{n}-{side}") for side in order}
            s, p = results[n]["service"], results[n]["plain"]
            print(f"N={n}: service {s['wall']:.1f} s ({s['completed']}/{s['trials']} completed), plain Tune "
                  f"{p['wall']:.1f} s", flush=True)
    finally:
        if args.keep:
            print(f"run folders kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)

    print("\nthe whole command (wall time from outside, start-up and end included):")
    print("| trials | service | plain Tune + OptunaSearch | service/plain | service's end | end share "
          "| driver peak memory (service / plain) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, sides in results.items():
        s, p = sides["service"], sides["plain"]
        print(f"| {n} | {1000 * s['wall'] / n:.0f} ms/trial ({s['wall']:.0f} s) | {1000 * p['wall'] / n:.0f} ms/trial "
              f"({p['wall']:.0f} s) | {s['wall'] / p['wall']:.2f}x | {s['end']:.1f} s | {100 * s['end'] / s['wall']:.1f}% "
              f"| {s['memory_mib']:.0f} / {p['memory_mib']:.0f} MiB |")
    print("\nthe service's end (results.parquet and the journal, best.yaml's test accuracy, the report; Ray's "
          "shutdown apart), what it left, and --resume of the finished run:")
    print("| trials | end | Ray's shutdown | results.parquet | optuna.journal | report.html | --resume |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, sides in results.items():
        s = sides["service"]
        print(f"| {n} | {s['end']:.1f} s | {s['shutdown']:.1f} s | {s['rows']} rows, {s['results_mib']:.1f} MiB | "
              f"{s['journal_mib']:.1f} MiB | {s['report_mib']:.1f} MiB | {s['resume_s']:.1f} s, exit "
              f"{s['resume_code']} |")
    last = results[sizes[-1]]["service"]
    print(f"\n--resume of the last run said: {last['resume_said']}")
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        growth = math.log(results[b]["service"]["end"] / results[a]["service"]["end"]) / math.log(b / a)
        print(f"growth exponent of the service's end, N={a} -> {b}: {growth:.2f} (1.00: linear)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
