"""TPE on a conditional space: Optuna 5's multivariate TPE as pinned (what a space with `when:`
gets) against the same with `group: true`, measured offline on a synthetic objective (no training, no Ray).

    python bench/conditional_tpe.py [--trials 60] [--seeds 12]

The space is spaces/conditional.yaml's shape: an optimizer choice with its own keys
(momentum, nesterov for sgd; beta1, weight_decay for adamw), a depth with a width per extra
layer, and lr. The objective is a cheap function of the drawn config whose best lies in one
branch; keys not drawn do not count. Each seed runs OrderedSearch as Tune drives it (suggest,
on_trial_result, on_trial_complete, 2 at once) with search/searching/searcher.py's suggest, so the
conditions are drawn define-by-run exactly as in a search.

Printed: the mean (and median) regret of the best trial after N trials, over the seeds, for
each setting, and how many seeds each setting wins.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

import optuna  # noqa: E402

from search.definition.space import parse_space  # noqa: E402
from search.searching.ordered import TPE_SETTINGS, OrderedSearch  # noqa: E402
from search.searching.searcher import suggest  # noqa: E402

SPACE = {"space": {
    "optimizer": {"distribution": "choice", "values": ["sgd", "adamw"]},
    "lr": {"distribution": "float", "low": 1e-4, "high": 1.0, "log": True},
    "momentum": {"distribution": "float", "low": 0.0, "high": 0.99, "when": {"optimizer": "sgd"}},
    "nesterov": {"distribution": "choice", "values": [False, True], "when": {"optimizer": "sgd"}},
    "beta1": {"distribution": "float", "low": 0.5, "high": 0.99, "when": {"optimizer": "adamw"}},
    "weight_decay": {"distribution": "float", "low": 1e-6, "high": 1e-1, "log": True, "when": {"optimizer": "adamw"}},
    "model.layers": {"distribution": "int", "low": 1, "high": 3},
    "model.width_2": {"distribution": "int", "low": 16, "high": 512, "log": True, "when": {"model.layers": [2, 3]}},
    "model.width_3": {"distribution": "int", "low": 16, "high": 512, "log": True, "when": {"model.layers": 3}},
}}
BEST = 1.0  # the objective's maximum (adamw, 3 layers, every key at its optimum)


def objective(c: dict) -> float:
    """A score per branch with the interactions real ones have; adamw's best beats sgd's, depth 3 beats 1.

    sgd: what counts is the effective step lr / (1 - momentum) (a ridge in (lr, momentum));
    adamw: the best lr falls as beta1 rises; a wide second layer wants a wide third.
    """
    if c["optimizer"] == "sgd":
        step = c["lr"] / (1 - c["momentum"])
        value = 0.95 - 0.03 * math.log10(step / 1.0) ** 2 - 0.1 * (c["momentum"] - 0.9) ** 2 \
            - 0.01 * (not c["nesterov"])
    else:
        value = 1.0 - 0.03 * math.log10(c["lr"] / (3e-3 * (1 - c["beta1"]) / 0.1)) ** 2 \
            - 0.1 * (c["beta1"] - 0.9) ** 2 - 0.005 * math.log10(c["weight_decay"] / 1e-4) ** 2
    layers = c["model.layers"]
    value -= 0.02 * (3 - layers)
    if layers >= 2:
        value -= 0.01 * math.log2(c["model.width_2"] / 256) ** 2
    if layers == 3:
        value -= 0.01 * math.log2(c["model.width_3"] / (c["model.width_2"] / 2)) ** 2
    return value


def best_after(group: bool, seed: int, trials: int) -> float:
    space = parse_space({**SPACE, "experiment": {"seed": seed}})
    ask = functools.partial(suggest, searched=space.searched, experiment_seed=seed)
    searcher = OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=seed, sampler="tpe", lag=2,
                             tpe_settings={**TPE_SETTINGS, "group": group})
    best = -math.inf
    for n in range(trials):
        config = searcher.suggest(str(n))
        value = objective(config)
        searcher.on_trial_result(str(n), {"val_acc": value, "epoch": 1})
        searcher.on_trial_complete(str(n))
        best = max(best, value)
    return BEST - best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--seeds", type=int, default=12)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # group is "experimental"
    regrets = {group: [best_after(group, seed, args.trials) for seed in range(args.seeds)] for group in (False, True)}
    print(f"regret of the best trial after {args.trials} trials, {args.seeds} seeds (lower is better):")
    for group, values in regrets.items():
        print(f"  group={group!s:5}  mean {statistics.mean(values):.4f}  median {statistics.median(values):.4f}")
    wins = sum(t < f for f, t in zip(regrets[False], regrets[True]))
    ties = sum(t == f for f, t in zip(regrets[False], regrets[True]))
    print(f"  group=True better on {wins} of {args.seeds} seeds ({ties} ties); "
          f"mean regret ratio (True/False) {statistics.mean(regrets[True]) / statistics.mean(regrets[False]):.2f}")


if __name__ == "__main__":
    main()
