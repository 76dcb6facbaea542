"""`python -m search runs` and `compare`: each run's state read from its own folder."""

from __future__ import annotations

from search.store.results import results_schema
from search.store.run_folder import RunFolder
from search.outputs.runs import best_text, compare, list_runs, read_run
from search.store.storage import Storage
from tests.helpers import small_space


def make_run(storage, space, name: str, statuses: list[str]) -> RunFolder:
    """A run folder as a search leaves it: spec.yaml and one results part per trial (2 epochs each)."""
    folder = RunFolder(storage, name)
    folder.claim()
    folder.write_spec(space)
    for number, status in enumerate(statuses):
        rows = [{"trial_id": f"t{number}", "status": status, "trial_number": number, "epoch": epoch,
                 "val_acc": 0.5 + number / 100, "val_loss": 1 - number / 100, "finished_at": 1.8e9 + number, "lr": 0.1}
                for epoch in (1, 2)]
        folder.parts.write(space, f"t{number}", rows, results_schema(space))
    return folder


def test_runs_says_each_runs_state(tmp_path, data_root, capsys):
    storage = Storage.at(str(tmp_path))
    space = small_space(tmp_path, data_root)  # num_samples 4
    make_run(storage, space, "done", ["COMPLETED"] * 3 + ["STOPPED"])
    make_run(storage, space, "stopped", ["COMPLETED", "INTERRUPTED"])
    make_run(storage, space, "crashed", ["ERROR"] * 4)
    ended = make_run(storage, space, "budget", ["COMPLETED", "STOPPED"])
    storage.write("budget/ended.yaml", b"ended_by: time_budget\ntime_budget: 5.0\n")
    live = make_run(storage, space, "live", ["COMPLETED", "ERROR"])
    with live.held("--name"):
        states = {run.name: (run.state, run.done, run.total) for run in list_runs(storage)}
        running = read_run(live)
    assert states == {"done": ("finished", 4, 4), "stopped": ("interrupted", 1, 4), "crashed": ("failed", 4, 4),
                      "budget": ("ended by budget", 2, 4), "live": ("running", 2, 4)}
    # no best.yaml while it runs: the best epoch of its trials that ended, outside ERROR (trial 1's 0.51 is not)
    assert (running.best, best_text(running)) == (0.5, "val_acc 0.5000 (so far)")
    assert read_run(live).state == "interrupted"  # its process ended with one of four trials

    from search.cli import main

    assert main(["runs", "--storage-path", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "ended by budget" in printed and "budget" in printed and "2/4" in printed
    assert main(["runs", str(tmp_path)]) == 0  # the storage as a positional, as `ls` takes a folder
    assert capsys.readouterr().out == printed
    assert main(["runs", str(tmp_path), "--storage-path", str(tmp_path / "done")]) == 2
    assert f"--storage-path: names the storage once: the positional says {tmp_path}, got" in capsys.readouterr().err
    assert main(["compare", ended.path, str(tmp_path / "done")]) == 0
    assert "(none: the same search)" in capsys.readouterr().out


def test_runs_and_compare_refuse_what_is_not_a_run_folder_with_exit_2(tmp_path, data_root, capsys):
    from search.cli import main

    storage = Storage.at(str(tmp_path / "runs"))
    space = small_space(tmp_path / "runs", data_root)
    good, bad = make_run(storage, space, "good", ["COMPLETED"]), make_run(storage, space, "bad", ["COMPLETED"])
    for damaged in (b"garbage: [\n", b"experiment: 3\n", b"experiment: {num_samples: abc}\n", b"run: {}\nexperiment:\n"):
        storage.write("bad/spec.yaml", damaged)
        assert main(["compare", good.path, bad.path]) == 2, damaged
        assert f"RUN: {bad.path}/spec.yaml is missing or cannot be read: not a run folder" in capsys.readouterr().err
        assert main(["runs", "--storage-path", str(tmp_path / "runs")]) == 0, damaged  # the damaged one left out
        assert "good" in capsys.readouterr().out
    storage.write("good/best.yaml", b"result: 5\n")  # a damaged best.yaml: no best, no crash
    assert read_run(good).best is None
    (tmp_path / "a-file").write_text("")
    assert main(["runs", "--storage-path", str(tmp_path / "a-file")]) == 2
    assert "--storage-path: must be a folder of runs, and this is a file, got" in capsys.readouterr().err
    assert main(["runs", str(tmp_path / "a-file")]) == 2
    assert "STORAGE: must be a folder of runs, and this is a file, got" in capsys.readouterr().err
    assert main(["runs", "--storage-path", f"file://{tmp_path / 'a-file'}"]) == 2
    assert "--storage-path: must be a folder of runs (" in capsys.readouterr().err


def test_compare_shows_the_spec_differences(tmp_path, data_root):
    storage = Storage.at(str(tmp_path))
    a = make_run(storage, small_space(tmp_path, data_root), "a", ["COMPLETED"])
    b = make_run(storage, small_space(tmp_path, data_root, experiment={"seed": 8, "time_budget": "1h"}), "b",
                 ["COMPLETED"])
    text = compare(a, b)
    assert "experiment.seed" in text and "experiment.time_budget" in text and "'1h'" in text
    assert "training.epochs" not in text  # the same in both



def test_a_run_of_several_objectives_before_its_pareto_yaml_is_listed_and_compared(tmp_path, data_root, capsys):
    """Its metric is a list (a TypeError here before). With pareto.yaml: tests/searches/test_multi_objective.py."""
    storage = Storage.at(str(tmp_path))
    make_run(storage, small_space(tmp_path, data_root), "one", ["COMPLETED"])
    space = small_space(tmp_path, data_root, experiment={"metric": ["val_acc", "val_loss"], "mode": ["max", "min"]})
    several = make_run(storage, space, "two", ["COMPLETED", "INTERRUPTED"])
    assert (read_run(several).state, read_run(several).metric) == ("interrupted", "val_acc, val_loss")

    from search.cli import main

    assert main(["runs", "--storage-path", str(tmp_path)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["two"][1:4] == ["interrupted", "1/4", "-"] and "one" in rows
    assert main(["compare", str(tmp_path / "one"), several.path]) == 0
    assert "experiment.metric" in capsys.readouterr().out


def test_runs_lists_a_run_whose_results_part_folder_is_empty_and_compare_refuses_it(tmp_path, data_root, capsys):
    """A crash before the first trial ended, or parts deleted: pandas reads the empty folder as a frame
    without columns, and `runs` and `compare` ended in a KeyError (listing no run of the storage)."""
    from search.cli import main

    storage = Storage.at(str(tmp_path))
    space = small_space(tmp_path, data_root)
    make_run(storage, space, "good", ["COMPLETED"] * 4)
    empty = make_run(storage, space, "empty", ["COMPLETED", "COMPLETED"])
    for part in (tmp_path / "empty" / "results.parquet").iterdir():
        part.unlink()
    assert main(["runs", "--storage-path", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in printed.splitlines()[2:4]}
    assert rows["good"][1:3] == ["finished", "4/4"]
    assert rows["empty"][1:5] == ["interrupted", "0/4", "no", "results"]
    assert f"note: {empty.path}: results.parquet holds no results part" in printed
    assert read_run(empty).missing is not None and read_run(RunFolder(storage, "good")).missing is None

    for pair in (["good", "empty"], ["empty", "good"]):
        assert main(["compare", *(str(tmp_path / name) for name in pair)]) == 2
        error = capsys.readouterr().err
        assert f"{tmp_path / 'empty'}: results.parquet holds no results part" in error and "--resume" in error
    (tmp_path / "empty" / "results.parquet" / "t0.parquet").write_bytes(b"not parquet")  # a part that does not read
    assert main(["runs", "--storage-path", str(tmp_path)]) == 0
    assert f"note: {empty.path}: results.parquet cannot be read (" in capsys.readouterr().out


def test_runs_says_target_reached_for_a_run_its_stop_when_ended(tmp_path, data_root, capsys):
    from search.cli import main

    storage = Storage.at(str(tmp_path))
    space = small_space(tmp_path, data_root, experiment={"stop_when": {"val_acc": 0.5}})
    target = make_run(storage, space, "target", ["COMPLETED", "STOPPED"])
    # as search/searching/budget.py writes it when a target holds
    storage.write("target/ended.yaml", b"ended_by: stop_when\nmetric: val_acc\nop: '>='\ntarget: 0.5\n"
                                       b"trial_number: 0\nvalue: 0.5\nepoch: 1\n")
    budget = make_run(storage, space, "budget", ["COMPLETED", "STOPPED"])
    storage.write("budget/ended.yaml", b"ended_by: time_budget\ntime_budget: 5.0\n")
    assert (read_run(target).state, read_run(budget).state) == ("target reached", "ended by budget")
    assert main(["runs", "--storage-path", str(tmp_path)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert "target reached" in rows["target"] and "ended by budget" in rows["budget"]


def test_compare_shows_every_test_metric_best_yaml_holds_and_no_test_acc_a_run_has_none_of(tmp_path, data_root):
    storage = Storage.at(str(tmp_path))
    space = small_space(tmp_path, data_root)
    regression, function = make_run(storage, space, "regression", ["COMPLETED"]), make_run(storage, space, "own",
                                                                                            ["COMPLETED"])
    # best.yaml's result as search/outputs/finish.py writes it: a regression's test_acc is null, and a
    # function trainable's run has no test metrics of hpsearch's (its own test_ metric is among its metrics)
    storage.write("regression/best.yaml", b"lr: 0.1\nresult: {trial_number: 0, trial_id: t0, epoch: 2, metric: val_acc,"
                                          b" val_acc: 0.5, test_acc: null, test_loss: 0.25, test_r2_score: 0.61}\n")
    storage.write("own/best.yaml", b"lr: 0.1\nresult: {trial_number: 0, trial_id: t0, epoch: 2, metric: val_acc,"
                                   b" val_acc: 0.5, test_mae: 0.3}\n")
    rows = {line.split()[0]: line.split()[1:] for line in compare(regression, function).splitlines()
            if line.startswith("result.")}
    assert rows["result.test_r2_score"] == ["0.61", "-"] and rows["result.test_loss"] == ["0.25", "-"]
    assert rows["result.test_mae"] == ["-", "0.3"]
    assert "result.test_acc" not in rows
    shown = {line.split()[0] for line in compare(function, function).splitlines() if line.strip()}
    assert "result.test_acc" not in shown and "result.test_loss" not in shown
