"""The numeric suite: how many trials each searcher needs to reach TPE's 50-trial result, on spaces of numbers.

    python bench/numeric.py [--quick] [--seeds S] [--trials N] [--workers W] [--searchers A,B] [--tasks T,U]

Tasks (every key a number, so `sampler: auto` chooses its GP for each):
- standard synthetic functions: Branin (2 keys), Hartmann-3, Hartmann-6, Rosenbrock-4, Levy-4, Ackley-5;
- scikit-learn models on scikit-learn's bundled datasets, scored by deterministic 3-fold cross-validation,
  as Bayesmark does: an RBF SVM on breast cancer (C, gamma), gradient boosting on diabetes (learning rate, depth,
  subsample, leaf size), an MLP on wine (width, alpha, initial learning rate).

Searchers are driven as bench/quality.py drives them (in-process, as Tune drives a searcher, on a simulated
clock; every trial takes 1-1.5 units, drawn from its config, so finishing orders vary): hpsearch's
OrderedSearch with `sampler: auto` (search/searching/choice.py decides per task), tpe and gp at
max_concurrent 4, gp without the kernel chain (search/searching/gp_kernels.py: each fit from Optuna's
defaults, as before it), plain Optuna's GP and TPE one at a time, Tune's OptunaSearch at 4, random search;
and peers where their packages are installed (pip install -e '.[peers]'), each 4 at once:
Syne Tune's GP BO (BOTorch: logEI, pending trials fantasised), SMAC3's random forest (its HPO facade) and GP
(its black-box facade; about 3 s of CPU a suggestion here, so not in the default set).

The figure: for each task, TPE's result is the mean over seeds of `hpsearch tpe @4`'s best after 50 trials;
a searcher reaches it at the first N where its own mean best after N trials is as good. Printed per task and
as the median over tasks (">N": not within the trials run), with each searcher's CPU ms per suggestion.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import statistics
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.distributions import FloatDistribution, IntDistribution

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from bench.quality import SEARCHERS as TABLE_SEARCHERS, AskTell, Ordered, Runner, in_workers, simulate  # noqa: E402
from search.searching.choice import choose_sampler  # noqa: E402
from search.definition.schema import Searched  # noqa: E402

REFERENCE, AT = "hpsearch tpe @4", 50  # the result every searcher is timed to: this one's mean best after 50 trials
CONCURRENCY = 4


def floats(*bounds: tuple[str, float, float], log: bool = False) -> tuple[Searched, ...]:
    return tuple(Searched(name, FloatDistribution(low, high, log=log)) for name, low, high in bounds)


def box(prefix: str, dims: int, low: float, high: float) -> tuple[Searched, ...]:
    return floats(*((f"{prefix}{i}", low, high) for i in range(dims)))


def duration(config: dict[str, Any], searched: tuple[Searched, ...]) -> float:
    """1 to 1.5 time units, a function of the config alone (crc32: the same in every process)."""
    text = repr([config[d.name] for d in searched]).encode()
    return 1.0 + 0.5 * (zlib.crc32(text) % 1000) / 1000


# ---- synthetic functions (minimised; the optimum is known) -------------------------------------

def branin(x: np.ndarray) -> float:
    a, b, c, r, s, t = 1, 5.1 / (4 * math.pi ** 2), 5 / math.pi, 6, 10, 1 / (8 * math.pi)
    return float(a * (x[1] - b * x[0] ** 2 + c * x[0] - r) ** 2 + s * (1 - t) * math.cos(x[0]) + s)


HARTMANN = {
    3: (np.array([[3, 10, 30], [0.1, 10, 35], [3, 10, 30], [0.1, 10, 35]]),
        1e-4 * np.array([[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]])),
    6: (np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8],
                  [17, 8, 0.05, 10, 0.1, 14]]),
        1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                         [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])),
}


def hartmann(x: np.ndarray) -> float:
    a, p = HARTMANN[len(x)]
    return float(-np.sum(np.array([1.0, 1.2, 3.0, 3.2]) * np.exp(-np.sum(a * (x - p) ** 2, axis=1))))


def rosenbrock(x: np.ndarray) -> float:
    return float(np.sum(100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))


def levy(x: np.ndarray) -> float:
    w = 1 + (x - 1) / 4
    return float(math.sin(math.pi * w[0]) ** 2 + np.sum((w[:-1] - 1) ** 2 * (1 + 10 * np.sin(math.pi * w[:-1] + 1) ** 2))
                 + (w[-1] - 1) ** 2 * (1 + math.sin(2 * math.pi * w[-1]) ** 2))


def ackley(x: np.ndarray) -> float:
    return float(-20 * math.exp(-0.2 * math.sqrt(np.mean(x ** 2))) - math.exp(np.mean(np.cos(2 * math.pi * x)))
                 + 20 + math.e)


# ---- scikit-learn models, 3-fold cross-validation ----------------------------------------------

@functools.cache
def dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    return getattr(datasets, f"load_{name}")(return_X_y=True)


def cross_validated(model, data: str, scoring: str) -> float:
    """Minus the mean 3-fold score (a loss), folds shuffled with a fixed seed: a config always scores the same."""
    from sklearn.model_selection import KFold, cross_val_score

    x, y = dataset(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an MLP that has not converged in max_iter is a poor config, not news
        return -float(np.mean(cross_val_score(model, x, y, cv=KFold(3, shuffle=True, random_state=0),
                                              scoring=scoring)))


def svc_cancer(c: dict[str, Any]) -> float:
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    return cross_validated(make_pipeline(StandardScaler(), SVC(C=c["C"], gamma=c["gamma"])), "breast_cancer",
                           "accuracy")


def boosting_diabetes(c: dict[str, Any]) -> float:
    from sklearn.ensemble import GradientBoostingRegressor

    model = GradientBoostingRegressor(n_estimators=30, learning_rate=c["learning_rate"], max_depth=c["max_depth"],
                                      subsample=c["subsample"], min_samples_leaf=c["min_samples_leaf"], random_state=0)
    return cross_validated(model, "diabetes", "neg_mean_squared_error") / 1000


def mlp_wine(c: dict[str, Any]) -> float:
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = MLPClassifier(hidden_layer_sizes=(c["width"],), alpha=c["alpha"], learning_rate_init=c["lr"],
                          max_iter=60, random_state=0)
    return cross_validated(make_pipeline(StandardScaler(), model), "wine", "accuracy")


@dataclass(frozen=True)
class Task:
    """A numeric search task: its keys and its loss (lower is better) for a config of them."""

    name: str
    searched: tuple[Searched, ...]
    loss: Callable[..., float]
    vector: bool = True  #: loss takes the keys' values as an array (synthetic), else the config mapping

    def measure(self, config: dict[str, Any]) -> tuple[float, float]:
        values = np.array([config[d.name] for d in self.searched]) if self.vector else config
        return self.loss(values), duration(config, self.searched)


TASKS = {task.name: task for task in (
    Task("branin", floats(("x0", -5, 10), ("x1", 0, 15)), branin),
    Task("hartmann3", box("x", 3, 0, 1), hartmann),
    Task("hartmann6", box("x", 6, 0, 1), hartmann),
    Task("rosenbrock4", box("x", 4, -2, 2), rosenbrock),
    Task("levy4", box("x", 4, -10, 10), levy),
    Task("ackley5", box("x", 5, -5, 5), ackley),
    Task("svc_cancer", floats(("C", 1e-2, 1e3), ("gamma", 1e-5, 1e1), log=True), svc_cancer, vector=False),
    Task("boosting_diabetes", (Searched("learning_rate", FloatDistribution(0.01, 0.5, log=True)),
                               Searched("max_depth", IntDistribution(1, 6)),
                               Searched("subsample", FloatDistribution(0.5, 1.0)),
                               Searched("min_samples_leaf", IntDistribution(1, 30))), boosting_diabetes, vector=False),
    Task("mlp_wine", (Searched("width", IntDistribution(4, 64, log=True)),
                      Searched("alpha", FloatDistribution(1e-6, 1e-1, log=True)),
                      Searched("lr", FloatDistribution(1e-4, 1e-1, log=True))), mlp_wine, vector=False),
)}
QUICK_TASKS = ("branin", "hartmann3")


def auto_sampler(task: Task, trials: int) -> str:
    """What `sampler: auto` runs for this task (FIFO, one objective, no constraints)."""
    return choose_sampler(choices=0, conditional=0, numbers=len(task.searched), objectives=1, constraints=0,
                          num_samples=trials, scheduler="fifo").sampler


class NoKernelChain(Ordered):
    """hpsearch's gp as it was before gp_kernels.py: each suggestion's fit from Optuna's default kernel."""

    def ask(self):
        asked = super().ask()
        self.searcher.kernels.clear()
        return asked


