"""A function trainable's contract on its own, without Ray: the space file's checks of a function search, its
reserved names, the report and checkpoint contract (report(dict) as Tune's, divergence, contract errors), a
checkpoint's round trip, best.yaml replayed (the searches of a toy function, and the driver of a plain
function without torch: tests/searches/test_function_trainable.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from search.definition.space import parse_space
from trainable.errors import ConfigError
from trainable.function import (ContractError, MetricNotReported, Reporter, ReportMisuse, ReservedName, _Diverged,
                                load_state, replay, resolve_function, save_state)


# A toy training function as a user would write it: no Ray, milliseconds per report. Trial 1 fails once
# at its third epoch while the marker file exists; its restart must continue from the checkpoint.
TOY = '''
import os
import torch


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    x = checkpoint["x"] if checkpoint else torch.zeros(())
    for epoch in range(start, config["epochs"]):
        if epoch == 2 and config["trial_number"] == 1 and os.path.exists(config["marker"]):
            os.remove(config["marker"])
            raise RuntimeError("killed once")
        noise = torch.randn((), generator=torch.Generator().manual_seed(config["seed"] + epoch))
        x = x + config["lr"] * (1 - x) + 0.01 * noise
        report(score=x, resumed_from=start, checkpoint={"x": x, "epoch": epoch + 1})
'''


def toy_space(folder: Path, **experiment) -> dict:
    """The toy's space; toy.py and space.yaml are written in `folder` (a reference is relative to the file)."""
    (folder / "toy.py").write_text(TOY)
    (folder / "space.yaml").write_text("")
    return {"trainable": "toy.py:train",
            "experiment": {"name": "toy", "metric": "score", "mode": "max", "num_samples": 4, "seed": 3,
                           "max_failures": 1, "storage_path": str(folder / "runs"), **experiment},
            "resources": {"cpus": 0.5},
            "training": {"epochs": 3, "marker": str(folder / "fail-once")},
            "space": {"lr": {"distribution": "float", "low": 0.1, "high": 0.9}}}


