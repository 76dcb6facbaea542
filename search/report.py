"""report.html and its figures as PNGs: the standard plots of a search, from its run folder.

    python -m search report runs/<name>        (a search also writes it when it ends)

Figures: the optimization history, parallel coordinates and parameter importances (Optuna's
visualization module, matplotlib backend, on the study of results.parquet), every trial's
learning curve with the best one highlighted, a timeline of trials per slot (packing and
idle time) and where the slot time went. The HTML embeds the PNGs, so it opens offline.
"""

from __future__ import annotations

import base64
import html
import io
import warnings
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import optuna  # noqa: E402
import pandas as pd  # noqa: E402

from search.run_folder import RunFolder  # noqa: E402
from search.space import Space  # noqa: E402
from search.study import make_study  # noqa: E402
from search.summary import PHASES, journal_note, slot_time  # noqa: E402

REPORT_FILE = "report.html"
FIGURE_FOLDER = "report"


def _optuna_figure(plot: Callable, study: optuna.Study, **kwargs) -> plt.Figure:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        axes = plot(study, **kwargs)
    figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
    figure.set_size_inches(8, 4.5)
    figure.tight_layout()
    return figure


def learning_curves(frame: pd.DataFrame, metric: str, best_trial: str | None) -> plt.Figure:
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for trial_id, rows in frame.dropna(subset=["epoch"]).groupby("trial_id"):
        rows = rows.sort_values("epoch")
        label = f"#{int(rows['trial_number'].iloc[0])}" if not pd.isna(rows["trial_number"].iloc[0]) else trial_id
        if trial_id == best_trial:
            axes.plot(rows["epoch"], rows[metric], color="tab:red", linewidth=2.5, marker="o",
                      label=f"best: trial {label}", zorder=3)
        else:
            axes.plot(rows["epoch"], rows[metric], color="tab:gray", alpha=0.5, linewidth=1)
    axes.set(xlabel="epoch", ylabel=metric, title=f"Learning curves ({metric} per epoch, every trial)")
    axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes.legend(loc="best")
    figure.tight_layout()
    return figure


def trial_spans(frame: pd.DataFrame) -> pd.DataFrame:
    """Per trial: its slot (node + device), start (first epoch's start), end and training seconds."""
    rows = frame.dropna(subset=["finished_at"])
    started = rows["finished_at"] - rows["epoch_seconds"]
    if "started_at" in rows:  # the trial's start in its actor, set-up and data fetch included
        started = rows["started_at"].fillna(started)
    rows = rows.assign(started=started)
    return rows.groupby("trial_id").agg(
        number=("trial_number", "first"), node=("node", "first"), device=("device", "first"),
        gpus=("accelerator_ids", "first"), start=("started", "min"), end=("finished_at", "max"),
        training=("epoch_seconds", "sum")).sort_values("start")


def lanes(spans: pd.DataFrame) -> pd.Series:
    """A row per concurrently running trial on each slot group (greedy interval partitioning)."""
    lane_of, free_at = {}, {}
    for trial_id, span in spans.iterrows():
        group = (span["node"], span["device"], span["gpus"])
        ends = free_at.setdefault(group, [])
        lane = next((i for i, end in enumerate(ends) if end <= span["start"]), len(ends))
        if lane == len(ends):
            ends.append(span["end"])
        else:
            ends[lane] = span["end"]
        lane_of[trial_id] = f"{span['node'][:6]} {span['device']}{(' gpu ' + span['gpus']) if span['gpus'] else ''}" \
                            f" / slot {lane}"
    return pd.Series(lane_of)


def most_at_once(spans: pd.DataFrame) -> int:
    """The most trials that ran at the same time (ends before starts at a tie)."""
    events = sorted([(t, 1) for t in spans["start"]] + [(t, -1) for t in spans["end"]])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return max(most, 1)


def timeline(frame: pd.DataFrame) -> plt.Figure:
    spans = trial_spans(frame)
    figure, axes = plt.subplots(figsize=(8, 4.5))
    if spans.empty:
        axes.text(0.5, 0.5, "no trial reported an epoch", ha="center")
        return figure
    spans["lane"] = lanes(spans)
    origin = spans["start"].min()
    names = sorted(spans["lane"].unique())
    for trial_id, span in spans.iterrows():
        y = names.index(span["lane"])
        axes.barh(y, span["end"] - span["start"], left=span["start"] - origin, height=0.6,
                  color="tab:blue", alpha=0.75, edgecolor="black")
        axes.text(span["start"] - origin, y, f" #{int(span['number'])}" if not pd.isna(span["number"]) else "",
                  va="center", fontsize=7, color="white")
    axes.set_yticks(range(len(names)), names, fontsize=7)
    axes.set(xlabel="seconds since the first trial started", title="Trials per slot (gaps: idle slots)")
    figure.tight_layout()
    return figure


