"""TPE at scale: OrderedSearch's suggest time at thousands of finished trials, and what bounds it.

    python bench/tpe_scale.py [--sizes 1000,5000] [--reps 5,3]

No Ray: the searcher is driven as Tune drives it (suggest, on_trial_result per epoch,
on_trial_complete), on the space of spaces/mnist.yaml, with lag = its max_concurrent and a
synthetic val_acc, a cheap function of the config, over 2 epochs per trial.

History is filled once, untimed, through the same API with the kept study and the pinned
TPE_SETTINGS, and saved at each size. At each size every case gets a searcher restored from
that record and one untimed suggestion (a restored searcher builds its study from the record
once), then REPS suggestions are timed, the cases interleaved (a shared machine is noisy);
each timed suggestion's trial then finishes, so the next sees one more result. Cases:

- old: the study rebuilt per suggestion (tests/units/searching/test_ordered_scale.py keeps that code as the
  oracle of the kept study); checked to suggest what the kept study suggests;
- new: the kept study, with TPE_SETTINGS, then with one TPE setting changed at a time;
- the kept study with TPE's search space worked out by each suggestion's own sampler, as before
  the search space was kept with the study (OrderedSearch._with_kept_space);
- TPE not started (n_startup_trials above n: random draws) and the random sampler: the
  searcher's cost without TPE's model.

Printed: ms per suggestion (median) at each size, growth from the first size to the last,
and each case against the new default.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from search.definition.space import Space, parse_space  # noqa: E402
from search.searching.ordered import TPE_SETTINGS, OrderedSearch  # noqa: E402
from search.searching.searcher import suggest  # noqa: E402
from tests.test_ordered_scale import RebuildingSearch  # noqa: E402
from trainable.yaml_file import read_yaml_mapping  # noqa: E402

SPACE_FILE = REPO / "spaces" / "mnist.yaml"
EPOCHS = 2
NEW = "new: kept study, TPE_SETTINGS"
OLD = "old: study rebuilt per suggestion"


class OwnSpaceSearch(OrderedSearch):
    """The kept study with a search space worked out again by each suggestion's sampler (before 2026-12-04)."""

    def _with_kept_space(self, sampler):
        return sampler


# label -> (searcher class, sampler, TPE settings)
CASES: dict[str, tuple[type[OrderedSearch], str, dict[str, Any]]] = {
    OLD: (RebuildingSearch, "tpe", TPE_SETTINGS),
    NEW: (OrderedSearch, "tpe", TPE_SETTINGS),
    "search space per suggestion (before)": (OwnSpaceSearch, "tpe", TPE_SETTINGS),
    "n_ei_candidates=8": (OrderedSearch, "tpe", {**TPE_SETTINGS, "n_ei_candidates": 8}),
    "n_ei_candidates=96": (OrderedSearch, "tpe", {**TPE_SETTINGS, "n_ei_candidates": 96}),
    "multivariate=False": (OrderedSearch, "tpe", {**TPE_SETTINGS, "multivariate": False}),
    "constant_liar=False": (OrderedSearch, "tpe", {**TPE_SETTINGS, "constant_liar": False}),
    "n_startup_trials > n (random)": (OrderedSearch, "tpe", {**TPE_SETTINGS, "n_startup_trials": 10**9}),
    "sampler: random": (OrderedSearch, "random", TPE_SETTINGS),
}


def val_acc(config: dict[str, Any], epoch: int) -> float:
    """Peaks at lr 0.05, t_max 7, clip_norm 2, batch_size 128, and improves with the epoch."""
    return (0.99 - 0.05 * abs(math.log(config["lr"] / 0.05)) - 0.002 * abs(config["t_max"] - 7)
            - 0.01 * abs(math.log(config["clip_norm"] / 2)) - 0.01 * (config["batch_size"] != 128) - 0.02 / epoch)


