"""search/definition/ranking.py, the rule the most code shares, on its own: scores, ties, statuses, feasibility,
and the one best epoch that `ranked` and `Objectives.point_epoch` must agree on. No Ray, no torch."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from search.definition.objectives import FEASIBLE, Bound, Objectives, fronts
from search.definition.ranking import best_candidates, best_value, is_better, points, rank, ranked, signed


@pytest.mark.parametrize("value, mode, expected", [
    (0.5, "max", 0.5), (0.5, "min", -0.5), (3, "min", -3.0),
    (math.nan, "max", None), (math.inf, "max", None), (-math.inf, "min", None), (None, "min", None),
    ("abc", "max", None), ([0.5], "max", None),
])
def test_signed_scores_finite_numbers_only_and_negates_for_min(value, mode, expected):
    assert signed(value, mode) == expected


def test_best_value_and_is_better_skip_what_does_not_score():
    assert best_value([0.2, math.nan, 0.9, None, math.inf], "max") == 0.9
    assert best_value([0.2, math.nan, 0.9, None, -math.inf], "min") == 0.2
    assert best_value([math.nan, None], "min") is None
    assert is_better(0.1, None, "min") and is_better(0.1, 0.2, "min") and not is_better(0.2, 0.2, "min")
    assert is_better(0.3, 0.2, "max") and not is_better(0.2, 0.2, "max")


def test_rank_puts_scored_first_then_the_better_then_the_later():
    reports = [rank(0.9, "max", 1), rank(math.nan, "max", 5), rank(0.9, "max", 3), rank(0.8, "max", 4)]
    assert max(reports) == rank(0.9, "max", 3), "of equal scores, the later report"
    assert min(reports) == rank(math.nan, "max", 5), "an unscored report loses to every scored one"
    assert max(rank(None, None, 2), rank(None, None, 7)) == rank(None, None, 7), "no metric: the order alone"


def frame(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["trial_id", "trial_number", "epoch", "status", "val_loss"])


ROWS = frame([
    ("a", 0, 1, "COMPLETED", 0.30), ("a", 0, 2, "COMPLETED", 0.20), ("a", 0, 3, "COMPLETED", 0.20),
    ("b", 1, 1, "COMPLETED", 0.20), ("b", 1, 2, "COMPLETED", math.nan),
    ("c", 2, 1, "ERROR", 0.10),
    ("d", 3, 1, "INTERRUPTED", 0.15),
])


def test_ranked_breaks_ties_by_the_earlier_trial_then_the_later_epoch():
    order = ranked(ROWS, "val_loss", "min")
    assert list(zip(order["trial_id"], order["epoch"])) == [
        ("c", 1), ("d", 1), ("a", 3), ("a", 2), ("b", 1), ("a", 1)], "NaN never ranks; 0.20 ties go to #0, epoch 3"
    assert list(ranked(ROWS, "val_loss", "max")["val_loss"])[:1] == [0.30]
    assert ranked(ROWS, "val_loss", "min", without=["ERROR", "INTERRUPTED"]).iloc[0]["trial_id"] == "a"
    assert ranked(ROWS, "not_a_metric", "min").empty


def test_best_candidates_prefer_finished_trials_and_take_an_errored_one_only_when_none_else_scored():
    assert best_candidates(ROWS, "val_loss", "min").iloc[0][["trial_id", "epoch"]].tolist() == ["a", 3]
    interrupted_only = ROWS[ROWS["trial_id"].isin(["c", "d"])]
    assert best_candidates(interrupted_only, "val_loss", "min").iloc[0]["trial_id"] == "d"
    errored_only = ROWS[ROWS["trial_id"] == "c"]
    assert best_candidates(errored_only, "val_loss", "min").iloc[0]["trial_id"] == "c"


def test_an_infeasible_trial_is_never_the_best_candidate():
    marked = ROWS.assign(**{FEASIBLE: [False, False, False, True, True, None, None]})
    assert ranked(marked, "val_loss", "min", feasible=True)["trial_id"].tolist()[:1] == ["c"]
    assert best_candidates(marked, "val_loss", "min").iloc[0]["trial_id"] == "b", "feasible and finished"


def test_a_trials_point_is_the_epoch_ranked_names_also_at_a_tie():
    # Objectives.point_epoch picked the earlier of two equal epochs while ranked (best.yaml, the checkpoint
    # kept) picked the later: a constraint was judged at one epoch and the trial reported at another
    one = Objectives(("val_loss",), ("min",), (Bound("size", "<=", 10.0),))
    trial = ROWS[ROWS["trial_id"] == "a"]
    reports = {int(r["epoch"]): {"val_loss": r["val_loss"], "size": 1.0} for _, r in trial.iterrows()}
    assert one.point_epoch(reports) == ranked(trial, "val_loss", "min").iloc[0]["epoch"] == 3
    assert points(ROWS, Objectives(("val_loss",), ("min",))).set_index("trial_id")["epoch"].to_dict() == \
        {"a": 3, "b": 1, "c": 1, "d": 1}


def test_with_several_objectives_a_trials_point_is_its_last_epoch_with_every_objective_finite():
    rows = ROWS.assign(size=[5.0, 4.0, math.nan, 1.0, 1.0, 2.0, 3.0])
    two = Objectives(("val_loss", "size"), ("min", "min"))
    assert points(rows, two).set_index("trial_id")["epoch"].to_dict() == {"a": 2, "b": 1, "c": 1, "d": 1}


def pairwise_fronts(points, violations):
    """The definition of fronts(), pair by pair: peel the points no point left dominates."""
    def dominates(i, j):
        if points[i] is None:
            return False
        if points[j] is None:
            return True
        if violations[i] > 0 or violations[j] > 0:
            return violations[i] < violations[j]
        return all(a >= b for a, b in zip(points[i], points[j])) and any(a > b for a, b in zip(points[i], points[j]))
    left, out, front = set(range(len(points))), [0] * len(points), 0
    while left:
        level = {i for i in left if not any(dominates(j, i) for j in left if j != i)}
        for i in level:
            out[i] = front
        left -= level
        front += 1
    return out


def test_fronts_sort_by_domination_with_constraints_and_unscored_points():
    assert fronts([], []) == []
    # (2, 1) and (1, 2) trade off; (1, 1) is below both; a tie is on the same front; None is below everything;
    # an infeasible point is below every feasible one, the less violating above the more
    assert fronts([(2, 1), (1, 2), (1, 1), (1, 1), None, (9, 9), (9, 9)], [0, 0, 0, 0, 0, 0.5, 0.1]) == [0, 0, 1, 1, 4, 3, 2]
    rng = np.random.default_rng(0)
    for case in range(40):  # ties (values on a grid of 4), unscored points, infeasible ones, 1 to 3 objectives
        n, width = int(rng.integers(1, 60)), int(rng.integers(1, 4))
        points = [None if rng.random() < 0.1 else tuple(rng.integers(0, 4, width).astype(float)) for _ in range(n)]
        violations = [float(rng.choice([0, 0, 0, 0.5, 1.5])) for _ in range(n)]
        assert fronts(points, violations) == pairwise_fronts(points, violations), case


def test_the_summarys_table_lists_tied_trials_in_the_rule_s_order_so_its_first_row_is_the_best():
    """A tie (common: 1/300 steps of an accuracy) listed the trials in the order of their ids, so the table's
    first row and the Best line named different trials."""
    from search.outputs.summary import format_table

    ids = ["f3", "a1", "c9", "0b", "e4"]  # random hex, as Tune's: their order is not the trials'
    tied = pd.DataFrame({"trial_id": ids, "trial_number": [4, 1, 0, 3, 2], "status": ["COMPLETED"] * 5,
                         "epoch": [1] * 5, "score": [3.0, 3.0, 1.5, 3.0, math.nan], "x": [1, 2, 3, 4, 5]})
    lines = format_table(tied, "score", "max", ["x"]).splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["#1", "#3", "#4", "#0", "#2"], \
        "equal scores by trial number, then the lower score, then what does not score"
    assert lines[1].split()[1] == best_candidates(tied, "score", "max").iloc[0]["trial_id"] == "a1"
