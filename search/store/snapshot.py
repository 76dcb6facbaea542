"""tune_state.zip: each of Tune's snapshots of a run on URI storage, as one object, so that a killed driver's run
resumes whole.

Tune saves its state to a staging folder on the driver (its experiment state, its search algorithm's state, the
searcher's record searcher.json), then uploads that folder to the run folder file by file, in the background,
every trial's result.json with it. On a local disk that takes milliseconds. On an object store a driver killed
mid-upload (SIGKILL, a lost head) left files of different moments in the run folder, and the resume read them
as one: Tune's state held trials the searcher's record did not (it numbered them again: one trial number twice,
another never run), or the other way round (a number never run); its count of trials started was not its
trials' (one too few); a result.json lacked the epochs of the checkpoint the state named (rows lost), or held
epochs after it (run again); and the state named a checkpoint that Tune's num_to_keep had deleted since (Tune
refused the trial).

So on URI storage, when Tune saves (it asks every callback for its state once its own files are written, before
it uploads them), TuneStateCopy reads those files, and the result.json of every trial that had not ended by the
previous snapshot, from the staging folder, and writes them to the run folder as one zip. An object store
replaces an object whole, so the zip holds one moment; it is written before Tune's upload starts, so it is never
older than Tune's files there. `--resume` puts its files back in the run folder where they differ (`restore`)
before anything reads Tune's record. The checkpoints it names stay: the driver keeps num_to_keep on every
storage (search/store/retention.py) and deletes a checkpoint only once two later snapshots no longer name it.

A SIGKILL then loses what happened since Tune's last snapshot (at least 10 s apart, about 5% of the driver's time,
this write included): trials that ended since run again with the same numbers, configs and seeds, and running
ones continue from the checkpoints it names (docs/stops-and-resume.md).
"""

from __future__ import annotations

import io
import os
import sys
import zipfile
from typing import Iterable, Mapping, cast

from ray import tune
from ray.tune.experiment import Trial

from search.store.results import RECORD_FILE
from search.store.run_folder import RunFolder
from search.store.searcher_record import RECORD_FILE as SEARCHER_RECORD
from search.store.storage import is_uri

SNAPSHOT_FILE = "tune_state.zip"
# A snapshot's files at the top of Tune's folder, beside searcher.json: Tune's experiment state, and its search
# algorithm's (its counter of trials, OptunaSearch's pickle under reproducible: false, pbt's variant generator).
# Not its callbacks' state, written after it asks for it: none of hpsearch's callbacks keeps one there.
TUNE_STATE = ("experiment_state-", "search_gen_state-", "searcher-state-", "basic-variant-state-")


def snapshot_files(staging: str, trial_folders: Iterable[str]) -> dict[str, bytes]:
    """Tune's state files in its staging folder as it has just saved them, and each of `trial_folders`'
    result.json, by their paths in the run folder."""
    files = {}
    for entry in sorted(os.scandir(staging), key=lambda e: e.name):
        if entry.is_file() and (entry.name.startswith(TUNE_STATE) or entry.name == SEARCHER_RECORD):
            with open(entry.path, "rb") as f:
                files[entry.name] = f.read()
    for folder in trial_folders:
        try:
            with open(os.path.join(folder, RECORD_FILE), "rb") as f:
                files[f"{os.path.basename(folder.rstrip('/'))}/{RECORD_FILE}"] = f.read()
        except FileNotFoundError:  # not started in this process: its record in the run folder stands
            pass
    return files


def pack(files: Mapping[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bundle:
        for name, data in files.items():
            bundle.writestr(name, data)
    return out.getvalue()


def unpack(data: bytes) -> dict[str, bytes]:
    """pack's inverse; ValueError if `data` is no zip, or names a path outside the run folder."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as bundle:
            files = {name: bundle.read(name) for name in bundle.namelist()}
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ValueError(f"not a zip ({error})") from None
    for name in files:
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"it names {name!r}, outside the run folder")
    return files


class TuneStateCopy(tune.Callback):
    """On URI storage, writes tune_state.zip at each of Tune's snapshots (module docstring)."""

    def __init__(self, folder: RunFolder):
        self.folder = folder
        self._reset()

    def _reset(self) -> None:
        self._trials: list[Trial] = []  # Tune's own list of the run's trials (on_step_begin)
        self._ended: set[str] = set()  # trials that ended since the last snapshot: their records go in it once more
        self._failed = False  # one note

    def __getstate__(self) -> dict:
        return {"folder": self.folder}  # Tune pickles its callbacks when the run starts; the rest is this process's

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def on_step_begin(self, iteration, trials, **info) -> None:
        self._trials = trials  # Tune saves at the end of a step, and adds its new trials to this list

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended.add(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended.add(trial.trial_id)

    def get_state(self) -> None:
        """Tune is saving its state (and asks nothing of this callback to keep): its files go in one zip now."""
        if not self._trials:  # no trial yet: nothing that a resume could read in part
            return None
        # Ray types Trial.local_path Optional, but it is its storage's staging path: a str, or it raises
        folders = [cast(str, t.local_path) for t in self._trials
                   if t.status not in (Trial.TERMINATED, Trial.ERROR) or t.trial_id in self._ended]
        try:
            files = snapshot_files(self._trials[0].local_experiment_path, folders)
            self.folder.storage.write(f"{self.folder.name}/{SNAPSHOT_FILE}", pack(files))
            self._ended = set()
        except Exception as failure:  # the search goes on; a resume after a kill may then read Tune's files in part
            if not self._failed:
                self._failed = True
                print(f"note: Tune's state not copied to {self.folder.storage.join(self.folder.name, SNAPSHOT_FILE)} "
                      f"({type(failure).__name__}: {failure}); a resume after the driver is killed may find Tune's "
                      "files there uploaded in part", file=sys.stderr, flush=True)
        return None


def restore(folder: RunFolder) -> list[str]:
    """Before a resume on URI storage: the files of tune_state.zip put back in the run folder where they differ
    (module docstring); the names of Tune's state files among them (not the trials' records)."""
    if not is_uri(folder.path):
        return []
    data = folder.storage.read(f"{folder.name}/{SNAPSHOT_FILE}")
    if data is None:  # a run started before the copy was kept, or one that never saved with a trial
        return []
    try:
        files = unpack(data)
    except ValueError as error:
        print(f"note: {folder.storage.join(folder.name, SNAPSHOT_FILE)} does not read ({error}); Tune's files in "
              "the run folder are resumed as they are", file=sys.stderr, flush=True)
        return []
    restored = []
    for name, content in files.items():
        if folder.storage.read(f"{folder.name}/{name}") != content:
            folder.storage.write(f"{folder.name}/{name}", content)
            restored.append(name)
    return [name for name in restored if "/" not in name]
