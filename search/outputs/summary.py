"""The terminal summary: top trials, the best config, wall time and orchestration overhead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from search.definition.objectives import FEASIBLE, Objectives
from search.definition.ranking import best_first, points
from search.outputs.journal import local_journal_path
from search.searching.study import JOURNAL_FILE
from search.store.storage import is_uri
from trainable.config import SCHEDULE_KEY
from trainable.function import trial_config


@dataclass(frozen=True)
class Timing:
    """Where the wall time of a search went."""

    wall_seconds: float  #: the whole command (search/outputs/phases.py), from its start to the summary
    training_seconds: float  #: sum of epoch_seconds of the epochs this run trained
    slots: int  #: trials that could run at once

    @property
    def overhead_seconds(self) -> float:
        """Wall time not explained by training spread over the slots."""
        return max(0.0, self.wall_seconds - self.training_seconds / max(self.slots, 1))

    @property
    def overhead_share(self) -> float:
        return self.overhead_seconds / self.wall_seconds if self.wall_seconds else 0.0


def journal_note(run_path: str) -> str:
    """Where the run's Optuna study is, in one line; on URI storage, also where this machine writes it."""
    if is_uri(run_path):
        local = local_journal_path(run_path)
        return f"Study: {run_path}/{JOURNAL_FILE}, copied from this machine's {local} (optuna-dashboard {local})"
    return f"Study: {run_path}/{JOURNAL_FILE} (optuna-dashboard {run_path}/{JOURNAL_FILE})"


def max_trials_per_gpu(frame: pd.DataFrame) -> int:
    """The most trials that ran at once on one GPU (same node, same accelerator id).

    Each trial's span runs from the start of its first epoch to the end of its last.
    """
    events = []
    for _, trial in frame.dropna(subset=["finished_at"]).groupby("trial_id"):
        ids = str(trial["accelerator_ids"].iloc[0] or "")
        if not ids:
            continue
        start = (trial["finished_at"] - trial["epoch_seconds"]).min()
        end = trial["finished_at"].max()
        for gpu in ids.split(","):
            key = (trial["node"].iloc[0], gpu)
            events += [(key, start, 1), (key, end, -1)]
    most = 0
    running: dict[tuple[Any, str], int] = {}  # (node, GPU id) -> the trials running on it
    for key, _, step in sorted(events, key=lambda e: (e[1], e[2])):  # ends before starts at a tie
        running[key] = running.get(key, 0) + step
        most = max(most, running[key])
    return most


def trial_spans(frame: pd.DataFrame) -> list[tuple[float, float]]:
    """Each trial's (first epoch's start, last report), from results.parquet's finished_at and epoch_seconds;
    [] without them.

    An epoch's start is its report's time less its epoch_seconds, except the first epoch of a run of the trial:
    that starts where the run began (started_at) after its data fetch and set-up. Between an epoch's end and its
    report the canonical loop measures the model's latency and writes the checkpoint (~10 ms of a 30 ms epoch on
    3,000 MNIST images), which would otherwise move the trial's start that much later and count it idle."""
    if not {"finished_at", "epoch_seconds"} <= set(frame.columns):
        return []
    timed = frame.dropna(subset=["finished_at", "epoch_seconds"])
    starts = timed["finished_at"] - timed["epoch_seconds"]
    if {"started_at", "fetch_seconds", "setup_seconds"} <= set(timed.columns):
        began = timed["started_at"] + timed["fetch_seconds"].fillna(0.0) + timed["setup_seconds"].fillna(0.0)
        starts = began.where(timed["started_at"].notna(), starts)
    starts = starts.groupby(timed["trial_id"]).min()
    ends = timed["finished_at"].groupby(timed["trial_id"]).max()
    return [(float(starts[t]), float(ends[t])) for t in starts.index]


