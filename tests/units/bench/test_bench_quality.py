"""bench/quality.py, CI-sized: the table it prints, regrets a user can trust, the same numbers twice."""

from __future__ import annotations

import re

import numpy as np

from bench import quality


def test_quick_prints_a_row_per_searcher_with_finite_regrets_and_repeats_itself(capsys):
    quality.main(["--quick", "--workers", "1"])
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("| ") and not line.startswith("| searcher")]
    assert [row.split(" | ")[0][2:] for row in rows] == list(quality.QUICK)
    assert "| searcher | hpolib | hpobench | all | rank | ms/suggestion | slots busy |" in printed
    for row in rows:
        regrets = [float(cell) for cell in row.strip("| ").split(" | ")[1:4]]
        assert all(0 <= r < float("inf") for r in regrets), row
    assert re.search(r"^N = 25$", printed, re.MULTILINE)
    # the goal's ratio comes with the paired difference and its standard error, against the better of Optuna's two
    goal = re.search(r"^goal at N = 25: hpsearch tpe @4 / the better of optuna tpe sequential = ([\d.]+)x .*; "
                     r"hpsearch tpe @4 - optuna tpe sequential = ([+-][\d.]+) \+- ([\d.]+) \(standard error, 4 pairs\)",
                     printed, re.MULTILINE)
    assert goal, printed
    overall = {row.split(" | ")[0][2:]: float(row.split(" | ")[3]) for row in rows[:len(quality.QUICK)]}  # N = 25
    assert abs(float(goal[2]) - (overall[quality.DEFAULT] - overall[quality.SEQUENTIAL])) <= 0.0011
    assert abs(float(goal[1]) - overall[quality.DEFAULT] / overall[quality.SEQUENTIAL]) <= 0.05
    assert float(goal[3]) > 0

    # a searcher's run depends only on the table and the seed: hpsearch's default at 4 at once, again
    family, name = quality.table_names(("hpolib",))[0]  # a table --quick loaded (tables are cached)
    first = quality.run_one((quality.DEFAULT, family, name, 1, 25))
    again = quality.run_one((quality.DEFAULT, family, name, 1, 25))
    np.testing.assert_array_equal(first[3], again[3])


def test_a_tables_regret_is_zero_at_its_optimum_and_one_at_its_median():
    table = quality.load_table(*quality.table_names(("hpobench",))[-1])  # the one --quick loads
    assert table.regret(table.optimum) == 0
    assert table.regret(table.median) == 1
    best = np.unravel_index(np.argmin(table.loss), table.loss.shape)
    config = {d.name: (int(i) if not d.is_choice else d.values[i]) for d, i in zip(table.searched, best)}
    assert table.index(config) == best
