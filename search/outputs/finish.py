"""What a search leaves when its trials end: derived from Tune's record, never merged with older copies.

results.parquet (every trial's part written again from Tune's record), best.yaml (the best
epoch whose checkpoint reads, with its test accuracy), report.html and the summary the CLI
prints, and the Outcome the Python API returns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pandas as pd
import pyarrow.fs as pafs

from search.definition.kind import TrialKind
from search.definition.objectives import feasible_only, first, mark_feasible, names, objectives_of
from search.definition.ranking import best_candidates, ranked
from search.definition.space import Space
from search.definition.status import TUNE_ENDED, TUNE_PENDING, TUNE_TERMINATED
from search.outputs.journal import sync_journal
from search.outputs.pareto import checkpoints_by_epoch, write_pareto
from search.outputs.phases import TIMING_FILE, Phases
from search.outputs.summary import Timing, format_summary, journal_note, status_counts, wall_line
from search.searching.notes import ended_note, failed_lines, read_ended, search_notes, warm_start_line
from search.searching.pbt import replay_config
from search.store.results import (ERROR, INTERRUPTED, LOST, RECORD_FILE, config_from_row, read_record, results_schema,
                                  to_frame, trial_id_of, trial_rows, with_reported)
from search.store.retention import on_storage
from search.store.run_folder import RunFolder
from search.store.storage import is_uri
from trainable.metrics import METRICS
from trainable.report import CheckpointError
from trainable.yaml_file import dump_yaml

if TYPE_CHECKING:  # torch with it: a search of a function trainable has no use for it in the driver
    from trainable.data import Data

NO_SUCCESS_EXIT = 3  #: the CLI's exit code for a search that ran but where every trial failed or diverged


@dataclass(frozen=True)
class Outcome:
    """What a finished search leaves, for the CLI and for tests."""

    name: str
    path: str  #: the run folder: <storage_path>/<name>
    results: pd.DataFrame
    best: dict[str, Any] | None  #: best.yaml's content
    timing: Timing
    summary: str
    interrupted: bool = False  #: stopped (Ctrl-C, SIGTERM) before every trial finished; --resume continues it
    succeeded: bool = True  #: some trial outside ERROR reported a finite metric (else the CLI exits 3)


def derive(folder: RunFolder, space: Space, grid, notes: list[str], ran_to_end: bool = False) -> pd.DataFrame:
    """results.parquet from Tune's record of every trial, this run's and earlier runs'.

    Status comes from the saved experiment state (after Ctrl-C the live trial objects read
    TERMINATED, the saved state RUNNING); a trial that never started has no row. A derived file
    never loses what survives: where a trial's record is gone or shorter than its results part
    (a damaged run folder), the part's rows stay, and `notes` says so. When Tune ran to its end
    (`ran_to_end`), every trial ended: TERMINATED, or ERROR with its error (a trial saved as PAUSED
    is one a scheduler stopped while it waited at a rung: Ray records a stop of a trial without a
    live actor in memory only). statuses.json keeps the statuses (TuneRecord.keep_statuses).
    """
    rows, parts = [], []
    schema = results_schema(space)
    # Tune's loop ends, unstopped, only once every trial is TERMINATED or ERROR (with its error): the
    # statuses are the grid's then, and Tune's record is not read (its 10,000 trials as objects took
    # 12 s and 1.5 GB of the driver's memory; a trial stopped at a rung may still read PAUSED there)
    saved = {} if ran_to_end else folder.record.saved_trials()
    statuses = {trial_id: status for trial_id, (status, _) in saved.items()}
    suggested = folder.record.searcher_state().get("suggested", {})  # trial number -> (when, seconds); OrderedSearch's
    for result in grid:
        trial_id = trial_id_of(result)
        if ran_to_end:
            status, config = (ERROR if result.error is not None else TUNE_TERMINATED), None
            statuses[trial_id] = status
        else:
            status, config = saved.get(trial_id, (TUNE_TERMINATED, None))
        reports = read_record(result.filesystem, result.path)
        if not reports and result.error is None and status == TUNE_PENDING:
            continue
        ended = status in TUNE_ENDED
        trial_config = cast(dict[str, Any], result.config or config)  # Tune gives every trial a config
        trial = trial_rows(trial_id, trial_config, reports, done=ended, error=result.error is not None,
                           suggested=suggested.get((trial_config or {}).get("trial_number")))
        trial = kept_rows(folder, trial_id, trial, schema, record_gone=not record_exists(result), notes=notes)
        trial = mark_feasible(trial, objectives_of(space.experiment))
        parts.append((trial_id, trial))
        rows += trial
    schema = with_reported(schema, rows)  # every part with every metric any trial reported
    for trial_id, trial in parts:
        folder.parts.write(space, trial_id, trial, schema)
    folder.record.keep_statuses(statuses)  # a --resume of the finished run reads them, not Tune's record
    return to_frame(rows, schema)


def record_exists(result) -> bool:
    """Whether the trial's result.json is there (a resume recreates a deleted trial folder, empty)."""
    return result.filesystem.get_file_info(f"{result.path.rstrip('/')}/{RECORD_FILE}").type != pafs.FileType.NotFound


