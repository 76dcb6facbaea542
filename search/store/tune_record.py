"""Tune's record of a run, in its run folder: Tune's experiment state (each trial's status and config), one
folder per trial (result.json, checkpoints), the searcher's record of the same moment (searcher.json), and
statuses.json, the statuses the end of the search read. Read through Tune's public API (ExperimentAnalysis,
Tuner.can_restore), never parsed here; search/store/run_folder.py's RunFolder.record gives it.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow.fs as pafs

from search.store.results import RECORD_FILE as TRIAL_RECORD
from search.store.searcher_record import RECORD_FILE, record_from_json
from trainable.errors import ConfigError, problem

if TYPE_CHECKING:  # Ray Tune is imported where a run's state is read (analysis)
    from ray import tune

    from search.store.run_folder import RunFolder

STATUSES_FILE = "statuses.json"


@dataclass(frozen=True)
class TuneRecord:
    """Tune's record in `folder`."""

    folder: RunFolder

    def analysis(self) -> tune.ExperimentAnalysis:
        """Tune's newest saved state of this run, as Tune reads it; ValueError if there is none or it does not read.

        It reads every trial's result.json too (ExperimentAnalysis has no way to skip them): about
        2.4 ms per trial of two reports, 2.4 s at 1,000 trials and 20 s at 10,000 (parsing Tune's state
        file ourselves took 0.1 s); Tune's trials as objects take most of the time and over 1 GB. Paid when a
        stopped search ends, and when a resume finds no statuses.json of Tune's present state (_statuses).
        """
        from ray import tune  # here: `report`, `runs`, `export` and `compare` start without Ray Tune

        if not tune.Tuner.can_restore(self.folder.path):
            raise ValueError(f"no saved experiment state of Tune in {self.folder.path}")
        quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # a trial with no result.json yet is no news here
        try:
            fs, base = self.folder.fs()
            return tune.ExperimentAnalysis(base, storage_filesystem=fs)
        except Exception as error:  # what a damaged file raises depends on where it breaks
            raise ValueError(f"Tune's experiment state in {self.folder.path} cannot be read "
                             f"({type(error).__name__}: {error})") from None
        finally:
            quiet.setLevel(level)

    def saved_trials(self) -> dict[str, tuple[str, dict[str, Any] | None]]:
        """Trial id -> (status, config) as Tune last saved them; {} if there is no readable state."""
        try:
            return dict(_saved_trials(self, self.state_stamp()))  # a copy: the kept one stays as Tune wrote it
        except ValueError:
            return {}

    def saved_statuses(self) -> dict[str, str]:
        """Trial id -> status as Tune last saved them; {} if there is no readable state."""
        try:
            return self.statuses()
        except ValueError:
            return {}

    def statuses(self) -> dict[str, str]:
        """saved_statuses, ValueError where Tune's record does not read. statuses.json answers while Tune's
        state files are the ones the end of the search found (Tune wrote them, and they read then): reading
        the record takes 20 s and over 1 GB at 10,000 trials, and a --resume asks up to four times."""
        from ray import tune  # here: `report`, `runs`, `export` and `compare` start without Ray Tune

        if not tune.Tuner.can_restore(self.folder.path):  # whatever statuses.json and the cached record say
            raise ValueError(f"no saved experiment state of Tune in {self.folder.path}")
        stamp = self.state_stamp()
        kept = self.folder.storage.read(f"{self.folder.name}/{STATUSES_FILE}")
        if stamp and kept is not None:
            try:
                record = json.loads(kept)
                if [tuple(s) for s in record["experiment_state"]] == list(stamp):
                    return dict(record["statuses"])
            except (ValueError, KeyError, TypeError):  # damaged: Tune's record answers
                pass
        return {trial_id: status for trial_id, (status, _) in _saved_trials(self, stamp).items()}

    def keep_statuses(self, statuses: dict[str, str]) -> None:
        """statuses.json: every trial's status as the end of the search found it in Tune's record (or, where
        Tune ran to its end, in the trials it returned), with Tune's state files as they are now, after its
        last save; nothing where there is no state or no trial."""
        stamp = self.state_stamp()
        if stamp and statuses:
            self.folder.storage.write(f"{self.folder.name}/{STATUSES_FILE}",
                               json.dumps({"experiment_state": stamp, "statuses": statuses}).encode())

    def missing(self, trial_ids) -> list[str]:
        """The trials among `trial_ids` whose folder has no result.json (Tune's record of its reports):
        one call that looks each file up, without reading it (reading 10,000 of them took seconds)."""
        fs, base = self.folder.fs()
        paths = [f"{base}/trial_{t}/{TRIAL_RECORD}" for t in trial_ids]  # tuner.trial_folder_name
        return [t for t, info in zip(trial_ids, fs.get_file_info(paths)) if info.type == pafs.FileType.NotFound]

    def state_stamp(self) -> tuple[tuple[str, int | None, int | None], ...]:
        """Tune's experiment-state files here, by name, size and modification time: a new snapshot
        changes it, so _saved_trials reads Tune's record again only after Tune has written one."""
        fs, base = self.folder.fs()
        try:
            infos = fs.get_file_info(pafs.FileSelector(base))
        except OSError:
            return ()
        return tuple(sorted((i.base_name, i.size, i.mtime_ns) for i in infos
                            if i.base_name.startswith("experiment_state")))

    def searcher_state(self) -> dict[str, Any]:
        """OrderedSearch's record as of Tune's last snapshot (searcher.json), {} if there is none or it does not read.

        Its `waits` and `suggested` map trial numbers (int) to seconds and to (unix time, seconds).
        """
        data = self.folder.storage.read(f"{self.folder.name}/{RECORD_FILE}")
        if data is None:  # reproducible: false (OptunaSearch), or no snapshot yet
            return {}
        try:
            return record_from_json(data)
        except ValueError:
            return {}

    def check(self) -> None:
        """Tune's experiment state (and the searcher's record) must read, or Tune would silently
        start the search over: ConfigError, saying so."""
        fix = ("Tune's record of this run is damaged, and resuming would start the search over. "
               "Restore the file from a copy, or start a new run (its finished trials stay in "
               "results.parquet and in the trial folders)")
        try:
            self.statuses()
            record = self.folder.storage.read(f"{self.folder.name}/{RECORD_FILE}")
            if record is not None:
                try:
                    record_from_json(record)
                except ValueError as error:
                    raise ValueError(f"{self.folder.storage.join(self.folder.name, RECORD_FILE)} cannot be read ({error})") from None
        except ValueError as error:
            raise ConfigError([problem("--resume", f"{error}. {fix}", self.folder.name)]) from None


@functools.lru_cache(maxsize=2)
def _saved_trials(record: TuneRecord, stamp: tuple) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """Trial id -> (status, config) of Tune's record `record` as of `stamp` (TuneRecord.state_stamp);
    ValueError if it does not read.

    Kept per stamp (the newest two: small, ids, statuses and configs) because a resume of a run
    without statuses.json asks three times before Tune starts (RunFolder.check_record, ResultParts.drop_unrecorded,
    finished), and each read of Tune's record reads every trial's result.json: at 10,000 trials the
    --resume of a finished run took 99 s, 20 s of it each read.
    """
    return {trial.trial_id: (trial.status, trial.config if isinstance(trial.config, dict) else None)
            for trial in record.analysis().trials}
