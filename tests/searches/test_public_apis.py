"""What hpsearch reads and writes of Ray's and Optuna's state goes through their public APIs:
the searcher's record is our own JSON file, Tune's state is read by Tune, a claim is undone on
any storage."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from ray import tune
from ray.tune.search import ConcurrencyLimiter

from search.store.searcher_record import RECORD, RECORD_FILE, record_from_json
from search.searching.ordered import OrderedSearch
from search.store.results import RESULTS_FILE
from search.store.run_folder import PROBE_FILE, SPEC_FILE, RunFolder
from search.searching.searcher import suggest
from search.definition.space import parse_space
from search.store.storage import Storage
from trainable.errors import ConfigError

SPACE = parse_space({"space": {"lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
                               "batch_size": {"distribution": "choice", "values": [32, 64]},
                               "t_max": {"distribution": "randint", "low": 1, "high": 8}}})


def searcher(seed: int = 3, lag: int = 2, sampler: str = "cmaes") -> OrderedSearch:
    ask = functools.partial(suggest, searched=SPACE.searched, experiment_seed=seed)
    return OrderedSearch(ask, metric="val_acc", mode="max", experiment_seed=seed, sampler=sampler, lag=lag)


def finish(s: OrderedSearch, trial_id: str, config: dict) -> None:
    for epoch in (1, 2):
        s.on_trial_result(trial_id, {"val_acc": config["lr"] * epoch, "epoch": epoch})
    s.on_trial_complete(trial_id, {"val_acc": config["lr"] * 2})


# ---- the searcher's record: JSON of ours ----

def test_the_record_is_json_and_a_restored_searcher_suggests_the_same_next_trial(tmp_path):
    s = searcher()
    for t in range(13):  # past CMA-ES's start-up, so its state travels in the record's system attrs
        config = s.suggest(f"t{t}")
        if t != 12:  # trial 12 is still running when the record is saved
            finish(s, f"t{t}", config)
    s.save_to_dir(str(tmp_path))
    text = (tmp_path / RECORD_FILE).read_text()
    assert set(json.loads(text)) == set(RECORD)
    assert [p.name for p in tmp_path.iterdir()] == [RECORD_FILE], "no temporary file left behind"

    restored = searcher()
    restored.restore_from_dir(str(tmp_path))
    for key in RECORD:  # int keys, tuples and distributions come back as the searcher held them
        assert getattr(restored, key) == getattr(s, key), key
    assert any(key.startswith("cma") for _, _, attrs in restored.asked for key in attrs)
    last = {"lr": s.asked[12][0]["lr"]}
    finish(s, "t12", last)
    finish(restored, "t12", last)
    assert restored.suggest("t13") == s.suggest("t13")


def test_a_record_that_is_not_one_is_a_value_error():
    with pytest.raises(ValueError):
        record_from_json("{\"numbers\": ")
    with pytest.raises(ValueError, match="not a searcher record"):
        record_from_json(json.dumps({"numbers": {}}))


# ---- the run folder ----

@pytest.mark.parametrize("uri", [False, True], ids=["folder", "file-uri"])
def test_release_undoes_a_claim_on_any_storage(tmp_path, uri):
    """A search that could not start leaves no run folder, also on storage given as a URI."""
    storage = Storage.at(f"file://{tmp_path}" if uri else str(tmp_path))
    failed = RunFolder(storage, "failed")
    failed.claim()
    storage.write(f"failed/{SPEC_FILE}", b"spec")
    storage.write(f"failed/{PROBE_FILE}", b"{}")
    failed.release()
    assert not (tmp_path / "failed").exists() and not failed.exists()
    failed.claim()  # the name is free again

    ran = RunFolder(storage, "ran")  # a trial ran: nothing of it is removed
    ran.claim()
    storage.write(f"ran/{SPEC_FILE}", b"spec")
    storage.write("ran/trial_a/result.json", b"{}")
    ran.release()
    assert (tmp_path / "ran" / SPEC_FILE).exists() and (tmp_path / "ran" / "trial_a" / "result.json").exists()


@pytest.fixture(scope="module")
def tune_run(ray_local, tmp_path_factory):
    """Three trials of OrderedSearch under Tune, one at a time, in a run folder."""

    def one_report(config):  # defined here: Ray pickles it by value (the tests folder is not on the workers' path)
        tune.report({"val_acc": config["lr"], "epoch": 1})

    storage = Storage.at(str(tmp_path_factory.mktemp("runs")))
    tuner = tune.Tuner(one_report, tune_config=tune.TuneConfig(
        search_alg=ConcurrencyLimiter(searcher(sampler="tpe", lag=1), max_concurrent=1), num_samples=3),
        run_config=tune.RunConfig(storage_path=storage.uri, name="run", verbose=0))
    grid = tuner.fit()
    assert not grid.errors
    return RunFolder(storage, "run"), grid


def test_tune_saves_the_searchers_json_record_in_the_run_folder(tune_run):
    folder, grid = tune_run
    state = folder.record.searcher_state()
    assert sorted(state["finished"]) == [0, 1, 2] and sorted(state["suggested"]) == [0, 1, 2]
    numbers = {result.config["trial_number"]: result.metrics["val_acc"] for result in grid}
    assert state["finished"] == numbers, "a trial's value, by its number"
    when, seconds = state["suggested"][0]
    assert when > 0 and seconds > 0
    assert not list(Path(folder.path).glob("searcher-*.pkl")), "no pickle of the searcher beside it"


def test_saved_trials_are_tunes_last_saved_statuses_and_configs(tune_run):
    folder, grid = tune_run
    saved = folder.record.saved_trials()
    assert len(saved) == 3 and {status for status, _ in saved.values()} == {"TERMINATED"}
    assert set(saved) == {result.metrics["trial_id"] for result in grid}
    assert sorted(config["trial_number"] for _, config in saved.values()) == [0, 1, 2]
    folder.check_record()  # reads


def test_a_resume_drops_the_parts_of_trials_tunes_state_does_not_hold(tune_run):
    """A trial that ended after Tune's last snapshot runs again on resume: its old part must not count twice."""
    folder, _ = tune_run
    recorded = sorted(folder.record.saved_trials())
    folder.storage.write(f"{folder.name}/{RESULTS_FILE}/{recorded[0]}.parquet", b"part")
    folder.storage.write(f"{folder.name}/{RESULTS_FILE}/unknown.parquet", b"part")
    assert folder.parts.drop_unrecorded() == ["unknown"]
    assert folder.parts.ended() == [recorded[0]]


def test_a_damaged_searcher_record_refuses_to_resume(tune_run):
    folder, _ = tune_run
    path = f"{folder.name}/{RECORD_FILE}"
    good = folder.storage.read(path)
    try:
        folder.storage.write(path, good[: len(good) // 2])
        with pytest.raises(ConfigError, match="cannot be read.*resuming would start the search over"):
            folder.check_record()
        assert folder.record.searcher_state() == {}
    finally:
        folder.storage.write(path, good)