def kept_rows(folder: RunFolder, trial_id: str, derived: list[dict[str, Any]], schema, *, record_gone: bool,
              notes: list[str]) -> list[dict[str, Any]]:
    """A trial's rows: the record's, plus the epochs only its results part still holds."""
    recorded = {int(r["epoch"]) for r in derived if r.get("epoch") is not None}
    if not record_gone and folder.parts.epochs(trial_id) <= recorded:
        return derived
    part = folder.parts.read(trial_id, schema)
    number = derived[0].get("trial_number")
    if not part and not record_gone:  # its epoch column read, the rest does not: the record is what there is
        return derived
    if not part:  # gone from both: nothing to recover, and the status says so
        notes.append(f"trial #{number} ({trial_id}): its folder and its results part are gone; nothing of it "
                     "could be recovered (status LOST)")
        return [{**derived[0], "status": LOST}]
    by_epoch = {int(r["epoch"]): r for r in part if r.get("epoch") is not None}
    by_epoch.update({int(r["epoch"]): r for r in derived if r.get("epoch") is not None})  # the record wins
    status = part[0]["status"]  # written when the trial ended, from the whole record
    notes.append(f"trial #{number} ({trial_id}): " + ("its folder (Tune's record) is gone" if record_gone else
                                                      "its record is shorter than its results part")
                 + f"; its rows come from results.parquet as written when it ended (status {status})")
    return [{**by_epoch[e], "status": status} for e in sorted(by_epoch)]


def best_with_test(grid, rows: pd.DataFrame, data: Data | None, kind: TrialKind, needs_checkpoint: bool = False
                   ) -> tuple[pd.Series | None, dict[str, float] | None, str]:
    """The best row (its `checkpoint`: the folder of that epoch's, relative to the run folder, where one
    reads), its test metrics (test_loss, test_acc with cross_entropy, test_<column> of training.metrics)
    measured on that checkpoint, and a note.

    The best is the best value, whether or not its epoch kept a checkpoint (experiment.checkpoint_every,
    num_to_keep): best.yaml's replay trains from its config and needs none; without one there are no
    test metrics, and the note says so. `needs_checkpoint` (pbt: a trial's config changed mid-run, and
    only a checkpoint holds the schedule best.yaml replays): the best row whose checkpoint reads.
    """
    checkpoints = checkpoints_by_epoch(grid)
    skipped, unsaved = [], 0
    for _, row in rows.iterrows():
        checkpoint = checkpoints.get((row["trial_id"], int(row["epoch"])))
        saved = None
        if checkpoint is not None and on_storage(checkpoint):  # else checkpoint_every skipped it, or num_to_keep
            try:
                with checkpoint.as_directory() as where:
                    saved = kind.load_checkpoint(where)
            except CheckpointError as error:
                skipped.append(str(error))
        if saved is None and needs_checkpoint:
            unsaved += checkpoint is None
            continue
        notes = [f"skipped {s}" for s in skipped] if needs_checkpoint else []
        if needs_checkpoint and unsaved:
            notes.insert(0, f"the best epoch with a checkpoint: {unsaved} better one(s) had none kept "
                            "(pbt replays the schedule a checkpoint records)")
        if saved is None:
            why = f"its checkpoint does not read ({skipped[-1]})" if skipped else \
                f"it kept no checkpoint ({kind.checkpoints_kept_by})"
            return row, None, "; ".join([f"epoch {int(row['epoch'])} of trial #{row['trial_number']}: {why}; "
                                         f"{kind.without_checkpoint}", *notes])
        assert checkpoint is not None  # `saved` comes only from a checkpoint
        # trial_<id>/checkpoint_<k>: Tune numbers checkpoints, not epochs
        row = pd.concat([row, pd.Series({"checkpoint": "/".join(checkpoint.path.rstrip("/").split("/")[-2:])})])
        return kind.tested(row, saved, data, notes)  # the loop's checkpoint on the test part; a function has none
    return ((rows.iloc[0] if len(rows) else None), None,
            "no readable checkpoint" + (f" ({unsaved} epoch(s) had none kept)" if unsaved else "")
            + "".join(f"; {s}" for s in skipped))


