"""The run folder, `<storage_path>/<name>/`: claimed once, the resolved spec, the derived files.

    spec.yaml        the space as resolved at start (defaults, flags, absolute references);
                     written once, and what `--resume` runs
    <Tune's files>   experiment state and one folder per trial (result.json, checkpoints):
                     the record of the search, read through Tune's public API (ExperimentAnalysis,
                     Tuner.can_restore), never parsed here
    searcher.json    OrderedSearch's record (search/searching/ordered.py), saved with each of Tune's snapshots
    results.parquet  a folder of Parquet parts, one per trial, derived from the record
    best.yaml        the best trial's config and outcome, derived from the record
    gpu_probe.json   resources.gpus: auto: the probe's figures and the choice (search/execution/gpu_probe.py);
                     written once, before the trials, and what --resume keeps
    statuses.json    every trial's status in Tune's record, as the end of the search found it, with the
                     names, sizes and times of Tune's state files then: a --resume finds a finished run
                     without reading Tune's record while those files are unchanged
    tune_state.zip   on URI storage, Tune's last snapshot as one object, which a --resume puts back first
                     (search/store/snapshot.py)

Derived files are rewritten from the record, never merged with an older copy of themselves.
"""

from __future__ import annotations

from dataclasses import replace

import fcntl
import functools
import hashlib
import io
import json
import logging
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import yaml

from search.definition.schema import run_name_problem
from search.definition.space import Space, parse_space, to_raw
from search.store.results import RECORD_FILE as TRIAL_RECORD
from search.store.results import RESULTS_FILE, is_json, results_schema, table, table_bytes
from search.store.searcher_record import RECORD_FILE, record_from_json
from search.store.storage import Storage, apply_options, is_uri, split_query
from trainable.errors import ConfigError, problem
from trainable.yaml_file import Loader, dump_yaml

if TYPE_CHECKING:  # Ray Tune is imported where a run's state is read (RunFolder.analysis)
    from ray import tune

SPEC_FILE = "spec.yaml"
BEST_FILE = "best.yaml"
PROBE_FILE = "gpu_probe.json"
STATUSES_FILE = "statuses.json"
LOCK_FILE = ".lock"  # held by the process that searches the run (RunFolder.held)
RUN_SECTION = "run"  # spec.yaml's record of where and with what the run started; not part of the space


def spec_hash(raw: dict[str, Any]) -> str:
    """A hash of what a run searches: spec.yaml's space section as written (to_raw), less data.root
    (where the files are, which a resume may change; the data's fingerprint checks what they are).

    Taken of the file's text as written, not of the space parsed again, so a spec written by an
    earlier release, before a key with a default existed, still matches and resumes."""
    raw = dict(raw)
    if "data" in raw:  # a function trainable's space has none
        raw["data"] = {k: v for k, v in raw["data"].items() if k != "root"}
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()


