"""The driver's resident memory through one search of N no-op trials, phase by phase.

The service side of bench/many_trials.py (`python -m search` on a space naming a function that does no work
and reports once, 2 at a time), its driver's VmRSS read from /proc every 0.5 s. Printed: the memory 10 s into
the trials (the imports, Ray, the first trials), its growth over the trials (and per trial), the highest
during them (Tune's ResultGrid, built as fit() returns, is the last of it), the end's phases (results, report)
and the peak; each phase's bounds from the run's timing.yaml.

    .venv/bin/python bench/driver_memory.py [--trials 3000]     # about 2.5 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)
sys.path.insert(1, str(REPO / "bench"))

from many_trials import NOOP, service_space  # noqa: E402


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def at(samples: list[tuple[float, float]], second: float) -> float:
    """The last sample at or before `second`."""
    return max((m for t, m in samples if t <= second), default=samples[0][1])


def main() -> int:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=3000)
    parser.add_argument("--keep", action="store_true", help="keep the run folder (printed)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="hpsearch-memory-"))
    try:
        (folder / "noop.py").write_text(NOOP)
        space = service_space(args.trials, folder)
        samples: list[tuple[float, float]] = []
        started = time.time()
        with (folder / "service.log").open("w") as log:
            process = subprocess.Popen([sys.executable, "-m", "search", "--space", str(space), "--name", "service"],
                                       cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
            while process.poll() is None:
                if (mib := rss_mib(process.pid)) is not None:
                    samples.append((time.time() - started, mib))
                time.sleep(0.5)
        if process.returncode != 0 or not samples:
            raise SystemExit(f"the search failed (exit {process.returncode}); see {folder / 'service.log'}")
        phases = yaml.safe_load((folder / "runs" / "service" / "timing.yaml").read_text())["phases"]
        bounds, elapsed = {}, 0.0
        for name, seconds in phases.items():  # timing.yaml's phases follow one another from the process's start
            bounds[name] = (elapsed, elapsed + seconds)
            elapsed += seconds
        trials_from, trials_to = bounds["trials"]
        first = at(samples, min(trials_from + 10, trials_to))
        before_end = max(m for t, m in samples if t <= trials_to)
        print(f"{args.trials} no-op trials, 2 at a time: the driver's resident memory (MiB)")
        print("| | MiB |\n|---|---:|")
        print(f"| 10 s into the trials, or at their end (imports, Ray, the first trials) | {first:.0f} |")
        grown = at(samples, trials_to) - first
        print(f"| growth over the trials | {grown:.0f} ({1024 * grown / args.trials:.0f} KB a trial) |")
        print(f"| highest during the trials | {before_end:.0f} |")
        for name in ("results", "report"):
            low, high = bounds[name]
            inside = [m for t, m in samples if low <= t <= high + 0.5] or [at(samples, high)]
            print(f"| {name} phase ({high - low:.1f} s): at its start, its highest | {at(samples, low):.0f}, {max(inside):.0f} |")
        print(f"| peak | {max(m for _, m in samples):.0f} |")
        if args.keep:
            print(f"kept in {folder}")
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