def best_entry(best: pd.Series, test: dict[str, float] | None, note: str, metric: str, name: str,
               schema, kind: TrialKind, metrics: tuple[str, ...] = METRICS, trials: int | None = None) -> dict[str, Any]:
    """best.yaml's content; `trials`: how many trials it is the best of (a resume that finds fewer than
    its trials there derives it again: a stop between results.parquet and best.yaml left an older one)."""
    return {
        "config": replay_config(config_from_row(best, schema), best.attrs.get("lineage")),
        "result": {
            "trial_number": None if pd.isna(best["trial_number"]) else int(best["trial_number"]),
            "trial_id": best["trial_id"],
            "epoch": int(best["epoch"]),
            "metric": metric,
            **{m: float(best[m]) for m in metrics},
            **kind.test_metrics(test),  # the loop's on the dataset's test part; a function has no test split
            "checkpoint": best.get("checkpoint"),  #: its folder, relative to the run folder; null: none read
            **({"note": note} if note else {}),
            "search": name,
            **({"trials": trials} if trials is not None else {}),
        },
    }


def best_yaml(entry: dict[str, Any], path: str, space: Space) -> str:
    result = entry["result"]
    header = (f"# Best trial of search {result['search']} ({space.source}), by {result['metric']} "
              f"at epoch {result['epoch']}.\n"
              f"# Re-run it: {rerun_command(path, space)}{' (download it first)' if is_uri(path) else ''}\n"
              + space.kind.replay_note(result))
    return header + dump_yaml({**entry["config"], "result": result})


def resume_command(space: Space, folder: RunFolder, address: str | None = None) -> str:
    """The exact command that continues this run (the Python API's call for a space given as a dict),
    on the cluster it ran on (`address`: the one the search joined, None for its own local Ray)."""
    if not space.source.endswith((".yaml", ".yml")):
        on = f", address={address!r}" if address else ""
        return f"search.run(..., name={folder.name!r}, resume=True{on})  (storage_path {folder.storage.uri})"
    return (f"python -m search --space {space.source} --storage-path {folder.storage.uri} "
            f"--resume --name {folder.name}" + (f" --address {address}" if address else ""))


def rerun_command(path: str, space: Space) -> str:
    """The command that replays best.yaml, with the data root the search used. A function on several workers
    does not replay on one process (python -m trainable refuses it): a search of its one config does."""
    instead = space.kind.rerun_instead(space, path)
    if instead:
        return instead
    # on an object store, the URI itself (python -m trainable reads it), with the endpoint the storage path gave
    query = space.experiment.storage_path.partition("?")[2] if is_uri(path) else ""
    where = f"{path}?{query}" if query else path
    return f"python -m trainable --config {where}" + (f" --data-root {space.data_root}" if space.data_root else "")


def no_success(frame: pd.DataFrame, metric: str, interrupted: bool = False) -> str:
    """Why no trial succeeded, for the summary: the trials' statuses, and how the command exits
    (an interrupted search exits 130, whatever its trials did)."""
    statuses = status_counts(frame) or "no trial ran"
    if interrupted:
        return f"No trial has succeeded yet: none outside ERROR reported a finite {metric} ({statuses})"
    return (f"No trial succeeded: none outside ERROR reported a finite {metric} ({statuses}); "
            f"the command exits {NO_SUCCESS_EXIT}")


