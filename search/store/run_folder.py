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
RunFolder keeps the run's own files (the claim, spec.yaml, best.yaml, gpu_probe.json); Tune's record is
`folder.record` (search/store/tune_record.py) and results.parquet's parts `folder.parts`
(search/store/results_parts.py).
"""

from __future__ import annotations

from dataclasses import replace

import fcntl
import hashlib
import json
import os
import re
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import pyarrow.fs as pafs
import yaml

from search.definition.schema import run_name_problem
from search.definition.space import Space, parse_space, to_raw
from search.store.results_parts import NoResults, NotARunFolder, ResultParts  # noqa: F401  (their users import them here)
from search.store.storage import Storage, apply_options, is_uri, split_query
from search.store.tune_record import TuneRecord
from trainable.errors import ConfigError, problem
from trainable.yaml_file import Loader, dump_yaml

SPEC_FILE = "spec.yaml"
BEST_FILE = "best.yaml"
PROBE_FILE = "gpu_probe.json"
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
        fs, base = self.fs()
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

    def fs(self) -> tuple[pafs.FileSystem, str]:
        return pafs.FileSystem.from_uri(self.path) if is_uri(self.path) else (pafs.LocalFileSystem(), self.path)

    @property
    def record(self) -> TuneRecord:
        """Tune's record of the run (search/store/tune_record.py)."""
        return TuneRecord(self)

    @property
    def parts(self) -> ResultParts:
        """results.parquet's parts (search/store/results_parts.py)."""
        return ResultParts(self)

    def check_record(self) -> None:
        """What a resume needs of the run's record: Tune's experiment state and the searcher's record must read,
        or Tune would silently start the search over (ConfigError); each results part that does not read is
        said (the end of the search writes it again)."""
        self.record.check()
        self.parts.say_unreadable()

    def rebuild_hint(self) -> str:
        """How results.parquet is written again: a resume derives every part from Tune's record."""
        return (f"resuming the run writes its parts again from Tune's record (python -m search --space "
                f"{self.storage.join(self.name, SPEC_FILE)} --storage-path {self.storage.uri} --name {self.name} "
                "--resume)")

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


def open_run(run: str, *, results: bool = True) -> RunFolder:
    """The run folder at `run` (a local path or a URI); NotARunFolder if it holds no spec.yaml.

    `results`: NoResults where its results.parquet is a folder with no part (ResultParts.damage):
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
    if results and (damage := folder.parts.damage()) is not None:
        raise NoResults(f"{run}: {damage}")
    return folder