class SyneTune:
    """A peer: Syne Tune's GP Bayesian optimisation (its BOTorch baseline, botorch's SingleTaskGP and logEI),
    driven through its scheduler interface as its own Tuner drives it. Running trials are pending: the searcher
    fantasises their results (its default) when it suggests the next."""

    def __init__(self, task: Task, seed: int, trials: int):
        from syne_tune.config_space import lograndint, loguniform, randint, uniform
        from syne_tune.optimizer.baselines import BOTorch

        def domain(d: Searched):
            dist = d.distribution
            if isinstance(dist, IntDistribution):
                return (lograndint if dist.log else randint)(dist.low, dist.high)
            return (loguniform if dist.log else uniform)(dist.low, dist.high)

        import torch

        torch.set_num_threads(1)  # one core per bench worker, as the other searchers have
        # Syne Tune's start-up configs are drawn with numpy's global generator (Domain.sample() without a
        # random_state), so the run is seeded there too, or two runs of one seed would differ
        np.random.seed(seed)
        self.scheduler = BOTorch({d.name: domain(d) for d in task.searched}, metric="loss", do_minimize=True,
                                 random_seed=seed)
        self.count = 0

    def ask(self) -> tuple[Any, dict[str, Any]]:
        from syne_tune.backend.trial_status import Trial

        suggestion = self.scheduler.suggest()
        trial = Trial(trial_id=self.count, config=suggestion.config, creation_time=None)
        self.count += 1
        self.scheduler.on_trial_add(trial)
        return trial, suggestion.config

    def tell(self, trial: Any, loss: float) -> None:
        self.scheduler.on_trial_result(trial, {"loss": loss})
        self.scheduler.on_trial_complete(trial, {"loss": loss})


