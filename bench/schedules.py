"""Schedulers measured in seconds: a simulator that drives the searcher and the scheduler a search runs, on a
virtual clock, and the multi-fidelity and several-objective suites on real learning curves (bench/curves.py).

    python bench/schedules.py [--quick] [--seeds S] [--workers W] [--tables digits,cancer,diabetes]
                              [--searchers "bohb,syne-tune BOHB"]

The simulator (`simulate`) builds the searcher and the scheduler with the service's own functions
(search/searching/searcher.py make_searcher, search/execution/tuner.py make_scheduler) from a real Space, and
drives them as Tune's controller does: up to max_concurrent trials hold a slot; each epoch of a trial ends after
its duration on the clock; its result goes to the scheduler (CONTINUE, PAUSE or NOOP at a rung, STOP), then to the
searcher unless stopped; a paused trial frees its slot until the scheduler clears it (choose_trial_to_run) or
stops it (stop_trial); a held one keeps its slot until the scheduler starts its next epoch, pauses or stops it;
a free slot asks the scheduler for a paused trial first, then the searcher for a new one.
Because hpsearch's searcher and halving are reproducible, a Ray search of the same space runs the same trials
with the same stops (tests/searches/test_model_based.py holds them side by side), so a table costs seconds, not Ray runs.

The suites (each search: max_concurrent 4, grace_period 1, reduction_factor 3 over 27 epochs: rungs 1, 3, 9):
- multi-fidelity: FIFO + TPE (60 trials of 27 epochs: 1,620), ASHA + TPE, Hyperband + TPE and bohb, then
  peers from Syne Tune 0.16 (optional, pip install -e '.[peers]'): its ASHA (random configs) and BOHB (ASHA with a
  KDE fit on each trial's last report), on the same tables, seeds, rungs and virtual clock (`simulate_peer`
  drives them as Syne Tune's Tuner does). The figure: the epochs each spends, in report order, until its best
  report is as good as FIFO + TPE's final best, as a share of FIFO's epochs (each row spends at most FIFO's
  epochs: past them it saved nothing); the median over seeds per table, then over tables;
- several objectives (the metric, min, and the model's size, min): MO FIFO (60 trials) against MO-ASHA and MO bohb.
  The figure: the epochs until the hypervolume of the reports so far reaches MO FIFO's final hypervolume.
"""

from __future__ import annotations

import argparse
import heapq
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
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from bench.curves import EPOCHS, GRID, TABLES, load  # noqa: E402
from bench.quality import in_workers  # noqa: E402
from search.definition.space import Space, parse_space  # noqa: E402
from search.execution.tuner import make_scheduler, param_space  # noqa: E402
from search.searching.searcher import make_searcher  # noqa: E402

Metrics = Callable[[dict[str, Any], int], dict[str, float]]  # (config, epoch) -> the metrics reported then


@dataclass(frozen=True)
class Report:
    """One result, in the order the simulated search received it."""

    at: float  #: the clock
    trial_number: int
    epoch: int
    metrics: dict[str, float]


@dataclass
class Simulated:
    reports: list[Report]
    configs: dict[int, dict[str, Any]]  #: trial number -> config, as the searcher gave it
    last_epoch: dict[int, int]  #: trial number -> the last epoch it reported
    stopped: set[int]  #: trials a scheduler stopped before their last epoch


class Controller:
    """What the schedulers ask of Tune's controller: the trials, stop_trial and pause_trial (as the controller's
    wrapper passes them on), and the next epoch of a trial held at a rung (search/execution/ray_internals.py
    continue_held_trial: Tune's _schedule_trial_train). `held`: the trials holding a slot with no epoch running."""

    def __init__(self, trials: dict[str, Trial], searcher, scheduler, stopped: set[int],
                 train: Callable[[str], None]):
        self.trials, self.searcher, self.scheduler, self.stopped = trials, searcher, scheduler, stopped
        self.train, self.held = train, set()

    def get_trials(self) -> list[Trial]:
        return list(self.trials.values())

    def stop_trial(self, trial: Trial) -> None:
        if trial.status in (Trial.ERROR, Trial.TERMINATED):
            return
        if trial.status in (Trial.PENDING, Trial.PAUSED):
            self.scheduler.on_trial_remove(self, trial)
            self.searcher.on_trial_complete(trial.trial_id)
        else:  # a trial held at a rung, stopped there
            self.scheduler.on_trial_complete(self, trial, trial.last_result)
            self.searcher.on_trial_complete(trial.trial_id, trial.last_result)
        self.held.discard(trial.trial_id)
        trial.set_status(Trial.TERMINATED)
        self.stopped.add(int(trial.config["trial_number"]))

    def pause_trial(self, trial: Trial, should_checkpoint: bool = True) -> None:
        self.held.discard(trial.trial_id)
        trial.set_status(Trial.PAUSED)

    def _schedule_trial_train(self, trial: Trial) -> None:
        self.held.discard(trial.trial_id)
        self.train(trial.trial_id)


