"""What a running search shows: progress on the terminal, and each finished trial in
results.parquet and in the Optuna journal (`optuna-dashboard runs/<name>/optuna.journal`).

A Tune callback in the driver. It keeps no copy of the reports: a trial's rows are derived
from Tune's record (its result.json) when the trial ends, so the work per finished trial
stays the same however many came before. They are handed to one writer thread at the end
of the controller step, after search/snapshot.py may have saved Tune's state: Tune's
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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow.fs as pafs
from ray.tune import Callback

from search.results import read_record, results_schema, score, to_frame, trial_rows
from search.run_folder import RunFolder
from search.space import Space
from search.storage import is_uri


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
        self._journal = None  # (study, trial ids in it), opened on first use; not pickled with the callback
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
        """Append one finished trial to optuna.journal (once: a trial re-run after a resume is skipped)."""
        if is_uri(self.folder.path):
            return  # a journal file needs a local (or shared) file system
        from search.study import JOURNAL_FILE, frozen_trial, journal, make_study

        if self._journal is None:
            path = os.path.join(self.folder.path, JOURNAL_FILE)
            study = make_study(to_frame([], self.schema), self.space, journal(path), self.folder.name)
            self._journal = (study, {t.user_attrs.get("trial_id") for t in study.get_trials(deepcopy=False)})
        study, known = self._journal
        trial_id = rows[0]["trial_id"]
        if trial_id not in known:
            study.add_trial(frozen_trial(to_frame(rows, self.schema), self.space))
            known.add(trial_id)
