"""The schema in a whole search: an int model keyword on a log scale and a choice of mappings, drawn, trained,
recorded and labelled the same way by the searcher, results.parquet, the journal and the report (the schema's
units: tests/units/definition/test_schema.py)."""

from __future__ import annotations

import copy

import optuna
import pytest

from search.definition.schema import label
from search.definition.space import parse_space

MAPPINGS = [{"act": "relu", "depth": 2}, {"depth": 3, "act": "tanh"}]  # keys in two orders

NET = '''
import math
from torch import nn


def net(hidden, block, input_shape, num_classes):
    act = {"relu": nn.ReLU, "tanh": nn.Tanh}[block["act"]]
    layers = [nn.Flatten(), nn.Linear(math.prod(input_shape), hidden)]
    for _ in range(block["depth"] - 1):
        layers += [act(), nn.Linear(hidden, hidden)]
    return nn.Sequential(*layers, act(), nn.Linear(hidden, num_classes))
'''


@pytest.mark.slow
def test_a_search_over_a_log_int_keyword_and_a_choice_of_mappings_runs_to_the_end(ray_local, tmp_path, data_root):
    """The two bugs of one mapping per place: a float drawn for an int keyword, a mapping's two labels."""
    import pandas as pd

    from search.driver import run_search
    from search.searching.study import JOURNAL_FILE, journal
    from tests.helpers import SMALL

    (tmp_path / "net.py").write_text(NET)
    raw = copy.deepcopy(SMALL)
    raw["experiment"].update(num_samples=3, storage_path=str(tmp_path / "runs"), report=True)  # its figures take mappings
    raw["data"].update(root=str(data_root), train_size=1000, val_size=300)
    raw["training"]["epochs"] = 1
    raw["model"] = {"factory": f"{tmp_path / 'net.py'}:net"}
    raw["space"].update({"model.hidden": {"distribution": "int", "low": 16, "high": 256, "log": True},
                         "model.block": {"distribution": "choice", "values": MAPPINGS}})
    space = parse_space(raw, source="tests")
    outcome = run_search(space)
    frame = pd.read_parquet(f"{outcome.path}/results.parquet")
    assert set(frame["status"]) == {"COMPLETED"}, frame[["trial_id", "status"]]
    assert str(frame["model.hidden"].dtype) == "int64"
    assert (tmp_path / "runs" / outcome.name / "report.html").is_file()
    study = optuna.load_study(study_name=outcome.name, storage=journal(f"{outcome.path}/{JOURNAL_FILE}"))
    assert len(study.trials) == 3 and all(t.state.name == "COMPLETE" for t in study.trials)
    assert study.best_value == frame["val_acc"].max()
    assert {t.params["model.block"] for t in study.trials} <= {label(v) for v in MAPPINGS}