class Smac:
    """A peer: SMAC3 through its ask/tell interface, 4 configs asked before their results (as its parallel
    runners do). `facade` "hpo": a random forest and local search (its default for HPO); "bb": a GP (its
    black-box facade). Deterministic tasks, so each config is evaluated once; told the run's trials, as its
    initial design is sized from them."""

    def __init__(self, task: Task, seed: int, trials: int, facade: str):
        import logging
        import tempfile

        from ConfigSpace import ConfigurationSpace, Float, Integer
        from smac import BlackBoxFacade, HyperparameterOptimizationFacade, Scenario

        space = ConfigurationSpace(seed=seed)
        for d in task.searched:
            kind = Integer if isinstance(d.distribution, IntDistribution) else Float
            space.add(kind(d.name, (d.distribution.low, d.distribution.high), log=d.distribution.log))
        self.folder = tempfile.TemporaryDirectory()  # SMAC writes its run history; nothing here reads it
        scenario = Scenario(space, deterministic=True, n_trials=trials, seed=seed, output_directory=Path(self.folder.name))
        make = HyperparameterOptimizationFacade if facade == "hpo" else BlackBoxFacade
        self.smac = make(scenario, target_function=lambda config, seed=0: 0.0, overwrite=True, logging_level=logging.ERROR)

    def ask(self) -> tuple[Any, dict[str, Any]]:
        info = self.smac.ask()
        return info, dict(info.config)

    def tell(self, info: Any, loss: float) -> None:
        from smac.runhistory.dataclasses import TrialValue

        self.smac.tell(info, TrialValue(cost=loss))


