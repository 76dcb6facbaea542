"""optuna.journal: the search as an Optuna study that optuna-dashboard reads while it runs.

Optuna numbers a study's trials in the order they enter it, so entries enter in trial-number
order and Optuna's trial number is hpsearch's `trial_number` (also kept as a user attribute):
`optuna-dashboard runs/<name>/optuna.journal` shows trial k as results.parquet's trial_number k.

An entry's life, as the search goes (search/execution/progress.py hands the steps to its writer thread
in batches, at most one a second: a trial that ends within it enters whole, as it ended, in one write):

- the trial starts: RUNNING, with its params and user attributes trial_number, trial_id, seed
  and status RUNNING; a lower-numbered trial Tune has not started yet enters first, WAITING;
- each epoch: its metric as an intermediate value;
- it ends: COMPLETE with its value (its best epoch, as best.yaml picks it) when it ran all its
  epochs (status COMPLETED), PRUNED (its curve and that value kept) when a scheduler stopped it
  early (STOPPED: asha, hyperband), or FAIL (no finite metric, DIVERGED, or an error); status is
  results.parquet's. Optuna's best reads COMPLETE trials only, so the end of the search makes a
  STOPPED or DIVERGED trial that holds the run's best (best.yaml's, or on pareto.yaml's front)
  COMPLETE, its status user attribute unchanged (search/searching/study.py): the journal is then
  written anew, once;
- the search stops (Ctrl-C) before it ends: the entry stays RUNNING with status INTERRUPTED, and
  `--resume` continues that same entry. Only an entry that must change after it ended (a trial
  run again after a killed driver, or an errored trial resumed) makes the journal be written
  anew beside the old one and moved over it: rare, and a dashboard reloads to see it.

Other processes may write to the file as the search goes (optuna-dashboard's notes, a user attribute, a
study attribute): what they write stays, a rewrite included, which carries every study and trial attribute
it did not set. A trial they end (the dashboard's "Mark as Fail") stays as they left it while it runs (its
reports are no longer appended: Optuna refuses them), and takes the state results.parquet gives it when it
ends, which the summary (or, during the search, a note) says: the journal is results.parquet's view.

A warm-started run (search/searching/warm_start.py) has a second study in the file, `<run>.warm_start`
(WARM_STUDY): the earlier run's trials the searcher was told before trial 0, each with the user
attributes warm_start_from (the earlier run) and warm_start_trial_number. They live apart so
that the run's own entries keep their numbers.

The file is created when the search starts, so a dashboard can open it before any trial ends.
On URI storage (s3://, gs://) a journal needs a local file: it lives on the driver's disk
(`local_journal_path`), and is copied into the run folder as the search goes (at most ~5% of
the writer thread's time, as Tune rations its snapshots) and when it ends.
"""

from __future__ import annotations

import copy
import os
import re
import time
import uuid
from typing import Any, Mapping, Sequence

import optuna
import pandas as pd
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages.journal import BaseJournalBackend, JournalFileBackend
from optuna.trial import FrozenTrial, TrialState, create_trial

from search.definition.objectives import objectives_of
from search.definition.space import Space
from search.searching.study import JOURNAL_FILE, PENDING, best_trials, frozen_trial, trial_records
from search.searching.warm_start import load, told
from search.store.results import DIVERGED, STOPPED, results_schema
from search.store.run_folder import RunFolder
from search.store.storage import is_uri

WARM_STUDY = "{run}.warm_start"  #: the warm start's study in optuna.journal


def local_journal_path(run_path: str) -> str:
    """Where the journal of the run folder `run_path` is written: in it if local, or, on URI storage, on
    the driver's disk under $XDG_CACHE_HOME (~/.cache) at hpsearch/journals/<scheme>/<its path>/optuna.journal."""
    if not is_uri(run_path):
        return os.path.join(run_path, JOURNAL_FILE)
    scheme, rest = run_path.split("://", 1)
    parts = [re.sub(r"[^A-Za-z0-9._=-]", "_", p) for p in rest.split("/") if p not in ("", ".", "..")]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "hpsearch", "journals", scheme, *parts, JOURNAL_FILE)


def _content(trial: FrozenTrial) -> tuple:
    return (trial.state, trial.values, trial.params, trial.intermediate_values, trial.user_attrs, trial.constraints)


