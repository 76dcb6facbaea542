"""`python -m search export` timed: this checkout against another tree (an earlier commit), side by side.

Each export is a fresh process, so what it costs is mostly imports: torch always; and whatever
search.outputs.export pulls in through the run folder's modules (torchmetrics, torchvision and
torch._dynamo, Ray Tune) whether or not the export needs them. The bench runs the same export in
each tree, interleaved and REPS times (a shared 2-core machine is noisy), and prints per tree and
format the median wall seconds, the median CPU seconds of the process (user + system: what load on
the machine inflates least), the ratio to the other tree, and the heavy modules one import of
search.outputs.export loads.

    git archive HEAD~1 search trainable | tar -x -C /tmp/before     # the tree to compare with
    python bench/export.py runs/<name> --against /tmp/before [--formats torchscript,state_dict] [--reps 5]

A format a tree does not know (or a run it refuses) is printed as its exit code.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torchmetrics", "torchvision", "torch._dynamo", "ray.tune", "scipy.signal")


def run_once(tree: Path, run: str, fmt: str, out: Path) -> tuple[float, float, int]:
    """(wall s, CPU s, exit code) of one `python -m search export` with `tree` first on the path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "search", "export", run, "--format", fmt, "-o", str(out)],
                          cwd=out.parent, capture_output=True, env={**os.environ, "PYTHONPATH": str(tree)})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done.returncode


def heavy_imports(tree: Path) -> str:
    code = f"import sys, search.outputs.export; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    return done.stdout.strip() or ("none" if done.returncode == 0 else f"exit {done.returncode}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a finished run folder")
    parser.add_argument("--against", required=True, help="another tree holding search/ and trainable/")
    parser.add_argument("--formats", default="torchscript,state_dict")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    run = os.path.abspath(args.run)
    trees = {"this": REPO, "other": Path(args.against).resolve()}
    times: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    with tempfile.TemporaryDirectory() as where:
        for rep in range(args.reps):
            for fmt in args.formats.split(","):
                order = list(trees.items()) if rep % 2 == 0 else list(trees.items())[::-1]
                for name, tree in order:
                    times.setdefault((name, fmt), []).append(run_once(tree, run, fmt, Path(where) / f"m-{name}"))
    print(f"python -m search export {run} --format F, {args.reps} times each, interleaved "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'tree':6} {'format':12} {'wall s':>7} {'CPU s':>6} {'this/other CPU':>14}  heavy imports")
    for (name, fmt), runs in times.items():
        codes = {code for *_, code in runs}
        wall, cpu = (statistics.median(r[i] for r in runs) for i in (0, 1))
        other = statistics.median(r[1] for r in times[("other", fmt)])
        ratio = f"{cpu / other:.2f}" if name == "this" else ""
        shown = f"{wall:7.2f} {cpu:6.2f}" if codes == {0} else f"exit {sorted(codes)}".rjust(14)
        print(f"{name:6} {fmt:12} {shown} {ratio:>14}  {heavy_imports(trees[name])}")


if __name__ == "__main__":
    main()