def simulate(space: Space, metrics: Metrics, duration: Callable[[dict[str, Any]], float] = lambda config: 1.0,
             epochs: int | None = None) -> Simulated:
    """Run `space`'s search on a virtual clock: each trial reports `metrics(config, epoch)` after each epoch,
    every epoch taking `duration(config)`; with `epochs`, it ends at that many reports (a budget of epochs)."""
    experiment = space.experiment
    searcher, scheduler = make_searcher(space), make_scheduler(space)
    fixed = param_space(space)  # Tune's trial config: the fixed part, then the searcher's suggestion over it
    planned_default = space.trial_defaults().epochs
    trials: dict[str, Trial] = {}
    out = Simulated([], {}, {}, set())
    clock: list[tuple[float, int, str]] = []  # (when its next epoch ends, tie-break, trial id): a heap
    next_epoch: dict[str, int] = {}
    now, created, sequence = 0.0, 0, 0

    def start(trial_id: str) -> None:
        nonlocal sequence
        sequence += 1
        trials[trial_id].set_status(Trial.RUNNING)
        heapq.heappush(clock, (now + duration(trials[trial_id].config), sequence, trial_id))

    controller = Controller(trials, searcher, scheduler, out.stopped, train=start)
    while True:
        # a free slot (a held trial keeps its own): a cleared paused trial first, then a new one
        while len(clock) + len(controller.held) < experiment.max_concurrent:
            resumed = scheduler.choose_trial_to_run(controller) if hasattr(scheduler, "_ready") else None
            if resumed is not None and resumed.status == Trial.PAUSED:
                start(resumed.trial_id)
                continue
            if created == experiment.num_samples:
                break
            trial_id = f"sim_{created:05d}"
            config = searcher.suggest(trial_id)
            if config is None:  # every slot the limiter allows is busy, or an earlier result is still out
                break
            created += 1
            trials[trial_id] = Trial("simulated", config={**fixed, **config}, trial_id=trial_id, stub=True)
            out.configs[int(config["trial_number"])] = config
            next_epoch[trial_id] = 1
            scheduler.on_trial_add(controller, trials[trial_id])
            start(trial_id)
        if not clock:
            waiting = [t for t in trials.values() if t.status == Trial.PAUSED]
            assert not waiting and not controller.held and created == experiment.num_samples, \
                "the simulated search is stuck"
            return out
        now, _, trial_id = heapq.heappop(clock)
        trial = trials[trial_id]
        n, epoch = int(trial.config["trial_number"]), next_epoch[trial_id]
        result = {**metrics(trial.config, epoch), "epoch": epoch, "training_iteration": epoch, "trial_id": trial_id}
        trial.run_metadata.last_result = result  # what Tune's update_last_result stores, without its metric analysis
        out.reports.append(Report(now, n, epoch, {k: v for k, v in result.items() if k not in ("trial_id",)}))
        out.last_epoch[n] = epoch
        if len(out.reports) == epochs:
            return out
        decision = scheduler.on_trial_result(controller, trial, result)
        if decision != TrialScheduler.STOP:
            searcher.on_trial_result(trial_id, result)
        planned = int(trial.config.get("epochs") or planned_default)
        if decision == TrialScheduler.STOP or epoch >= planned:
            if decision == TrialScheduler.STOP and epoch < planned:
                out.stopped.add(n)
            trial.set_status(Trial.TERMINATED)
            scheduler.on_trial_complete(controller, trial, result)
            searcher.on_trial_complete(trial_id, result)
        elif decision == TrialScheduler.PAUSE:
            trial.set_status(Trial.PAUSED)
            next_epoch[trial_id] = epoch + 1
        elif decision == TrialScheduler.NOOP:  # held at a rung: its slot stays its own until the scheduler says
            controller.held.add(trial_id)
            next_epoch[trial_id] = epoch + 1
        else:
            next_epoch[trial_id] = epoch + 1
            heapq.heappush(clock, (now + duration(trial.config), sequence, trial_id))
            sequence += 1


