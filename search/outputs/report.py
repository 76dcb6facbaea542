"""report.html and its figures as PNGs: the standard plots of a search, from its run folder.

    python -m search report runs/<name>        (a search also writes it when it ends)

Figures: the optimization history, parallel coordinates and parameter importances (Optuna's
visualization module, matplotlib backend, on the study of results.parquet), every trial's
learning curve with the best one highlighted, a timeline of trials per slot (packing and
idle time) and where the slot time went. The HTML embeds the PNGs, so it opens offline.

Several objectives: every trial stands at its point, the epoch pareto.yaml uses (search/definition/objectives.py
`point_epoch`: its last epoch whose objectives are all finite), in the figures and in a table of the
front, which says each front trial's status and epoch beside its objectives.
"""

from __future__ import annotations

import base64
import html
import io
import re
import warnings
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only; no display on a server or in CI
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import optuna  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402

from search.definition.objectives import Objectives, objectives_of, pareto_front  # noqa: E402
from search.definition.space import Space  # noqa: E402
from search.outputs.summary import PHASES, journal_note, slot_time, status_counts  # noqa: E402
from search.searching.study import make_study  # noqa: E402
from search.store.run_folder import RunFolder  # noqa: E402

HANDOVER = 0.05  # seconds; see most_at_once
LABELLED_TRIALS = 200  #: the timeline numbers its trials up to this many
REPORT_FILE = "report.html"
FIGURE_FOLDER = "report"


def _optuna_figure(plot: Callable, study: optuna.Study, **kwargs) -> plt.Figure:
    # Optuna's plots switch matplotlib to its ggplot style for good (plt.style.use): keep that
    # to its own figures, not ours and not a caller's
    with warnings.catch_warnings(), matplotlib.rc_context():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # several objectives: figures() gives the importances a target to minimise, as this warns it must be
        warnings.filterwarnings("ignore", message="PedAnovaImportanceEvaluator computes")
        # PED-ANOVA on a few trials, or on a when: key drawn by a few: it still ranks the key
        warnings.filterwarnings("ignore", message="Some regimes for parameter")
        axes = plot(study, **kwargs)
    figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
    figure.set_size_inches(8, 4.5)
    figure.tight_layout()
    return figure


def learning_curves(frame: pd.DataFrame, metric: str, best_trial: str | None) -> plt.Figure:
    figure, axes = plt.subplots(figsize=(8, 4.5))
    rows = frame.dropna(subset=["epoch"]).sort_values(["trial_id", "epoch"], kind="stable")
    ids = rows["trial_id"].to_numpy()
    epochs, values = rows["epoch"].to_numpy(float), rows[metric].to_numpy(float)
    values = np.where(np.isfinite(values), values, np.nan)  # a diverged epoch's inf breaks its curve, as a gap
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if len(ids) else np.array([], int)
    # every other trial's curve in one artist: one Line2D per trial took 2.5 s to build and as long to
    # draw at 3,000 trials (10,000 trials: a third of the report's time)
    others = [np.column_stack([epochs[a:b], values[a:b]]) for a, b in zip(starts, [*starts[1:], len(ids)])
              if ids[a] != best_trial]
    axes.add_collection(LineCollection(others, colors="tab:gray", alpha=0.5, linewidths=1))
    # where each curve ends, a dot: a trial a scheduler stopped after one epoch has no line to draw
    ends = np.array([curve[-1] for curve in others]).reshape(-1, 2)
    axes.scatter(ends[:, 0], ends[:, 1], s=10, color="tab:gray", alpha=0.6, zorder=2)
    axes.autoscale_view()
    best = rows[rows["trial_id"] == best_trial]
    if len(best):
        number = best["trial_number"].iloc[0]
        label = f"#{int(number)}" if not pd.isna(number) else best_trial
        axes.plot(best["epoch"], best[metric], color="tab:red", linewidth=2.5, marker="o",
                  label=f"best: trial {label}", zorder=3)
    axes.set(xlabel="epoch", ylabel=metric, title=f"Learning curves ({metric} per epoch, every trial)")
    axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    if len(best):  # else nothing is labelled: no legend to draw
        axes.legend(loc="best")
    figure.tight_layout()
    return figure


def trial_spans(frame: pd.DataFrame) -> pd.DataFrame:
    """Per trial: its slot (node + device), start (first epoch's start), end and training seconds,
    and when its slot was taken (before the start: an idle actor's wait, a new actor's start)."""
    rows = frame.dropna(subset=["finished_at"])
    started = rows["finished_at"] - rows["epoch_seconds"]
    if "started_at" in rows:  # the trial's start in its actor, set-up and data fetch included
        started = rows["started_at"].fillna(started)
    taken = started
    if {"start_seconds", "idle_seconds"} <= set(rows):  # first rows only; a run from before them has none
        taken = started - rows["start_seconds"].fillna(0) - rows["idle_seconds"].fillna(0)
    rows = rows.assign(started=started, taken=taken)
    return rows.groupby("trial_id").agg(
        number=("trial_number", "first"), node=("node", "first"), device=("device", "first"),
        gpus=("accelerator_ids", "first"), start=("started", "min"), end=("finished_at", "max"),
        taken=("taken", "min"), training=("epoch_seconds", "sum")).sort_values("start")