def number_of(trial: FrozenTrial) -> int | None:
    number = trial.user_attrs.get("trial_number")
    return None if number is None else int(number)


def placeholder(number: int) -> FrozenTrial:
    """An entry for a trial number nothing is known of yet, so that later numbers stay in place."""
    return create_trial(state=TrialState.WAITING, user_attrs={"trial_number": number, "status": PENDING})


class HeldAppends(BaseJournalBackend):
    """Optuna's journal file, whose appends can be held in memory and written together (`commit`).

    Optuna's file backend writes each change of an entry (a value, an attribute, a state) as an append
    of its own: a lock (a symlink made, renamed and removed), a write and an fsync, then a read back.
    Held, a batch of the search's entries is one append (Journal.hold; search/execution/progress.py holds
    each batch). Reads see the held changes after the file's lines, numbered as if written after them. A
    dashboard sees the batch when it is committed. Another process can write the file meanwhile (a note
    made in optuna-dashboard): its lines then come before the held ones in the file, and `commit` says
    that the numbers the held ones were read under are not the file's (Journal.commit reads it again).
    """

    def __init__(self, path: str) -> None:
        self._file = JournalFileBackend(path)
        self.holding = False
        self._held: list[dict[str, Any]] = []
        self._in_file = 0  # the logs of the file read so far: the held ones are numbered after them
        self._read_held = False  # whether a read has returned held logs (numbered after self._in_file)

    def read_logs(self, log_number_from: int) -> list[dict[str, Any]]:
        if log_number_from > self._in_file:  # read up to the held ones already
            return self._held[log_number_from - self._in_file:]
        logs = list(self._file.read_logs(log_number_from))
        self._in_file = log_number_from + len(logs)
        self._read_held = bool(self._held)
        return logs + self._held

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        self._held.extend(logs)
        if not self.holding:
            self.commit()

    def commit(self) -> bool:
        """Append the held logs; False if they were read under numbers another process's lines took."""
        if not self._held:
            return True
        held, self._held = self._held, []
        self._file.append_logs(held)
        # read back once: Optuna's file backend learns where each line starts, so later reads seek past them
        lines = sum(1 for _ in self._file.read_logs(self._in_file))
        in_order = not self._read_held or lines == len(held)
        self._in_file += lines
        self._read_held = False
        return in_order