# ---- the suites, on bench/curves.py's tables ------------------------------------------------------

KEYS = tuple(GRID)


def table_space(scheduler: str, sampler: str, trials: int, seed: int, several: bool) -> Space:
    """A function trainable's space over a curves table's grid (each key searched as its index)."""
    raw = {"trainable": f"{REPO / 'bench' / 'curves.py'}:train_curve",
           "experiment": {"metric": ["loss", "size"] if several else "loss", "mode": ["min", "min"] if several else "min",
                          "num_samples": trials, "max_concurrent": 4, "seed": seed, "sampler": sampler,
                          "scheduler": scheduler, "grace_period": 1, "reduction_factor": 3},
           "training": {"epochs": EPOCHS},
           "space": {key: {"distribution": "int", "low": 0, "high": len(GRID[key]) - 1} for key in KEYS}}
    return parse_space(raw, source=str(REPO / "bench" / "space.yaml"))


def table_metrics(curves: np.ndarray, sizes: np.ndarray) -> Metrics:
    def metrics(config: dict[str, Any], epoch: int) -> dict[str, float]:
        at = tuple(int(config[key]) for key in KEYS)
        return {"loss": float(curves[at][epoch - 1]), "size": float(sizes[at])}
    return metrics


def table_duration(config: dict[str, Any]) -> float:
    """An epoch takes 1 to 1.5 units, a function of the config (so finishing orders vary)."""
    return 1.0 + 0.5 * (zlib.crc32(repr([config[key] for key in KEYS]).encode()) % 1000) / 1000


