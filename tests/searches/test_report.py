"""See the search: report.html (opened in headless Chromium), PNGs, the Optuna journal, trackers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pytest

from search.driver import run_search
from search.searching.study import JOURNAL_FILE, journal
from tests.helpers import small_space

pytestmark = pytest.mark.slow
FIGURES = ("history", "parallel", "importance", "curves", "timeline", "time")


@pytest.fixture(scope="module")
def searched(ray_local, tmp_path_factory, data_root):
    space = small_space(tmp_path_factory.mktemp("runs"), data_root,
                        experiment={"num_samples": 4, "max_concurrent": 2, "loggers": ["tensorboard", "mlflow"],
                                    "report": True})
    return space, run_search(space, name="seen")


def test_a_search_writes_report_html_and_a_png_per_figure(searched):
    _, outcome = searched
    run = Path(outcome.path)
    page = (run / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(FIGURES), "every figure inside the page"
    assert "http://" not in page and "https://" not in page, "nothing to fetch: it opens offline"
    for name in FIGURES:
        image = plt_image(run / "report" / f"{name}.png")
        assert image.shape[0] > 100 and image.std() > 0.01, f"{name}.png holds a picture"
    assert f"Report: {run}/report.html" in outcome.summary


def plt_image(path: Path) -> np.ndarray:
    import matplotlib.image

    return matplotlib.image.imread(path)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: `make test` installs Debian's package with apt-get (as root)")
    return found


def test_report_html_renders_in_headless_chromium(searched, tmp_path):
    _, outcome = searched
    page = Path(outcome.path) / "report.html"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([chromium(), *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f'data-figures-shown="{len(FIGURES)}"' in dom.stdout, "every figure decoded, with a size"
    assert max(map(len, outcome.summary.splitlines())) > 120, "a summary wider than the page, to wrap"
    assert 'data-summary-fits="true"' in dom.stdout, "the summary wraps: no scrolling sideways to read it"
    console_errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and "rror" in line]
    assert not console_errors, console_errors
    shot = tmp_path / "report.png"
    done = subprocess.run([chromium(), *flags, f"--screenshot={shot}", "--window-size=1000,1800", page.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    pixels = plt_image(shot)[..., :3]
    assert pixels.std() > 0.05, "the screenshot is not blank"
    assert (pixels.reshape(-1, 3).std(axis=1) > 0.1).mean() > 0.01, "and it has colour: the plots"


def test_the_optuna_journal_holds_every_trial_with_values_as_in_results(searched):
    space, outcome = searched
    study = optuna.load_study(study_name=outcome.name, storage=journal(str(Path(outcome.path) / JOURNAL_FILE)))
    assert len(study.trials) == space.experiment.num_samples
    best_epoch = outcome.results.groupby("trial_id")["val_acc"].max()
    for trial in study.trials:
        assert trial.value == best_epoch[trial.user_attrs["trial_id"]], "the value: the trial's best epoch"
        rows = outcome.results[outcome.results["trial_id"] == trial.user_attrs["trial_id"]]
        assert trial.intermediate_values == dict(zip(rows["epoch"], rows["val_acc"]))
        assert trial.user_attrs["seed"] == rows["seed"].iloc[0]
    assert study.best_value == outcome.best["result"]["val_acc"], "and it agrees with best.yaml"


def test_tensorboard_finds_event_files_for_every_trial(searched):
    """Every trial's event file holds each epoch's metrics at that epoch's step, as results.parquet has them,
    one event per report (search/execution/tuner.py's EventFiles), and no bookkeeping."""
    _, outcome = searched
    trials = sorted(Path(outcome.path).glob("trial_*"))
    assert len(trials) == 4
    for trial in trials:
        [events] = trial.glob("events.out.tfevents.*")
        scalars = [e for e in read_events(events) if e.summary.value and e.summary.value[0].HasField("simple_value")]
        rows = outcome.results[outcome.results["trial_id"] == trial.name.removeprefix("trial_")]
        assert [e.step for e in scalars] == list(rows["epoch"]), "one event per report, at its step"
        for event, (_, row) in zip(scalars, rows.iterrows()):
            values = {v.tag: v.simple_value for v in event.summary.value}
            for metric in ("val_acc", "val_loss", "train_loss", "epoch_seconds"):
                assert values[f"ray/tune/{metric}"] == pytest.approx(row[metric], rel=1e-6), (metric, event.step)
            assert not any("placement" in tag or "metric_names" in tag for tag in values), values


def test_one_event_per_report_holds_what_tensorboardx_writes_value_by_value(tmp_path):
    """EventFiles' writer (search/execution/tuner.py OneEventPerReport) against tensorboardX's own add_scalar: the
    same tags (cleaned as tensorboardX cleans them), values and steps, in one event per flush."""
    import numpy as np
    from tensorboardX import SummaryWriter

    from search.execution.tuner import OneEventPerReport

    reports = [{"ray/tune/val_acc": np.float32(0.25), "ray/tune/acc@1": 1, "ray/tune/done": False},
               {"ray/tune/val_acc": 0.5, "ray/tune/acc@1": np.int64(2), "ray/tune/done": True}]
    written = {}
    for name, wrap in (("tensorboardx", lambda w: w), ("ours", OneEventPerReport)):
        writer = wrap(SummaryWriter(logdir=str(tmp_path / name)))
        for step, report in enumerate(reports, 1):
            for tag, value in report.items():
                writer.add_scalar(tag, value, global_step=step)
            writer.flush()
        writer.close()
        [events] = (tmp_path / name).glob("events.out.tfevents.*")
        written[name] = [e for e in read_events(events) if e.summary.value]
    assert len(written["ours"]) == len(reports) and len(written["tensorboardx"]) == 3 * len(reports)
    values = {name: [(e.step, v.tag, v.simple_value) for e in events for v in e.summary.value]
              for name, events in written.items()}
    assert values["ours"] == values["tensorboardx"]
    assert ("ray/tune/acc_1" in {tag for _, tag, _ in values["ours"]})


def test_a_trials_event_file_is_synced_at_most_once_a_second_and_holds_every_report_when_it_ends(tmp_path):
    """tensorboardX's flush fsyncs the file: Tune's logger flushed after every report (~3 ms of the controller's
    turn each). OneEventPerReport flushes at most every FLUSH_EVERY_S; close writes the rest."""
    from tensorboardX import SummaryWriter

    from search.execution.tuner import OneEventPerReport

    class Counting(SummaryWriter):
        flushes = 0

        def flush(self):
            Counting.flushes += 1
            super().flush()

    writer = OneEventPerReport(Counting(logdir=str(tmp_path)))
    for step in range(1, 21):  # 20 reports within a second
        writer.add_scalar("ray/tune/val_acc", step / 20, global_step=step)
        writer.flush()
    assert Counting.flushes == 1, "the first report's flush; the next 19 within its second wait"
    writer.close()
    [events] = tmp_path.glob("events.out.tfevents.*")
    assert [e.step for e in read_events(events) if e.summary.value] == list(range(1, 21)), "every report, in order"


def test_a_trials_event_file_is_closed_off_the_controllers_thread_and_whole_once_the_writes_are_waited_for(tmp_path):
    """A close (a flush and an os.fsync) took 1.1-3 ms of the controller's turn between two short trials: EventFiles
    runs it on a thread of its own (its WriterThread), and Tune's snapshot waits for it (EventFiles.get_state)."""
    import threading

    from tensorboardX import SummaryWriter

    from search.execution.tuner import OneEventPerReport, event_files_thread

    release, closed_on = threading.Event(), []

    class Slow(SummaryWriter):
        def close(self):
            # a slow disk, held until the test lets it go (a close on the caller's thread: 60 s, then a failure)
            release.wait(timeout=60)
            closed_on.append(threading.current_thread().name)
            super().close()

    disk = event_files_thread()
    writer = OneEventPerReport(Slow(logdir=str(tmp_path)), later=disk.submit)
    for step in (1, 2):
        writer.add_scalar("ray/tune/val_acc", step / 2, global_step=step)
        writer.flush()
    writer.close()  # returns while the close waits
    assert closed_on == []
    release.set()
    disk.wait()
    assert closed_on and closed_on[0].startswith("hpsearch-event-files"), closed_on
    [events] = tmp_path.glob("events.out.tfevents.*")
    assert [e.step for e in read_events(events) if e.summary.value] == [1, 2]


def test_event_files_pickled_by_the_release_before_background_writes_resume_with_them():
    """A resumed Tuner unpickles the callbacks of the run's start: EventFiles of 8444678 had no writer thread, and a
    resume of such a run failed at its first trial's start (AttributeError), as issue 49 item 8's Progress did."""
    import pickle

    from search.execution.tuner import EventFiles
    from search.execution.writer_thread import WriterThread

    before = EventFiles()
    del before.__dict__["_disk"]  # what that release pickled
    resumed = pickle.loads(pickle.dumps(before))
    assert isinstance(resumed._disk, WriterThread)
    assert resumed.get_state() is None  # Tune's snapshot waits for the writes, none here


def read_events(path: Path) -> list:
    """The events of a TensorBoard event file: TFRecords (length, its CRC, an Event, the Event's CRC)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    data, events, at = path.read_bytes(), [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        event = Event()
        event.ParseFromString(data[at + 12:at + 12 + length])
        events.append(event)
        at += 12 + length + 4
    return events


def test_mlflow_records_one_run_per_trial(searched):
    mlflow = pytest.importorskip("mlflow", reason="the test extra installs mlflow-skinny")
    _, outcome = searched
    client = mlflow.tracking.MlflowClient(tracking_uri=f"sqlite:///{outcome.path}/mlflow.db")
    [experiment] = [e for e in client.search_experiments() if e.name == outcome.name]
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 4
    assert all("val_acc" in run.data.metrics for run in runs)
    # the runs table shows each trial's value (its best epoch), as results.parquet scores it
    best = outcome.results.groupby("trial_id")["val_acc"].max()
    shown = {run.data.tags["trial_name"].rsplit("_", 1)[-1]: run.data.metrics["val_acc"] for run in runs}
    assert shown == pytest.approx({trial_id: best[trial_id] for trial_id in shown})


def test_the_report_command_writes_it_again_and_keeps_the_searchs_summary(searched, tmp_path):
    from search.store.run_folder import open_run
    from search.outputs.report import kept_summary

    _, outcome = searched
    run = Path(outcome.path)
    folder = open_run(str(run))
    said = kept_summary(folder)
    assert said and "Best: trial #" in said and "Top trials" in said

    def redraw() -> str:
        done = subprocess.run([os.sys.executable, "-m", "search", "report", str(run)], capture_output=True,
                              text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == f"{run}/report.html"
        return kept_summary(folder)

    shutil.copy(run / "report.html", tmp_path / "report.html")
    try:
        assert redraw() == said, "a redraw keeps what the search said"
        (run / "report.html").unlink()  # a stopped search leaves none: the redraw says what the folder holds
        best = outcome.best["result"]
        assert redraw() == (f"Redrawn by python -m search report from the run folder: 4 of experiment.num_samples 4 "
                            f"trials (4 completed)\nBest (best.yaml): trial #{best['trial_number']} "
                            f"({best['trial_id']}) epoch {best['epoch']}: val_acc {best['val_acc']:.4f}\n"
                            # which sampler ran and why, read back from spec.yaml (search/searching/choice.py)
                            "Sampler: sampler auto: tpe (1 choice among 4 searched keys, 4 trials)")
    finally:
        shutil.copy(tmp_path / "report.html", run / "report.html")


def test_the_report_command_on_a_damaged_folder_draws_without_a_best_or_names_the_spec(searched, tmp_path, capsys):
    import shutil

    from search.cli import main

    _, outcome = searched
    run = tmp_path / "copy"
    shutil.copytree(outcome.path, run, ignore=shutil.ignore_patterns("*.lock", "report*"))
    (run / "best.yaml").write_text("\n")  # emptied: the report is drawn, with no best trial marked
    assert main(["report", str(run)]) == 0 and (run / "report.html").exists()
    (run / "spec.yaml").write_text("garbage: [\n")
    assert main(["report", str(run)]) == 2
    error = capsys.readouterr().err
    assert f"RUN: {run}/spec.yaml cannot be read (" in error and "--resume" not in error and "new run" not in error


def legend(figure) -> dict[str, float]:
    """The figure's legend as label -> seconds ("label: 12.3 s")."""
    texts = [t.get_text().rsplit(": ", 1) for t in figure.legends[0].get_texts()]
    return {label: float(seconds.removesuffix(" s")) for label, seconds in texts}


def test_the_summary_and_the_report_count_slot_time_by_one_rule(searched):
    from search.outputs import report
    from search.outputs import summary

    _, outcome = searched
    # a long wait in the queue: the trial held no slot then, so neither view may call it slot time
    results = outcome.results
    frame = results.assign(queue_seconds=results["queue_seconds"].mask(results["epoch"] == 1, 1000.0))
    in_slot = summary.slot_time(frame)
    assert "queue_seconds" not in in_slot and "suggest_seconds" not in in_slot
    figure = report.time_breakdown(frame, outcome.timing.slots)
    parts = legend(figure)
    assert f"{outcome.timing.slots} slot(s) x" in figure.axes[0].get_xlabel()
    report.plt.close(figure)
    phases = {label: seconds for label, seconds in parts.items() if not label.startswith("idle")}
    assert phases == pytest.approx({summary.PHASES[p]: v for p, v in in_slot.items()}, abs=0.05)

    lines = summary.time_breakdown(frame).splitlines()
    shown = lines[0].removeprefix("Slot time (mean per trial): ").split(", ")
    assert [part.split()[0] + "_seconds" for part in shown] == list(in_slot), "the same phases as the figure"
    outside = {label: s for label, s in phases.items() if label not in ("training", "validation")}
    biggest = next(line for line in lines if "biggest outside training" in line)
    named = biggest.split(": ", 1)[1].rsplit(" (", 1)[0]
    # the figure's biggest non-training part, to its legend's 0.1 s (two phases may round alike: either is it)
    assert outside[named] == max(outside.values()), "the figure's biggest non-training part"
    assert "not in a slot (mean per trial): " in lines[-1] and "queue 1e+03 s" in lines[-1]


def test_the_time_figure_holds_its_slot_time_in_its_window(searched):
    import re

    from search.outputs import report

    _, outcome = searched
    figure = report.time_breakdown(outcome.results, outcome.timing.slots)
    slots, wall = re.search(r"\((\d+) slot\(s\) x ([\d.]+) s\b", figure.axes[0].get_xlabel()).groups()
    parts = legend(figure)
    report.plt.close(figure)
    # the first actors' start comes before their trials start: it is slot time in the window too
    rounding = 0.05 * (len(parts) + int(slots))  # each figure shows one decimal
    assert sum(parts.values()) == pytest.approx(int(slots) * float(wall), abs=rounding), parts


def test_the_report_counts_the_slots_the_search_had_not_max_concurrent(searched):
    from search.outputs import report
    from search.outputs import summary

    space, outcome = searched
    assert summary.slot_count(max_concurrent=4, capacity=2) == 2, "what the cluster holds"
    assert summary.slot_count(max_concurrent=4, capacity=0) == 4, "an autoscaler will add nodes"
    assert space.experiment.max_concurrent == 2
    [(_, figure)] = [v for k, v in report.figures(outcome.results, space, None, slots=1).items() if k == "time"]
    assert "(1 slot(s) x" in figure.axes[0].get_xlabel()
    # `python -m search report` does not know them: the most trials that ran at once, said so
    # (how many overlapped depends on when the actors came up: on a loaded machine one may run them all)
    at_once = report.most_at_once(report.trial_spans(outcome.results))
    assert 1 <= at_once <= space.experiment.max_concurrent
    figure = report.time_breakdown(outcome.results, None)
    assert f"({at_once} slot(s) (the most trials that ran at once) x" in figure.axes[0].get_xlabel()
    report.plt.close("all")


def test_the_report_says_where_the_study_is(searched):
    _, outcome = searched
    page = (Path(outcome.path) / "report.html").read_text()
    assert f"Study: {outcome.path}/{JOURNAL_FILE} (optuna-dashboard {outcome.path}/{JOURNAL_FILE})" in page


def clipped_texts(figure) -> list[str]:
    """Every drawn text (titles, axis and tick labels, legend texts and swatches, notes) that
    does not lie wholly inside the figure, as 'text: its box in pixels'."""
    import matplotlib.text

    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    hidden = set()  # tick labels of ticks outside the view: matplotlib places but does not draw them
    for axes in figure.axes:
        for axis, (low, high) in ((axes.xaxis, axes.get_xlim()), (axes.yaxis, axes.get_ylim())):
            low, high = sorted((low, high))
            slack = (high - low) * 1e-9
            for locs, labels in ((axis.get_majorticklocs(), axis.get_majorticklabels()),
                                 (axis.get_minorticklocs(), axis.get_minorticklabels())):
                hidden |= {id(label) for loc, label in zip(locs, labels) if not low - slack <= loc <= high + slack}
    drawn = [(repr(t.get_text()), t) for t in figure.findobj(matplotlib.text.Text)
             if t.get_visible() and t.get_text().strip() and id(t) not in hidden]
    for legend in [*figure.legends, *filter(None, (axes.get_legend() for axes in figure.axes))]:
        drawn += [(f"legend swatch {i}", handle) for i, handle in enumerate(legend.legend_handles)]
        drawn.append(("the legend's box", legend))
    inside = figure.bbox.padded(1)  # a pixel of rounding
    clipped = []
    for name, artist in drawn:
        box = artist.get_window_extent(renderer)
        if not (inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1):
            clipped.append(f"{name}: {box.bounds}")
    return clipped


def test_no_text_of_any_report_figure_is_clipped_and_drawing_them_warns_nothing(searched):
    import warnings

    from search.outputs import report

    space, outcome = searched
    results = outcome.results
    one_trial = results[results["trial_id"] == results["trial_id"].iloc[0]]
    best_trial = outcome.best["result"]["trial_id"]
    cases = {"the search": (results, best_trial, outcome.timing.slots),
             "`python -m search report` (slots not known)": (results, best_trial, None),
             "no best trial": (results, None, outcome.timing.slots), "one trial": (one_trial, None, 1)}
    problems = []
    for case, (frame, best, slots) in cases.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            drawn = report.figures(frame, space, best, slots)
        problems += [f"{case}: warns {w.category.__name__}: {w.message}" for w in caught]
        assert set(drawn) == set(FIGURES)
        problems += [f"{case}: {name}.png cuts {text}" for name, (_, figure) in drawn.items()
                     for text in clipped_texts(figure)]
        report.plt.close("all")
    assert problems == []


def test_every_figure_names_the_metric_on_its_axes(searched):
    from search.outputs import report

    space, outcome = searched
    drawn = report.figures(outcome.results, space, outcome.best["result"]["trial_id"], outcome.timing.slots)
    labels = {name: [label for axes in figure.axes for label in (axes.get_xlabel(), axes.get_ylabel())]
              for name, (_, figure) in drawn.items()}
    report.plt.close("all")
    assert not [name for name, shown in labels.items() if "Objective Value" in shown], "Optuna's default name"
    for name in ("history", "parallel", "curves"):
        assert space.experiment.metric in labels[name], f"{name}.png names {space.experiment.metric}"


def test_several_objectives_the_report_lists_the_front_at_pareto_yamls_epoch_with_each_trials_status(tmp_path):
    """Each trial stands at its point (its last epoch with every objective finite), as in pareto.yaml, not at
    its best epoch of the first objective; and a front trial's status is in report.html beside its values.
    Results parts as a search writes them (no search needed: the report reads the run folder)."""
    import re

    import pandas as pd
    import yaml

    from search.definition.objectives import objectives_of
    from search.definition.space import parse_space
    from search.outputs.pareto import write_pareto
    from search.outputs.report import write_report
    from search.store.results import results_schema
    from search.store.run_folder import RunFolder
    from search.store.storage import Storage

    (tmp_path / "own.py").write_text("def train(config, report, checkpoint=None):\n    report(acc=0.0, cost=0.0)\n")
    space = parse_space({"trainable": str(tmp_path / "own.py") + ":train",
                         "experiment": {"name": "two", "metric": ["acc", "cost"], "mode": ["max", "min"],
                                        "num_samples": 2, "storage_path": str(tmp_path)},
                         "training": {"epochs": 3},
                         "space": {"lr": {"distribution": "float", "low": 0.1, "high": 1.0}}}, source="tests")
    folder = RunFolder(Storage.at(str(tmp_path)), "two")
    folder.claim()
    folder.write_spec(space)
    # trial #0: acc best at epoch 2 (0.9), its point is epoch 3 (0.5, 0.2); ASHA stopped it. #1 is dominated.
    curves = {0: ("STOPPED", [0.3, 0.9, 0.5], [0.5, 0.5, 0.2]), 1: ("COMPLETED", [0.4, 0.4, 0.4], [0.9, 0.9, 0.9])}
    for number, (status, accs, costs) in curves.items():
        rows = [{"trial_id": f"t{number}", "status": status, "trainable": space.trainable, "epochs": 3, "lr": 0.5,
                 "seed": number, "trial_number": number, "num_threads": 1, "epoch": epoch, "acc": acc, "cost": cost,
                 "finished_at": 1.8e9 + epoch, "epoch_seconds": 1.0}
                for epoch, (acc, cost) in enumerate(zip(accs, costs), start=1)]
        folder.parts.write(space, f"t{number}", rows, results_schema(space))
    frame = pd.read_parquet(tmp_path / "two" / "results.parquet")
    write_pareto(folder, space, frame, objectives_of(space.experiment))
    page = Path(write_report(folder, space, frame, None, "summary")).read_text()

    table = re.search(r'<table id="front">(.*?)</table>', page, re.S)
    assert table, "no table of the front in report.html"
    cells = [re.findall(r"<t[dh]>(.*?)</t[dh]>", row) for row in re.findall(r"<tr>(.*?)</tr>", table.group(1))]
    assert cells == [["trial", "trial_id", "status", "epoch", "acc", "cost"],
                     ["#0", "t0", "STOPPED", "3", "0.5", "0.2"]]
    front = yaml.safe_load((tmp_path / "two" / "pareto.yaml").read_text())["trials"]
    assert [(e["trial_number"], e["epoch"], e["status"]) for e in front] == [(0, 3, "STOPPED")]


def test_the_learning_curves_show_a_trial_stopped_after_one_epoch():
    """Issue 49 item 12: a one-epoch curve is a line of one point, which draws nothing (7 of 20 trials of an
    ASHA search were missing from the figure); each curve's end is a dot."""
    import pandas as pd

    from search.outputs.report import learning_curves

    frame = pd.DataFrame({"trial_id": ["a", "a", "a", "b", "c", "c"], "trial_number": [0, 0, 0, 1, 2, 2],
                          "epoch": [1, 2, 3, 1, 1, 2], "val_acc": [0.5, 0.6, 0.7, 0.3, 0.4, 0.45]})
    figure = learning_curves(frame, "val_acc", best_trial="a")
    dots = [tuple(p) for c in figure.axes[0].collections for p in getattr(c, "get_offsets", lambda: [])()]
    assert (1.0, 0.3) in dots and (2.0, 0.45) in dots, dots