def lanes(spans: pd.DataFrame) -> pd.Series:
    """A row per concurrently running trial on each slot group (greedy interval partitioning)."""
    lane_of = {}
    free_at: dict[tuple, list[float]] = {}  # slot group -> when each of its lanes is free
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
    """The most trials that held a slot at the same time, from taking it to their end (ends before
    starts at a tie): two actors that start together are two slots, however short their trials.
    An actor's next trial takes its slot when the last one reported, a fraction of a millisecond
    before that report's `finished_at` stamp: a handover within HANDOVER seconds is no overlap."""
    events = sorted([(t, 1) for t in spans["taken"]] + [(t - HANDOVER, -1) for t in spans["end"]])
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
    for y, lane in enumerate(names):  # one artist per slot, not per trial (10,000 bars took seconds)
        trials = spans[spans["lane"] == lane]
        axes.broken_barh(list(zip(trials["start"] - origin, trials["end"] - trials["start"])), (y - 0.3, 0.6),
                         facecolors="tab:blue", alpha=0.75, edgecolor="black")
    if len(spans) <= LABELLED_TRIALS:  # past that the numbers overlap into a smear, and take seconds to draw
        for _, span in spans.iterrows():
            axes.text(span["start"] - origin, names.index(span["lane"]),
                      f" #{int(span['number'])}" if not pd.isna(span["number"]) else "",
                      va="center", fontsize=7, color="white")
    axes.set_xlim(left=0)  # the first trial's start, as the axis label says
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
    # constrained layout makes room for a legend placed "outside": below the axes, inside the figure
    figure, axes = plt.subplots(figsize=(8, 4.4), layout="constrained")
    if spans.empty:
        return figure
    # from the first slot taken, not the first trial's start: the first actors' start is slot time
    wall = spans["end"].max() - spans["taken"].min()
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
    # tab10 is a ListedColormap, whose colors (a tuple of RGB triples) matplotlib's stubs type as any ArrayLike
    colors = matplotlib.colormaps["tab10"].colors  # type: ignore[attr-defined]
    for i, (label, seconds) in enumerate(parts.items()):
        axes.barh(0, seconds, left=left, color="lightgray" if label.startswith("idle") else colors[i % 10],
                  label=f"{label}: {seconds:.1f} s")
        left += seconds
    axes.set_yticks([])
    held = " (the most trials that ran at once)" if seen else ""
    axes.set(xlabel=f"slot-seconds ({slots} slot(s){held} x {wall:.1f} s,\n"
                    "from the first slot taken to the last trial's end)",
             title="Where the slot time went")
    # one column: the longest phase names do not fit two to a row in 8 inches
    figure.legend(loc="outside lower center", ncol=1, fontsize=8, frameon=False)
    return figure


def _message(text: str) -> plt.Figure:
    figure = plt.figure(figsize=(8, 1.5))
    figure.text(0.5, 0.5, text, ha="center", va="center", wrap=True)  # wrapped within the figure
    return figure


def figures(frame: pd.DataFrame, space: Space, best_trial: str | None,
            slots: int | None = None) -> dict[str, tuple[str, plt.Figure]]:
    """name -> (caption, figure); `slots` as in time_breakdown."""
    study = make_study(frame, space)
    objectives = objectives_of(space.experiment)
    metric = objectives.metrics[0]
    # several objectives: the figures of one value show the first; the Pareto front shows them all
    target = {"target": lambda t: t.values[0]} if objectives.several else {}
    # importances look for what makes a target low: a maximised first objective is negated there
    sign = -1 if objectives.modes[0] == "max" else 1
    finished = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # a parameter with one value in every finished trial has no axis to draw (a range of zero)
    varied = [p for p in dict.fromkeys(k for t in finished for k in t.params)
              if len({repr(t.params.get(p)) for t in finished}) > 1]
    out = {}
    optuna_plots = {
        "history": ("Optimization history: each trial's value and the best so far",
                    optuna.visualization.matplotlib.plot_optimization_history, 1, {}),
        "parallel": ("Parallel coordinates of the searched parameters against the value",
                     optuna.visualization.matplotlib.plot_parallel_coordinate, 2, {"params": varied}),
        "importance": ("Parameter importances (PED-ANOVA, Optuna's default evaluator)",
                       optuna.visualization.matplotlib.plot_param_importances, 2, {}),
    }
    for name, (caption, plot, needs, kwargs) in optuna_plots.items():
        if len(finished) < needs:
            out[name] = (caption, _message(f"needs {needs} finished trials with a finite {metric}, "
                                           f"got {len(finished)}"))
        elif name == "parallel" and not varied:
            out[name] = (caption, _message("every finished trial has the same parameters: nothing to draw"))
        else:
            wanted = {"target": lambda t: sign * t.values[0]} if target and name == "importance" else target
            # mypy infers no lambda whose parameters have defaults (python/mypy#15459): these bind the loop's values
            out[name] = (caption, _guarded(lambda plot=plot, wanted=wanted, kwargs=kwargs: _optuna_figure(  # type: ignore[misc]
                plot, study, target_name=metric, **wanted, **kwargs)))
    if objectives.several:
        out["pareto"] = ("Pareto front: every finished trial at its point (its last epoch whose objectives are all "
                         "finite, as in pareto.yaml); infeasible ones in grey",
                         _guarded(lambda: _optuna_figure(optuna.visualization.matplotlib.plot_pareto_front, study,
                                                         target_names=list(objectives.metrics))))
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


