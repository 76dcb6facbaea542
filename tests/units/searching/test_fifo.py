"""search/searching/fifo.py: which FIFO scheduler a search gets (its trials' reports in batches, or one a call).
What the batches do on Ray: tests/units/execution/test_ray_internals.py."""

from __future__ import annotations

import pytest
from ray.tune.schedulers import FIFOScheduler

from search.definition.space import parse_space
from search.execution.tuner import make_scheduler
from search.searching.fifo import BatchingFIFO
from tests.units.trainable.test_function_contract import toy_space


@pytest.mark.parametrize("experiment, batches", [
    ({}, True),
    ({"scheduler": "fifo", "max_failures": 0}, True),
    ({"time_budget": "10m"}, False),  # a stop at a report would drop the batch's later reports
    ({"stop_when": {"score": 0.9}}, False),
])
def test_a_fifo_search_gets_its_reports_in_batches_unless_something_may_stop_a_trial_at_a_report(tmp_path,
                                                                                              experiment, batches):
    space = parse_space(toy_space(tmp_path, **experiment), source=str(tmp_path / "space.yaml"))
    scheduler = make_scheduler(space)
    assert isinstance(scheduler, BatchingFIFO) is batches
    assert isinstance(scheduler, FIFOScheduler), "Tune's FIFO either way: every trial runs all its epochs"


def test_early_stopping_schedulers_get_no_batches(tmp_path):
    space = parse_space(toy_space(tmp_path, scheduler="asha"), source=str(tmp_path / "space.yaml"))
    assert getattr(make_scheduler(space), "result_batch", None) is None, "ASHA decides at reports"