def versions() -> dict[str, str]:
    """Versions that change what a seeded search does (Optuna's defaults moved in 5.0)."""
    out = {}
    for package in ("hpsearch", "torch", "ray", "optuna", "numpy"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "unknown"
    return out


@dataclass(frozen=True)
class RunFolder:
    storage: Storage
    name: str

    @property
    def path(self) -> str:
        return self.storage.join(self.name)

    def trial_path(self, tune_path: str) -> str:
        """A trial's folder as the user reaches it: Tune's path has no scheme on object storage (s3://...)."""
        return self.storage.join(self.name, tune_path.rstrip("/").rsplit("/", 1)[-1])

    def exists(self) -> bool:
        return self.storage.exists(self.name)

    def claim(self) -> None:
        """Create the folder, failing if it exists: of two searches started with one name, one runs.

        Atomic on a local filesystem (mkdir). Object stores have no atomic create; there the
        check and the create are two steps.
        """
        taken = ConfigError([problem("--name", f"{self.path} already holds a search; pass --resume to "
                                               "continue it or choose another --name", self.name)])
        if is_uri(self.storage.uri):
            fs, base = pafs.FileSystem.from_uri(self.storage.uri)
            if fs.get_file_info(f"{base.rstrip('/')}/{self.name}").type != pafs.FileType.NotFound:
                raise taken
            fs.create_dir(f"{base.rstrip('/')}/{self.name}", recursive=True)
            return
        os.makedirs(self.storage.uri, exist_ok=True)
        try:
            os.mkdir(self.path)
        except FileExistsError:
            raise taken from None

    def release(self) -> None:
        """Undo claim() when the search could not start: remove the folder if it holds only spec.yaml
        (and gpu_probe.json), on a local folder or a storage URI alike."""
        fs, base = self._fs()
        if fs.get_file_info(base).type != pafs.FileType.Directory:
            return
        names = {info.base_name for info in fs.get_file_info(pafs.FileSelector(base))}
        if names <= {SPEC_FILE, PROBE_FILE, LOCK_FILE}:
            fs.delete_dir(base)

    def check_no_links(self, key: str) -> None:
        """A run folder whose folders link elsewhere is refused: its outputs would land outside it."""
        if is_uri(self.path):
            return
        for where, folders, _ in os.walk(self.path):
            for name in folders:
                if os.path.islink(os.path.join(where, name)):
                    link = os.path.join(where, name)
                    raise ConfigError([problem(key, f"{link} is a symbolic link (to {os.readlink(link)}); hpsearch "
                                                    "writes nothing outside the run folder: replace the link with a "
                                                    "folder", self.name)])

    @contextmanager
    def held(self, key: str):
        """Hold the run for this process while it searches: a second search or resume of it is
        refused with exit 2, as a second claim of a new run's name is.

        A file lock (flock) on `.lock` in a local run folder: Linux releases it when the process
        ends, a SIGKILL included, so a dead holder never blocks a resume. Object stores have no
        such lock; there two resumes at once are not prevented (docs/stops-and-resume.md).
        """
        if is_uri(self.path):
            yield
            return
        fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError([problem(key, f"{self.path} is being searched right now ({holder}); wait for that "
                                            "process to end (or stop it), then resume", self.name)]) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        try:
            yield
        finally:
            os.close(fd)  # the lock goes with the descriptor

    def write_spec(self, space: Space, data: dict[str, Any] | None = None, run: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
        """spec.yaml, its one writer: the space as resolved, and how the run started (where, with what
        versions, the data's fingerprint, and a hash of the space that a resume checks: an edited spec
        is refused). `run`: the run section a resume read, kept with its changes (run.resumed_with);
        None: a new run's. Returns the run section written."""
        raw = to_raw(space)
        if run is None:
            run = {"name": self.name, "path": self.path, "source": space.source, "versions": versions(), "data": data}
            if space.sampler_choice:  # sampler: auto's choice and why: a resume reads it back (search/searching/choice.py)
                run["sampler_choice"] = space.sampler_choice
        run = {**run, "spec_sha256": spec_hash(raw)}
        changed = ", and the\n# changes of its resumes (run.resumed_with)." if run.get("resumed_with") else ".\n#"
        header = (f"# The resolved spec of search {self.name}: {space.source} after defaults and flags{changed} "
                  f"--resume runs this file, not the space file. Do not edit: a resume refuses an edited spec.\n")
        text = dump_yaml({RUN_SECTION: run, **raw})
        self.storage.write(f"{self.name}/{SPEC_FILE}", (header + text).encode())
        return run

    def read_spec(self, key: str = "--resume") -> tuple[Space, dict[str, Any]]:
        """The stored spec and its run section; ConfigError if missing or unreadable.

        `key` names what needed it in the message: --resume (which then advises a new run), or RUN for
        the commands that read a run folder (report, export)."""
        data = self.storage.read(f"{self.name}/{SPEC_FILE}")
        where = self.storage.join(self.name, SPEC_FILE)
        resuming = key == "--resume"
        if data is None:
            raise ConfigError([problem(key, f"{where} is missing: this run was not started by this version of "
                                            "hpsearch (or its folder is damaged), so it cannot be "
                                            + ("resumed faithfully; start a new run" if resuming else "read"),
                                       self.name)])
        try:
            raw = yaml.load(data.decode("utf-8"), Loader=Loader)
            run = raw.pop(RUN_SECTION)
            written = spec_hash(raw)
            # messages and the printed commands name the space file the run was started from
            space = parse_space(raw, source=run.get("source") or where)
            # sampler: auto chose once, when the run started: the spec names that sampler, the run section why
            space = replace(space, sampler_choice=run.get("sampler_choice"))
        except ConfigError:
            raise
        except Exception as error:
            raise ConfigError([problem(key, f"{where} cannot be read ({type(error).__name__}: {error})"
                                            + ("; start a new run" if resuming else ""), self.name)]) from None
        if resuming and run.get("spec_sha256") not in (None, written):  # runs from before the hash pass
            raise ConfigError([problem("--resume", f"{where} was edited after the run started; a resume runs the "
                                                   "search as it started (Tune's record holds its trials and their "
                                                   "count), so undo the edit, or start a new run from a space file "
                                                   "with the change", self.name)])
        return space, run

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        return pafs.FileSystem.from_uri(self.path) if is_uri(self.path) else (pafs.LocalFileSystem(), self.path)

    def analysis(self) -> tune.ExperimentAnalysis:
        """Tune's newest saved state of this run, as Tune reads it; ValueError if there is none or it does not read.

        It reads every trial's result.json too (ExperimentAnalysis has no way to skip them): about
        2.4 ms per trial of two reports, 2.4 s at 1,000 trials and 20 s at 10,000 (parsing Tune's state
        file ourselves took 0.1 s); Tune's trials as objects take most of the time and over 1 GB. Paid when a
        stopped search ends, and when a resume finds no statuses.json of Tune's present state (_statuses).
        """
        from ray import tune  # here: `report`, `runs`, `export` and `compare` start without Ray Tune

        if not tune.Tuner.can_restore(self.path):
            raise ValueError(f"no saved experiment state of Tune in {self.path}")
        quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
        level = quiet.level
        quiet.setLevel(logging.ERROR)  # a trial with no result.json yet is no news here
        try:
            fs, base = self._fs()
            return tune.ExperimentAnalysis(base, storage_filesystem=fs)
        except Exception as error:  # what a damaged file raises depends on where it breaks
            raise ValueError(f"Tune's experiment state in {self.path} cannot be read "
                             f"({type(error).__name__}: {error})") from None
        finally:
            quiet.setLevel(level)

    def saved_trials(self) -> dict[str, tuple[str, dict[str, Any] | None]]:
        """Trial id -> (status, config) as Tune last saved them; {} if there is no readable state."""
        try:
            return dict(_saved_trials(self, self._state_stamp()))  # a copy: the kept one stays as Tune wrote it
        except ValueError:
            return {}

    def saved_statuses(self) -> dict[str, str]:
        """Trial id -> status as Tune last saved them; {} if there is no readable state."""
        try:
            return self._statuses()
        except ValueError:
            return {}

    def _statuses(self) -> dict[str, str]:
        """saved_statuses, ValueError where Tune's record does not read. statuses.json answers while Tune's
        state files are the ones the end of the search found (Tune wrote them, and they read then): reading
        the record takes 20 s and over 1 GB at 10,000 trials, and a --resume asks up to four times."""
        from ray import tune  # here: `report`, `runs`, `export` and `compare` start without Ray Tune

        if not tune.Tuner.can_restore(self.path):  # whatever statuses.json and the cached record say
            raise ValueError(f"no saved experiment state of Tune in {self.path}")
        stamp = self._state_stamp()
        kept = self.storage.read(f"{self.name}/{STATUSES_FILE}")
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
        stamp = self._state_stamp()
        if stamp and statuses:
            self.storage.write(f"{self.name}/{STATUSES_FILE}",
                               json.dumps({"experiment_state": stamp, "statuses": statuses}).encode())

    def records_missing(self, trial_ids) -> list[str]:
        """The trials among `trial_ids` whose folder has no result.json (Tune's record of its reports):
        one call that looks each file up, without reading it (reading 10,000 of them took seconds)."""
        fs, base = self._fs()
        paths = [f"{base}/trial_{t}/{TRIAL_RECORD}" for t in trial_ids]  # tuner.trial_folder_name
        return [t for t, info in zip(trial_ids, fs.get_file_info(paths)) if info.type == pafs.FileType.NotFound]

    def _state_stamp(self) -> tuple[tuple[str, int | None, int | None], ...]:
        """Tune's experiment-state files here, by name, size and modification time: a new snapshot
        changes it, so _saved_trials reads Tune's record again only after Tune has written one."""
        fs, base = self._fs()
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
        data = self.storage.read(f"{self.name}/{RECORD_FILE}")
        if data is None:  # reproducible: false (OptunaSearch), or no snapshot yet
            return {}
        try:
            return record_from_json(data)
        except ValueError:
            return {}

    def check_record(self) -> None:
        """Tune's experiment state (and the searcher's record) must read, or Tune would silently
        start the search over.

        Also says which parts of results.parquet are unreadable: the end of the search
        writes every trial's part again from Tune's records.
        """
        fix = ("Tune's record of this run is damaged, and resuming would start the search over. "
               "Restore the file from a copy, or start a new run (its finished trials stay in "
               "results.parquet and in the trial folders)")
        try:
            self._statuses()
            record = self.storage.read(f"{self.name}/{RECORD_FILE}")
            if record is not None:
                try:
                    record_from_json(record)
                except ValueError as error:
                    raise ValueError(f"{self.storage.join(self.name, RECORD_FILE)} cannot be read ({error})") from None
        except ValueError as error:
            raise ConfigError([problem("--resume", f"{error}. {fix}", self.name)]) from None
        fs, base = self._fs()
        parts = f"{base}/{RESULTS_FILE}"
        if fs.get_file_info(parts).type == pafs.FileType.Directory:
            for info in fs.get_file_info(pafs.FileSelector(parts)):
                if not info.base_name.endswith(".parquet"):
                    continue
                try:
                    with fs.open_input_file(info.path) as stream:
                        pq.read_table(io.BytesIO(stream.read()))
                except (pa.ArrowException, OSError) as error:
                    print(f"note: {info.path} is unreadable ({error}); it is rebuilt from Tune's records when "
                          "the search ends", file=sys.stderr, flush=True)

    def ended_trials(self) -> list[str]:
        """Ids of the trials whose part of results.parquet is written (they ended)."""
        fs, base = self._fs()
        parts = f"{base}/{RESULTS_FILE}"
        if fs.get_file_info(parts).type != pafs.FileType.Directory:
            return []
        return [i.base_name[:-len(".parquet")] for i in fs.get_file_info(pafs.FileSelector(parts))
                if i.base_name.endswith(".parquet")]

    def drop_unrecorded_parts(self) -> list[str]:
        """Remove the results parts of trials that Tune's last snapshot does not hold; their ids.

        They ended after that snapshot (Tune's own rule, search/execution/tuner.py), before the driver was killed. A
        resume runs them again under new ids (with the same trial numbers, configs and seeds in
        a reproducible search) and writes their parts anew; kept, they would be counted twice.
        """
        recorded = set(self.saved_statuses())
        dropped = [t for t in self.ended_trials() if t not in recorded]
        fs, base = self._fs()
        for trial_id in dropped:
            fs.delete_file(f"{base}/{RESULTS_FILE}/{trial_id}.parquet")
        return dropped

    def results_damage(self) -> str | None:
        """What makes results.parquet unreadable as a whole, said for the user; None if nothing does.

        Only a folder of parts with no part in it counts here (a crash before the first trial ended
        left it, or the parts were deleted): pandas reads it as a frame without a column, which
        every reader of the run then trips on. A run with no results.parquet at all has not ended
        a trial yet: that is a state, not damage (a running search, an interrupted one to resume).
        Listing the folder costs one call, so every command that opens a run can afford it."""
        fs, base = self._fs()
        parts = f"{base}/{RESULTS_FILE}"
        if fs.get_file_info(parts).type != pafs.FileType.Directory or self.ended_trials():
            return None
        return f"{RESULTS_FILE} holds no results part: no trial of this run ended, or its parts were deleted; " \
               + self.rebuild_hint()

    def rebuild_hint(self) -> str:
        """How results.parquet is written again: a resume derives every part from Tune's record."""
        return (f"resuming the run writes its parts again from Tune's record (python -m search --space "
                f"{self.storage.join(self.name, SPEC_FILE)} --storage-path {self.storage.uri} --name {self.name} "
                "--resume)")

    def read_results(self) -> pd.DataFrame:
        """results.parquet as one frame, for the commands that read a run (runs, compare, report, export,
        a warm start); NoResults, naming the run and what is missing, where there is nothing to read
        (no results.parquet, a folder with no part, a part that does not read, no trial_id column)."""
        where = self.storage.join(self.name, RESULTS_FILE)
        if (damage := self.results_damage()) is not None:
            raise NoResults(f"{self.path}: {damage}")
        if not self.storage.exists(self.name, RESULTS_FILE):
            raise NoResults(f"{self.path}: has no {RESULTS_FILE} yet: no trial of this run has ended")
        try:
            frame = pd.read_parquet(where)
        except (OSError, ValueError) as error:  # ArrowInvalid is a ValueError: a part that is not Parquet
            raise NoResults(f"{self.path}: {RESULTS_FILE} cannot be read ({type(error).__name__}: {error}); "
                            + self.rebuild_hint()) from None
        if not {"trial_id", "status"} <= set(frame.columns):  # parts of another program, or empty ones
            raise NoResults(f"{self.path}: {RESULTS_FILE} holds no trial_id and status columns (not results of "
                            "hpsearch); " + self.rebuild_hint())
        return frame

    def write_part(self, space: Space, trial_id: str, rows: list[dict[str, Any]],
                   schema: pa.Schema | None = None) -> pa.Table:
        """One trial's rows as its part of results.parquet (replacing an earlier part); returns the part as
        written, whose to_pylist() is results.records(rows, schema) (its journal entry's, made once).

        `schema`: results_schema(space), if the caller holds it (it takes ms to make, per trial).
        """
        part = table(rows, schema or results_schema(space))
        self.storage.write(f"{self.name}/{RESULTS_FILE}/{trial_id}.parquet", table_bytes(part))
        return part

    def read_part(self, trial_id: str, schema: pa.Schema) -> list[dict[str, Any]]:
        """The rows of a trial's results part as written ([] if there is none or it does not read)."""
        data = self.storage.read(f"{self.name}/{RESULTS_FILE}/{trial_id}.parquet")
        if data is None:
            return []
        try:
            rows = pq.ParquetFile(io.BytesIO(data)).read().to_pylist()  # a third faster than pq.read_table
        except (pa.ArrowException, OSError):
            return []
        text = [f.name for f in schema if is_json(f)]
        for row in rows:  # back to values: table() writes them as JSON text again
            row.update({c: json.loads(row[c]) for c in text if isinstance(row.get(c), str)})
        return rows

    def part_epochs(self, trial_id: str) -> set[int]:
        """The epochs a trial's results part holds (none if there is no part or it does not read): the
        end of a search checks every part against Tune's record, and its epoch column alone reads in
        a fifth of the time of the whole part."""
        data = self.storage.read(f"{self.name}/{RESULTS_FILE}/{trial_id}.parquet")
        if data is None:
            return set()
        try:
            epochs = pq.ParquetFile(io.BytesIO(data)).read(columns=["epoch"]).column("epoch").to_pylist()
        except (pa.ArrowException, OSError, KeyError):
            return set()
        return {int(e) for e in epochs if e is not None}

    def write_probe(self, figures: dict[str, Any]) -> None:
        self.storage.write(f"{self.name}/{PROBE_FILE}", json.dumps(figures, indent=1).encode())

    def read_probe(self) -> dict[str, Any] | None:
        """gpu_probe.json's content; None if there is none or it does not read (then auto probes again)."""
        data = self.storage.read(f"{self.name}/{PROBE_FILE}")
        try:
            figures = json.loads(data) if data is not None else None
        except ValueError:
            return None
        return figures if isinstance(figures, dict) else None

    def write_best(self, text: str) -> str:
        self.storage.write(f"{self.name}/{BEST_FILE}", text.encode())
        return self.storage.join(self.name, BEST_FILE)


# ---- which run folder -------------------------------------------------------------------

# what an automatic run name adds to experiment.name: -YYYYMMDD-HHMMSS, and -k when that second was taken
RUN_TIME = re.compile(r"(?P<time>\d{8}-\d{6})(?:-(?P<k>[1-9]\d*))?")


def newest_run(names: list[str], experiment_name: str) -> str | None:
    """The latest of the folders named exactly `<experiment_name>-YYYYMMDD-HHMMSS[-k]`, by that time and k.

    Exactly: for the space `mnist`, `mnist-large-20261201-090000` is another space's run.
    """
    prefix = experiment_name + "-"
    runs = [((m["time"], int(m["k"] or 1)), n) for n in names
            if n.startswith(prefix) and (m := RUN_TIME.fullmatch(n[len(prefix):]))]
    return max(runs)[1] if runs else None


def run_folder_name(space: Space, storage: Storage, name: str | None, resume: bool) -> str:
    """The run's folder name; resuming without --name picks the newest run of this space."""
    if name is not None:
        if wrong := run_name_problem(name):
            raise ConfigError([wrong])
        exists = storage.exists(name)
        if resume and not exists:
            raise ConfigError([problem("--name", f"no search to resume at {storage.join(name)}", name)])
        if not resume and exists:
            raise ConfigError([problem("--name", f"{storage.join(name)} already holds a search; "
                                                 "pass --resume to continue it or choose another --name", name)])
        return name
    if resume:
        newest = newest_run(storage.list_dirs(), space.experiment.name)
        if newest is None:
            raise ConfigError([problem("--resume", f"no run named {space.experiment.name}-* under {storage.uri} "
                                                   "to resume (pass --name)", True)])
        return newest
    return f"{space.experiment.name}-{time.strftime('%Y%m%d-%H%M%S')}"


class NotARunFolder(ValueError):
    """The folder named as a run folder holds no spec.yaml."""


class NoResults(NotARunFolder):
    """A run folder whose results.parquet cannot be read as a whole (RunFolder.read_results,
    results_damage): a NotARunFolder, so every command that refuses a folder with exit 2 refuses it."""


@functools.lru_cache(maxsize=2)
def _saved_trials(folder: RunFolder, stamp: tuple) -> dict[str, tuple[str, dict[str, Any] | None]]:
    """Trial id -> (status, config) of Tune's record in `folder` as of `stamp` (RunFolder._state_stamp);
    ValueError if it does not read.

    Kept per stamp (the newest two: small, ids, statuses and configs) because a resume of a run
    without statuses.json asks three times before Tune starts (check_record, drop_unrecorded_parts,
    finished), and each read of Tune's record reads every trial's result.json: at 10,000 trials the
    --resume of a finished run took 99 s, 20 s of it each read.
    """
    return {trial.trial_id: (trial.status, trial.config if isinstance(trial.config, dict) else None)
            for trial in folder.analysis().trials}


def open_run(run: str, *, results: bool = True) -> RunFolder:
    """The run folder at `run` (a local path or a URI); NotARunFolder if it holds no spec.yaml.

    `results`: NoResults where its results.parquet is a folder with no part (RunFolder.results_damage):
    report, compare, export, check and a warm start read the results, and would fail on it with a
    KeyError far from the cause. False for a caller that needs only Tune's record (a restore)."""
    # a local folder by its absolute path, so `report .` and `report /` name a folder, not ""
    base, options = split_query(run) if is_uri(run) else (run, {})
    where = base.rstrip("/") if is_uri(run) else os.path.abspath(os.path.expanduser(run))
    parent, _, name = where.rpartition("/")
    apply_options(options)  # an endpoint in the URI's query (search/store/storage.py URI_OPTIONS)
    folder = RunFolder(Storage.at(parent or "/"), name)
    if not name or folder.storage.read(f"{name}/{SPEC_FILE}") is None:
        raise NotARunFolder(f"{run}: not a run folder of hpsearch (it has no {SPEC_FILE}); name a folder "
                            "like runs/mnist-20261130-101500")
    if results and (damage := folder.results_damage()) is not None:
        raise NoResults(f"{run}: {damage}")
    return folder