def problems(raw: dict, folder: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_space(raw, source=str(folder / "space.yaml"))
    return str(caught.value)


def test_model_and_data_sections_are_refused_with_the_reason(tmp_path):
    raw = {**toy_space(tmp_path), "model": {"factory": "mlp"}, "data": {"train_size": 10}}
    said = problems(raw, tmp_path)
    assert "model: does not apply with a function trainable: the function loads its own model and data" in said
    assert "data: does not apply" in said


def test_free_names_pass_through_and_any_metric_name_parses(tmp_path):
    space = parse_space(toy_space(tmp_path), source=str(tmp_path / "space.yaml"))
    assert space.trainable == f"{tmp_path / 'toy.py'}:train"  # absolute: best.yaml replays from anywhere
    assert dict(space.fixed) == {"epochs": 3, "marker": str(tmp_path / "fail-once")}
    assert [d.name for d in space.searched] == ["lr"] and space.experiment.metric == "score"


def test_reserved_names_and_bad_references_are_refused(tmp_path):
    raw = toy_space(tmp_path)
    raw["training"]["seed"] = 1
    raw["space"]["momentum"] = {"distribution": "float", "low": 1, "high": 0}
    said = problems(raw, tmp_path)
    assert "training.seed: is set by the driver per trial, got 1" in said
    assert "space.momentum.low: must be <= high (0), got 1" in said
    assert "trainable: must be FILE.py:FUNCTION" in problems({**toy_space(tmp_path), "trainable": "train"}, tmp_path)
    with pytest.raises(ConfigError, match="toy.py defines no nope"):
        resolve_function(f"{tmp_path / 'toy.py'}:nope")
    several = toy_space(tmp_path)
    several["experiment"].update(metric=["score", "score"], mode=["max", "min"], constraints=["2 <= x"])
    said = problems(several, tmp_path)
    assert ("experiment.metric: must name a metric the function reports (a Python identifier), or a list of "
            "distinct ones, got ['score', 'score']") in said
    assert ("experiment.constraints[0]: must read 'METRIC <= NUMBER' or 'METRIC >= NUMBER' with a METRIC the "
            "function reports, got '2 <= x'") in said


def test_a_metric_named_like_a_config_key_is_refused_in_the_space_file(tmp_path):
    raw = toy_space(tmp_path)
    raw["experiment"].update(metric="lr", stop_when={"status": 1})
    said = problems(raw, tmp_path)
    assert "experiment.metric: must name a metric of the function, not a config key or a column of " \
           "hpsearch's own" in said and "got 'lr'" in said
    assert "experiment.stop_when: must name a metric of the function" in said and "got 'status'" in said


def test_a_function_gets_several_objectives_and_constraints(tmp_path):
    raw = toy_space(tmp_path)
    raw["experiment"].update(metric=["score", "loss"], mode=["max", "min"], constraints=["size <= 3"],
                             reproducible=True)
    experiment = parse_space(raw, source=str(tmp_path / "space.yaml")).experiment
    assert (list(experiment.metric), list(experiment.mode), list(experiment.constraints)) == (
        ["score", "loss"], ["max", "min"], ["size <= 3"])


def test_where_a_trial_ran_is_no_objective_or_constraint_of_a_function(tmp_path):
    """A report hands Tune where the trial ran and its phases packed in one value: the search cannot read them."""
    raw = toy_space(tmp_path)
    raw["experiment"].update(constraints=["gpu_memory_allocated_mb <= 4000"])
    assert "experiment.constraints: must name a metric of the function, not where a trial ran or when" in \
        problems(raw, tmp_path) and "got 'gpu_memory_allocated_mb'" in problems(raw, tmp_path)
    raw["experiment"].update(constraints=["gpu_memory_reserved_mb <= 4000"])  # a number of its own: read
    assert [str(c) for c in parse_space(raw, source=str(tmp_path / "space.yaml")).experiment.constraints] == \
        ["gpu_memory_reserved_mb <= 4000"]


def test_a_first_report_without_the_metric_names_what_was_reported():
    report = Reporter("val_acc", send=lambda *a: None)
    with pytest.raises(MetricNotReported, match=r"experiment.metric: every metric the search needs \(val_acc\) "
                                                r"must be among those the function reports \(loss, acc\); "
                                                r"missing: val_acc"):
        report(loss=1.0, acc=0.5)
    constrained = Reporter(["score", "size"], send=lambda *a: None, objectives=1)
    with pytest.raises(MetricNotReported, match="missing: size"):
        constrained(score=1.0)


def test_report_takes_one_dict_as_tune_report_does_and_refuses_any_other_positional():
    """Issue 49 item 1: report({...}) was taken as the checkpoint, and the trial failed saying it reported
    no metric."""
    sent = []
    report = Reporter(["score", "size"], send=lambda row, epoch, checkpoint: sent.append((row, checkpoint)),
                      objectives=1)
    report({"score": 0.5, "size": torch.tensor(3.0)}, checkpoint={"w": torch.zeros(2)})
    report({"score": 0.6}, size=4)  # both ways at once
    assert [(r["score"], r["size"], r["metric_names"]) for r, _ in sent] == \
        [(0.5, 3.0, ["score", "size"]), (0.6, 4.0, ["score", "size"])]
    assert sent[0][1]["w"].shape == (2,) and sent[1][1] is None, "the checkpoint goes by name only"
    with pytest.raises(ReportMisuse, match=r"report\(\): the metrics go as one dict, as tune.report takes them, or "
                                           r"as keywords, the checkpoint by name: .*; got a positional float"):
        report(0.7)
    with pytest.raises(ReportMisuse, match="size given both in the dict and as a keyword"):
        report({"score": 0.7, "size": 1}, size=2)
    assert isinstance(ReportMisuse("x"), ContractError) and len(sent) == 2


def test_a_metric_named_like_a_column_of_the_run_folder_is_refused():
    """Issue 37 item 1: a metric named like a config key rewrote that trial's config in results.parquet and
    best.yaml; `status` broke the end of the search; `done` ended the trial after one report."""
    rows = []
    config = {"x": 0.5, "seed": 3, "trial_number": 0, "trainable": "t.py:train"}
    report = Reporter("score", send=lambda row, *a: rows.append(row), config=config,
                      reserved={"status", "trial_id", "done", "epoch"})
    for name in ("x", "seed"):
        with pytest.raises(ReservedName, match=f"a metric cannot be named {name}: {name} is a config key of "
                                               "this trial"):
            report(score=1.0, **{name: 123.0})
    for name in ("status", "done", "trial_id", "epoch_seconds", "diverged"):
        with pytest.raises(ReservedName, match=f"cannot be named {name}: names the run folder"):
            report(score=1.0, **{name: 1.0})
    assert rows == [], "nothing refused reaches the results"
    # epoch: accepted as the count of reports (1, 2, ...), as Tune's and Optuna's examples report it
    report(score=1.0, epoch=1)
    report(score=1.0, epoch=torch.tensor(2))
    with pytest.raises(ReservedName, match=r"report\(epoch=0\): epoch must count the reports \(1 on the first, "
                                           r"then 2, 3, ...; this is report 3\)"):
        report(score=1.0, epoch=0)
    assert [r["epoch"] for r in rows] == [1, 2] and all(r["metric_names"] == ["score"] for r in rows)


def test_a_function_that_catches_the_divergence_still_ends_diverged():
    """Issue 37 hostile 7: `except Exception` around the loop kept reporting after the NaN."""
    rows = []
    report = Reporter("loss", send=lambda row, epoch, checkpoint: rows.append(row))
    for value in (1.0, float("nan"), 0.5, 0.4):
        try:
            report(loss=value)
        except Exception:  # a function's own catch-all: the divergence is not an Exception
            pass
        except BaseException:
            continue
    assert [r["diverged"] for r in rows] == [False, True], "nothing after the NaN is reported"
    assert report.diverged


def test_a_nan_metric_ends_the_trial_with_its_row_marked_diverged():
    rows = []
    report = Reporter("loss", send=lambda row, epoch, checkpoint: rows.append(row))
    report(loss=torch.tensor(1.0))
    with pytest.raises(_Diverged):
        report(loss=float("nan"))
    assert [r["epoch"] for r in rows] == [1, 2] and [r["diverged"] for r in rows] == [False, True]


def test_a_checkpoint_round_trips_readable_with_weights_only(tmp_path):
    state = {"model": {"w": torch.arange(3.0)}, "epoch": 4, "note": "plain"}
    save_state(tmp_path, 4, state)
    back = load_state(tmp_path)
    assert back["epoch"] == 4 and back["state"]["note"] == "plain"
    assert torch.equal(back["state"]["model"]["w"], torch.arange(3.0))
    with pytest.raises(TypeError, match="must be a dict of tensors"):
        save_state(tmp_path, 1, [1, 2])
    # a numpy array would be saved, then fail the restart that needs it: refused when it is reported
    import numpy as np

    with pytest.raises(TypeError, match=r"reads back, and this one does not \(UnpicklingError: .*Unsupported global"):
        save_state(tmp_path, 1, {"array": np.zeros(2)})
    # ... also where the function allowed numpy for itself: a restart loads before the function runs
    reconstruct = np.zeros(1).__reduce__()[0]  # with these four, torch.load reads a numpy array in this process
    torch.serialization.add_safe_globals([reconstruct, np.ndarray, np.dtype, type(np.dtype("float64"))])
    try:
        with pytest.raises(TypeError, match="reads back, and this one does not") as refused:
            save_state(tmp_path, 1, {"array": np.zeros(2)})
        assert "Please use" not in str(refused.value), "not torch's advice to allow it"
        assert reconstruct in torch.serialization.get_safe_globals(), "the function's own allowance stays"
    finally:
        torch.serialization.clear_safe_globals()


def test_best_yaml_replays_the_function(tmp_path, capsys):
    (tmp_path / "toy.py").write_text(TOY)
    config = {"trainable": f"{tmp_path / 'toy.py'}:train", "epochs": 2, "lr": 0.5, "marker": "none", "seed": 1,
              "trial_number": 0}
    assert replay(config, "score") == 0
    assert capsys.readouterr().out.count("Epoch [") == 2


def test_a_metric_of_several_numbers_is_refused_by_name():
    report = Reporter("score", send=lambda *a: None)
    with pytest.raises(TypeError, match=r"report\(score=\.\.\.\): a metric must be a number .* of shape \(2,\)"):
        report(score=torch.zeros(2))


def test_spec_differences_compare_the_trainable_reference_whole():
    from search.definition.space import spec_differences

    a = {"trainable": "a.py:train", "training": {"epochs": 3}, "space": None}
    b = {"trainable": "b.py:train", "training": {"epochs": 4, "lr": 0.1}, "space": {}}
    assert spec_differences(a, b) == [("trainable", "a.py:train", "b.py:train"),
                                      ("training.epochs", 3, 4), ("training.lr", "(absent)", 0.1)]
    assert spec_differences(a, {**a, "trainable": None}) == [("trainable", "a.py:train", None)]


def test_enqueued_configs_of_a_function_space_are_checked_against_its_free_names(tmp_path):
    raw = toy_space(tmp_path)
    raw["space"]["units"] = {"distribution": "int", "low": 1, "high": 8}
    raw["experiment"]["enqueue"] = [{"lr": 0.5, "units": 3}]
    assert parse_space(raw, source=str(tmp_path / "space.yaml")).experiment.enqueue == ({"lr": 0.5, "units": 3},)
    raw["experiment"]["enqueue"] = [{"lr": 5, "units": 2.5, "nope": 1}]
    said = problems(raw, tmp_path)
    assert "experiment.enqueue[0].lr: must be in [0.1, 0.9], got 5" in said
    assert "experiment.enqueue[0].units: must be an integer in [1, 8], got 2.5" in said
    assert "experiment.enqueue[0].nope: must be a searched key (lr, units), got 1" in said
    raw["experiment"].update(enqueue=[], lag=1, reproducible=False)
    assert "experiment.lag: applies to the reproducible searcher only" in problems(raw, tmp_path)


def test_progress_shows_a_report_past_epochs_without_a_total():
    from search.execution.progress import of_epochs

    assert [of_epochs(3, 5), of_epochs(5, 5), of_epochs(6, 5), of_epochs(2, None)] == ["/5", "/5", "", ""]


def test_a_choice_of_mixed_types_keeps_each_drawn_values_type_through_the_results(tmp_path):
    """Issue 49 item 6: with values [0.5, true, 2.5] the trial that ran with true was recorded, summarised and
    replayed as 1.0; 0x10 came back as 16.0. Values that compare equal cannot be told apart by Optuna: refused."""
    from search.store.results import config_from_row, results_schema, to_frame

    raw = toy_space(tmp_path)
    raw["space"] = {"x": {"distribution": "choice", "values": [0.5, True, 2.5]},
                    "y": {"distribution": "choice", "values": ["1e5", None, 16, math.inf, True, 10]}}
    space = parse_space(raw, source=str(tmp_path / "space.yaml"))
    schema = results_schema(space)
    rows = [{"trial_id": f"t{i}", "status": "COMPLETED", "trainable": "toy.py:train", "x": x, "y": y, "seed": i,
             "trial_number": i, "epoch": 1, "score": 1.0} for i, (x, y) in
            enumerate([(True, 16), (2.5, True), (0.5, None), (True, math.inf), (2.5, "1e5")])]
    frame = to_frame(rows, schema)
    back = [config_from_row(row, schema) for _, row in frame.iterrows()]
    for row, config in zip(rows, back):
        for key in ("x", "y"):
            assert config.get(key) == row[key] and type(config.get(key)) is type(row[key]), (key, row, config)
    raw["space"] = {"x": {"distribution": "choice", "values": [1, True, 2]}}
    assert "space.x.values: must not hold two values that compare equal (1, 1.0 and true, 0 and false" in \
        problems(raw, tmp_path)


@pytest.mark.parametrize("name", ["search", "note", "checkpoint", "world_size", "device", "hostname", "started_at",
                                  "status", "result"])
def test_a_name_the_run_folder_keeps_is_refused_as_a_metric_and_as_a_report(tmp_path, name):
    """Issue 50: a metric named `search` crashed the end of the search (best.yaml's key). One list
    (search/definition/reserved.py) for the space check and the function's reports."""
    from search.store.results import reserved_names
    from trainable.function import tune_keys

    raw = toy_space(tmp_path)
    raw["experiment"]["metric"] = name
    assert "experiment.metric: must name a metric of the function, not " in problems(raw, tmp_path)
    assert f"got '{name}'" in problems(raw, tmp_path)
    space = parse_space(toy_space(tmp_path), source=str(tmp_path / "space.yaml"))
    report = Reporter("score", send=lambda *a: None, reserved=reserved_names(space) | tune_keys())
    with pytest.raises(ReservedName, match=f"a metric cannot be named {name}"):
        report({"score": 1.0, name: 1.0})


@pytest.mark.parametrize("name", ["world_size", "device", "hostname", "node", "started_at", "status", "trial_id",
                                  "epoch", "feasible", "queue_seconds", "result"])
def test_a_config_key_named_like_a_column_of_the_run_folder_is_refused(tmp_path, name):
    """Issue 50: a key `device` made the end of the search crash and results.parquet unreadable (two columns of
    one name). best.yaml's result keys (note, search, ...) stay free for config keys: they are under `result`."""
    raw = toy_space(tmp_path)
    raw["training"][name] = 1
    assert f"training.{name}: must not be " in problems(raw, tmp_path)
    raw = toy_space(tmp_path)
    raw["training"]["note"] = "a note"
    parse_space(raw, source=str(tmp_path / "space.yaml"))


@pytest.mark.parametrize("reproducible", [True, False])
def test_early_stopping_of_a_function_without_epochs_and_a_conditional_searched_epochs_builds(tmp_path, reproducible):
    # a function may leave training.epochs unsaid; its searched epochs (drawn only for one optimizer here) bound
    # the rungs, as the space check counts them: the scheduler and the searcher used to fail on None > int
    from search.execution.tuner import make_scheduler
    from search.searching.searcher import make_searcher

    raw = toy_space(tmp_path, scheduler="asha", reproducible=reproducible, sampler="tpe")
    raw["training"].pop("epochs")
    raw["space"].update(opt={"distribution": "choice", "values": ["a", "b"]},
                        epochs={"distribution": "int", "low": 2, "high": 8, "when": {"opt": "a"}})
    space = parse_space(raw, source=str(tmp_path / "space.yaml"))
    scheduler = make_scheduler(space)
    if reproducible:  # search/searching/halving.py: the rungs below the 8 epochs
        assert scheduler.rungs == [[1, 2, 4]]
    else:  # Ray's ASHA
        assert scheduler._max_t == 8
    assert make_searcher(space) is not None
