"""Nothing lost, nothing silent: a damaged run folder, a torn journal, two resumes at once, an edited
spec, other data on resume, links out of the run folder, a full disk. Each fault as a user meets it."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from search.cli import load_space
from search.driver import run_search
from search.outputs.finish import kept_rows
from search.execution.preflight import check_same_data, data_fingerprint
from search.store.results import RESULTS_FILE, results_schema, table, trial_rows
from search.store.run_folder import RunFolder, spec_hash
from search.definition.space import parse_space
from search.store.storage import Storage
from search.searching.study import JOURNAL_FILE, journal
from tests.helpers import assert_outputs_agree, small_space
from tests.searches.test_resume import reported, wait_for
from trainable.data import load_data
from trainable.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TINY = {"data": {"train_size": 1000, "val_size": 300}, "training": {"epochs": 1}}


def tiny_space(storage: Path, data_root: Path, **experiment):
    return small_space(storage, data_root, experiment={"num_samples": 3, "max_concurrent": 2, **experiment}, **TINY)


def rows_of(frame: pd.DataFrame) -> pd.DataFrame:
    columns = ["trial_number", "epoch", "seed", "lr", "val_acc", "status"]
    return frame.sort_values(["trial_number", "epoch"])[columns].reset_index(drop=True)


def resume(outcome) -> subprocess.CompletedProcess:
    """`--resume` in a new process, as after a kill: a new Ray, none of the old one's local copies."""
    storage, name = outcome.path.rsplit("/", 1)
    done = subprocess.run([sys.executable, "-m", "search", "--space", f"{outcome.path}/spec.yaml", "--storage-path",
                           storage, "--name", name, "--resume"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def finished(ray_local, tmp_path_factory, data_root):
    """3 trials of the MNIST loop, one at a time (one trial process): the tests damage the run folder, not
    trials at once."""
    storage = tmp_path_factory.mktemp("damage") / "runs"
    space = tiny_space(storage, data_root, max_concurrent=1)
    return space, run_search(space, name="damaged")


@pytest.mark.slow
def test_a_damaged_run_folder_keeps_every_row_and_says_what_it_could_not_recover(finished):
    space, first = finished
    run = Path(first.path)
    before = rows_of(first.results)
    best_before = (run / "best.yaml").read_text()
    others = first.results[first.results["trial_id"] != first.best["result"]["trial_id"]]
    gone, lost = sorted(others["trial_id"].unique())
    shutil.rmtree(run / f"trial_{gone}")  # Tune's record of one trial
    with open(run / JOURNAL_FILE, "ab") as f:  # a kill mid-append
        f.write(b'{"op_code": 6, "worker_id": "x", "trial_id"')

    resumed = resume(first)
    assert_frame = rows_of(pd.read_parquet(run / "results.parquet"))
    pd.testing.assert_frame_equal(assert_frame, before)  # nothing lost, statuses unchanged (not STOPPED)
    assert "its folder (Tune's record) is gone; its rows come from results.parquet" in resumed.stdout
    assert (run / "best.yaml").read_text() == best_before
    assert f"{JOURNAL_FILE} could not be used" in resumed.stdout and (run / f"{JOURNAL_FILE}.damaged").exists()
    study = optuna.load_study(study_name="damaged", storage=journal(str(run / JOURNAL_FILE)))
    assert len(study.trials) == 3 and study.best_value == assert_frame["val_acc"].max()
    assert_outputs_agree(run)

    # gone from both places: nothing to recover, and its status says so
    shutil.rmtree(run / f"trial_{lost}")
    (run / "results.parquet" / f"{lost}.parquet").unlink()
    again = resume(first)
    frame = pd.read_parquet(run / "results.parquet")
    assert list(frame.loc[frame["trial_id"] == lost, "status"]) == ["LOST"]
    assert "its folder and its results part are gone; nothing of it could be recovered (status LOST)" in again.stdout
    assert (run / "best.yaml").read_text() == best_before
    assert_outputs_agree(run)


@pytest.mark.slow
def test_a_part_whose_epochs_read_but_not_its_other_columns_leaves_the_record_as_it_is(tmp_path):
    """The end reads a part's epoch column first (outputs.kept_rows): a part damaged elsewhere is no lost trial."""
    space = parse_space({"space": {"lr": {"distribution": "uniform", "low": 0.1, "high": 0.2}}})
    schema = results_schema(space)
    folder = RunFolder(Storage.at(str(tmp_path)), "damaged-part")
    config = {"trial_number": 0, "seed": 7, "lr": 0.15, "epochs": 3}
    reports = [{"epoch": e, "val_acc": 0.1 * e, "val_loss": 1.0, "train_loss": 1.0} for e in (1, 2, 3)]
    buffer = io.BytesIO()
    pq.write_table(table(trial_rows("t", config, reports, done=True, error=False), schema), buffer)
    data = bytearray(buffer.getvalue())
    metadata = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    columns = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(columns.index("val_acc"))
    end = chunk.data_page_offset + chunk.total_compressed_size
    data[end - 8:end] = bytes(b ^ 0xFF for b in data[end - 8:end])  # the end of val_acc's compressed page
    folder.storage.write(f"{folder.name}/{RESULTS_FILE}/t.parquet", bytes(data))
    assert folder.parts.epochs("t") == {1, 2, 3} and folder.parts.read("t", schema) == [], "the damage tested here"
    record = trial_rows("t", config, reports[:1], done=False, error=False)
    notes = []
    assert kept_rows(folder, "t", record, schema, record_gone=False, notes=notes) == record and notes == []


def test_outputs_never_follow_a_link_out_of_the_run_folder(finished, tmp_path, capsys):
    # `python -m search report RUN`, in-process: its refusal needs no Ray
    from search.cli import main

    space, first = finished
    run = Path(first.path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(run / "report", ignore_errors=True)  # SMALL draws no report: a user may still link one
    (run / "report").symlink_to(elsewhere)
    try:
        capsys.readouterr()
        code = main(["report", str(run)])
        stderr = capsys.readouterr().err
        assert code == 2, stderr[-2000:]
        assert f"{run}/report is a symbolic link (to {elsewhere}); hpsearch writes nothing outside the run folder" \
            in stderr
        assert list(elsewhere.iterdir()) == []
        with pytest.raises(ConfigError, match="report is a symbolic link"):
            run_search(space, name="damaged", resume=True)
    finally:
        (run / "report").unlink()


def spec_folder(tmp_path: Path, data_root: Path) -> RunFolder:
    space = tiny_space(tmp_path / "runs", data_root)
    folder = RunFolder(Storage.at(str(tmp_path / "runs")), "held")
    folder.claim()
    folder.write_spec(space)
    return folder


def test_a_second_resume_of_a_run_being_searched_is_refused(tmp_path, data_root):
    folder = spec_folder(tmp_path, data_root)
    with folder.held("--name"):
        done = subprocess.run([sys.executable, "-m", "search", "--space", str(REPO / "spaces" / "mnist.yaml"),
                               "--storage-path", str(tmp_path / "runs"), "--name", "held", "--resume"],
                              capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"--resume: {folder.path} is being searched right now (pid {os.getpid()} on " in done.stderr
    assert "Traceback" not in done.stderr


def test_a_killed_holder_does_not_block_a_resume(tmp_path, data_root):
    folder = spec_folder(tmp_path, data_root)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom search.store.run_folder import RunFolder\nfrom search.store.storage import Storage\n"
        f"with RunFolder(Storage.at({str(tmp_path / 'runs')!r}), 'held').held('--name'):\n"
        "    print('held', flush=True)\n    time.sleep(600)\n")], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match="is being searched right now"):
            with folder.held("--resume"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    with folder.held("--resume"):  # the kernel released the dead holder's lock
        pass


def test_an_edited_spec_is_refused_and_a_reformatted_one_is_not(tmp_path, data_root):
    folder = spec_folder(tmp_path, data_root)
    spec = Path(folder.path) / "spec.yaml"
    text = spec.read_text()
    spec.write_text(text.replace("\n", "\n\n", 3) + "# a comment\n")  # the same spec, written otherwise
    folder.read_spec()
    raw = yaml.safe_load(text)
    raw["experiment"]["num_samples"] = 5
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as caught:
        folder.read_spec()
    assert caught.value.problems == [f"--resume: {folder.path}/spec.yaml was edited after the run started; a resume "
                                     "runs the search as it started (Tune's record holds its trials and their "
                                     "count), so undo the edit, or start a new run from a space file with the "
                                     "change, got 'held'"]


def test_a_resume_with_other_data_is_refused_naming_both_fingerprints(tmp_path, data_root):
    folder = spec_folder(tmp_path, data_root)
    then = load_data(tiny_space(tmp_path, data_root).trial_defaults(), data_root)
    other = parse_space({**yaml.safe_load((Path(folder.path) / "spec.yaml").read_text()),
                         "data": {"root": str(data_root), "train_size": 1000, "val_size": 300, "split_seed": 1}})
    now = load_data(other.trial_defaults(), data_root)
    assert check_same_data({"data": data_fingerprint(then)}, then, folder) == data_fingerprint(then)
    with pytest.raises(ConfigError) as caught:
        check_same_data({"data": data_fingerprint(then)}, now, folder)
    (line,) = caught.value.problems
    assert line.startswith("--resume: the data differ from those the run started with (train, val: ")
    assert str(data_fingerprint(then)) in line and str(data_fingerprint(now)) in line


# The toy training function (tests/helpers.py); the disk guard is the driver's, not the MNIST loop's. On the
# test's small disk its second epoch never ends (as a trial of the MNIST loop would go on training): only the
# stop ends it. The test fills the disk once Tune's record holds the first epoch, so the stop always finds a
# trial with a report and a checkpoint to resume from (when the first checkpoint filled the disk, a stop
# could come before the driver had taken that epoch's report: a CI run had no row at all).
FULL_DISK_TOY = """
import os
import shutil
import threading

import torch

DISK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "disk")


def train(config, report, checkpoint=None):
    start = checkpoint["epoch"] if checkpoint else 0
    x = checkpoint["x"] if checkpoint else torch.zeros(())
    for epoch in range(start, config["epochs"]):
        if epoch and shutil.disk_usage(DISK).total < 100 * 2**20:  # the 64 MB disk, before it is made larger
            threading.Event().wait()  # until the guard's stop ends the trial
        noise = torch.randn((), generator=torch.Generator().manual_seed(config["seed"] + epoch))
        x = x + config["lr"] * (1 - x) + 0.01 * noise
        report(score=float(x), val_acc=float(x), val_loss=float(1 - x), checkpoint={"x": x, "epoch": epoch + 1})
"""


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")
def test_a_full_disk_stops_the_search_as_ctrl_c_does_and_it_resumes_once_space_is_free(ray_local, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    # 64 MB, stopped below 40 MB free: 28 MB written beside the run folder crosses the line
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], check=True)
    try:
        raw = yaml.safe_load((REPO / "spaces" / "mnist.yaml").read_text())
        (tmp_path / "toy.py").write_text(FULL_DISK_TOY)
        raw["trainable"] = "toy.py:train"  # beside the space file
        del raw["model"], raw["data"]
        raw["experiment"].update(num_samples=4, max_concurrent=1, storage_path=str(disk), min_free_mb=40,
                                 max_failures=0)
        raw["training"] = {"epochs": 2}
        space_file = tmp_path / "space.yaml"
        space_file.write_text(yaml.safe_dump(raw))
        command = [sys.executable, "-m", "search", "--space", str(space_file), "--name", "full"]
        # Tune copies result.json into the run folder with its snapshots: every second here (by default 10 s)
        with (tmp_path / "out").open("w") as stdout, (tmp_path / "err").open("w") as stderr:
            stopped = subprocess.Popen(command, stdout=stdout, stderr=stderr, text=True, cwd=REPO,
                                       env={**os.environ, "TUNE_GLOBAL_CHECKPOINT_S": "1"})
        try:
            wait_for(lambda: True if reported(disk / "full") else None, 300, "the first epoch in Tune's record")
            (disk / "ballast").write_bytes(bytes(28 * 2**20))  # a user's other files fill the disk
            stopped.wait(timeout=300)
        finally:
            if stopped.poll() is None:
                stopped.kill()
        out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
        assert stopped.returncode == 130, err[-3000:]
        assert "the search stopped as Ctrl-C stops it" in err and "free space" in err
        assert 'search/driver.py", line' not in err  # trials may log their own ENOSPC; the driver not
        assert "1 trial(s) unfinished, 3 not started" in out
        assert_outputs_agree(disk / "full")
        subprocess.run(["mount", "-o", "remount,size=512m", str(disk)], check=True)  # space freed
        # the resume in this process (on the session's Ray), as the command's --resume runs it: the stop above
        # is the command's (its exit 130), the resume is what the run folder it left allows
        resumed = run_search(load_space(str(space_file), []), name="full", resume=True)
        assert resumed.succeeded and not resumed.interrupted, resumed.summary  # the command's exit 0
        frame = pd.read_parquet(disk / "full" / "results.parquet")
        assert frame["trial_id"].nunique() == 4 and set(frame["status"]) == {"COMPLETED"}
        assert_outputs_agree(disk / "full")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_spec_written_before_a_key_existed_still_resumes(tmp_path, data_root):
    # a release adds a key with a default (experiment.lag came so); the spec.yaml of a run started
    # before it lacks the key, and its hash was taken of what that release wrote
    folder = spec_folder(tmp_path, data_root)
    spec = Path(folder.path) / "spec.yaml"
    raw = yaml.safe_load(spec.read_text())
    lag = raw["experiment"].pop("lag")
    raw["run"]["spec_sha256"] = spec_hash({k: v for k, v in raw.items() if k != "run"})
    spec.write_text(yaml.safe_dump(raw, sort_keys=False))
    space, _ = folder.read_spec()
    assert space.experiment.lag == lag


def test_an_empty_results_part_folder_is_named_with_exit_2_by_every_command_that_reads_the_run(finished, tmp_path,
                                                                                                  data_root, capsys):
    """A crash before the first trial ended, or parts deleted, leaves results.parquet/ with no part; pandas
    reads it as a frame without columns. runs, report, compare, export, check and a warm start ended in a
    KeyError traceback; each now names the run and what is missing, and `runs` lists the other runs."""
    from search.cli import main
    from search.definition.space import to_raw

    space, first = finished
    storage = Path(first.path).parent
    empty = storage / "empty"
    shutil.copytree(first.path, empty, ignore=shutil.ignore_patterns("*.lock"))
    for part in (empty / RESULTS_FILE).iterdir():
        part.unlink()
    said = f"{empty}: {RESULTS_FILE} holds no results part: no trial of this run ended, or its parts were deleted"

    assert main(["runs", "--storage-path", str(storage)]) == 0
    listed = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in listed.splitlines()[2:] if not line.startswith("note")}
    assert rows["empty"][:4] == ["interrupted", "0/3", "no", "results"] and first.name in rows
    assert f"note: {said}" in listed
    for command in (["report", str(empty)], ["compare", first.path, str(empty)],
                    ["export", str(empty), "-o", str(tmp_path / "model.pt")]):
        assert main(command) == 2, command
        error = capsys.readouterr().err
        assert said in error and "--resume" in error, (command, error)
    warm = {**to_raw(space), "experiment": {**to_raw(space)["experiment"], "warm_start": str(empty)}}
    (tmp_path / "warm.yaml").write_text(yaml.safe_dump(warm))
    assert main(["check", "--space", str(tmp_path / "warm.yaml")]) == 2
    assert f"experiment.warm_start: must be an earlier run folder of hpsearch ({said}" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="experiment.warm_start: must be an earlier run folder") as refused:
        run_search(tiny_space(tmp_path / "runs", data_root, warm_start=str(empty)), name="warm")
    assert said in str(refused.value) and not (tmp_path / "runs" / "warm").exists()