def kept_summary(folder: RunFolder) -> str | None:
    """The summary in the folder's report.html, as its search wrote it, or None (no report, or none in it):
    `python -m search report` draws the figures again and keeps what the search said."""
    page = folder.storage.read(f"{folder.name}/{REPORT_FILE}")
    found = None if page is None else re.search(r'<pre id="summary">(.*?)</pre>', page.decode(errors="replace"), re.S)
    return html.unescape(found.group(1)) if found and found.group(1).strip() else None


def redrawn_summary(frame: pd.DataFrame, space: Space, best: dict) -> str:
    """A summary for a redraw where the search left none (a stopped or running search has no report yet)."""
    metric = space.experiment.metric
    line = (f"Redrawn by python -m search report from the run folder: {frame['trial_id'].nunique()} of "
            f"experiment.num_samples {space.experiment.num_samples} trials "
            f"({status_counts(frame)})")
    if best.get("trial_id") and isinstance(metric, str) and isinstance(best.get(metric), (int, float)):
        line += (f"\nBest (best.yaml): trial #{best.get('trial_number')} ({best['trial_id']}) epoch "
                 f"{best.get('epoch')}: {metric} {best[metric]:.4f}")
    return line + (f"\nSampler: {space.sampler_choice}" if space.sampler_choice else
                   f"\nSampler: {space.experiment.sampler}")


def front_table(frame: pd.DataFrame, objectives: Objectives) -> str:
    """The front as an HTML table: each trial at its point (pareto.yaml's epoch) with its status, so a
    trial's place on the front never hides how it ended; "" for one objective (best.yaml says the best)."""
    if not objectives.several:
        return ""
    try:
        front = pareto_front(frame, objectives)
    except Exception as error:  # as a figure that cannot be drawn: a message, not a report that fails
        why = html.escape(f"{type(error).__name__}: {error}")
        return f'<p id="front">The Pareto front could not be listed: {why}</p>'
    head = ["trial", "trial_id", "status", "epoch", *objectives.measured]
    rows = []
    for _, row in front.iterrows():
        number = "" if pd.isna(row["trial_number"]) else f"#{int(row['trial_number'])}"
        values = [f"{float(row[m]):.6g}" if pd.api.types.is_number(row.get(m)) else "-" for m in objectives.measured]
        cells = [number, row["trial_id"], row["status"], int(row["epoch"]), *values]
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    wanted = ", ".join(f"{m} {mode}" for m, mode in zip(objectives.metrics, objectives.modes))
    caption = (f"Pareto front ({wanted}): {len(rows)} feasible non-dominated trial(s) of "
               f"{frame['trial_id'].nunique()}, each at its point, the epoch pareto.yaml holds")
    return (f'<table id="front"><caption>{html.escape(caption)}</caption><tr>'
            + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


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
figure{{margin:2em 0}}table{{border-collapse:collapse}}td,th{{padding:0 .6em;text-align:right}}
caption{{text-align:left}}pre{{background:#f4f4f4;padding:1em;white-space:pre-wrap;overflow-wrap:anywhere}}
</style></head>
<body><h1>Search {html.escape(folder.name)}</h1>
<p>{len(frame['trial_id'].unique())} trials of {space.experiment.num_samples}; metric {html.escape(str(space.experiment.metric))}
({html.escape(str(space.experiment.mode))}); space {html.escape(space.source)}.</p>
<p id="study">{html.escape(journal_note(folder.path))}</p>
<pre id="summary">{html.escape(summary.strip())}</pre>
{front_table(frame, objectives_of(space.experiment))}
{''.join(blocks)}
<script>
// for a headless check (and nothing else): how many figures decoded and have a size, and
// whether the summary wraps within the page (no scrolling sideways, in the page or in the block)
window.addEventListener("load", () => {{
  const shown = [...document.images].filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.figuresShown = shown;
  const summary = document.getElementById("summary");
  document.body.dataset.summaryFits = summary.scrollWidth <= summary.clientWidth
    && document.documentElement.scrollWidth <= window.innerWidth;
}});
</script>
</body></html>
"""
    folder.storage.write(f"{folder.name}/{REPORT_FILE}", page.encode())
    return folder.storage.join(folder.name, REPORT_FILE)