def time_breakdown(frame: pd.DataFrame, slots: int | None) -> plt.Figure:
    """Slot time by phase (summary.slot_time: the summary's rule), and what no phase explains.

    `slots`: the slots the search ran with (summary.slot_count); None where they are not known
    (`python -m search report`): then the most trials that ran at once.
    """
    spans = trial_spans(frame)
    figure, axes = plt.subplots(figsize=(8, 4.4))
    if spans.empty:
        return figure
    wall = spans["end"].max() - spans["start"].min()
    seen = slots is None
    if seen:
        slots = most_at_once(spans)
    in_slot = slot_time(frame)
    if in_slot:
        parts = {PHASES[p]: v for p, v in in_slot.items()}
    else:  # a run from before the phase columns
        in_trials = (spans["end"] - spans["start"]).sum() - spans["training"].sum()
        parts = {"training": spans["training"].sum(), "in trials, between epochs (checkpoint, report)": in_trials}
    parts["idle, or in no phase"] = max(0.0, wall * slots - sum(parts.values()))
    left = 0.0
    colors = matplotlib.colormaps["tab10"].colors
    for i, (label, seconds) in enumerate(parts.items()):
        axes.barh(0, seconds, left=left, color="lightgray" if label.startswith("idle") else colors[i % 10],
                  label=f"{label}: {seconds:.1f} s")
        left += seconds
    axes.set_yticks([])
    held = " (the most trials that ran at once)" if seen else ""
    axes.set(xlabel=f"slot-seconds ({slots} slot(s){held} x {wall:.1f} s from first start to last end)",
             title="Where the slot time went")
    axes.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5), ncol=2, fontsize=8, frameon=False)
    figure.tight_layout()
    return figure


def _message(text: str) -> plt.Figure:
    figure, axes = plt.subplots(figsize=(8, 1.5))
    axes.axis("off")
    axes.text(0.5, 0.5, text, ha="center", va="center")
    return figure


def figures(frame: pd.DataFrame, space: Space, best_trial: str | None,
            slots: int | None = None) -> dict[str, tuple[str, plt.Figure]]:
    """name -> (caption, figure); `slots` as in time_breakdown."""
    study = make_study(frame, space)
    metric = space.experiment.metric
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    out = {}
    optuna_plots = {
        "history": ("Optimization history: each trial's value and the best so far",
                    optuna.visualization.matplotlib.plot_optimization_history, 1),
        "parallel": ("Parallel coordinates of the searched parameters against the value",
                     optuna.visualization.matplotlib.plot_parallel_coordinate, 1),
        "importance": ("Parameter importances (fANOVA)", optuna.visualization.matplotlib.plot_param_importances, 2),
    }
    for name, (caption, plot, needs) in optuna_plots.items():
        if len(finished) < needs:
            out[name] = (caption, _message(f"needs {needs} finished trial(s) with a finite {metric}"))
        else:
            out[name] = (caption, _guarded(lambda: _optuna_figure(plot, study)))
    out["curves"] = ("Learning curves, the best trial highlighted",
                     _guarded(lambda: learning_curves(frame, metric, best_trial)))
    out["timeline"] = ("Timeline of trials per worker slot: packing and idle time", _guarded(lambda: timeline(frame)))
    out["time"] = ("Training against orchestration",
                   _guarded(lambda: time_breakdown(frame, slots)))
    return out


def _guarded(draw: Callable[[], plt.Figure]) -> plt.Figure:
    """One figure that cannot be drawn becomes a message, not a report (or a search) that fails."""
    try:
        return draw()
    except Exception as error:
        plt.close("all")
        return _message(f"this figure could not be drawn: {type(error).__name__}: {error}")


def png(figure: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def write_report(folder: RunFolder, space: Space, frame: pd.DataFrame, best_trial: str | None,
                 summary: str = "", slots: int | None = None) -> str:
    """Write report.html and report/<figure>.png into the run folder; return the HTML's path.

    `slots`: the trials that could run at once (summary.slot_count; the summary's Timing.slots).
    """
    blocks = []
    for name, (caption, figure) in figures(frame, space, best_trial, slots).items():
        data = png(figure)
        folder.storage.write(f"{folder.name}/{FIGURE_FOLDER}/{name}.png", data)
        blocks.append(f'<figure id="{name}"><img alt="{html.escape(caption)}" '
                      f'src="data:image/png;base64,{base64.b64encode(data).decode()}">'
                      f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hpsearch: {html.escape(folder.name)}</title>
<style>body{{font-family:sans-serif;max-width:900px;margin:2em auto}}img{{max-width:100%}}
figure{{margin:2em 0}}pre{{background:#f4f4f4;padding:1em;overflow-x:auto}}</style></head>
<body><h1>Search {html.escape(folder.name)}</h1>
<p>{len(frame['trial_id'].unique())} trials of {space.experiment.num_samples}; metric {space.experiment.metric}
({space.experiment.mode}); space {html.escape(space.source)}.</p>
<p id="study">{html.escape(journal_note(folder.path))}</p>
<pre>{html.escape(summary.strip())}</pre>
{''.join(blocks)}
<script>
// for a headless check (and nothing else): how many figures decoded and have a size
window.addEventListener("load", () => {{
  const shown = [...document.images].filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.figuresShown = shown;
}});
</script>
</body></html>
"""
    folder.storage.write(f"{folder.name}/{REPORT_FILE}", page.encode())
    return folder.storage.join(folder.name, REPORT_FILE)
