"""Shared fixtures: a writable copy of the MNIST raw files, the arrays loaded once, a local Ray."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the clone holds the four raw MNIST files (read-only; we copy them)
SHARED_RAW = Path(os.environ.get("HPSEARCH_SHARED", REPO.parent / "shared")) / "data" / "MNIST" / "raw"


@pytest.fixture(scope="session")
def data_root(tmp_path_factory) -> Path:
    """A data root holding MNIST/raw/*.gz; torchvision verifies their md5 and unpacks them."""
    if not SHARED_RAW.is_dir():
        pytest.fail(f"MNIST raw files not found in {SHARED_RAW} (set HPSEARCH_SHARED to the shared folder)")
    root = tmp_path_factory.mktemp("data")
    shutil.copytree(SHARED_RAW, root / "MNIST" / "raw")
    for f in (root / "MNIST" / "raw").iterdir():
        f.chmod(0o644)  # the shared copies are read-only; unpacking writes beside them
    return root


@pytest.fixture(scope="session")
def mnist_train(data_root):
    """MNIST's 60,000 training images as uint8 arrays, loaded once per session."""
    from trainable.data import load_dataset

    return load_dataset("mnist", data_root, train=True)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the tests that run searches in-process; shut down at the end."""
    import ray

    from search.execution.ray_internals import lean_local_ray

    # as a search's own local Ray, no log monitor polling for the whole session; its autoscaler monitor stays:
    # searches here did not start this Ray, so the capacity check reads whether an autoscaler serves it
    with lean_local_ray(autoscaler_monitor=True):
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# The files whose tests take longest (seconds of a full run on 2 cores, `make test`'s durations), run
# first: pytest-xdist's loadfile with --no-loadscope-reorder (the Makefile's) hands out files in collection
# order, so a long file collected last keeps one worker busy after the other has finished (the longest-first
# order makes the two even). Without that flag xdist 3 orders files by their number of tests instead.
LONGEST_FIRST = ["test_faults.py", "test_chaos.py", "test_object_store.py", "test_workers.py", "test_resume.py", "test_gpus.py",
                 "test_model_based.py", "test_damage.py", "test_cluster.py", "test_user_code.py", "test_search.py",
                 "test_halving.py", "test_function_trainable.py", "test_autoscaler.py", "test_layout.py",
                 # the rest in an earlier run's order
                 "test_budgets.py", "test_quiet.py", "test_session.py", "test_exits.py", "test_reproducible.py",
                 "test_multi_objective.py", "test_per_report.py", "test_shared_cluster.py", "test_own_function.py",
                 "test_trial_timeout.py", "test_conditional.py", "test_warm_start.py", "test_end_to_end.py",
                 "test_report.py", "test_schema_in_a_search.py", "test_pbt.py", "test_export.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order stays


_file_seconds: dict[str, float] = {}  # test file -> seconds of its tests' setup, call and teardown


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    _file_seconds[path] = _file_seconds.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    """The longest files, whose order LONGEST_FIRST keeps (under xdist the reports reach this process too)."""
    if not _file_seconds:
        return
    terminalreporter.write_sep("=", "longest files (seconds of their tests' phases: the order of LONGEST_FIRST)")
    for path, seconds in sorted(_file_seconds.items(), key=lambda item: -item[1])[:15]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")
    terminalreporter.write_line(f"{sum(_file_seconds.values()):8.1f}s all {len(_file_seconds)} files")
