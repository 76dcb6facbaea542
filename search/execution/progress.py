"""What a running search shows: progress on the terminal, each finished trial in
results.parquet, and every trial in the Optuna journal as it starts, learns and ends
(`optuna-dashboard runs/<name>/optuna.journal`; search/outputs/journal.py).

A Tune callback in the driver. It keeps no copy of the reports: a trial's rows are derived
from Tune's record (its result.json) when the trial ends, so the work per finished trial
stays the same however many came before. They are handed to one writer thread at the end
of the controller step, after Tune may have saved its state (by its own ~5% rule): Tune's
controller runs the trials' reports, resets and starts one after another, so ~10 ms of
Parquet and journal per trial on its thread would be ~10 ms more per trial for the whole
search. A part whose trial that state does not hold is removed on resume
(ResultParts.drop_unrecorded), as the trial runs again; a part not yet written when
the driver dies is written from Tune's record when the search ends.

The journal's entries are batched: a trial's start, its epochs' values and its end are handed to
the writer thread at most once a second (JOURNAL_EVERY_S), at the end of a controller step, in
trial-number order. A trial that ends before its batch enters the journal whole, as it ended, in
one write, after the trials numbered below it that had started by then. Each journal write takes
a file lock, an append and an fsync (~1 ms of the driver's CPU and several of its wall time); one
per report was the driver's biggest cost of its own per report, and a trial that ended before a
lower-numbered one still running (which then held a WAITING placeholder, filled in value by value)
cost ~15 writes (bench/per_report.py, docs/performance.md). A dashboard polls every few seconds,
so it sees the same.

On a terminal the progress is one line redrawn in place (done/total, running, best, ETA);
elsewhere (CI logs, `| tee`) it is a plain line per epoch, with the elapsed time and the ETA.
With `--quiet` (`search.run(quiet=True)`) it is one line per finished trial, on a terminal too:
its number, status, epochs and best value, as results.parquet holds them.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pyarrow.fs as pafs
from ray.tune import Callback
from ray.tune.experiment import Trial

from search.definition.objectives import first, mark_feasible, objectives_of
from search.definition.ranking import best_value, is_better, score
from search.definition.space import Space
from search.definition.status import ERROR
from search.execution.ray_internals import last_failure_is_contract_error, no_retry_of_contract_errors
from search.execution.writer_thread import WriterThread
from search.outputs.journal import Journal
from search.searching.budget import end_search
from search.searching.failing import FAILING_AFTER, FirstFailures, last_line
from search.searching.study import RUNNING
from search.store.results import read_record, records, results_schema, trial_rows
from search.store.run_folder import RunFolder
from trainable.errors import ConfigError

if TYPE_CHECKING:
    from ray.tune.stopper import Stopper

# Every Progress with a writer thread started, so the driver can hand on their last journal batch
# and wait for their threads after Tune returns, even when Tune ended without on_experiment_end (a
# quick stop, a second Ctrl-C) or restored its own Progress. Tune forces this module-level set: a
# resumed Tuner runs the Progress it unpickled, not one the driver holds, so the driver cannot reach
# it through an instance of its own.
_unflushed: set[Progress] = set()

JOURNAL_EVERY_S = 1.0  # the most a trial's start, epoch or end waits to be handed to the writer thread


@dataclass
class Live:
    """What a trial's journal entry gains in the next batch (on Tune's thread, until it is handed on)."""

    start: tuple[str, dict] | None = None  # (trial_id, config) if its start is not written yet
    epochs: dict[int, float] = field(default_factory=dict)
    ended: bool = False  # its entry is written whole, from the rows its results part holds (Progress._write)
    held: bool = False  # kept back one batch already, for a lower-numbered trial Tune had not started (_hand_on)


# `--quiet`: a choice of this command, not of the run, so neither in spec.yaml nor in the pickled callback:
# a resumed Tuner runs the Progress it unpickled (see _unflushed), which reads it here (Progress._reset).
_quiet = False


@contextlib.contextmanager
def quiet_progress(quiet: bool) -> Iterator[None]:
    """Within it, a search's progress is one line per finished trial (quiet) or per epoch (the default)."""
    global _quiet
    before, _quiet = _quiet, bool(quiet)
    try:
        yield
    finally:
        _quiet = before