def busy_share(spans: list[tuple[float, float]], slots: int) -> tuple[float, float]:
    """The span of `spans` (first start to last end) and the share of it during which `slots` of them ran at once."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end before a start at a tie
    running, last, full = 0, events[0][0], 0.0
    for at, step in events:
        if running >= slots:
            full += at - last
        running, last = running + step, at
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    return span, (full / span if span > 0 else 0.0)


def slots_line(frame: pd.DataFrame, slots: int) -> str | None:
    """"Slots: 2 trials training at once 93% of the training span (21.0 s ...)", for more than one slot. The span
    runs from the first epoch's start to the last report: a trial's start-up (its actor, its data, its model, its
    other workers) is not in it, nor counted as training; the phases line says where that time went."""
    spans = trial_spans(frame) if slots > 1 else []
    if len(spans) < 2:
        return None
    busy = busy_share(spans, slots)
    return (f"Slots: {slots} trials training at once {100 * busy[1]:.0f}% of the training span ({busy[0]:.1f} s, "
            "the first epoch's start to the last report; start-ups not counted)")


# results.parquet's phase columns, in the order a trial meets them, and what each one is
PHASES = {
    "suggest_seconds": "the searcher's suggestion",
    "queue_seconds": "waiting for a free actor",
    "idle_seconds": "an actor waiting for its next trial (the driver: results, snapshots, the searcher)",
    "start_seconds": "actor start or reuse",
    "fetch_seconds": "data fetch",
    "setup_seconds": "set-up before the first epoch",
    "train_seconds": "training",
    "evaluate_seconds": "validation",
    "checkpoint_seconds": "writing checkpoints",
    "report_seconds": "reporting (checkpoint upload, Tune taking the result)",
}


# The one rule for slot time, used by the summary and by the report's figure: a slot is what
# one trial holds (its actor, its CPU and GPU share). The searcher suggests in the driver and a
# queued trial holds no actor, so neither phase is slot time; every other phase is.
DRIVER_PHASES = ("suggest_seconds", "queue_seconds")
TRAINING_PHASES = ("train_seconds", "evaluate_seconds")


def slot_count(max_concurrent: int, capacity: int) -> int:
    """Trials that can run at once: max_concurrent, or fewer where the cluster holds fewer
    (capacity 0: an autoscaler will add nodes, so max_concurrent)."""
    return min(max_concurrent, capacity) if capacity else max_concurrent


def phase_totals(frame: pd.DataFrame) -> dict[str, float]:
    """Seconds per phase column present in results.parquet, summed over trials, in PHASES order."""
    return {p: float(frame[p].fillna(0).sum()) for p in PHASES if p in frame and frame[p].notna().any()}


def slot_time(frame: pd.DataFrame) -> dict[str, float]:
    """Slot-seconds per phase a trial spends in its slot ({} for a run without phase columns)."""
    return {p: v for p, v in phase_totals(frame).items() if p not in DRIVER_PHASES}


def time_breakdown(frame: pd.DataFrame) -> str | None:
    """Where the trials' slot time went (means over trials), naming the biggest phase outside training;
    then the time trials spent outside a slot (the suggestion, the queue)."""
    in_slot = slot_time(frame)
    if "train_seconds" not in in_slot:
        return None
    trials = max(frame["trial_id"].nunique(), 1)
    mean = lambda totals: ", ".join(f"{p.removesuffix('_seconds')} {v / trials:.3g} s" for p, v in totals.items())
    lines = ["Slot time (mean per trial): " + mean(in_slot)]
    outside = {p: v for p, v in in_slot.items() if p not in TRAINING_PHASES}
    if outside:
        biggest = max(outside, key=outside.__getitem__)
        lines.append(f"      biggest outside training and validation: {PHASES[biggest]} "
                     f"({biggest}, {outside[biggest]:.1f} s in all)")
    driver = {p: v for p, v in phase_totals(frame).items() if p in DRIVER_PHASES}
    if driver:
        lines.append("      not in a slot (mean per trial): " + mean(driver))
    return "\n".join(lines)


def format_table(frame: pd.DataFrame, metric: str, mode: str, searched: list[str], top: int = 5,
                 also: tuple[str, ...] = ()) -> str:
    """The top trials, each at the epoch that stands for it (search/definition/ranking.py `points`: its best
    epoch, or with several objectives its point, as pareto.yaml has it), one line each; `also`: the
    other objectives, shown too."""
    # a point's epoch depends on which objectives are finite, not on their modes
    objectives = Objectives((metric, *also), (mode,) * (1 + len(also)))
    table = points(frame.sort_values(["trial_id"], kind="stable"), objectives)
    if table.empty:
        return "(no trials)"
    table = best_first(table, metric, mode)  # ties as best.yaml breaks them: its trial is the first row
    # a trial that breaks experiment.constraints is never best: listed after the feasible ones, and marked
    infeasible = FEASIBLE in table and table[FEASIBLE].eq(False).any()  # null: not judged
    if infeasible:
        table = table.sort_values(FEASIBLE, key=lambda f: f.eq(False), kind="stable")
    table = table.head(top)
    table["trial_number"] = table["trial_number"].map(lambda v: "-" if pd.isna(v) else f"#{int(v)}")
    shown = [metric, *[c for c in also if c != metric and c in table], *([FEASIBLE] if infeasible else [])]
    columns = ["trial_number", "trial_id", "status", "epoch", *shown, *[c for c in searched if c not in shown]]
    return table[columns].to_string(index=False, float_format=lambda v: f"{v:.4g}")


def wall_line(timing: Timing, phases: str | None = None) -> str:
    """The summary's time line; `phases`, once the command is over: where its wall time went."""
    return (f"Wall time {timing.wall_seconds:.1f} s ({'the whole command' if phases else 'until the report'}): training "
            f"{timing.training_seconds:.1f} trial-s over {timing.slots} slot(s); outside training "
            f"{timing.overhead_seconds:.1f} s ({100 * timing.overhead_share:.0f}%)"
            + (f"\n      phases: {phases}" if phases else ""))


