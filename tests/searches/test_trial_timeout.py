"""experiment.trial_timeout: a trial that never finishes its epoch ends as an error, and the search goes on.

Two ways a trial hangs: spinning in Python (stopped by an exception in its thread) and blocked
inside C (a sleep; its process is ended). The first trial to reach each marker hangs that way.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from search.definition.space import parse_space
from search.driver import run_search
from tests.helpers import assert_outputs_agree
from tests.helpers import blob_space, write

HANGING = """
    import os
    import time
    from torch import nn

    def first(path):
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False

    class Hanging(nn.Module):
        def __init__(self, input_shape, num_classes, markers, width=16):
            super().__init__()
            self.markers = markers
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(input_shape[0], width), nn.ReLU(),
                                     nn.Linear(width, num_classes))

        def forward(self, x):
            if self.training and len(x) > 2:  # not in the check before the search
                if first(os.path.join(self.markers, "spin")):
                    while True:  # busy in Python
                        pass
                if first(os.path.join(self.markers, "sleep")):
                    time.sleep(10**6)  # blocked inside C
            return self.net(x)
"""


@pytest.mark.slow
def test_trials_that_hang_end_as_errors_and_the_search_goes_on(ray_local, tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    write(tmp_path / "hanging.py", HANGING)
    raw = blob_space(tmp_path, experiment={"num_samples": 4, "max_failures": 0, "trial_timeout": 5},
                     model={"factory": "hanging.py:Hanging", "markers": str(markers)})
    space_file = tmp_path / "space.yaml"
    space_file.write_text(yaml.safe_dump(raw))
    outcome = run_search(parse_space(yaml.safe_load(space_file.read_text()), source=str(space_file)))
    statuses = pd.read_parquet(f"{outcome.path}/results.parquet").drop_duplicates("trial_id")["status"]
    assert sorted(statuses) == ["COMPLETED", "COMPLETED", "ERROR", "ERROR"]
    assert "went 5 s without finishing an epoch (experiment.trial_timeout); it was stopped" in outcome.summary
    assert "its process ended: a trial blocked outside Python past experiment.trial_timeout (5 s)" in outcome.summary
    assert outcome.succeeded and outcome.best is not None
    assert_outputs_agree(Path(outcome.path))
