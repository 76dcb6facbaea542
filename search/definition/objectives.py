"""Several objectives and constraints: what `experiment.metric`, `mode` and `constraints` ask of a
trial, which epoch of a trial counts, which trials are feasible, and the Pareto front.

    experiment:
      metric: [val_acc, params]        # one metric (a string, as before) or a list of distinct ones
      mode: [max, min]                 # one mode per metric
      constraints: ["params <= 200000", "latency_ms <= 5"]   # METRIC <= NUMBER or METRIC >= NUMBER

A trial's point is its report at ONE epoch, used everywhere (the searcher's study, optuna.journal,
results.parquet's `feasible`, pareto.yaml, best.yaml, the report):

- one objective: its best epoch by that metric (ties: the earlier), the epoch best.yaml always picked;
- several: the last epoch whose objectives are all finite (the trained model the front describes;
  its checkpoint is always kept).

A trial is feasible when every constraint holds at its point; a constraint on a metric the point
lacks (not finite) is broken. Infeasible trials are kept and marked; they are never best and never
on the front. Optuna holds each constraint of a finished trial (Trial.set_constraint, create_trial's
`constraints`: Optuna 5's replacement of constraints_func) as `value - bound` (`<=`) or `bound - value`
(`>=`): <= 0 when it holds. TPE, NSGA-II and GP read them; so do Study.best_trials and optuna-dashboard.

Nothing here imports Ray or torch: the space file's checks run before anything starts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Sequence, cast

import numpy as np
import pandas as pd

from search.definition.status import DIVERGED, UNFINISHED
from trainable.errors import problem
from trainable.metrics import OBJECTIVES, metric_name, score

FEASIBLE = "feasible"  #: results.parquet's column: the trial's point meets every constraint
# samplers that optimise one objective only (schema.Sampler names)
SINGLE_OBJECTIVE_SAMPLERS = ("cmaes",)
# successive halving: trials judged at rungs; with several objectives by non-dominated sorting (search/searching/halving.py)
HALVING = ("asha", "hyperband", "bohb")
_CONSTRAINT = re.compile(r"\s*(\S+?)\s*(<=|>=)\s*(\S+)\s*")


def first(value: str | Sequence[str]) -> str:
    """experiment.metric or mode as one name: itself, or the first of a list (progress, checkpoints, curves)."""
    return value if isinstance(value, str) else value[0]


def several(experiment: Any) -> bool:
    return not isinstance(experiment.metric, str) and len(experiment.metric) > 1


def names(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Bound:
    """'METRIC <= NUMBER' or 'METRIC >= NUMBER': a constraint (experiment.constraints) or a target
    (experiment.stop_when, search/searching/budget.py)."""

    metric: str
    op: str  #: "<=" or ">="
    bound: float

    def violation(self, value: Any) -> float:
        """Optuna's constraint value: <= 0 when it holds; infinite when the metric was not measured."""
        v = score(value)
        if v is None:
            return math.inf
        return v - self.bound if self.op == "<=" else self.bound - v

    def holds(self, value: Any) -> bool:
        """Whether a measured, finite `value` is within the bound (a target: reached)."""
        return self.violation(value) <= 0

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"


CONSTRAINT_RULE = (f"must read 'METRIC <= NUMBER' or 'METRIC >= NUMBER' with a METRIC the trainable reports "
                   f"({', '.join(OBJECTIVES)}, or train_/val_<name> of training.metrics)")
OWN_CONSTRAINT_RULE = "must read 'METRIC <= NUMBER' or 'METRIC >= NUMBER' with a METRIC the function reports"


def parse_constraint(text: Any, any_name: bool = False) -> Bound | None:
    """'params <= 200000' as a Bound; None if it is not one (CONSTRAINT_RULE says why). `any_name`: the
    metric may be any identifier (a function trainable's own names, checked on its first report)."""
    match = _CONSTRAINT.fullmatch(text) if isinstance(text, str) else None
    if match is None or not (match.group(1).isidentifier() if any_name else metric_name(match.group(1))):
        return None
    try:
        bound = float(match.group(3))
    except ValueError:
        return None
    return Bound(match.group(1), match.group(2), bound) if math.isfinite(bound) else None