def flush_all() -> None:
    """Write every part and journal entry a Progress holds or has handed to its writer thread (after Tune
    returned: its controller thread, which adds to them, is this one)."""
    while _unflushed:
        _unflushed.pop().flush()


def error_line(trial) -> str:
    """The last line of the error Tune wrote for `trial` (its driver-side copy), '?' if none reads."""
    try:  # written here first (error_file, the driver's copy), in the run folder at Tune's next sync
        error = Path(trial.error_file).read_text() if trial.error_file else trial.get_error()
    except Exception:  # unreadable: the line still says where the traceback is
        error = None
    return last_line(error)


def clock(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss from an hour on), as a progress line shows elapsed time and ETA."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def of_epochs(epoch: Any, epochs: Any) -> str:
    """"/5" after an epoch of 5; nothing where a function trainable reports past its `epochs` (or has none)."""
    try:
        return f"/{epochs}" if epochs is not None and int(epoch) <= int(epochs) else ""
    except (TypeError, ValueError):
        return ""


class Progress(Callback):
    """Shows progress, writes a trial's rows when it ends and its journal entry as it goes."""

    def __init__(self, folder: RunFolder, space: Space):
        self.folder, self.space = folder, space
        self.metric, self.mode = first(space.experiment.metric), first(space.experiment.mode)
        self.total = space.experiment.num_samples
        self.ended: set[str] = set()
        self.running: set[str] = set()
        self.best: float | None = None
        self.started = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        """What this process keeps apart from Tune's pickled copy of the callback."""
        self._journal: Journal | None = None  # opened by the writer thread; not pickled with the callback
        self._journal_failed = False  # one note, then the end of the search writes the journal
        # (trial, error, trials ended by then) that ended in this step, written at its end
        self._ending: list[tuple[Any, bool, int]] = []
        self._schema = None  # results_schema(space), made once: it takes ms, and this runs per trial
        self._writer = WriterThread("hpsearch-results", "writing a results part or the journal")  # off Tune's thread
        self._epochs: dict[str, float] = {}  # running trial -> share of its epochs done (the ETA's)
        self._ended_before = len(self.ended)  # trials that ended before this process: not in its ETA
        self._paced_from: float | None = None  # when this process's first trial started: the ETA's pace
        self._quiet = _quiet  # one line per finished trial (quiet_progress)
        self._live: dict[int, Live] = {}  # trial number -> its entry's next batch (module docstring)
        self._live_at = 0.0  # when the last batch was handed on
        # the writer thread's own: an ended trial's records (results.records), from its part's write until its batch
        self._ended_rows: dict[int, list[dict[str, Any]]] = {}
        # the first trials' ends in this process (a resume watches anew: the code may have been fixed)
        self.first_failures = FirstFailures(needed=min(FAILING_AFTER, self.total))

    def __getstate__(self) -> dict[str, Any]:
        keep = ("_journal", "_journal_failed", "_ending", "_schema", "_writer", "_epochs", "_ended_before",
                "_paced_from", "_quiet", "_live", "_live_at", "_ended_rows", "first_failures")
        return {k: v for k, v in self.__dict__.items() if k not in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # unpickled by a resume (Tune keeps the callback as it was at start): this process's
        # clock, the trials that already ended (their results parts), the journal reopened later
        self.__dict__.update(state, started=time.monotonic())
        self.ended = set(self.folder.parts.ended())
        try:  # the space as the resume wrote it (--more-trials, --num-samples): spec.yaml, not the pickle, whose
            # Space an earlier release made (its models may lack a field this release reads: resources.workers)
            self.space = self.folder.read_spec()[0]
            self.total = self.space.experiment.num_samples
        except ConfigError:
            pass  # the resume itself reads and checks spec.yaml first; keep the old total
        self._reset()

    def setup(self, stop: Stopper | None = None, num_samples: int | None = None, total_num_samples: int | None = None,
              **info: Any) -> None:
        self._submit(self._to_journal, lambda journal: None)  # the journal exists from the start

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        no_retry_of_contract_errors(trial)  # the same on every try: ERROR at once (search/searching/failing.py)
        self.running.add(trial.trial_id)
        self._paced_from = self._paced_from or time.monotonic()
        number = trial.config.get("trial_number")
        if number is None:  # not numbered: a journal entry by itself
            self._submit(self._to_journal, functools.partial(self._start_entry, trial.trial_id, dict(trial.config)))
            return
        # a restart (max_failures, a resume) starts its entry again; its epochs follow anew
        self._live[int(number)] = Live(start=(trial.trial_id, dict(trial.config)), held=self._held(int(number)))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.ended.discard(trial.trial_id)  # a restarted trial is running again
        self.running.add(trial.trial_id)
        value = score(result.get(self.metric))
        epoch, number = result.get("epoch"), trial.config.get("trial_number")
        if value is not None and is_better(value, self.best, self.mode):
            self.best = value
        if value is not None and epoch is not None and number is not None:
            self._live.setdefault(int(number), Live()).epochs[int(epoch)] = value
        if epoch is not None and trial.config.get("epochs"):
            self._epochs[trial.trial_id] = min(1.0, int(epoch) / int(trial.config["epochs"]))
        if self._quiet:  # its line comes when it ends (_write)
            return
        if sys.stdout.isatty():
            self._bar()
            return
        raw = result.get(self.metric)
        shown = f"{value:.4f}" if value is not None else str(raw) if isinstance(raw, (int, float)) else "nan"
        best = "-" if self.best is None else f"{self.best:.4f}"
        elapsed, eta = self._times()
        print(f"[{len(self.ended):>{len(str(self.total))}}/{self.total} done] trial {trial.trial_id} "
              f"epoch {epoch}{of_epochs(epoch, trial.config.get('epochs'))} {self.metric} {shown} | best {best} "
              f"| elapsed {elapsed} | ETA {eta}", flush=True)

    def _line_start(self, done: int) -> str:
        return f"[{done:>{len(str(self.total))}}/{self.total} done]"

    def _trial_line(self, rows: list[dict[str, Any]], line: tuple[str, str, str]) -> str:
        """A finished trial in one line (--quiet): its number, status, epochs and best value, as its results part
        holds them (DIVERGED, STOPPED by a scheduler), then the search's best, elapsed time and ETA."""
        start, elapsed, eta = line
        last = rows[-1]
        epochs = sum(r.get("epoch") is not None for r in rows)
        value = best_value((r.get(self.metric) for r in rows), self.mode)
        number = last.get("trial_number")
        best = "-" if self.best is None else f"{self.best:.4f}"
        return (f"{start} trial {'-' if number is None else f'#{int(number)}'} ({last['trial_id']}) {last['status']}, "
                f"{epochs}{of_epochs(epochs, last.get('epochs'))} epochs, best {self.metric} "
                f"{'-' if value is None else f'{value:.4f}'} | best {best} | elapsed {elapsed} | ETA {eta}")

    def _times(self) -> tuple[str, str]:
        """Elapsed time, and the ETA at this process's pace since its first trial started (start-up excluded):
        trials ended, and the share of epochs done of those running."""
        now = time.monotonic()
        running = sum(self._epochs.get(t, 0.0) for t in self.running)
        done = len(self.ended) - self._ended_before + running
        left = max(0.0, self.total - len(self.ended) - running)
        paced = now - (self._paced_from or now)
        return clock(now - self.started), (clock(paced / done * left) if done > 0 and paced > 0 else "?")

    def _bar(self) -> None:
        done, width = len(self.ended), 24
        filled = width * done // max(self.total, 1)
        elapsed, eta = self._times()
        best = "-" if self.best is None else f"{self.best:.4f}"
        sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} done, "
                         f"{len(self.running)} running | best {self.metric} {best} | {elapsed} | ETA {eta}   ")
        sys.stdout.flush()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.first_failures.ended(trial.config.get("trial_number"), None)
        self._ended(trial, error=False)

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        where = "its last checkpoint" if trial.checkpoint is not None else "its start (no checkpoint yet)"
        self._say_failure(trial, f"restarts from {where} (experiment.max_failures)", error_line(trial))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        last = error_line(trial)
        failing = self.first_failures.ended(trial.config.get("trial_number"), last)
        earlier = self.first_failures.same_as_before(last)
        retried = " (not restarted: it broke the function's contract, as it would on every try)" \
            if last_failure_is_contract_error(trial) else ""
        self._say_failure(trial, f"ended in ERROR{retried}", last, earlier)
        self._ended(trial, error=True)
        # trials yet to start, and a searcher's Budget to end them (PBT's population starts at once)
        if failing is not None and len(self.ended) + len(self.running) < self.total \
                and self.space.experiment.scheduler != "pbt":
            end_search(self.folder, failing)
            print(f"stopping the search: its first {len(failing['failed_trials'])} trials failed with the same "
                  "error and none succeeded; no trial starts after this one", flush=True)

    def _say_failure(self, trial, what: str, last: str, earlier: int | None = None) -> None:
        """One line per failure, where Tune logs a traceback (dropped unless --verbose: search/execution/session.py
        quiet); an error an earlier trial already showed is named by that trial."""
        if sys.stdout.isatty() and not self._quiet:
            sys.stdout.write("\n")  # below the progress bar
        shown = f"the same error as trial #{earlier}" if earlier is not None else last
        print(f"trial {trial.trial_id} (#{trial.config.get('trial_number')}) failed and {what}: {shown} "
              f"(traceback in {self.folder.trial_path(trial.path)}/error.txt)", flush=True)

    def on_experiment_end(self, trials, **info) -> None:
        self.on_step_end(iteration=None, trials=trials)
        self.flush()
        if sys.stdout.isatty() and not self._quiet:
            sys.stdout.write("\n")

    def on_step_end(self, iteration, trials, **info) -> None:
        ending, self._ending = self._ending, []
        for trial, error, done in ending:
            # the line's counts and times now, on Tune's thread: the writer thread must not read sets this one changes
            line = (self._line_start(done), *self._times()) if self._quiet else None
            self._submit(self._write, trial.trial_id, trial.config, trial.local_path, error=error, line=line)
        if ending and sys.stdout.isatty() and not self._quiet:
            self._bar()
        self._hand_on(trials, force=False)

    def _hand_on(self, trials, *, force: bool) -> None:
        """The journal's batch to the writer thread, at most once per JOURNAL_EVERY_S unless `force`d. Handed on
        after the ended trials' parts (the same writer thread, in order), so their rows are there for it.

        Optuna numbers entries in the order they enter, so an entry above a trial with none yet makes a WAITING
        placeholder of it, filled in later one value per write. Tune starts two trials in the order their actors
        come up, not always by number: an entry above a trial Tune has not started yet is kept back one batch,
        for that trial's start to come first; one batch only, as a trial can wait long (for a GPU, a node)."""
        now = time.monotonic()
        if not self._live or not (force or now - self._live_at >= JOURNAL_EVERY_S):
            return
        below = None if force else min((int(t.config["trial_number"]) for t in trials
                                        if t.status == Trial.PENDING and t.config.get("trial_number") is not None),
                                       default=None)
        batch = {n: e for n, e in self._live.items() if below is None or n <= below or e.held}
        self._live = {n: e for n, e in self._live.items() if n not in batch}
        for entry in self._live.values():
            entry.held = True
        self._live_at = now
        if batch:
            self._submit(self._write_live, batch)

    def _held(self, number: int) -> bool:
        """Whether trial `number`'s entry was kept back a batch already (an entry that replaces it keeps that)."""
        entry = self._live.get(number)
        return entry is not None and entry.held

    def _write_live(self, live: dict[int, Live]) -> None:
        """One batch of journal entries, in trial-number order (search/outputs/journal.py), written in one
        append to the file (Journal.hold)."""
        self._to_journal(Journal.hold)
        for number in sorted(live):
            entry, written = live[number], self._ended_rows.pop(number, None)
            if entry.ended:  # none written: its part did not write; the end of the search writes its entry
                if written:
                    self._to_journal(functools.partial(self._ended_entry, written))
                continue
            if entry.start is not None:
                self._to_journal(functools.partial(self._start_entry, *entry.start))
            if entry.epochs:
                self._to_journal(functools.partial(self._report_entry, number, entry.epochs))
        self._to_journal(Journal.commit)

    @staticmethod
    def _ended_entry(written: list[dict[str, Any]], journal: Journal) -> None:
        """An ended trial's entry, whole, from its results part's records (ResultParts.write)."""
        journal.put(journal.trial_of(written))

    @staticmethod
    def _report_entry(number: int, epochs: dict[int, float], journal: Journal) -> None:
        for epoch, value in sorted(epochs.items()):
            journal.report(number, epoch, value)

    def _submit(self, work, *args, **kwargs) -> None:
        _unflushed.add(self)
        self._writer.submit(work, *args, **kwargs)

    def flush(self) -> None:
        """Wait until every ended trial's part and journal entry is written."""
        self._hand_on(None, force=True)  # the last batch goes now, not after its second
        self._writer.wait()
        _unflushed.discard(self)

    def _ended(self, trial, *, error: bool) -> None:
        self.ended.add(trial.trial_id)
        self.running.discard(trial.trial_id)
        self._epochs.pop(trial.trial_id, None)
        number = trial.config.get("trial_number")
        if number is not None:  # its entry is written whole as it ended, in the next batch
            self._live[int(number)] = Live(ended=True, held=self._held(int(number)))
        self._ending.append((trial, error, len(self.ended)))

    @property
    def schema(self):
        if self._schema is None:
            self._schema = results_schema(self.space)
        return self._schema

    @property
    def journal(self) -> Journal:
        if self._journal is None:
            self._journal = Journal(self.folder, self.space, self.schema)
        return self._journal

    def _to_journal(self, change: Callable[[Journal], None]) -> None:
        """One change to the journal, on the writer thread; a failure is said once and never stops the search."""
        if self._journal_failed:
            return
        try:
            change(self.journal)
            for note in self.journal.overridden:  # another process ended an entry otherwise (search/outputs/journal.py)
                print(f"note: {note}", file=sys.stderr, flush=True)
            self.journal.overridden.clear()
        except Exception as failure:  # the journal is a view: the end of the search writes it from the results
            self._journal_failed = True
            print(f"note: optuna.journal not kept up to date during the search ({type(failure).__name__}: "
                  f"{failure}); the end of the search writes it from results.parquet", file=sys.stderr, flush=True)

    def _start_entry(self, trial_id: str, config: dict[str, Any], journal: Journal) -> None:
        rows = [{**row, "status": RUNNING} for row in trial_rows(trial_id, config, [], done=False, error=False)]
        journal.start(journal.trial_of(records(rows, self.schema)))

    def _write(self, trial_id: str, config: dict[str, Any], local_path: str, *, error: bool,
               line: tuple[str, str, str] | None = None) -> None:
        """`line`: with --quiet, the start, elapsed time and ETA of the trial's progress line, printed here."""
        # Tune's JSON logger has flushed every report of this trial to its driver-side folder
        rows = None
        try:
            reports = read_record(pafs.LocalFileSystem(), local_path)
            rows = mark_feasible(trial_rows(trial_id, config, reports, done=True, error=error),
                                 objectives_of(self.space.experiment))
            written = self.folder.parts.write(self.space, trial_id, rows, self.schema).to_pylist()
        except Exception as problem:  # written again from Tune's record when the search ends
            self._say_ended(line, rows, trial_id, config, error)
            print(f"note: the results part of trial {trial_id} is not written yet ({type(problem).__name__}: "
                  f"{problem}); the end of the search writes it", file=sys.stderr, flush=True)
            return
        self._say_ended(line, rows, trial_id, config, error)
        number = config.get("trial_number")
        if number is None:  # not numbered: a journal entry by itself, now
            self._to_journal(functools.partial(self._ended_entry, written))
        else:
            self._ended_rows[int(number)] = written  # its batch (_write_live) follows on this thread

    def _say_ended(self, line: tuple[str, str, str] | None, rows: list[dict[str, Any]] | None, trial_id: str,
                   config: dict[str, Any], error: bool) -> None:
        """A finished trial's --quiet line (`line` None: not quiet); from its rows, or where its record did not
        read, from what Tune said."""
        if line is None:
            return
        if rows:
            print(self._trial_line(rows, line), flush=True)
            return
        print(f"{line[0]} trial #{config.get('trial_number')} ({trial_id}) {ERROR if error else 'ended'} "
              f"| elapsed {line[1]} | ETA {line[2]}", flush=True)

    def add_to_journal(self, rows: list[dict[str, Any]]) -> None:
        """Put one ended trial in optuna.journal (a trial re-run after a resume replaces its entry), as the
        writer thread does."""
        self._to_journal(functools.partial(self._ended_entry, records(rows, self.schema)))
