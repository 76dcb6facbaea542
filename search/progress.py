"""What a running search shows: progress on the terminal, and each finished trial in
results.parquet and in the Optuna journal (`optuna-dashboard runs/<name>/optuna.journal`).

A Tune callback in the driver. It keeps no copy of the reports: a trial's rows are derived
from Tune's record (its result.json) when the trial ends, so the work per finished trial
stays the same however many came before. They are handed to one writer thread at the end
of the controller step, after Tune may have saved its state (by its own ~5% rule): Tune's
controller runs the trials' reports, resets and starts one after another, so ~10 ms of
Parquet and journal per trial on its thread would be ~10 ms more per trial for the whole
search. A part whose trial that state does not hold is removed on resume
(run_folder.drop_unrecorded_parts), as the trial runs again; a part not yet written when
the driver dies is written from Tune's record when the search ends.

On a terminal the progress is one line redrawn in place (done/total, running, best, ETA);
elsewhere (CI logs, `| tee`) it is a plain line per epoch.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow.fs as pafs
from ray.tune import Callback

from search.results import INTERRUPTED, read_record, results_schema, score, to_frame, trial_rows
from search.run_folder import RunFolder
from search.space import Space
from search.storage import is_uri

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial


# Every writer thread started here, so the driver can wait for them after Tune returns even
# when Tune ended without on_experiment_end (a second Ctrl-C) or restored its own Progress.
_writers: set[ThreadPoolExecutor] = set()


def flush_all() -> None:
    """Wait until every part and journal entry handed to a writer thread is written."""
    while _writers:
        _writers.pop().shutdown(wait=True)


def is_better(value: float, best: float | None, mode: str) -> bool:
    return best is None or (value > best if mode == "max" else value < best)


class Progress(Callback):
    """Shows progress, writes a trial's rows and journal entry when it ends."""

    def __init__(self, folder: RunFolder, space: Space):
        self.folder, self.space = folder, space
        self.metric, self.mode = space.experiment.metric, space.experiment.mode
        self.total = space.experiment.num_samples
        self.ended: set[str] = set()
        self.running: set[str] = set()
        self.best: float | None = None
        self.started = time.monotonic()
        self._journal: Journal | None = None  # opened on first use; not pickled with the callback
        self._ending: list[tuple[Any, bool]] = []  # (trial, error) that ended in this step, written at its end
        self._schema = None  # results_schema(space), made once: it takes ms, and this runs per trial
        self._writer: ThreadPoolExecutor | None = None  # parts and journal, off Tune's controller thread

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_journal": None, "_ending": [], "_schema": None, "_writer": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickled by a resume (Tune keeps the callback as it was at start): this process's
        # clock, the trials that already ended (their results parts), the journal reopened later
        self.__dict__.update(state, started=time.monotonic(), _journal=None, _ending=[], _schema=None,
                             _writer=None)
        self.ended = set(self.folder.ended_trials())

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.running.add(trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.ended.discard(trial.trial_id)  # a restarted trial is running again
        self.running.add(trial.trial_id)
        value = score(result.get(self.metric))
        if value is not None and is_better(value, self.best, self.mode):
            self.best = value
        if sys.stdout.isatty():
            self._bar()
            return
        shown = "nan" if value is None else f"{value:.4f}"
        best = "-" if self.best is None else f"{self.best:.4f}"
        print(f"[{len(self.ended):>{len(str(self.total))}}/{self.total} done] trial {trial.trial_id} "
              f"epoch {result.get('epoch')}/{trial.config.get('epochs')} {self.metric} {shown} | best {best}",
              flush=True)

    def _bar(self) -> None:
        done, width = len(self.ended), 24
        filled = width * done // max(self.total, 1)
        elapsed = time.monotonic() - self.started
        eta = f"{elapsed / done * (self.total - done):.0f} s" if done else "?"
        best = "-" if self.best is None else f"{self.best:.4f}"
        sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} done, "
                         f"{len(self.running)} running | best {self.metric} {best} | ETA {eta}   ")
        sys.stdout.flush()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended(trial, error=False)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended(trial, error=True)

    def on_experiment_end(self, trials, **info) -> None:
        self.on_step_end(iteration=None, trials=trials)
        self.flush()
        if sys.stdout.isatty():
            sys.stdout.write("\n")

    def on_step_end(self, iteration, trials, **info) -> None:
        ending, self._ending = self._ending, []
        for trial, error in ending:
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpsearch-results")
                _writers.add(self._writer)
            self._writer.submit(self._write, trial.trial_id, trial.config, trial.local_path, error=error)
        if ending and sys.stdout.isatty():
            self._bar()

    def flush(self) -> None:
        """Wait until every ended trial's part and journal entry is written."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            _writers.discard(self._writer)
            self._writer = None

    def _ended(self, trial, *, error: bool) -> None:
        self.ended.add(trial.trial_id)
        self.running.discard(trial.trial_id)
        self._ending.append((trial, error))

    @property
    def schema(self):
        if self._schema is None:
            self._schema = results_schema(self.space)
        return self._schema

    def _write(self, trial_id: str, config: dict[str, Any], local_path: str, *, error: bool) -> None:
        # Tune's JSON logger has flushed every report of this trial to its driver-side folder
        try:
            reports = read_record(pafs.LocalFileSystem(), local_path)
            rows = trial_rows(trial_id, config, reports, done=True, error=error)
            self.folder.write_part(self.space, trial_id, rows, self.schema)
        except Exception as problem:  # written again from Tune's record when the search ends
            print(f"note: the results part of trial {trial_id} is not written yet ({type(problem).__name__}: "
                  f"{problem}); the end of the search writes it", file=sys.stderr, flush=True)
            return
        try:
            self.add_to_journal(rows)
        except Exception as failure:  # the journal is a view; it must never stop the search
            print(f"note: trial {trial_id} not added to optuna.journal ({type(failure).__name__}: {failure})",
                  file=sys.stderr, flush=True)

    def add_to_journal(self, rows: list[dict[str, Any]]) -> None:
        """Put one finished trial in optuna.journal (a trial re-run after a resume replaces its entry)."""
        if is_uri(self.folder.path):
            return  # a journal file needs a local (or shared) file system; the summary says so
        if self._journal is None:
            self._journal = Journal(self.folder, self.space, self.schema)
        self._journal.put(to_frame(rows, self.schema))


def journal_key(trial: FrozenTrial) -> tuple[int, Any]:
    """A journal entry's trial: its trial number (a re-run after a resume keeps it, not its Tune id)."""
    number = trial.user_attrs.get("trial_number")
    return (0, number) if number is not None else (1, trial.user_attrs.get("trial_id"))