@dataclass(frozen=True)
class Objectives:
    """The search's objectives (metric, mode pairs) and constraints."""

    metrics: tuple[str, ...]
    modes: tuple[str, ...]
    constraints: tuple[Bound, ...] = ()

    @property
    def several(self) -> bool:
        return len(self.metrics) > 1

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        """Optuna's study directions."""
        return ["maximize" if m == "max" else "minimize" for m in self.modes]

    @property
    def measured(self) -> tuple[str, ...]:
        """Every metric a trial's point needs: the objectives, then the constraints' others."""
        return tuple(dict.fromkeys([*self.metrics, *(c.metric for c in self.constraints)]))

    def point_epoch(self, reports: Mapping[int, Mapping[str, Any]]) -> int | None:
        """The epoch of a trial's point among its reports (epoch -> report); None if no epoch has one."""
        epochs = [e for e in sorted(reports) if all(score(reports[e].get(m)) is not None for m in self.metrics)]
        if not epochs:
            return None
        if self.several:
            return epochs[-1]
        sign = 1 if self.modes[0] == "max" else -1  # of equal values the later epoch, as ranking.ranked picks
        # each of `epochs` has a score for every objective
        return max(epochs, key=lambda e: (sign * cast(float, score(reports[e][self.metrics[0]])), e))

    def values(self, report: Mapping[str, Any]) -> list[float]:
        """A point's objectives (`report` at point_epoch: each has a score)."""
        return [cast(float, score(report.get(m))) for m in self.metrics]

    def violations(self, report: Mapping[str, Any]) -> list[float]:
        return [c.violation(report.get(c.metric)) for c in self.constraints]

    def constraint_values(self, report: Mapping[str, Any]) -> dict[str, float]:
        """The constraints as Optuna holds them on a trial: 'params <= 200000' -> its violation."""
        return dict(zip(map(str, self.constraints), self.violations(report)))

    def feasible(self, report: Mapping[str, Any]) -> bool:
        return all(v <= 0 for v in self.violations(report))


def objectives_of(experiment: Any) -> Objectives:
    """A validated Experiment's objectives (schema.Experiment: metric, mode, constraints)."""
    constraints = tuple(parse_constraint(c, any_name=True) for c in getattr(experiment, "constraints", ()))
    # each parses once the space is valid (problems() says the others); function_kind.metric_problems, which
    # reads them before that, skips the Nones
    return Objectives(names(experiment.metric), names(experiment.mode), cast("tuple[Bound, ...]", constraints))


def problems(experiment: Any, any_name: bool = False) -> list[str]:
    """What the schema's per-field rules cannot say: lengths, each constraint, what several objectives exclude.
    `any_name`: a function trainable's, whose metrics have its own names."""
    out = []
    metrics, modes = names(experiment.metric), names(experiment.mode)
    if len(metrics) != len(modes):
        out.append(problem("experiment.mode", f"must have one mode per metric ({len(metrics)}: "
                                              f"{', '.join(metrics)})", experiment.mode))
    for i, text in enumerate(experiment.constraints):
        if parse_constraint(text, any_name) is None:
            out.append(problem(f"experiment.constraints[{i}]", OWN_CONSTRAINT_RULE if any_name else CONSTRAINT_RULE,
                               text))
    if experiment.constraints and not experiment.reproducible:
        out.append(problem("experiment.constraints", "need experiment.reproducible: true (the searcher that "
                                                     "tells Optuna each trial's constraints)", experiment.constraints))
    if len(metrics) > 1:
        if experiment.sampler in SINGLE_OBJECTIVE_SAMPLERS:
            out.append(problem("experiment.sampler", "must not be cmaes with several objectives (it optimises "
                                                     "one); use tpe, nsga2, random, qmc or gp", experiment.sampler))
        if getattr(experiment, "warm_start", None):  # an earlier run's trials are told with one value
            out.append(problem("experiment.warm_start", "is not supported with several objectives",
                               experiment.warm_start))
        if experiment.scheduler == "pbt":
            out.append(problem("experiment.scheduler", "must be fifo, asha, hyperband or bohb with several objectives: "
                                                       "pbt ranks trials by one metric (docs/multi-objective.md)",
                               experiment.scheduler))
        elif experiment.scheduler in HALVING and not experiment.reproducible:
            out.append(problem("experiment.scheduler", f"{experiment.scheduler} with several objectives needs "
                                                       "experiment.reproducible: true (its rungs are ranked by "
                                                       "non-dominated sorting; Ray's ASHA ranks by one metric)",
                               experiment.scheduler))
    return out


# ---- a search's trials, from results.parquet ----------------------------------------------------

def point_row(rows: Iterable[Mapping[str, Any]], objectives: Objectives) -> Mapping[str, Any] | None:
    """One trial's rows (one per epoch) -> the row of its point, or None."""
    by_epoch = {int(r["epoch"]): r for r in rows if not pd.isna(r["epoch"])}
    epoch = objectives.point_epoch(by_epoch)
    return None if epoch is None else by_epoch[epoch]