class Journal:
    """optuna.journal of a run: entry k is trial_number k, as results.parquet holds it."""

    UPLOAD_SHARE = 0.05  # of the writer thread's time, at most, spent copying the journal to URI storage

    def __init__(self, folder: RunFolder, space: Space, schema=None):
        self.folder, self.space = folder, space
        self.schema = schema if schema is not None else results_schema(space)
        self.path = local_journal_path(folder.path)
        self._uploaded_at, self._upload_seconds = 0.0, 0.0
        self._holding = False
        self._upload_due = False  # a forced upload came while holding (a rewrite): the commit forces it
        self.overridden: list[str] = []  # entries another process ended otherwise, set back by a rewrite (notes)
        self.file_entries: dict[int, FrozenTrial] = {}
        self.foreign: list[FrozenTrial] = []  # trials of the study without a trial_number: another process's
        if is_uri(folder.path) and not os.path.exists(self.path):  # a resume on another machine
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            copy = folder.storage.read(f"{folder.name}/{JOURNAL_FILE}")
            if copy:
                with open(self.path, "wb") as f:
                    f.write(copy)
        self._open(self.path)
        trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        self.entries: dict[int, FrozenTrial] = {}
        for t in trials:  # the later of two entries of one trial wins
            if (number := number_of(t)) is not None:
                self.entries[number] = t
        if any(number_of(t) != t.number for t in trials):  # written in finishing order (before hpsearch 0.2),
            self._rewrite()  # or another process added a trial (study.ask()): numbered as results.parquet, anew
        else:
            self.upload(force=False)  # the run folder has a journal from the start

    def _open(self, path: str) -> None:
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._backend = HeldAppends(path)
        self.storage = optuna.storages.JournalStorage(self._backend)
        optuna.create_study(storage=self.storage, study_name=self.folder.name, load_if_exists=True,
                            directions=objectives_of(self.space.experiment).directions)
        self.study_id = self.storage.get_study_id_from_name(self.folder.name)
        self._write_warm_start()
        self._backend.holding = self._holding  # the study is in the file from the start; a batch goes on held

    def _write_warm_start(self) -> None:
        """The warm start's study, written once: the trials a file already holds are not added again."""
        warm = told(load(self.folder), self.space.searched)
        if not warm:
            return
        study = optuna.create_study(storage=self.storage, study_name=WARM_STUDY.format(run=self.folder.name),
                                    load_if_exists=True, direction=self.storage.get_study_directions(self.study_id)[0])
        study.add_trials(warm[len(study.get_trials(deepcopy=False)):])

    # ---- the search as it goes ----

    def hold(self) -> None:
        """Hold the changes from here until `commit`, to write them in one append (HeldAppends)."""
        self._holding = self._backend.holding = True

    def commit(self) -> None:
        """Write the changes held since `hold`, in one append, and write at once again from here."""
        self._holding = self._backend.holding = False
        try:
            in_order = self._backend.commit()
        except UpdateFinishedTrialError:
            in_order = False
        if not in_order:  # another process wrote the file meanwhile: read it as it is
            self._reopen()
            if self.foreign:  # and added a trial, which takes an Optuna number of the run's own
                self._rewrite()
        self.upload(force=self._upload_due)

    def trial_of(self, rows: Sequence[Mapping[str, Any]], *, best: bool = False) -> FrozenTrial:
        """One trial's rows (study.frozen_trial's records) as its entry: RUNNING, WAITING or ended, by its
        status column; `best`: it holds the run's best (study.best_trials), so it is COMPLETE even if
        STOPPED or DIVERGED."""
        return frozen_trial(rows, self.space, self.schema, live=True, best=best)

    def report(self, number: int, epoch: int, value: float) -> None:
        """Trial `number`'s metric at `epoch`, if its entry is running."""
        self._despite_others(lambda: self._report(number, epoch, value))

    def _despite_others(self, change) -> None:
        """`change`, read again from the file if another process ended a trial it touches.

        Optuna's journal refuses this process's update of a trial another process ended, then raises on each
        later read of the file: the storage opened again is another worker, whose reads skip that update."""
        try:
            change()
        except UpdateFinishedTrialError:
            self._reopen()
            change()

    def _report(self, number: int, epoch: int, value: float) -> None:
        entry = self.entries.get(number)
        if entry is None or entry.state.is_finished() or entry.intermediate_values.get(epoch) == value:
            return
        trial_id = self._id(number)
        self.storage.set_trial_intermediate_value(trial_id, epoch, value)
        self.entries[number] = self.storage.get_trial(trial_id)

    def start(self, trial: FrozenTrial) -> None:
        """A trial (re)starts: its entry RUNNING; one still running (a retry, a resume) keeps its curve."""
        number = number_of(trial)
        known = None if number is None else self.entries.get(number)
        if known is not None and not known.state.is_finished():
            trial = create_trial(state=trial.state, params=trial.params, distributions=trial.distributions,
                                 intermediate_values=known.intermediate_values,
                                 user_attrs={**known.user_attrs, **trial.user_attrs})
        self.put(trial)

    def put(self, trial: FrozenTrial) -> None:
        """Make the entry of `trial`'s number hold it: created, brought up to date, or (only if it
        ended with something else) replaced by writing the journal anew."""
        done = [True]
        self._despite_others(lambda: done.__setitem__(0, self._put(trial)))
        if not done[0]:
            self._rewrite()
        if not self._holding:
            self.upload(force=False)

    def sync(self, frame: pd.DataFrame) -> None:
        """Make the journal hold the trials of `frame` (results.parquet), rewriting it only if it must.

        Entries of trials not in `frame` that have not ended (WAITING: not started) stay.
        """
        # the file as it is: read again if another process ended a trial this one had written to
        self._despite_others(lambda: self.storage.get_all_trials(self.study_id, deepcopy=False))
        wanted: dict[int, FrozenTrial] = {}
        # only a stopped or diverged trial's entry depends on the others (COMPLETE if it holds the best)
        best = best_trials(frame, self.space) \
            if "status" in frame and frame["status"].isin([STOPPED, DIVERGED]).any() else set()
        for rows in trial_records(frame):
            trial = self.trial_of(rows, best=str(rows[0]["trial_id"]) in best)
            if (number := number_of(trial)) is not None:
                wanted[number] = trial
        ok = not any(e.state.is_finished() for n, e in self.entries.items() if n not in wanted)
        if not ok:
            self.entries = {n: e for n, e in self.entries.items() if n in wanted or not e.state.is_finished()}
        for number in sorted(wanted):
            ok = self._put(wanted[number], write=ok) and ok
        if not ok:
            self._rewrite()
        self.upload(force=True)

    def _put(self, trial: FrozenTrial, *, write: bool = True) -> bool:
        """Bring trial's entry up to date in place; False if only a rewrite can (self.entries then holds it)."""
        number = number_of(trial)
        assert number is not None  # every caller hands over a trial of results.parquet, which has its trial_number
        known = self.entries.get(number)
        if known is not None and _content(known) == _content(trial):
            return True
        if not write or (known is not None and not self._updatable(known, trial)):
            self.entries[number] = trial
            return False
        if known is None:
            for gap in range(len(self.entries), number):  # entries 0..n-1 exist: Optuna numbers in order
                self._create(placeholder(gap))
            if number < len(self.entries):  # not a gap: the entries are out of order (a hand-made journal)
                self.entries[number] = trial
                return False
            self._create(trial)
            return True
        trial_id = self._id(number)
        for name, value in trial.params.items():
            if name not in known.params or known.params[name] != value:
                distribution = trial.distributions[name]
                self.storage.set_trial_param(trial_id, name, distribution.to_internal_repr(value), distribution)
        for epoch, value in trial.intermediate_values.items():
            if known.intermediate_values.get(epoch) != value:
                self.storage.set_trial_intermediate_value(trial_id, epoch, value)
        for key, value in trial.user_attrs.items():
            if key not in known.user_attrs or known.user_attrs[key] != value:
                self.storage.set_trial_user_attr(trial_id, key, value)
        if trial.constraints and trial.constraints != known.constraints:  # set once, as the trial ends
            study = optuna.load_study(study_name=self.folder.name, storage=self.storage)
            for key, value in trial.constraints.items():
                optuna.Trial(study, trial_id).set_constraint(key, value)
        if trial.state != known.state:
            self.storage.set_trial_state_values(trial_id, trial.state, trial.values)
        self.entries[number] = self.storage.get_trial(trial_id)
        return True

    @staticmethod
    def _updatable(known: FrozenTrial, trial: FrozenTrial) -> bool:
        """Whether Optuna lets `known` become `trial` by appending: it has not ended, and only gains."""
        return (not known.state.is_finished()
                and not (known.state == TrialState.RUNNING and trial.state == TrialState.WAITING)
                and known.params.keys() <= trial.params.keys()
                and known.intermediate_values.keys() <= trial.intermediate_values.keys()
                and known.user_attrs.keys() <= trial.user_attrs.keys())

    def _create(self, trial: FrozenTrial) -> None:
        number = number_of(trial)
        assert number is not None  # _put's trial, or a placeholder: both have a trial_number
        trial_id = self.storage.create_new_trial(self.study_id, template_trial=trial)
        self.entries[number] = self.storage.get_trial(trial_id)

    def _id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def _rewrite(self) -> None:
        """Write every entry, in number order, to a new journal beside this one, and move it over; what other
        processes wrote (study and trial attributes) is carried over, and a trial they ended otherwise is noted."""
        folder, name = os.path.split(self.path)
        temporary = os.path.join(folder, f".{name}.{uuid.uuid4().hex}.tmp")
        theirs, study_attrs = self._as_the_file_holds()
        if self.foreign:
            numbers = ", ".join(str(t.number) for t in self.foreign)
            self.overridden.append(f"optuna.journal: {len(self.foreign)} trial(s) another process added to the "
                                   f"study (Optuna number {numbers}, no trial_number: study.ask()?) are left out "
                                   "of it: its trials are results.parquet's, numbered as there; to add configs "
                                   "to a search, use experiment.enqueue or a warm start")
        try:
            self._open(temporary)
            self._backend.holding = True  # the whole journal in one append
            for key, value in study_attrs[0].items():
                self.storage.set_study_user_attr(self.study_id, key, value)
            for key, value in study_attrs[1].items():
                self.storage.set_study_system_attr(self.study_id, key, value)
            top = max(self.entries, default=-1)
            ordered = [self.entries.get(n) or placeholder(n) for n in range(top + 1)]
            for number, trial in enumerate(ordered):
                self.storage.create_new_trial(self.study_id, template_trial=self._with_theirs(trial, theirs.get(number)))
            self._backend.commit()
            os.replace(temporary, self.path)  # readers see the old journal or the new one, whole
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        self._reopen()
        self.upload(force=True)

    def _as_the_file_holds(self) -> tuple[dict[int, FrozenTrial], tuple[dict, dict]]:
        """The file's entries by number and the study's (user, system) attributes, others' writes included."""
        ours = self.entries
        try:
            self._reopen()
            return (dict(self.file_entries),
                    (self.storage.get_study_user_attrs(self.study_id), self.storage.get_study_system_attrs(self.study_id)))
        except Exception:  # a file that does not read (the case that makes a rewrite): nothing to carry over
            return {}, ({}, {})
        finally:
            self.entries = ours

    def _with_theirs(self, trial: FrozenTrial, found: FrozenTrial | None) -> FrozenTrial:
        """`trial` with the attributes another process gave its entry; a state it gave noted (ours stands)."""
        if found is None:
            return trial
        if found.state.is_finished() and found.state != trial.state and trial.state.is_finished():
            self.overridden.append(f"trial #{number_of(trial)}: another process set its entry in optuna.journal to "
                                   f"{found.state.name}; results.parquet says {trial.user_attrs.get('status')}, "
                                   f"and the journal, its view, says {trial.state.name} again")
        merged = copy.deepcopy(trial)
        merged.user_attrs = {**found.user_attrs, **trial.user_attrs}
        merged.system_attrs = {**found.system_attrs, **trial.system_attrs}
        return merged

    def _reopen(self) -> None:
        """Read the journal file anew: its entries as the file holds them."""
        self._open(self.path)
        trials = self.storage.get_all_trials(self.study_id, deepcopy=False)
        self.foreign = [t for t in trials if number_of(t) is None]  # added by another process (study.ask())
        self.file_entries = {number: t for t in trials if (number := number_of(t)) is not None}
        self.entries = dict(self.file_entries)

    def upload(self, *, force: bool) -> None:
        """On URI storage, copy the journal into the run folder; unless forced, at most ~5% of the time."""
        if not is_uri(self.folder.path):
            return
        if self._holding:  # held changes are not in the file yet: the commit uploads
            self._upload_due = self._upload_due or force
            return
        now = time.monotonic()
        if not force and now - self._uploaded_at < self._upload_seconds / self.UPLOAD_SHARE:
            return
        with open(self.path, "rb") as f:
            data = f.read()
        self.folder.storage.write(f"{self.folder.name}/{JOURNAL_FILE}", data)
        self._upload_due = False
        self._uploaded_at = time.monotonic()
        self._upload_seconds = self._uploaded_at - now


