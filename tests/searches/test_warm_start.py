"""Warm start in a search: experiment.enqueue runs given configs first; --warm-start tells the study an earlier
run's trials (the configs and the earlier trials on their own: tests/units/searching/test_warm_start_configs.py)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.storages.journal import JournalFileBackend

from search.outputs.journal import WARM_STUDY, Journal
from search.store.run_folder import RunFolder
from search.store.storage import Storage
from search.searching.warm_start import NUMBER, read
from tests.helpers import small_space
from trainable.errors import ConfigError


@pytest.mark.slow
def test_a_search_with_enqueued_configs_warm_starts_the_next(ray_local, tmp_path, data_root):
    from search.driver import run_search

    small = {"data": {"train_size": 300, "val_size": 100}, "training": {"epochs": 1}}
    first = small_space(tmp_path, data_root, **small, experiment={
        "num_samples": 2, "enqueue": [{"lr": 0.25, "batch_size": 128}, {"lr": 0.02}]})
    earlier = run_search(first, name="earlier")
    frame = earlier.results.sort_values("trial_number")
    assert (frame["lr"].iloc[0], frame["batch_size"].iloc[0], frame["lr"].iloc[1]) == (0.25, 128, 0.02)
    before = {p: p.stat().st_mtime_ns for p in Path(earlier.path).rglob("*")}

    lr = {"distribution": "loguniform", "low": 0.01, "high": 0.2}  # trial 0's lr 0.25 is outside it now
    with pytest.raises(ConfigError, match="experiment.warm_start: must be a run with this search's metric"):
        run_search(small_space(tmp_path, data_root, **small, experiment={
            "warm_start": earlier.path, "metric": "val_loss", "mode": "min"}), name="refused")
    assert not (tmp_path / "refused").exists(), "refused before its folder was claimed"
    later = run_search(small_space(tmp_path, data_root, **small, space={"lr": lr}, experiment={
        "num_samples": 1, "warm_start": earlier.path}), name="later")
    assert f"warm start: 1 trial(s) from {earlier.path}" in later.summary
    assert "1 left out: 1 lr in [0.01, 0.2]" in later.summary
    assert list(later.results["trial_number"]) == [0]
    assert before == {p: p.stat().st_mtime_ns for p in Path(earlier.path).rglob("*")}, "the earlier run is only read"
    # batch_size fixed today: only the earlier trials that ran today's value are told (as a search's start reads them)
    fixed = read(small_space(tmp_path, data_root, **small, space={"batch_size": 128},
                             experiment={"warm_start": earlier.path}))
    ran = [int(n) for n in frame.loc[frame["batch_size"] == 128, "trial_number"]]
    assert [t["number"] for t in fixed.trials] == ran and 0 in ran
    assert fixed.left_out == ({"batch_size drew a value other than today's 128": 2 - len(ran)} if len(ran) < 2 else {})

    storage = optuna.storages.JournalStorage(JournalFileBackend(f"{later.path}/optuna.journal"))
    told = optuna.load_study(study_name=WARM_STUDY.format(run="later"), storage=storage).trials
    assert [(t.user_attrs["warm_start_from"], t.user_attrs[NUMBER], t.params["lr"]) for t in told] == \
        [("earlier", 1, 0.02)]
    own = optuna.load_study(study_name="later", storage=storage).trials
    assert [(t.number, t.user_attrs["trial_number"]) for t in own] == [(0, 0)]
    folder = RunFolder(Storage.at(str(tmp_path)), "later")
    Journal(folder, folder.read_spec()[0])  # as a resume opens it
    storage = optuna.storages.JournalStorage(JournalFileBackend(f"{later.path}/optuna.journal"))
    assert len(optuna.load_study(study_name="later.warm_start", storage=storage).trials) == 1, "not twice"