def mark_feasible(rows: list[dict[str, Any]], objectives: Objectives) -> list[dict[str, Any]]:
    """A trial's results rows with `feasible` set on each: its point meets every constraint (null: no point)."""
    by_epoch = {int(r["epoch"]): r for r in rows if score(r.get("epoch")) is not None}
    epoch = objectives.point_epoch(by_epoch)
    feasible = None if epoch is None else objectives.feasible(by_epoch[epoch])
    return [{**r, FEASIBLE: feasible} for r in rows]


def non_dominated(points: Sequence[Sequence[float]], modes: Sequence[str]) -> list[int]:
    """Indices of the points no other point dominates (at least as good in every objective, better in one)."""
    if not len(points):
        return []
    loss = np.asarray(points, dtype=float) * np.array([-1.0 if m == "max" else 1.0 for m in modes])
    keep = []
    for i, p in enumerate(loss):
        dominated = np.any(np.all(loss <= p, axis=1) & np.any(loss < p, axis=1))
        if not dominated:
            keep.append(i)
    return keep


def fronts(points: Sequence[Sequence[float] | None], violations: Sequence[float]) -> list[int]:
    """Each point's front in a non-dominated sorting (0: no point dominates it), every objective maximised, with
    constraints as pareto.yaml counts them (Deb's rule, as Optuna's NSGA-II): a feasible point (violation 0)
    dominates every infeasible one, an infeasible one with less total violation one with more, and a point
    None (an objective not finite) every point but another None. MO-ASHA's ranking of a rung (halving.py).

    One domination matrix, then fronts peeled by counting each point's dominators left (Deb's fast sort):
    O(n^2) in numpy. A rung is judged at every report that reaches it, over all lower-numbered trials, so
    pair by pair in Python a 500-trial search spent minutes a decision."""
    n = len(points)
    if n == 0:
        return []
    none = np.array([p is None for p in points])
    width = next((len(p) for p in points if p is not None), 0)
    values = np.array([[0.0] * width if p is None else [float(x) for x in p] for p in points]).reshape(n, width)
    violation = np.asarray(violations, dtype=float)
    at_least = np.all(values[:, None, :] >= values[None, :, :], axis=2)
    above = np.any(values[:, None, :] > values[None, :, :], axis=2)
    infeasible = (violation[:, None] > 0) | (violation[None, :] > 0)
    dominates = np.where(infeasible, violation[:, None] < violation[None, :], at_least & above)  # [i, j]: i dominates j
    dominates = np.where(none[None, :], True, dominates)  # every point dominates a None ...
    dominates[none, :] = False  # ... but a None dominates nothing
    left = dominates.sum(axis=0)  # each point's dominators not yet given a front
    out = np.full(n, -1)
    level, front = np.flatnonzero(left == 0), 0
    while level.size:
        out[level] = front
        left = left - dominates[level].sum(axis=0)
        level, front = np.flatnonzero((left == 0) & (out < 0)), front + 1
    return out.tolist()


def points(frame: pd.DataFrame, objectives: Objectives, statuses: Iterable[str] = UNFINISHED
           ) -> pd.DataFrame:
    """Each trial's point row, in trial-number order, for trials whose status is not in `statuses`
    (an errored or unfinished trial is never on the front, as it is never best)."""
    out = []
    for _, rows in frame.groupby("trial_id", sort=False):
        if rows["status"].iloc[0] in tuple(statuses):
            continue
        row = point_row((r for _, r in rows.iterrows()), objectives)
        if row is not None:
            out.append(row)
    if not out:
        return frame.iloc[0:0]
    return pd.DataFrame(out).sort_values("trial_number", kind="stable").reset_index(drop=True)


def pareto_front(frame: pd.DataFrame, objectives: Objectives) -> pd.DataFrame:
    """The feasible non-dominated trials' point rows, in trial-number order. A DIVERGED trial is never on
    it: its point is an epoch before its metric broke, a model that went on to NaN."""
    candidates = points(frame, objectives, (*UNFINISHED, DIVERGED))
    candidates = candidates[[objectives.feasible(r) for _, r in candidates.iterrows()]] if len(candidates) else \
        candidates
    keep = non_dominated(candidates[list(objectives.metrics)].to_numpy(dtype=float), objectives.modes)
    return candidates.iloc[keep].reset_index(drop=True)


def feasible_only(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of trials not marked infeasible (a search without constraints marks none)."""
    if FEASIBLE not in rows:
        return rows
    return rows.loc[rows[FEASIBLE].map(lambda v: v is None or v != v or bool(v)).astype(bool)]
