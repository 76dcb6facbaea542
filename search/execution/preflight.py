"""Before a search: which run folder, the checks that cost seconds, the claim and spec.yaml.

Everything a user can get wrong fails here, before Ray starts: the tracker packages, the
data (loaded once, test part included) and the model, tried on two inputs. A new run
claims its folder and writes spec.yaml; a resume reads spec.yaml back, checks Tune's record
and says what runs again. Until the trials start, a failure releases a new run's folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast, overload

import numpy as np
import pandas as pd
import yaml

from search.execution.capacity import CapacityError, trials_fit, workers_fit
from search.execution.session import EarlyRay
from search.outputs.finish import Outcome
from search.outputs.phases import Phases
from search.outputs.summary import Timing, status_counts
from search.searching.budget import resume_changes
from search.searching.choice import resolved
from search.searching.study import JOURNAL_FILE
from search.searching.warm_start import read as read_warm_start
from search.definition.space import Space, example_config, spec_differences, to_raw
from search.definition.status import TUNE_TERMINATED
from search.store.code_copy import keep_code
from search.store.results import RESULTS_FILE
from search.store.run_folder import BEST_FILE, SPEC_FILE, RunFolder, run_folder_name
from search.store.snapshot import SNAPSHOT_FILE
from search.store.snapshot import restore as restore_snapshot
from search.store.storage import Storage, check_storage, is_uri
from trainable.config import keyword_of, schedule_note
from trainable.errors import ConfigError, problem
from trainable.function import resolve_function
from trainable.kept_code import copies, relocated
from trainable.kept_code import read_record as read_code_record
from trainable.metrics import reports_accuracy
from trainable.report import CheckpointError
from trainable.yaml_file import dump_yaml

if TYPE_CHECKING:  # torch's modules: imported where the canonical loop is checked (see check_search)
    from trainable.config import TrialConfig
    from trainable.data import Data

# tracker -> (module it needs, the pip extra that installs it)
TRACKER_PACKAGES = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


# Ray's copy of a job's working dir: <temp>/session_<time>/runtime_resources/working_dir_files/...
RAY_RUNTIME_FOLDER = re.compile(r"/session_[^/]+/runtime_resources/")


def check_storage_outlives_ray(storage: Storage) -> None:
    """A run folder must not land in Ray's runtime folders, which Ray deletes when the cluster stops.

    `ray job submit --working-dir .` runs the driver in Ray's copy of `.`, so the default
    ./runs resolves there.
    """
    if is_uri(storage.uri):
        return
    where = os.path.realpath(storage.uri) + "/"
    if RAY_RUNTIME_FOLDER.search(where):
        raise ConfigError([problem("experiment.storage_path", f"resolves inside Ray's runtime folder ({where}), "
                                   "which Ray deletes when the cluster stops (a `ray job submit` runs in a copy of "
                                   "its working dir); give an absolute folder outside it or a URI (s3://...)",
                                   storage.uri)])


def claim(folder: RunFolder, *, automatic: bool) -> RunFolder:
    """Claim the run folder; an automatic name taken in the same second gets a suffix (-2, -3, ...)."""
    for attempt in range(1, 100 if automatic else 2):
        candidate = folder if attempt == 1 else RunFolder(folder.storage, f"{folder.name}-{attempt}")
        try:
            candidate.claim()
            return candidate
        except ConfigError:
            if not automatic:
                raise
    raise ConfigError([problem("--name", "no free automatic name; pass --name", folder.name)])


def check_search(space: Space) -> Data | None:
    """Load the data (test part included) and try the model once; ConfigError/DataError on failure.
    A function trainable has neither: its function is imported, and the data are None.

    All of it runs before Ray starts, so a bad reference, keyword or dataset costs seconds.
    """
    loggers = list(space.experiment.loggers)
    for tracker in loggers:
        module, extra = TRACKER_PACKAGES.get(tracker, (None, None))
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError([problem("experiment.loggers", f"{tracker} needs its package: "
                                                             f"pip install -e '.[{extra}]'", loggers)])
    if "mlflow" in loggers and is_uri(space.experiment.storage_path) and not os.environ.get("MLFLOW_TRACKING_URI"):
        raise ConfigError([problem("experiment.loggers", "mlflow with a storage URI needs MLFLOW_TRACKING_URI "
                                                         "(its default is a SQLite file in a local run folder)",
                                   loggers)])
    if space.trainable:  # the function loads its own data: import it now, so a bad reference costs seconds
        resolve_function(space.trainable)
        return None
    # no `trainable:`: the canonical loop's kind (search/definition/kind.py kind_of), whose configs are TrialConfigs.
    # Its checks import torch here: a search of a function has no use for it in the driver (about 1.5 s of a start)
    from trainable.data import load_data
    from trainable.factories import check_model, width_problems
    from trainable.measures import check_measures

    defaults = cast("TrialConfig", space.trial_defaults())
    data = load_data(defaults, space.data_root, key="data.dataset")
    searched_keys = tuple(key for d in space.searched if (key := keyword_of(d.name)) is not None)
    widths = [p for d in space.searched if d.is_choice
              for p in width_problems(defaults.model, keyword_of(d.name), d.values, f"space.{d.name}")]
    if widths:
        raise ConfigError(widths)
    drop_last_problem(space, len(data.train.labels))
    example = cast("TrialConfig", example_config(space))
    check_model(example, data.sample(), data.num_classes, searched_keys)
    check_measures(example, data)  # training.loss and training.metrics, once on a few examples
    note = schedule_note(defaults)  # a fixed t_max below epochs; a searched one is the user's choice
    if note:
        print(f"note: {note}", file=sys.stderr, flush=True)
    return data


def drop_last_problem(space: Space, train_examples: int) -> None:
    """data.drop_last with a batch_size above the training examples leaves no training batch at all: every
    such trial would end DIVERGED (a loss of 0/0) without a step. ConfigError naming the largest."""
    defaults = cast("TrialConfig", space.trial_defaults())  # check_search asks only for the canonical loop
    searched = {d.name: d for d in space.searched}
    if not defaults.drop_last or "drop_last" in searched:
        return
    sizes = [defaults.batch_size]
    if "batch_size" in searched:
        drawn = searched["batch_size"]
        sizes = list(drawn.values) if drawn.is_choice else [drawn.high]
    if max(sizes) > train_examples:
        key = "space.batch_size" if "batch_size" in searched else "training.batch_size"
        raise ConfigError([problem(key, f"must be at most the {train_examples} training examples with "
                                        "data.drop_last: true (every training batch would be dropped: no step is "
                                        "taken); lower it or set drop_last: false", max(sizes))])


@overload
def data_fingerprint(data: Data) -> dict[str, str | None]: ...
@overload
def data_fingerprint(data: None) -> None: ...
def data_fingerprint(data: Data | None) -> dict[str, str | None] | None:
    """A short hash of each part of the split (inputs, labels, their types and shapes) and of how
    inputs are prepared: what a resume must find again for its trials to be judged as before."""
    if data is None:  # a function trainable's data are its own
        return None
    def part(arrays) -> str | None:
        if arrays is None:
            return None
        digest = hashlib.blake2b(digest_size=8)
        for array in (arrays.inputs, arrays.labels):
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).data)
        return digest.hexdigest()

    prepared = hashlib.blake2b(repr((data.standardize, data.num_classes, data.input_shape)).encode(), digest_size=4)
    return {"train": part(data.train), "val": part(data.val), "test": part(data.test),
            "prepared": prepared.hexdigest()}


def check_same_data(run: dict[str, Any], data: Data | None, folder: RunFolder) -> dict[str, str | None] | None:
    """The resumed run's data must be the data it started with: another split would judge the rest of
    the trials on other examples. Runs started before fingerprints were kept pass."""
    if data is None:  # a function trainable's data are its own: nothing to compare
        return None
    now = data_fingerprint(data)
    then = run.get("data")
    if then is not None and then != now:
        differ = [k for k in now if then.get(k) != now[k]]
        raise ConfigError([problem("--resume", f"the data differ from those the run started with ({', '.join(differ)}: "
                                               f"{then} in {folder.path}/spec.yaml, {now} now); resume with the "
                                               "same dataset, data.root and split", folder.name)])
    return now


def differing_keys(now: dict[str, Any], then: dict[str, Any], ignore: tuple[str, ...]) -> list[str]:
    """`section.key` of every value two space files (as to_raw writes them) disagree on."""
    return [path for path, _, _ in spec_differences(now, then) if path not in ignore]


def spec_for_resume(space: Space, folder: RunFolder) -> tuple[Space, dict[str, Any]]:
    """The stored spec of `folder` and its run section; a space file that now says otherwise gets a
    note, not a say."""
    stored, run = folder.read_spec()
    # sampler: auto chose once, when the run started (RunFolder.read_spec reads the choice back): not again
    space = resolved(space, stored.experiment.sampler, run.get("sampler_choice"))
    if run.get("path") not in (None, folder.path):
        raise ConfigError([problem("--resume", f"this run was started at {run['path']}; Tune's records in it "
                                               "point there, so resuming the copy would write into the original. "
                                               "Resume it where it was started", folder.path)])
    stored = with_kept_code(stored, folder)
    if space.data_root is not None and space.data_root != stored.data_root:
        stored = replace(stored, data_root=space.data_root)  # where the files are, not what they are
    changes = resume_changes(space, stored)  # time_budget, stop_when, num_samples (search/searching/budget.py)
    if "num_samples" in changes and changes["num_samples"] < (held := len(folder.record.saved_statuses())):
        # Tune runs every trial its record holds, so a lower total would be recorded and not kept
        raise ConfigError([problem("experiment.num_samples", f"on --resume is the new total, and must be at "
                                   f"least the {held} trials this run already holds", changes["num_samples"])])
    if changes:
        stored = replace(stored, experiment=stored.experiment.model_copy(update=changes))
        run = record_changes(folder, stored, run, changes)
    changed = differing_keys(to_raw(space), to_raw(stored), ignore=("experiment.name", "data.root"))
    if changed:
        print(f"note: {space.source} differs from the stored spec of this run in {', '.join(changed)}; "
              f"--resume runs the stored spec ({folder.path}/spec.yaml)", file=sys.stderr, flush=True)
    return stored, run


def with_kept_code(stored: Space, folder: RunFolder) -> Space:
    """The stored spec with each referenced file that is gone (a cluster job's temporary copy) pointed at the
    run folder's copy (trainable/kept_code.py); a note per file. On URI storage the copies are not local: as is."""
    if is_uri(folder.path):
        return stored
    code = copies(folder.path)
    notes: list[str] = []
    trainable = relocated(stored.trainable, code, notes, read_code_record(folder.path))
    fixed = relocated(dict(stored.fixed), code, notes)
    for note in dict.fromkeys(notes):
        print(f"note: {note}", file=sys.stderr, flush=True)
    return replace(stored, trainable=trainable, fixed=fixed) if notes else stored


def record_changes(folder: RunFolder, stored: Space, run: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """spec.yaml with a resume's changes: the new values, their history in the run section, a new hash."""
    run = folder.write_spec(stored, run={**run, "resumed_with": [
        *run.get("resumed_with", []), {"at": time.strftime("%Y-%m-%d %H:%M:%S"),
                                       **{f"experiment.{k}": v for k, v in changes.items()}}]})
    print(f"note: --resume changes {', '.join(f'experiment.{k} to {v}' for k, v in changes.items())} "
          f"(recorded in {folder.path}/{SPEC_FILE})", file=sys.stderr, flush=True)
    return run


def prepare(space: Space, storage: Storage, name: str | None, resume: bool, held: ExitStack,
            early_ray: EarlyRay | None = None) -> tuple[Space, RunFolder, Data | None, tuple[pd.DataFrame, dict] | None]:
    """The space to run (a resume's is its spec.yaml), its claimed folder, its data, checked (None for a
    function trainable), and for a resume with nothing left to run, what `finished` read (else None).

    The run folder is held (RunFolder.held) until `held` closes: one process searches a run at a time.
    """
    check_storage_outlives_ray(storage)
    if not resume:
        space = resolved(space)  # sampler: auto chooses here, once; spec.yaml keeps the choice
    folder = RunFolder(storage, run_folder_name(space, storage, name, resume))
    if resume:
        held.enter_context(folder.held("--resume"))
        folder.check_no_links("--resume")
        # on URI storage, Tune's last snapshot as it saved it: its upload may have been cut short
        if restored := restore_snapshot(folder):
            print(f"note: Tune's files in {folder.path} were not all of its last snapshot ({', '.join(restored)} "
                  f"differed: the driver stopped while they were uploaded); they are put back from {SNAPSHOT_FILE}",
                  file=sys.stderr, flush=True)
        space, run = spec_for_resume(space, folder)
    data = check_search(space)
    if not resume:  # a refused warm start fails here, before the run folder is claimed
        read_warm_start(space)
    done = None
    if resume:
        check_same_data(run, data, folder)
        # a finished run's outputs all read (finished): nothing to check part by part, nothing runs again
        if (done := finished(space, folder)) is None:
            folder.check_record()
            rerun = folder.parts.drop_unrecorded()
            if rerun:
                print(f"note: {len(rerun)} trial(s) ended after Tune's last snapshot of this run; they run again "
                      f"with the same trial numbers, configs and seeds", file=sys.stderr, flush=True)
    else:
        folder = claim(folder, automatic=name is None)
        held.enter_context(folder.held("--name"))
        folder.write_spec(space, data_fingerprint(data))
        keep_code(folder, space)  # the files it references, so that best.yaml and --resume outlive them
    if early_ray is not None and done is None:  # a finished run's resume starts no Ray
        early_ray.checks_passed()  # the CLI's local Ray begins only now when user code had to be checked
    return space, folder, data, done


def check_local_capacity(space: Space) -> None:
    """A local Ray gets this machine's CPUs and GPUs: a trial that asks for more would never start."""
    resources = space.resources
    if resources.gpus == "auto":  # measured when the search starts (search/execution/gpu_probe.py)
        return
    gpus = local_gpus() if resources.gpus else None  # torch's import (seconds) only where trials ask for GPUs
    machine = {"CPU": float(len(os.sched_getaffinity(0))), "GPU": gpus or 0.0}
    holds = f"{machine['CPU']:g} CPU" + (f" and {gpus:g} GPU" if gpus is not None else "")
    if resources.workers > 1 and trials_fit(machine, resources) == 0:
        raise CapacityError(f"resources.workers: must be at most the workers of {resources.cpus:g} CPU and "
                            f"{resources.gpus:g} GPU each that this machine holds for a local Ray "
                            f"({workers_fit(machine, resources)}: {holds}), "
                            f"got {resources.workers}. Lower resources.workers or resources.cpus, or run on a "
                            "cluster (--address).")
    if trials_fit(machine, resources) == 0:
        raise CapacityError(f"resources: each trial asks for {resources.cpus:g} CPU and {resources.gpus:g} GPU, "
                            f"but this machine has {holds} for a local "
                            "Ray. Lower --gpus-per-trial / --cpus-per-trial, or run on a cluster with GPUs "
                            "(--address).")


def local_gpus() -> float:
    """The GPUs of this machine, as torch sees them (CUDA_VISIBLE_DEVICES included)."""
    import torch

    return float(torch.cuda.device_count())


def check_space(space: Space, *, address: str | None = None) -> str:
    """Every check a search makes before its first trial, without Ray or a run folder (`python -m search
    check`); returns the resolved spec as spec.yaml would hold it. ConfigError, DataError, CapacityError."""
    storage = Storage.at(space.experiment.storage_path)
    check_storage(storage, space.experiment.min_free_mb)
    check_storage_outlives_ray(storage)
    space = resolved(space)
    data = check_search(space)
    read_warm_start(space)  # the earlier run: readable, with this search's metric and mode
    if address is None and "RAY_ADDRESS" not in os.environ:  # a cluster's capacity is checked when joined
        check_local_capacity(space)
    choice = f"# {space.sampler_choice}\n" if space.sampler_choice else ""
    if data is None:
        return (f"# The resolved spec of {space.source}: defaults and flags applied; checks passed (the function "
                f"{space.trainable} imports)\n" + choice + dump_yaml(to_raw(space)))
    shape = ", ".join(map(str, data.input_shape))
    loss = cast("TrialConfig", space.trial_defaults()).loss  # data: the canonical loop's (check_search)
    return (f"# The resolved spec of {space.source}: defaults and flags applied; checks passed (data: "
            f"{len(data.train)} train, {len(data.val)} val, {0 if data.test is None else len(data.test)} test, "
            f"inputs ({shape}), {targets(data.num_classes, loss)}; the model on two inputs)\n"
            + choice + dump_yaml(to_raw(space)))


def targets(width: int, loss: str) -> str:
    """What the model predicts, in the task's words: classes under cross_entropy; with a regression loss (or a
    loss of the user's) `width` is the number of values it predicts, one per target column."""
    if reports_accuracy(loss):
        return f"{width} classes"
    return f"{width} output{'' if width == 1 else 's'} (training.loss {loss})"


@contextmanager
def released_on_failure(folder: RunFolder, *, resume: bool):
    """A new run that fails before its first trial (no cluster, no capacity, Ctrl-C) leaves no folder."""
    try:
        yield
    except BaseException:
        if not resume:
            folder.release()
        raise



def finished(space: Space, folder: RunFolder) -> tuple[pd.DataFrame, dict[str, Any]] | None:
    """results.parquet and best.yaml where a resume has nothing to run or repair: every trial TERMINATED
    in Tune's record (an errored one is retried), each with its record, and results.parquet, best.yaml's
    checkpoint and the journal read; else None."""
    saved = folder.record.saved_statuses()  # statuses.json while Tune's state is the one the search's end read
    if len(saved) < space.experiment.num_samples or any(s != TUNE_TERMINATED for s in saved.values()):
        return None
    if folder.record.missing(list(saved)):
        return None  # a trial folder is gone: the resume rebuilds its rows and says so
    try:
        frame = pd.read_parquet(f"{folder.path}/{RESULTS_FILE}")
        if set(frame["trial_id"]) != set(saved):
            return None
        best = yaml.safe_load(folder.storage.read(f"{folder.name}/{BEST_FILE}") or b"null")
        if best["result"].get("trials") != len(saved):  # written before the last trials ended: stale
            return None
        if best["result"]["checkpoint"] is not None:  # None: none was kept (a function that saves none)
            from search.outputs.export import read_checkpoint  # torch: only a finished run's resume reads one

            read_checkpoint(folder, best["result"]["checkpoint"])
    except (OSError, ValueError, TypeError, KeyError, CheckpointError):  # derived files to derive again
        return None
    journal = folder.storage.read(f"{folder.name}/{JOURNAL_FILE}")
    if not is_uri(folder.path) and (journal is None or not journal.endswith(b"\n")):
        return None
    return frame, best


def finished_run(space: Space, folder: RunFolder, phases: Phases, done: tuple[pd.DataFrame, dict[str, Any]]):
    """The Outcome of a --resume with nothing left to run (`done`: what `finished` read), said without starting Ray."""
    frame, best = done
    result, metric = best["result"], space.experiment.metric
    summary = (f"Search {folder.name} is finished: all {frame['trial_id'].nunique()} of experiment.num_samples "
               f"{space.experiment.num_samples} trials ended "
               f"({status_counts(frame)}); --resume has nothing to "
               f"run (Ray was not started). More trials: --resume --more-trials N.\n"
               f"Best: trial #{result['trial_number']} ({result['trial_id']}), epoch {result['epoch']}, "
               f"{metric} {result[metric]:.4f}: {folder.storage.join(folder.name, BEST_FILE)}\n"
               f"Results: {folder.path}/{RESULTS_FILE}; report: {folder.path}/report.html "
               f"(again: python -m search report {folder.path})")
    phases.mark("results")
    timing = Timing(phases.wall_seconds, 0.0, 0)
    return Outcome(folder.name, folder.path, frame, best, timing, summary)