def searcher(space: Space, case: str) -> OrderedSearch:
    kind, sampler, settings = CASES[case]
    experiment = space.experiment
    ask = functools.partial(suggest, searched=space.searched, experiment_seed=experiment.seed)
    return kind(ask, metric=experiment.metric, mode=experiment.mode, experiment_seed=experiment.seed,
                sampler=sampler, lag=experiment.max_concurrent, tpe_settings=settings)


def step(s: OrderedSearch) -> tuple[float, dict[str, Any]]:
    """One trial, suggested, run and finished; returns the suggest's seconds and the config."""
    trial_id = f"t{len(s.asked)}"
    start = time.perf_counter()
    config = s.suggest(trial_id)
    seconds = time.perf_counter() - start
    assert config is not None, "every earlier trial finished, so a slot is free"
    for epoch in range(1, EPOCHS + 1):
        s.on_trial_result(trial_id, {s.metric: val_acc(config, epoch), "epoch": epoch})
    s.on_trial_complete(trial_id)
    return seconds, config


def fill(space: Space, sizes: list[int], folder: Path) -> dict[int, Path]:
    """History of each size, made through the kept study and saved; returns the state files."""
    s, states, start = searcher(space, NEW), {}, time.perf_counter()
    for size in sizes:
        while len(s.asked) < size:
            step(s)
        states[size] = folder / f"state-{size}.pkl"
        s.save(str(states[size]))
        elapsed = time.perf_counter() - start
        print(f"filled {size} trials in {elapsed:.0f} s ({1000 * elapsed / size:.1f} ms per trial on average)",
              flush=True)
    return states


def measure(space: Space, state: Path, reps: int) -> dict[str, float]:
    """Median ms per suggestion of each case, restored from `state`, the cases interleaved."""
    searchers = {case: searcher(space, case) for case in CASES}
    for s in searchers.values():
        s.restore(str(state))
        step(s)  # a restored searcher builds its study here, once
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(reps):
        configs = {}
        for case, s in searchers.items():
            seconds, configs[case] = step(s)
            times[case].append(1000 * seconds)
        assert configs[OLD] == configs[NEW] == configs["search space per suggestion (before)"], \
            "the kept study suggests what the rebuilt one did"
    return {case: statistics.median(t) for case, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000", help="finished trials before the timed suggestions")
    parser.add_argument("--reps", default="5,3", help="timed suggestions per case at each size")
    args = parser.parse_args()
    sizes = [int(v) for v in args.sizes.split(",")]
    reps = [int(v) for v in args.reps.split(",")]
    space = parse_space(read_yaml_mapping(SPACE_FILE), source=str(SPACE_FILE))  # loads no data
    print(f"space {SPACE_FILE.relative_to(REPO)}: {len(space.searched)} searched, "
          f"lag {space.experiment.max_concurrent}; TPE_SETTINGS {TPE_SETTINGS}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        states = fill(space, sizes, Path(folder))
        ms = {size: measure(space, states[size], r) for size, r in zip(sizes, reps)}
    first, last = sizes[0], sizes[-1]
    print(f"\nms per suggestion, median of {', '.join(f'{r} at {n}' for n, r in zip(sizes, reps))}")
    header = [f"{'case':<34}"] + [f"{n:>8}" for n in sizes] + [f"{f'{last}/{first}':>10}"]
    header += [f"{f'/new@{n}':>10}" for n in sizes]
    print(" | ".join(header))
    for case in CASES:
        row = [f"{case:<34}"] + [f"{ms[n][case]:>8.1f}" for n in sizes]
        row += [f"{ms[last][case] / ms[first][case]:>9.2f}x"]
        row += [f"{ms[n][case] / ms[n][NEW]:>9.2f}x" for n in sizes]
        print(" | ".join(row))
    print("\nold/new: " + ", ".join(f"{ms[n][OLD] / ms[n][NEW]:.1f}x at {n} trials" for n in sizes))


if __name__ == "__main__":
    main()