SEARCHERS: dict[str, tuple[int, Callable[[Task, int], Runner]]] = {
    "hpsearch auto @4": (CONCURRENCY, None),  # the run of the sampler auto chooses (auto_sampler)
    "hpsearch tpe @4": TABLE_SEARCHERS["hpsearch tpe @4"],
    "hpsearch gp @4": TABLE_SEARCHERS["hpsearch gp @4"],
    "hpsearch gp @4 no kernel chain": (CONCURRENCY, functools.partial(NoKernelChain, sampler="gp", lag=CONCURRENCY)),
    "optuna gp sequential": (1, lambda task, seed: AskTell(task, optuna.samplers.GPSampler(seed=seed))),
    "optuna tpe sequential": TABLE_SEARCHERS["optuna tpe sequential"],
    "tune OptunaSearch @4": TABLE_SEARCHERS["tune OptunaSearch @4"],
    "random": TABLE_SEARCHERS["random"],
}
# Peers, each 4 at once, made for (task, seed, trials); optional packages: pip install -e '.[peers]'
PEERS: dict[str, tuple[int, Callable[[Task, int, int], Runner], str]] = {
    "syne-tune BOTorch @4": (CONCURRENCY, SyneTune, "syne_tune"),
    "smac hpo @4": (CONCURRENCY, functools.partial(Smac, facade="hpo"), "smac"),
    "smac bb @4": (CONCURRENCY, functools.partial(Smac, facade="bb"), "smac"),
}
SEARCHERS |= {label: (concurrency, None) for label, (concurrency, _, _) in PEERS.items()}
DEFAULT_SET = tuple(label for label in SEARCHERS if label != "smac bb @4")
QUICK = ("hpsearch auto @4", "hpsearch tpe @4", "random")


def run_one(job: tuple[str, str, int, int]) -> tuple[str, str, int, np.ndarray, float]:
    """One searcher on one task with one seed: (label, task, seed, best loss after each trial, CPU ms per ask)."""
    label, name, seed, trials = job
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    task = TASKS[name]
    concurrency, make = SEARCHERS[label]
    if label in PEERS:
        warnings.simplefilter("ignore")  # the peers' own warnings (botorch's, SMAC's): not this bench's to act on
        runner = PEERS[label][1](task, seed, trials)
    else:
        runner = make(task, seed)
    losses, seconds, _ = simulate(runner, task, trials, concurrency)
    return label, name, seed, np.minimum.accumulate(losses), 1000 * statistics.mean(seconds)


def resolved_label(label: str, task: Task, trials: int) -> str:
    """The run that stands for `label` on `task`: auto's is the chosen sampler's own (the same searcher, seeds)."""
    return f"hpsearch {auto_sampler(task, trials)} @4" if label == "hpsearch auto @4" else label


def reach(curve: np.ndarray, target: float) -> int | None:
    """The first N (1-based) whose best is at least as good as target, or None."""
    hits = np.nonzero(curve <= target + 1e-12)[0]
    return int(hits[0]) + 1 if len(hits) else None


