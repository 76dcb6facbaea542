"""A reused actor runs trial after trial in one process: what one trial changes must not reach the next.

run_trial is what Tune calls on a reused actor; these tests call it twice in this process, as
the actor would, with the data already fetched (so no Ray is needed).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.conftest import REPO
from trainable import adapter

KEY = "test-data"


@pytest.fixture
def fetched(monkeypatch):
    """A DataHandle whose data this 'actor' already holds, as after its first trial's fetch."""
    monkeypatch.setitem(adapter._fetched, KEY, object())
    return SimpleNamespace(ref=SimpleNamespace(hex=lambda: KEY))


def observed() -> dict:
    """The process-wide state a trial can change and the next one would inherit."""
    return {
        "default_dtype": torch.get_default_dtype(),
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state()[1].copy(),
        "python_rng": random.getstate(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "num_threads": torch.get_num_threads(),
        "cwd": os.getcwd(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }


def same(a: dict, b: dict) -> list[str]:
    """The keys on which two observations differ."""
    def equal(x, y):
        if isinstance(x, torch.Tensor):
            return torch.equal(x, y)
        if isinstance(x, np.ndarray):
            return np.array_equal(x, y)
        return x == y
    return [k for k in a if not equal(a[k], b[k])]


def test_a_trial_starts_from_the_same_global_state_whatever_ran_before_on_its_actor(fetched, tmp_path):
    seen = {}

    def innocent(config, *, data):
        seen[config["name"]] = observed()
        torch.ones(3) @ torch.ones(3)  # a float32 computation the default dtype would break

    def meddling(config, *, data):
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(123)
        torch.rand(5)
        np.random.seed(5)
        random.seed(5)
        torch.use_deterministic_algorithms(not torch.are_deterministic_algorithms_enabled())
        torch.set_num_threads(1 if torch.get_num_threads() != 1 else 2)
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.benchmark = not torch.backends.cudnn.benchmark
        os.chdir(tmp_path)

    adapter.run_trial({"name": "first"}, data=fetched, trial_function=innocent)
    adapter.run_trial({"name": "meddler"}, data=fetched, trial_function=meddling)
    adapter.run_trial({"name": "after"}, data=fetched, trial_function=innocent)

    assert same(seen["first"], seen["after"]) == []
    # and the process is left as it was found (here: for the other tests of this session)
    assert torch.get_default_dtype() == torch.float32 and os.getcwd() != str(tmp_path)


def test_a_failed_trial_leaves_nothing_behind_either(fetched, tmp_path):
    before = observed()

    def failing(config, *, data):
        torch.set_default_dtype(torch.float64)
        os.chdir(tmp_path)
        raise ValueError("the user's code failed")

    with pytest.raises(ValueError, match="the user's code failed"):
        adapter.run_trial({}, data=fetched, trial_function=failing)
    assert same(before, observed()) == []


@pytest.mark.parametrize("code", [0, 3, "bye"])
def test_sys_exit_in_a_trial_ends_it_as_an_error_that_says_so(fetched, code):
    def exiting(config, *, data):
        sys.exit(code)

    # Tune would report a SystemExit from its trainable thread as "Should not have reached here"
    with pytest.raises(adapter.TrialExit, match=rf"the trial called sys.exit\({code!r}\)"):
        adapter.run_trial({}, data=fetched, trial_function=exiting)


def test_tunes_own_stop_passes_through_as_tune_expects(fetched, monkeypatch):
    """Tune stops a trial (a scheduler's decision) by raising SystemExit(0) in tune.report."""
    def stopping_report(metrics, checkpoint=None):
        sys.exit(0)

    monkeypatch.setattr(adapter.tune, "report", stopping_report)

    def reporting(config, *, data):
        adapter.report({"val_acc": 0.5})

    with pytest.raises(SystemExit) as stopped:
        adapter.run_trial({}, data=fetched, trial_function=reporting)
    assert stopped.value.code == 0 and not isinstance(stopped.value, adapter.TrialExit)


def test_a_trial_that_changed_nothing_costs_its_process_no_import():
    """`torch.use_deterministic_algorithms` imports torch._inductor's config (the biggest import of a function
    trial's process otherwise); restoring a flag the trial did not change must not call it."""
    probe = ("import sys, torch\n"
             "from trainable.isolation import GlobalState\n"
             "GlobalState.capture().restore()\n"
             "print(sorted(m for m in sys.modules if m.startswith('torch._inductor')))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