def finish(grid, folder: RunFolder, space: Space, data: Data | None, phases: Phases, slots: int, gpus_per_trial: float,
           gpu_notes: tuple[str, str], *, resume: str, ran_to_end: bool = False, stopped: str | None = None) -> Outcome:
    """Derive results.parquet, best.yaml (with test accuracy), the report and the summary."""
    experiment = space.experiment
    notes: list[str] = []
    frame = derive(folder, space, grid, notes, ran_to_end)
    sync_journal(folder, space, frame, notes)
    phases.mark("results")
    ended = read_ended(folder) if ran_to_end else None  # a time_budget or stop_when ended it: done, exit 0
    interrupted = (frame["status"] == INTERRUPTED).any() or (
        frame["trial_id"].nunique() < experiment.num_samples and ended is None)
    this_run = frame[frame["finished_at"] >= phases.called]
    timing = Timing(phases.wall_seconds, float(this_run["epoch_seconds"].sum()), slots)

    metric, objectives = first(experiment.metric), objectives_of(experiment)
    scored = ranked(frame, metric, first(experiment.mode))
    succeeded = bool((scored["status"] != ERROR).any())
    # infeasible trials are never best; with several objectives pareto.yaml holds the answer, not best.yaml
    candidates, no_best = best_candidates(frame, metric, first(experiment.mode)), None
    if objectives.several:
        candidates, no_best = candidates.iloc[0:0], write_pareto(folder, space, frame, objectives, grid)
    elif objectives.constraints and succeeded and not len(feasible_only(scored)):
        no_best = f"No trial met experiment.constraints ({', '.join(map(str, objectives.constraints))})"
    best, test, note = best_with_test(grid, candidates, data, space.kind,
                                      needs_checkpoint=experiment.scheduler == "pbt")
    phases.mark("test")
    if best is not None and best["status"] in (ERROR, INTERRUPTED):
        how = "ended in ERROR" if best["status"] == ERROR else "was interrupted"
        others = "so did every trial with a score" if best["status"] == ERROR else "no trial has finished yet"
        note = "; ".join([f"trial #{best['trial_number']} {how} after its epoch {best['epoch']} ({others})",
                          *([note] if note else [])])
    entry = None
    best_path = folder.storage.join(folder.name, "best.yaml")
    if best is not None:
        schema = results_schema(space)  # a function's metrics: every reported column beyond the schema's
        metrics = space.kind.best_metrics(space, list(frame.columns), schema.names)
        entry = best_entry(best, test, note, metric, folder.name, schema, space.kind, metrics,
                           trials=frame["trial_id"].nunique())
        folder.write_best(best_yaml(entry, best_path, space))
    summary = format_summary(frame, entry, timing,
                             no_best=no_best if succeeded else no_success(frame, metric, interrupted),
                             metric=metric, mode=first(experiment.mode),
                             searched=[d.name for d in space.searched], gpus_per_trial=gpus_per_trial,
                             also=tuple(names(experiment.metric)[1:]),
                             gpu_notes=gpu_notes, rerun=rerun_command(best_path, space))
    summary += failed_lines(grid, folder, experiment.trial_timeout)
    summary += "".join(f"\nnote: {note}" for note in notes)
    if ended:
        summary += f"\nEnded: {ended_note(ended, frame['trial_id'].nunique())}"
    summary += "\n" + search_notes(space, folder, timing.wall_seconds * timing.slots, frame)
    summary += warm_start_line(folder)  # which trials the study was told before trial 0, and from where
    if interrupted:  # a stop must end in seconds (SIGTERM, then SIGKILL); the figures take seconds more
        summary += (f"\nReport: not remade for a stopped search (the search's end makes it); "
                    f"now: python -m search report {folder.path}\n{journal_note(folder.path)}")
    elif not experiment.report:
        summary += (f"\nReport: none (experiment.report is false); draw it with: python -m search report "
                    f"{folder.path}\n{journal_note(folder.path)}")
    else:
        try:
            from search.outputs.report import write_report  # matplotlib: only where a report is drawn

            report = write_report(folder, space, frame, None if entry is None else entry["result"]["trial_id"],
                                  summary, slots=slots)
            summary += f"\nReport: {report} (figures in {folder.path}/report/)\n{journal_note(folder.path)}"
        except Exception as error:  # the results are written; a figure must not turn them into a crash
            summary += (f"\nReport: not written ({type(error).__name__}: {error}); "
                        f"try again with: python -m search report {folder.path}")
    phases.mark("report")
    if stopped:  # the disk guard's reason (search/execution/disk_guard.py)
        summary += f"\nStopped: {stopped}"
    if interrupted:
        unfinished = frame.loc[frame["status"] == INTERRUPTED, "trial_id"].nunique()
        summary += (f"\nInterrupted: {unfinished} trial(s) unfinished, "
                    f"{experiment.num_samples - frame['trial_id'].nunique()} not started. Continue with:\n"
                    f"  {resume}")
    return Outcome(folder.name, folder.path, frame, entry, timing, summary, bool(interrupted), succeeded)


def with_time(outcome: Outcome, phases: Phases, folder: RunFolder) -> Outcome:
    """The outcome once the command is over (Ray shut down): its whole wall time and phases, in the
    summary and in the run folder's timing.yaml."""
    timing = Timing(phases.wall_seconds, outcome.timing.training_seconds, outcome.timing.slots)
    try:
        folder.storage.write(f"{folder.name}/{TIMING_FILE}", dump_yaml(phases.record()).encode())
    except OSError:  # a full disk: the summary still says it
        pass
    summary = outcome.summary.replace(wall_line(outcome.timing), wall_line(timing, phases.line()), 1)
    return dataclasses.replace(outcome, timing=timing, summary=summary)