def report(best: dict[tuple[str, str, int], np.ndarray], ms: dict[str, list[float]], labels: list[str],
           tasks: list[str], trials: int) -> str:
    seeds = sorted({seed for (_, _, seed) in best})
    mean = {(label, task): np.mean([best[label, task, s] for s in seeds], axis=0)
            for (label, task) in {(lab, t) for (lab, t, _) in best}}
    lines = [f"{len(tasks)} tasks, {len(seeds)} seeds, {trials} trials, {CONCURRENCY} at once; trials each searcher "
             f"needs until its mean best (over seeds) reaches {REFERENCE}'s mean best after {AT} trials "
             f"(>{trials}: not within them)", "",
             "| searcher | " + " | ".join(tasks) + " | median | ms/suggestion |",
             "|---|" + "---|" * (len(tasks) + 2)]
    medians = {}
    for label in labels:
        cells, reached = [], []
        for task in tasks:
            target = mean[REFERENCE, task][AT - 1]
            n = reach(mean[resolved_label(label, TASKS[task], trials), task], target)
            reached.append(math.inf if n is None else n)
            cells.append(f">{trials}" if n is None else str(n))
        medians[label] = statistics.median(reached)
        median = f">{trials}" if math.isinf(medians[label]) else f"{medians[label]:g}"
        run = resolved_label(label, TASKS[tasks[0]], trials)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {median} | {statistics.mean(ms[run]):.0f} |")
    lines += ["", "mean best after 25 and 50 trials (lower is better):", "",
              "| searcher | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for label in labels:
        cells = [" / ".join(f"{mean[resolved_label(label, TASKS[t], trials), t][n - 1]:.4g}" for n in (25, AT)
                            if n <= trials) for t in tasks]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "hpsearch auto @4" in labels:
        chosen = sorted({auto_sampler(TASKS[t], trials) for t in tasks})
        lines += ["", f"sampler auto chose {', '.join(chosen)} on every task; goal: auto's median <= 25 trials "
                      f"(measured: {medians['hpsearch auto @4']:g})"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI-sized: 2 tasks, 2 seeds, 50 trials, 3 searchers")
    parser.add_argument("--seeds", type=int, help="seeds 0..S-1 (default 10; --quick 2)")
    parser.add_argument("--trials", type=int, help="trials per run (default 60; --quick 50)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--searchers", help=f"comma-separated labels (known: {', '.join(SEARCHERS)})")
    parser.add_argument("--tasks", help=f"comma-separated tasks (known: {', '.join(TASKS)})")
    args = parser.parse_args(argv)
    labels = list(QUICK if args.quick else DEFAULT_SET)
    if args.searchers:
        labels = [label.strip() for label in args.searchers.split(",")]
    tasks = list(QUICK_TASKS if args.quick else TASKS)
    if args.tasks:
        tasks = [task.strip() for task in args.tasks.split(",")]
    unknown = [x for x in labels if x not in SEARCHERS] + [t for t in tasks if t not in TASKS]
    if unknown:
        parser.error(f"unknown searchers or tasks: {unknown}")
    missing = [label for label in labels if label in PEERS and importlib.util.find_spec(PEERS[label][2]) is None]
    if missing:
        print(f"left out, their package is not installed: {', '.join(missing)} "
              "(pip install -e '.[peers]')")
        labels = [label for label in labels if label not in missing]
    seeds = args.seeds or (2 if args.quick else 10)
    trials = max(args.trials or (AT if args.quick else 60), AT)
    runs = sorted({resolved_label(label, TASKS[t], trials) for label in {*labels, REFERENCE} for t in tasks})
    jobs = [(label, task, seed, trials) for task in tasks for seed in range(seeds) for label in runs]
    jobs.sort(key=lambda job: " gp " not in f" {job[0]} ")  # the slowest first, so the workers end together
    start = time.perf_counter()
    best, ms = {}, {label: [] for label in runs}
    for label, task, seed, curve, cost in in_workers(run_one, jobs, args.workers):
        best[label, task, seed] = curve
        ms[label].append(cost)
    print(report(best, ms, labels, tasks, trials))
    print(f"\n{len(jobs)} runs in {time.perf_counter() - start:.0f} s with {args.workers} workers")


if __name__ == "__main__":
    main()