def sync_journal(folder: RunFolder, space: Space, frame: pd.DataFrame, notes: list[str]) -> None:
    """optuna.journal as results.parquet holds the trials, at the end of a search: entry k is trial_number k.

    A journal that does not read, or whose last line a kill cut short (the next append would
    make it unreadable), is moved aside and written anew from results.parquet, as the results are.
    On URI storage the journal is the driver's local copy (local_journal_path), copied into the run folder.
    """
    path = local_journal_path(folder.path)
    try:
        if os.path.exists(path) and os.path.getsize(path) and not _ends_a_line(path):
            raise ValueError("its last line is cut short")
        journal = Journal(folder, space)
        journal.sync(frame)
        notes.extend(journal.overridden)
        return
    except Exception as failure:
        damage = f"{type(failure).__name__}: {failure}"
    aside = f"{path}.damaged"
    try:
        os.replace(path, aside)
        Journal(folder, space).sync(frame)
        notes.append(f"{JOURNAL_FILE} could not be used ({damage}); it was moved to {aside} and written anew "
                     "from results.parquet")
    except Exception as failure:  # the journal is a view; it must never fail the search
        notes.append(f"{JOURNAL_FILE} not brought up to date ({damage}; then {type(failure).__name__}: {failure})")


def _ends_a_line(path: str) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"