def _content(trial: FrozenTrial) -> tuple:
    return (trial.state, trial.value, trial.params, trial.intermediate_values, trial.user_attrs)


class Journal:
    """optuna.journal of a local run folder: one entry per trial number, as results.parquet has it.

    Optuna's journal is append-only, and a finished trial cannot be changed or removed. A trial
    that ended after Tune's last snapshot, before the driver was killed, runs again on resume
    under a new Tune id (run_folder.drop_unrecorded_parts); an errored trial resumed runs again
    under its own. Its entry is then replaced by writing the journal anew beside it and moving
    it over the old one: rare (only after a resume), and a dashboard open at that moment shows
    the old file until it is reloaded.
    """

    def __init__(self, folder: RunFolder, space: Space, schema=None):
        from search.study import JOURNAL_FILE, journal, make_study

        self.folder, self.space = folder, space
        self.schema = schema if schema is not None else results_schema(space)
        self.path = os.path.join(folder.path, JOURNAL_FILE)
        self._open = lambda path: make_study(to_frame([], self.schema), space, journal(path), folder.name)
        self.study = self._open(self.path)
        trials = self.study.get_trials(deepcopy=False)
        self.entries = {journal_key(t): t for t in trials}  # the later of two entries of one trial wins
        if len(self.entries) < len(trials):  # a journal written before entries were keyed by number
            self._rewrite()

    def put(self, rows: pd.DataFrame) -> None:
        """Add one trial's rows (one per epoch), or replace its entry if it holds something else."""
        from search.study import frozen_trial

        trial = frozen_trial(rows, self.space, self.schema)
        key = journal_key(trial)
        known = self.entries.get(key)
        if known is not None and _content(known) == _content(trial):
            return
        self.entries[key] = trial
        if known is None:
            self.study.add_trial(trial)
        else:
            self._rewrite()

    def sync(self, frame: pd.DataFrame) -> None:
        """Make the journal hold exactly the trials of `frame` (results.parquet), rewriting it only if it must."""
        from search.study import frozen_trial

        wanted = {}
        ended = frame[frame["status"] != INTERRUPTED]  # an unfinished trial has no entry until it ends
        for _, rows in ended.groupby("trial_id", sort=False):
            trial = frozen_trial(rows, self.space, self.schema)
            wanted[journal_key(trial)] = trial
        stale = set(self.entries) - set(wanted)
        changed = [k for k in wanted.keys() & self.entries.keys()
                   if _content(wanted[k]) != _content(self.entries[k])]
        if stale or changed:
            self.entries = wanted
            self._rewrite()
            return
        for key in sorted(wanted.keys() - self.entries.keys(), key=_order):
            self.entries[key] = wanted[key]
            self.study.add_trial(wanted[key])

    def _rewrite(self) -> None:
        folder, name = os.path.split(self.path)
        temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            study = self._open(temporary)
            study.add_trials([self.entries[k] for k in sorted(self.entries, key=_order)])
            os.replace(temporary, self.path)  # readers see the old journal or the new one, whole
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        self.study = self._open(self.path)


def _order(key: tuple[int, Any]) -> tuple[int, int, str]:
    """Trial-number order; entries without a number (none today) after them, by Tune id."""
    return key[0], key[1] if key[0] == 0 else 0, str(key[1])
