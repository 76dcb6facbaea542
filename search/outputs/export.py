"""A run's model, out of the run folder: best.yaml's checkpoint (or a chosen trial's best) ready for inference.

`python -m search export RUN [--trial N] [--format state_dict|torchscript|pt2|onnx] [-o FILE]` writes
the model with what it needs beside it (the trial config, the input shape and classes, how
inputs are prepared, the metrics); `search.load_best(RUN)` returns it as a module.

The model takes inputs as the trials' models got them: a built-in image set's uint8 pixels
as float32 (N, C, H, W), divided by 255 and standardised per channel with the recorded mean and
std; a dataset function's arrays as the function returned them (float64 read as float32).
Every file says so in its metadata (`hpsearch.yaml`).

A search of your own training function (`trainable: FILE.py:FUNCTION`) has no model hpsearch can
rebuild: its checkpoint is the dict the function reported. Its export (`state_dict`, the one format
that needs no model code) is that dict with the trial's config and metrics beside it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch
import yaml

from search.definition.kind import TrialKind
from search.definition.loop_kind import CanonicalLoop
from search.definition.objectives import FEASIBLE, first, objectives_of
from search.definition.ranking import rank
from search.definition.space import Space
from search.store.results import RECORD_FILE, RESULTS_FILE
from search.store.run_folder import BEST_FILE, RunFolder, open_run
from trainable.errors import ConfigError, problem
from trainable.model_export import META_FILE  # noqa: F401  (read by tests and users from here)
from trainable.model_export import model_of as model_of_checkpoint
from trainable.report import CHECKPOINT_FILE, CheckpointError, load_checkpoint

#: --format -> the ending of the default output file
FORMATS = {"state_dict": ".pt", "torchscript": ".torchscript.pt", "pt2": ".pt2", "onnx": ".onnx"}
#: --format -> how a user loads the file (what the CLI prints)
LOADS = {"state_dict": "torch.load(FILE, weights_only=True)",
         "torchscript": "torch.jit.load(FILE) (torch 2.14 deprecates torch.jit: --format pt2 is the same without it)",
         "pt2": "torch.export.load(FILE).module()", "onnx": "onnxruntime or onnx.reference"}


@dataclass(frozen=True)
class Chosen:
    """The checkpoint an export reads, and what the run recorded about its epoch."""

    folder: RunFolder
    checkpoint: str  #: its folder, relative to the run folder: trial_<id>/checkpoint_<k>
    saved: Any  #: trainable.report.Checkpoint; a function's: {"epoch": k, "state": the dict it reported}
    trial_number: int | None
    trial_id: str
    epoch: int
    metrics: dict[str, float]
    config: dict[str, Any] | None = None  #: a function trial's config as best.yaml holds it (the loop's: saved.config)
    kind: TrialKind = field(default_factory=CanonicalLoop)  #: the kind of trial that wrote it


class CheckpointGone(CheckpointError):
    """The record names a checkpoint whose file is not there: num_to_keep removed it (not damage)."""


def read_checkpoint(folder: RunFolder, relative: str, load: Callable[[str], Any] = load_checkpoint):
    """A checkpoint of the run by its relative folder, through the run's storage (local or URI);
    `load` reads the folder (trainable.report.load_checkpoint, or a function's load_state)."""
    data = folder.storage.read(f"{folder.name}/{relative}/{CHECKPOINT_FILE}")
    if data is None:
        raise CheckpointGone(f"{folder.storage.join(folder.name, relative)}: no {CHECKPOINT_FILE} there")
    with tempfile.TemporaryDirectory() as where:
        with open(os.path.join(where, CHECKPOINT_FILE), "wb") as f:
            f.write(data)
        return load(where)


def trial_reports(folder: RunFolder, trial_id: str) -> list[dict[str, Any]]:
    """Tune's record of a trial (result.json): one report per epoch, with its checkpoint folder if it saved one."""
    data = folder.storage.read(f"{folder.name}/trial_{trial_id}/{RECORD_FILE}") or b""
    reports = []
    for line in data.decode(errors="replace").splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:  # a line a kill cut short
            continue
    return reports


def none_feasible(folder: RunFolder) -> bool:
    """Whether the run's results hold trials with a point and none of them met experiment.constraints."""
    try:
        marked = pd.read_parquet(f"{folder.path}/{RESULTS_FILE}", columns=[FEASIBLE])[FEASIBLE].dropna()
    except (OSError, ValueError, KeyError):
        return False
    return len(marked) > 0 and not marked.astype(bool).any()


def trial_id_of_number(folder: RunFolder, number: int) -> str:
    try:
        frame = pd.read_parquet(f"{folder.path}/{RESULTS_FILE}", columns=["trial_id", "trial_number"])
    except (OSError, ValueError) as error:
        raise ConfigError([problem("--trial", f"{folder.path} has no readable {RESULTS_FILE} to find the trial "
                                              f"in ({type(error).__name__})", number)]) from None
    ids = frame.loc[frame["trial_number"] == number, "trial_id"].unique()
    if not len(ids):
        numbers = sorted(int(n) for n in frame["trial_number"].dropna().unique())
        known = f"{numbers[0]}..{numbers[-1]}" if numbers else "none"
        raise ConfigError([problem("--trial", f"no trial with that trial_number in {folder.path} "
                                              f"(it has {known})", number)])
    return str(ids[0])


def chosen_checkpoint(folder: RunFolder, trial: int | None = None) -> Chosen:
    """best.yaml's checkpoint, or (`trial`) that trial's best epoch whose checkpoint reads: a canonical-loop
    model's (what model_of and search.load_best rebuild)."""
    space, _ = folder.read_spec("RUN")
    cannot = space.kind.model_problem(folder.path)  # a function's: hpsearch has not its model's code
    if cannot:
        raise ConfigError([problem("RUN", cannot, folder.path)])
    return choose(folder, space, trial)


def choose(folder: RunFolder, space: Space, trial: int | None) -> Chosen:
    """The checkpoint to export, of either kind of trial: best.yaml's best epoch (refused, saying so, where
    that epoch kept no checkpoint), or trial number `trial`'s best epoch whose checkpoint reads.

    Among equal scores the later epoch comes first: num_to_keep keeps the newest of equals.
    """
    metric, mode = first(space.experiment.metric), first(space.experiment.mode)
    best = None
    if trial is None:
        if objectives_of(space.experiment).several:  # a front (pareto.yaml), never one best
            raise ConfigError([problem("RUN", "searched several objectives, so it has a Pareto front (pareto.yaml) "
                                              "instead of a best.yaml; pass --trial N, N one of its trial_numbers",
                                       folder.path)])
        try:
            best = yaml.safe_load(folder.storage.read(f"{folder.name}/{BEST_FILE}") or b"null")
        except yaml.YAMLError:  # a damaged best.yaml: as if it were not there (--trial N still exports)
            best = None
        if not isinstance(best, dict) or not isinstance(best.get("result"), dict):
            constraints = objectives_of(space.experiment).constraints
            why = (f"no trial met experiment.constraints ({', '.join(map(str, constraints))})"
                   if constraints and none_feasible(folder) else "the search has not ended, or no trial succeeded")
            raise ConfigError([problem("RUN", f"has no {BEST_FILE} ({why}); pass --trial N to export a trial",
                                       folder.path)])
        result = best["result"]
        trial_id, number = str(result["trial_id"]), result.get("trial_number")
    else:
        trial_id, number = trial_id_of_number(folder, trial), trial
    reports = trial_reports(folder, trial_id)
    if best is not None:
        # best.yaml's epoch is the best value, with or without a checkpoint: its own, never a neighbour's
        epoch = int(result["epoch"])
        at_best = [r for r in reports if r.get("epoch") == epoch] or [result]
        report = {**result, **at_best[-1]}  # Tune's report of that epoch (the last, after a restart), else best.yaml's
        if result.get("checkpoint"):
            candidates = [(result["checkpoint"], report)]
        else:  # older runs' best.yaml named no checkpoint, and a best epoch may have none: find it by its epoch
            candidates = [(f"trial_{trial_id}/{r['checkpoint_dir_name']}", {**result, **r})
                          for r in at_best if r.get("checkpoint_dir_name")]
    else:
        kept = [r for r in reports if r.get("checkpoint_dir_name")]
        kept.sort(key=lambda r: rank(r.get(metric), mode, r["epoch"]), reverse=True)  # best first
        candidates = [(f"trial_{trial_id}/{r['checkpoint_dir_name']}", r) for r in kept]
    load = space.kind.load_checkpoint
    problems = []  # the damaged ones: said; the removed ones are the normal case (num_to_keep), not news
    for relative, report in candidates:
        try:
            saved = read_checkpoint(folder, relative, load)
        except CheckpointGone:  # num_to_keep removed it: the next one
            continue
        except CheckpointError as error:  # damaged: the next one, and said
            problems.append(str(error))
            continue
        return chosen_of(folder, space, relative, saved, number, trial_id, report)
    if best is not None:
        value = result.get(metric)
        value = f" ({metric} {value:.4f})" if isinstance(value, (int, float)) else ""
        why = f"{space.kind.no_checkpoint_why}, or experiment.num_to_keep removed it"
        said = (f"has no readable checkpoint ({'; '.join(problems)})" if problems else f"has no checkpoint kept: {why}")
        raise ConfigError([problem("RUN", f"best.yaml's best, trial #{number} ({trial_id}) at epoch {epoch}{value}, "
                                          f"{said}; {other_epochs(folder, space, number)}", folder.path)])
    said = f"has no readable checkpoint ({'; '.join(problems)})" if problems else "kept no checkpoint"
    raise ConfigError([problem("--trial", f"trial #{number} ({trial_id}) {said}", trial)])


def other_epochs(folder: RunFolder, space: Space, number: int | None) -> str:
    """What the error of a best epoch without a checkpoint says of the trial's other epochs: --trial N where
    one of them kept a checkpoint that reads, else that none did (a function that never passes checkpoint=)."""
    if number is None:  # an older best.yaml without the trial's number
        return "--trial N exports trial N's best epoch that kept one"
    try:
        choose(folder, space, number)
    except ConfigError:
        return f"no other epoch of trial #{number} kept one that reads either, so --trial {number} cannot export it"
    return f"--trial {number} exports that trial's best epoch that kept one"


def chosen_of(folder: RunFolder, space: Space, relative: str, saved, number: int | None, trial_id: str,
              report: dict[str, Any]) -> Chosen:
    """A Chosen from the checkpoint read and Tune's report of its epoch."""
    objectives = objectives_of(space.experiment).metrics  # the loop's measured ones too (params, latency_ms)
    names, config = space.kind.chosen(report, saved)  # its metrics at that epoch, and a function's config
    metrics = {m: float(report[m]) for m in dict.fromkeys([*names, *objectives])
               if isinstance(report.get(m), (int, float))}
    return Chosen(folder, relative, saved, number, trial_id, int(report["epoch"]), metrics, config, space.kind)


def model_of(chosen: Chosen) -> torch.nn.Module:
    """The checkpoint's model on the CPU in eval mode."""
    return model_of_checkpoint(chosen.saved)


def metadata(chosen: Chosen) -> dict[str, Any]:
    """What a user needs beside the weights: where they came from, what goes in, what comes out."""
    where = {"run": chosen.folder.path, "checkpoint": chosen.checkpoint, "trial_number": chosen.trial_number,
             "trial_id": chosen.trial_id, "epoch": chosen.epoch, "metrics": chosen.metrics}
    facts = chosen.kind.facts(chosen.saved, chosen.config)  # the loop's model's inputs and outputs; a function's config
    # plain lists, strings and numbers: YAML, torch.load(weights_only) read them
    return json.loads(json.dumps({**where, **facts, "torch": str(torch.__version__)}))


def check_format(fmt: str | None) -> None:
    """ONNX needs two packages the default install leaves out (the `export` extra)."""
    if fmt is None:
        return
    if fmt not in FORMATS:
        raise ConfigError([problem("--format", f"must be one of {', '.join(FORMATS)}", fmt)])
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if fmt == "onnx" and missing:
        raise ConfigError([problem("--format", f"onnx needs {' and '.join(missing)}: pip install -e '.[export]' "
                                               "(about 10 MB)", fmt)])


def check_kind(fmt: str, kind: TrialKind) -> None:
    """A model graph needs the model's code, which a function's run does not have: its checkpoint is a dict."""
    cannot = kind.format_problem(fmt)
    if cannot:
        raise ConfigError([problem("--format", cannot, fmt)])


def export(run: str, *, trial: int | None = None, fmt: str | None = None,
           output: str | None = None) -> tuple[str, Chosen]:
    """Write the model of `run` (best.yaml's, or `trial`'s best) in `fmt` to `output`; returns (path, chosen).

    `fmt` None: torchscript, or state_dict for a search of your own training function."""
    check_format(fmt)
    folder = open_run(run)
    space, _ = folder.read_spec("RUN")
    fmt = fmt or space.kind.default_format  # a TorchScript model, or for a function the dict it checkpointed
    check_kind(fmt, space.kind)
    chosen = choose(folder, space, trial)
    output = output or f"{folder.name}-{'best' if trial is None else f'trial{trial}'}{FORMATS[fmt]}"
    chosen.kind.write(chosen.saved, metadata(chosen), fmt, output)  # the loop's model, or a function's dict
    return output, chosen


def describe(path: str, fmt: str | None, chosen: Chosen, metric: str | Sequence[str]) -> str:
    """What the CLI prints: the file, which epoch it holds, what the model takes, and how to load it."""
    fmt = fmt or chosen.kind.default_format
    values = [f"{m} {chosen.metrics[m]:.4f}" for m in ([metric] if isinstance(metric, str) else metric)
              if m in chosen.metrics]
    wrote = (f"Wrote {path} ({fmt}): trial #{chosen.trial_number} ({chosen.trial_id}), epoch {chosen.epoch}"
             + "".join(f", {v}" for v in values) + f", from {chosen.checkpoint}\n")
    load = f"Load it with {LOADS[fmt].replace('FILE', repr(path))}"
    return wrote + chosen.kind.contents(metadata(chosen)) + load