def searched_values(config: dict[str, Any], searched: list[str]) -> str:
    """best.yaml's searched values, `lr=0.1, batch_size=64`; a PBT trial's are its first epoch's, and
    `schedule:` (the changes after it) is named, not listed."""
    schedule = config.get(SCHEDULE_KEY)
    flat = trial_config({k: v for k, v in config.items() if k != SCHEDULE_KEY}).to_flat()
    text = ", ".join(f"{k}={flat.get(k)!r}" for k in searched) or "(nothing searched)"
    return text + (f" at epoch 1, then {len(schedule)} change(s) in best.yaml's schedule" if schedule else "")


def status_counts(frame: pd.DataFrame) -> str:
    """The trials by status, as the summary says them: '3 completed, 1 error' ('' without trials)."""
    counts = frame.drop_duplicates("trial_id")["status"].value_counts().to_dict()
    return ", ".join(f"{n} {s.lower()}" for s, n in sorted(counts.items()))


def test_figure(result: dict[str, Any], metric: str) -> str | None:
    """The test metric the Best line shows: the metric's own on the test part (test_acc for val_acc,
    test_r2_score for val_r2_score), else test_acc, else the first test metric best.yaml holds a value of;
    None where it holds none (a function trainable, a dataset without a test part: the note says why)."""
    held = [k for k, v in result.items()
            if k.startswith("test_") and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return next((k for k in (f"test_{str(metric).removeprefix('val_')}", "test_acc") if k in held),
                held[0] if held else None)


def format_summary(frame: pd.DataFrame, best: dict[str, Any] | None, timing: Timing, *,
                   metric: str, mode: str, searched: list[str], gpus_per_trial: float,
                   rerun: str, gpu_notes: tuple[str, ...] = (), no_best: str | None = None,
                   also: tuple[str, ...] = ()) -> str:
    """`gpu_notes`: how the GPUs per trial were chosen (auto's probe, spreading), one line each;
    `no_best`: why no trial succeeded (said where the best trial would be); `also`: the other
    objectives, shown in the table beside `metric`."""
    lines = [
        "",
        f"Top trials by {metric} ({mode})"
        # infeasible trials are listed after the rest (format_table), whatever their metric
        + (" among those that met experiment.constraints, then the others"
           if "feasible" in frame.columns and frame["feasible"].eq(False).any() else "")
        + f", {frame['trial_id'].nunique()} trials: "
        + status_counts(frame)
        # the table's rows are one epoch of each trial, which its `epoch` column names
        + ("; a row per trial at its point (its last epoch with every objective finite)" if also
           else "; a row per trial at its best epoch"),
        format_table(frame, metric, mode, searched, also=also),
        "",
    ]
    if no_best:
        lines.append(no_best + ("; best.yaml holds the best errored epoch" if best is not None else
                                "; no best.yaml"))
    if best is not None:
        result = best["result"]
        test_key = test_figure(result, metric)
        config = searched_values(best["config"], searched)
        lines += [
            f"Best: trial #{result['trial_number']} ({result['trial_id']}) epoch {result['epoch']}: "
            f"{metric} {result[metric]:.4f}" + (f", {test_key} {result[test_key]:.4f}" if test_key else "")
            + f" (seed {best['config']['seed']})" + (f"\n      note: {result['note']}" if result.get("note") else ""),
            f"      {config}",
            f"      re-run: {rerun}",
        ]
    lines.append(wall_line(timing))
    busy = slots_line(frame, timing.slots)
    if busy:
        lines.append(busy)
    breakdown = time_breakdown(frame)
    if breakdown:
        lines.append(breakdown)
    notes = [note for note in gpu_notes if note]
    if gpus_per_trial:
        lines.append(f"GPUs: {gpus_per_trial:g} per trial; at most {max_trials_per_gpu(frame)} "
                     f"trial(s) ran on one GPU at once")
        lines += [f"      {note}" for note in notes]
    elif notes:
        lines.append("GPUs: " + "; ".join(notes))
    return "\n".join(lines)
