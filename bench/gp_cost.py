"""The GP's own cost per suggestion: Optuna's batched acquisition (greenlet installed) against its sequential
fallback, side by side, at 25, 50, 100 and 200 trials.

    python bench/gp_cost.py [--trials 200] [--seed 0]

GPSampler optimises its acquisition from several starting points with L-BFGS-B. With the greenlet package
(a dependency of hpsearch) it runs those optimisations as one batch, evaluating the acquisition for every
start in one tensor call (optuna/_gp/batched_lbfgsb.py); without it, one start after another. Each side runs
in its own process (the fallback's by making `import greenlet` fail there) on one thread: hpsearch's
reproducible searcher with `sampler: gp`, one trial at a time on Hartmann-6 (bench/numeric.py). Printed: the
CPU seconds of each suggestion, as a mean over trials 11..N (the first 10 are random), and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import functools, json, sys, time, warnings
if sys.argv[1] == "sequential":
    sys.modules["greenlet"] = None  # `import greenlet` fails: Optuna falls back to sequential L-BFGS-B
sys.path.insert(0, sys.argv[4])
import optuna
from bench.numeric import TASKS
from search.searching.ordered import OrderedSearch
from search.searching.searcher import suggest
optuna.logging.set_verbosity(optuna.logging.ERROR)
warnings.simplefilter("ignore")
task, trials, seed = TASKS["hartmann6"], int(sys.argv[2]), int(sys.argv[3])
s = OrderedSearch(functools.partial(suggest, searched=task.searched, experiment_seed=seed), metric="loss",
                  mode="min", experiment_seed=seed, sampler="gp", lag=1, unseen=0)
seconds = []
for n in range(trials):
    start = time.process_time()
    config = s.suggest(f"t{n}")
    seconds.append(time.process_time() - start)
    s.on_trial_result(f"t{n}", {"loss": task.measure(config)[0], "epoch": 1})
    s.on_trial_complete(f"t{n}")
print(json.dumps(seconds))
"""


def side(mode: str, trials: int, seed: int) -> list[float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(trials), str(seed), str(REPO)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    batched, sequential = side("batched", args.trials, args.seed), side("sequential", args.trials, args.seed)
    print(f"hpsearch sampler gp on Hartmann-6, one trial at a time, seed {args.seed}: CPU seconds a suggestion "
          "(mean over trials 11..N)\n")
    print("| trials | batched (greenlet) | sequential | sequential / batched |\n|---|---|---|---|")
    for n in (25, 50, 100, 200):
        if n <= args.trials:
            b, s = (sum(x[10:n]) / (n - 10) for x in (batched, sequential))
            print(f"| {n} | {b:.3f} | {s:.3f} | {s / b:.2f}x |")
    late = [(n, batched[n - 1]) for n in (25, 50, 100, 200) if n <= args.trials]
    print("\nbatched, the suggestion of trial N alone: " + ", ".join(f"{n}: {v:.2f} s" for n, v in late))


if __name__ == "__main__":
    main()
