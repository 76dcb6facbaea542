"""Which result is best: a trial's value, a report's place among others, the rows best first.

The one home of "best", for one objective and several, read by everything that names a best:
the searcher's study (a trial's value), successive halving (a signed score at a rung), the
checkpoints kept and exported, progress, best.yaml, the summary, `runs` and `compare`, and
MLflow's run-level value. The rule:

- a value scores only if it is a finite number (trainable/metrics.py `score`); NaN, inf and
  missing values never win;
- one objective: the better score wins; among equal scores the earlier trial (by number), and within
  a trial the later report: its best epoch and the checkpoint kept for it are one (Tune's own
  num_to_keep keeps the newer of equal scores too, and ties are common: an accuracy on 300 images
  moves in steps of 1/300);
- several objectives: a trial's point is its last epoch whose objectives are all finite
  (search/definition/objectives.py `Objectives.point_epoch`), and no one trial is best: pareto.yaml
  holds the feasible non-dominated points.

Nothing here imports Ray or torch.
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

from search.definition.objectives import Objectives, feasible_only
from search.definition.status import ERROR, UNFINISHED
from trainable.metrics import score

__all__ = ["score", "signed", "best_value", "is_better", "Rank", "rank", "ranked", "best_first", "best_candidates",
           "points"]


def signed(value: Any, mode: str) -> float | None:
    """A score to maximise: the value, negated for mode min; None if it does not score."""
    finite = score(value)
    return None if finite is None else (finite if mode == "max" else -finite)


def best_value(values: Iterable[Any], mode: str) -> float | None:
    """The best score among `values` (a trial's value: its best epoch), None if none scores."""
    scores = [s for s in map(score, values) if s is not None]
    return (max(scores) if mode == "max" else min(scores)) if scores else None


def is_better(value: float, best: float | None, mode: str) -> bool:
    """Whether a scored `value` beats `best` (None: nothing yet)."""
    return best is None or (value > best if mode == "max" else value < best)


Rank = tuple[bool, float, int]


def rank(value: Any, mode: str | None, order: int) -> Rank:
    """A report's place among a trial's, higher is better: scored over unscored, the better
    score, then the later `order` (epoch, checkpoint): how checkpoints are kept and chosen.
    `mode` None: no metric (several objectives), so only the order counts."""
    value = signed(value, mode) if mode else None
    return value is not None, 0.0 if value is None else value, order


def ranked(frame: pd.DataFrame, metric: str, mode: str, *, feasible: bool = False,
           without: Iterable[str] = ()) -> pd.DataFrame:
    """Rows whose `metric` scores, best first; of equal scores the earlier trial's, and of one trial's the
    later epoch's (the module docstring); without those columns, the frame's order.

    `feasible`: drop the rows of trials that broke experiment.constraints; `without`: drop
    rows of these statuses (ERROR, say)."""
    if metric not in frame.columns:
        return frame.iloc[0:0]
    # astype(bool): on a frame with no rows (no trial started) an empty object Series would
    # select columns, not rows
    scored = frame[frame[metric].map(lambda v: score(v) is not None).astype(bool)]
    if without:
        scored = scored[~scored["status"].isin(list(without))]
    if feasible:
        scored = feasible_only(scored)
    keys, ascending = [metric], [mode == "min"]
    for column, up in (("trial_number", True), ("epoch", False)):  # the earlier trial, then the later epoch
        if column in scored.columns:
            keys.append(column)
            ascending.append(up)
    return scored.sort_values(keys, ascending=ascending, kind="stable")


def best_first(frame: pd.DataFrame, metric: str, mode: str) -> pd.DataFrame:
    """Every row of `frame`: those whose `metric` scores in `ranked`'s order, then the others in the frame's
    (a table of trials, whose first row is then the one best.yaml names)."""
    scored = ranked(frame, metric, mode)
    return pd.concat([scored, frame.drop(scored.index)]) if len(scored) < len(frame) else scored


def best_candidates(frame: pd.DataFrame, metric: str, mode: str) -> pd.DataFrame:
    """The rows that may be the run's best (one objective), best first: best.yaml's is the first, and
    the journal's study names the same trial. A feasible trial's; a finished trial's (not ERROR, not
    INTERRUPTED) where one has a score; else an interrupted trial's; an errored trial's only where no
    other trial scored (best.yaml's note then says so)."""
    scored = ranked(frame, metric, mode)
    succeeded = bool((scored["status"] != ERROR).any())  # before feasibility: an infeasible trial counts
    scored = feasible_only(scored)
    finished = scored[~scored["status"].isin(list(UNFINISHED))]
    return finished if len(finished) else scored[scored["status"] != ERROR] if succeeded else scored


def points(frame: pd.DataFrame, objectives: Objectives) -> pd.DataFrame:
    """One row per trial, at the epoch that stands for it: its best epoch by the objective (one),
    or its point (several: the last epoch whose objectives are all finite); a trial without one
    keeps its last row. In the frame's trial order."""
    out = []
    for _, rows in frame.groupby("trial_id", sort=False):
        if objectives.several:
            by_epoch = {int(r["epoch"]): r for _, r in rows.iterrows() if not pd.isna(r["epoch"])}
            epoch = objectives.point_epoch(by_epoch)
            out.append(rows.iloc[-1] if epoch is None else by_epoch[epoch])
        else:
            best = ranked(rows, objectives.metrics[0], objectives.modes[0])
            out.append(rows.iloc[-1] if best.empty else best.iloc[0])
    return pd.DataFrame(out) if out else frame.iloc[0:0]