def hypervolume(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """The area two minimised objectives' points dominate, up to `reference`."""
    inside = sorted(p for p in points if p[0] < reference[0] and p[1] < reference[1])
    area, best_second = 0.0, reference[1]
    for first, second in inside:  # by the first objective, ascending: each point adds the strip it newly covers
        if second < best_second:
            area += (reference[0] - first) * (best_second - second)
            best_second = second
    return area


# Every search spends at most FIFO's epochs (60 trials of 27): a halving row that has not reached FIFO's result by
# then never saves anything. Its trial cap is only a bound the budget reaches first (ASHA: ~3 epochs a trial).
FIFO_TRIALS = 60
BUDGET = FIFO_TRIALS * EPOCHS
CAP = 2000
# label -> (scheduler, several objectives, trials)
SUITE = {"fifo + tpe": ("fifo", False, FIFO_TRIALS), "asha + tpe": ("asha", False, CAP),
         "hyperband + tpe": ("hyperband", False, CAP), "bohb": ("bohb", False, CAP),
         "MO fifo": ("fifo", True, FIFO_TRIALS), "MO-ASHA": ("asha", True, CAP), "MO bohb": ("bohb", True, CAP)}


# ---- peers: Syne Tune's asynchronous multi-fidelity schedulers, on the same tables -------------------

# label -> its class in syne_tune.optimizer.baselines. Syne Tune 0.16 ships no MOBSTER, HyperTune or DEHB; of its
# model-based ASHA variants, BOHB is here, ASHACQR needs huggingface_hub (its blackbox repository's import) and
# ASHABORE takes minutes a search (on a 240-config grid its acquisition draws 10,000 times for 500 distinct configs)
PEERS = {"syne-tune ASHA": "ASHA", "syne-tune BOHB": "BOHB"}
# each table's rows in report order; the first is the reference the others are measured against, so it always runs
SINGLE_ROWS = ("fifo + tpe", "asha + tpe", "hyperband + tpe", "bohb", *PEERS)
SEVERAL_ROWS = ("MO fifo", "MO-ASHA", "MO bohb")


def simulate_peer(baseline: str, seed: int, metrics: Metrics, duration: Callable[[dict[str, Any]], float]
                  ) -> list[Report]:
    """Syne Tune's `baseline` scheduler on `simulate`'s virtual clock (4 at once, up to BUDGET epochs), called
    as its Tuner calls it (syne_tune/tuner.py _schedule_new_task, _update_running_trials): a free slot takes
    suggest(), a new trial (on_trial_add) or a paused one resumed from its next epoch; each epoch's result goes to
    on_trial_result, whose CONTINUE runs the next epoch, and whose STOP or PAUSE frees the slot (on_trial_remove);
    a trial that ends its last epoch on CONTINUE is on_trial_complete."""
    import logging

    from syne_tune.backend.trial_status import Trial as SyneTrial
    from syne_tune.config_space import randint
    from syne_tune.optimizer import baselines
    from syne_tune.optimizer.scheduler import SchedulerDecision

    logging.getLogger("syne_tune").setLevel(logging.ERROR)
    # its random configs (RandomSearcher's, the KDE's random fraction) are Domain.sample() without a random_state:
    # numpy's global generator, so the run is seeded there too, or two runs of one seed would differ
    np.random.seed(seed)
    scheduler = getattr(baselines, baseline)({key: randint(0, len(GRID[key]) - 1) for key in KEYS}, metric="loss",
                                             do_minimize=True, time_attr="epoch", max_t=EPOCHS, grace_period=1,
                                             reduction_factor=3, random_seed=seed)
    trials: dict[int, SyneTrial] = {}
    next_epoch: dict[int, int] = {}
    clock: list[tuple[float, int, int]] = []  # (when its next epoch ends, tie-break, trial id): a heap
    reports: list[Report] = []
    now, sequence = 0.0, 0

    def run_epoch(trial: SyneTrial) -> None:
        nonlocal sequence
        heapq.heappush(clock, (now + duration(trial.config), sequence, trial.trial_id))
        sequence += 1

    while True:
        while len(clock) < 4:
            suggestion = scheduler.suggest()
            if suggestion is None:  # the searcher has no config left
                break
            if suggestion.spawn_new_trial_id:
                assert suggestion.checkpoint_trial_id is None, "a warm start from another trial is not simulated"
                # plain ints: table_duration hashes the config's repr, which must be the same as hpsearch's rows'
                trial = SyneTrial(len(trials), {key: int(suggestion.config[key]) for key in KEYS}, None)
                trials[trial.trial_id], next_epoch[trial.trial_id] = trial, 1
                scheduler.on_trial_add(trial)
            else:
                trial = trials[suggestion.checkpoint_trial_id]
                if suggestion.config is not None:
                    trial.config = {key: int(suggestion.config[key]) for key in KEYS}
            run_epoch(trial)
        if not clock:
            return reports
        now, _, trial_id = heapq.heappop(clock)
        trial, epoch = trials[trial_id], next_epoch[trial_id]
        result = {**metrics(trial.config, epoch), "epoch": epoch}
        reports.append(Report(now, trial_id, epoch, result))
        if len(reports) == BUDGET:
            return reports
        next_epoch[trial_id] = epoch + 1
        decision = scheduler.on_trial_result(trial, result)
        if decision != SchedulerDecision.CONTINUE:  # ASHA's answer at max_t too, so its trials end here
            scheduler.on_trial_remove(trial)
        elif epoch == EPOCHS:
            scheduler.on_trial_complete(trial, result)
        else:
            run_epoch(trial)


def run_one(job: tuple[str, str, int]) -> tuple[str, str, int, list[tuple[int, float, float]]]:
    """One search: (label, table, seed, [(epoch count, loss, size) per report, in report order])."""
    label, table, seed = job
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.simplefilter("ignore")
    curves, sizes = load(table)
    if label in PEERS:
        reports = simulate_peer(PEERS[label], seed, table_metrics(curves, sizes), table_duration)
    else:
        scheduler, several, trials = SUITE[label]
        space = table_space(scheduler, "tpe", trials, seed, several)
        reports = simulate(space, table_metrics(curves, sizes), table_duration, epochs=BUDGET).reports
    return label, table, seed, [(i + 1, r.metrics["loss"], r.metrics["size"]) for i, r in enumerate(reports)]


def epochs_to(reports: list[tuple[int, float, float]], reached: Callable[[list[tuple[int, float, float]]], bool]
              ) -> float:
    """The epochs spent when `reached(reports so far)` first holds (inf: never)."""
    for i in range(len(reports)):
        if reached(reports[:i + 1]):
            return reports[i][0]
    return math.inf


def report(done: dict[tuple[str, str, int], list[tuple[int, float, float]]], tables: list[str]) -> str:
    """The markdown table of each suite that ran, and the goals' lines of the rows they name."""
    seeds = sorted({seed for (_, _, seed) in done})
    ran = {label for (label, _, _) in done}
    lines, figures = [], {}
    single, several = [label for label in SINGLE_ROWS if label in ran], [label for label in SEVERAL_ROWS if label in ran]
    if single:
        lines += [f"{len(tables)} tables ({', '.join(tables)}), {len(seeds)} seeds, 4 at once, rungs 1, 3, 9 of {EPOCHS} "
                  "epochs; epochs spent until the best report reaches FIFO + TPE's final best, as a share of FIFO's "
                  f"epochs (median over seeds; inf: not within FIFO's {BUDGET} epochs)", "",
                  "| searcher | " + " | ".join(tables) + " | median over tables | trials reaching it |", "|---|" +
                  "---|" * (len(tables) + 2)]
    for label in single:
        shares, cells, hits = [], [], 0
        for table in tables:
            per_seed = []
            for seed in seeds:
                fifo = done["fifo + tpe", table, seed]
                target = min(loss for _, loss, _ in fifo)
                spent = epochs_to(done[label, table, seed], lambda rs: min(r[1] for r in rs) <= target + 1e-12)  # noqa: B023
                hits += math.isfinite(spent)
                per_seed.append(spent / fifo[-1][0])
            shares.append(statistics.median(per_seed))
            cells.append(f"{shares[-1]:.3f}")
        figures[label] = statistics.median(shares)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {figures[label]:.3f} | {hits}/{len(tables) * len(seeds)} |")
    if several:
        lines += ["", "several objectives (loss, size): epochs until the reports' hypervolume reaches MO FIFO's final "
                      "hypervolume, as a share of MO FIFO's epochs", "",
                  "| searcher | " + " | ".join(tables) + " | median over tables |", "|---|" + "---|" * (len(tables) + 1)]
    for label in several:
        shares = []
        for table in tables:
            per_seed = []
            for seed in seeds:
                fifo = done["MO fifo", table, seed]
                reference = (max(loss for _, loss, _ in fifo), max(size for _, _, size in fifo) * 1.01)
                target = hypervolume([(loss, size) for _, loss, size in fifo], reference)
                spent = epochs_to(done[label, table, seed], lambda rs, reference=reference, target=target: hypervolume(
                    [(loss, size) for _, loss, size in rs], reference) >= target - 1e-12)
                per_seed.append(spent / fifo[-1][0])
            shares.append(statistics.median(per_seed))
        figures[label] = statistics.median(shares)
        lines.append(f"| {label} | " + " | ".join(f"{s:.3f}" for s in shares) + f" | {figures[label]:.3f} |")
    goals = []
    if {"bohb", "asha + tpe"} <= ran:
        goals.append(f"bohb <= 0.25 of FIFO's epochs (measured {figures['bohb']:.3f}) and below ASHA + TPE "
                     f"({figures['asha + tpe']:.3f})")
    if "MO-ASHA" in ran:
        goals.append(f"MO-ASHA <= 0.333 of MO FIFO's (measured {figures['MO-ASHA']:.3f})")
    if goals:
        lines += ["", "goals: " + "; ".join(goals)]
    return "\n".join(lines).lstrip()  # from the several-objective table when it is the only one


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 table, 2 seeds")
    parser.add_argument("--seeds", type=int, help="seeds 0..S-1 (default 4; --quick 2)")
    parser.add_argument("--workers", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--tables", help=f"comma-separated (known: {', '.join(TABLES)})")
    parser.add_argument("--searchers", help="comma-separated rows (default: all; each table's reference row runs "
                                            f"too): {', '.join(SINGLE_ROWS + SEVERAL_ROWS)}")
    args = parser.parse_args(argv)
    labels = args.searchers.split(",") if args.searchers else [*SINGLE_ROWS, *SEVERAL_ROWS]
    if unknown := [label for label in labels if label not in SINGLE_ROWS + SEVERAL_ROWS]:
        parser.error(f"unknown searchers: {', '.join(unknown)}")
    if any(label in PEERS for label in labels) and importlib.util.find_spec("syne_tune") is None:
        print("the syne-tune rows need: pip install -e '.[peers]'; running the others")
        labels = [label for label in labels if label not in PEERS]
    labels += [rows[0] for rows in (SINGLE_ROWS, SEVERAL_ROWS) if set(rows) & set(labels) and rows[0] not in labels]
    tables = args.tables.split(",") if args.tables else (["cancer"] if args.quick else list(TABLES))
    for table in tables:
        load(table)  # made here, once, before the workers read it
    seeds = args.seeds or (2 if args.quick else 4)
    jobs = [(label, table, seed) for table in tables for seed in range(seeds) for label in labels]
    start = time.perf_counter()
    done = {(label, table, seed): reports for label, table, seed, reports in in_workers(run_one, jobs, args.workers)}
    print(report(done, tables))
    print(f"\n{len(jobs)} searches in {time.perf_counter() - start:.0f} s with {args.workers} workers")


if __name__ == "__main__":
    main()
