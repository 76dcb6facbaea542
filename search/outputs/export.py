"""A run's model, out of the run folder: best.yaml's checkpoint (or a chosen trial's best) ready for inference.

`python -m search export RUN [--trial N] [--format state_dict|torchscript|onnx] [-o FILE]` writes
the model with what it needs beside it (the trial config, the input shape and classes, how
inputs are prepared, the metrics); `search.load_best(RUN)` returns it as a module.

The model takes inputs as the trials' models got them: a built-in image set's uint8 pixels
as float32 (N, C, H, W), divided by 255 and standardised per channel with the recorded mean and
std; a dataset function's arrays as the function returned them (float64 read as float32).
Every file says so in its metadata (`hpsearch.yaml`).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import yaml

from search.spec.objectives import FEASIBLE, first, objectives_of
from search.spec.ranking import rank
from search.store.results import RECORD_FILE, RESULTS_FILE
from search.store.run_folder import BEST_FILE, RunFolder, open_run
from trainable.data import TORCHVISION_SETS
from trainable.errors import ConfigError, problem
from trainable.factories import build_model
from trainable.metrics import METRICS, reports_accuracy
from trainable.report import CHECKPOINT_FILE, CheckpointError, load_checkpoint

#: --format -> the ending of the default output file
FORMATS = {"state_dict": ".pt", "torchscript": ".torchscript.pt", "onnx": ".onnx"}
META_FILE = "hpsearch.yaml"  # torchscript's extra file, onnx's metadata key: the metadata as YAML
EXPORT_FORMAT = 1  # the state_dict file's layout; loads with torch.load(weights_only=True)


@dataclass(frozen=True)
class Chosen:
    """The checkpoint an export reads, and what the run recorded about its epoch."""

    folder: RunFolder
    checkpoint: str  #: its folder, relative to the run folder: trial_<id>/checkpoint_<k>
    saved: Any  #: trainable.report.Checkpoint
    trial_number: int | None
    trial_id: str
    epoch: int
    metrics: dict[str, float]


def read_checkpoint(folder: RunFolder, relative: str):
    """A checkpoint of the run by its relative folder, through the run's storage (local or URI)."""
    data = folder.storage.read(f"{folder.name}/{relative}/{CHECKPOINT_FILE}")
    if data is None:
        raise CheckpointError(f"{folder.storage.join(folder.name, relative)}: no {CHECKPOINT_FILE} there")
    with tempfile.TemporaryDirectory() as where:
        with open(os.path.join(where, CHECKPOINT_FILE), "wb") as f:
            f.write(data)
        return load_checkpoint(where)


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
    """best.yaml's checkpoint, or (`trial`) that trial's best epoch whose checkpoint reads.

    Among equal scores the later epoch comes first: num_to_keep keeps the newest of equals.
    """
    space, _ = folder.read_spec("RUN")
    if space.trainable:
        raise ConfigError([problem("RUN", f"is a search of your own training function ({space.trainable}): its "
                                          "checkpoints hold the dict your function reported (a state.pt under "
                                          "'state'), not a model hpsearch can rebuild; load it with torch.load",
                                   folder.path)])
    metric, mode = first(space.experiment.metric), first(space.experiment.mode)
    best = yaml.safe_load(folder.storage.read(f"{folder.name}/{BEST_FILE}") or b"null")
    if trial is None:
        if objectives_of(space.experiment).several:  # a front (pareto.yaml), never one best
            raise ConfigError([problem("RUN", "searched several objectives, so it has a Pareto front (pareto.yaml) "
                                              "instead of a best.yaml; pass --trial N, N one of its trial_numbers",
                                       folder.path)])
        if not isinstance(best, dict) or "result" not in best:
            constraints = objectives_of(space.experiment).constraints
            why = (f"no trial met experiment.constraints ({', '.join(map(str, constraints))})"
                   if constraints and none_feasible(folder) else "the search has not ended, or no trial succeeded")
            raise ConfigError([problem("RUN", f"has no {BEST_FILE} ({why}); pass --trial N to export a trial",
                                       folder.path)])
        result = best["result"]
        trial_id, number = str(result["trial_id"]), result.get("trial_number")
        wanted = [result["epoch"]]  # older runs' best.yaml named no checkpoint: find it by its epoch
    else:
        trial_id, number, wanted = trial_id_of_number(folder, trial), trial, None
    reports = [r for r in trial_reports(folder, trial_id) if r.get("checkpoint_dir_name")]
    reports = [r for r in reports if wanted is None or r.get("epoch") in wanted]

    reports.sort(key=lambda report: rank(report.get(metric), mode, report["epoch"]), reverse=True)  # best first
    candidates = [(f"trial_{trial_id}/{r['checkpoint_dir_name']}", r) for r in reports]
    if trial is None and best["result"].get("checkpoint"):
        candidates = [(best["result"]["checkpoint"], best["result"])]
    problems = []
    for relative, report in candidates:
        try:
            saved = read_checkpoint(folder, relative)
        except CheckpointError as error:  # num_to_keep deleted it, or it is damaged: the next one
            problems.append(str(error))
            continue
        return Chosen(folder, relative, saved, number, trial_id, int(report["epoch"]),
                      {m: float(report[m]) for m in METRICS if report.get(m) is not None})
    which = f"trial #{number} ({trial_id})" if trial is not None else f"best.yaml's trial #{number} ({trial_id})"
    raise ConfigError([problem("--trial" if trial is not None else "RUN",
                               f"{which} has no readable checkpoint" + "".join(f"; {p}" for p in problems),
                               trial if trial is not None else folder.path)])


def model_of(chosen: Chosen):
    """The checkpoint's model on the CPU in eval mode."""
    saved = chosen.saved
    model = build_model(saved.config, saved.input_shape, saved.num_classes)
    model.load_state_dict(saved.state["model"])
    return model.eval()


def input_preparation(dataset: str) -> dict[str, Any]:
    """How raw inputs become what the model takes (trainable.data.prepare_inputs), as plain data."""
    if dataset in TORCHVISION_SETS:
        _, mean, std = TORCHVISION_SETS[dataset]
        return {"from": "uint8 images (N, H, W) or (N, H, W, C)", "to": "float32 (N, C, H, W)",
                "steps": "x / 255, then (x - mean) / std per channel", "mean": list(mean), "std": list(std)}
    return {"from": "the dataset function's inputs", "to": "the same, float64 read as float32", "steps": "none"}


def outputs_of(loss: str, width: int) -> str:
    """What the model's outputs are: class logits under cross_entropy, else the values the loss was given."""
    if reports_accuracy(loss):
        return f"logits (N, {width})"
    return f"predictions (N, {width}), compared with the targets by training.loss {loss}"


def metadata(chosen: Chosen) -> dict[str, Any]:
    """What a user needs beside the weights: where they came from, what goes in, what comes out."""
    saved = chosen.saved
    return json.loads(json.dumps({  # plain lists, strings and numbers: YAML, torch.load(weights_only) read them
        "run": chosen.folder.path, "checkpoint": chosen.checkpoint, "trial_number": chosen.trial_number,
        "trial_id": chosen.trial_id, "epoch": chosen.epoch, "metrics": chosen.metrics,
        "input_shape": list(saved.input_shape), "num_classes": saved.num_classes,
        "inputs": input_preparation(saved.config.dataset), "outputs": outputs_of(saved.config.loss, saved.num_classes),
        "config": saved.config.to_dict(), "torch": str(torch.__version__),
    }))


def check_format(fmt: str) -> None:
    """ONNX needs two packages the default install leaves out (the `export` extra)."""
    if fmt not in FORMATS:
        raise ConfigError([problem("--format", f"must be one of {', '.join(FORMATS)}", fmt)])
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if fmt == "onnx" and missing:
        raise ConfigError([problem("--format", f"onnx needs {' and '.join(missing)}: pip install -e '.[export]' "
                                               "(about 10 MB)", fmt)])


def write(model, meta: dict[str, Any], fmt: str, output: str) -> None:
    # frozen weights: a traced model with grad-requiring weights fails under torch.inference_mode
    model.requires_grad_(False)
    example = torch.zeros(2, *meta["input_shape"])
    text = yaml.safe_dump(meta, sort_keys=False)
    if fmt == "state_dict":
        torch.save({"format": EXPORT_FORMAT, **meta, "state_dict": model.state_dict()}, output)
        return
    if fmt == "torchscript":
        with warnings.catch_warnings():  # torch.jit is deprecated in favour of torch.export, and still loads anywhere
            warnings.simplefilter("ignore", category=FutureWarning)
            warnings.simplefilter("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*torch.jit.*is deprecated")
            try:
                traced = torch.jit.trace(model, example)
            except Exception as error:
                raise ConfigError([problem("--format", f"torch.jit.trace could not trace the model "
                                                       f"({type(error).__name__}: {error}); use state_dict or onnx",
                                           fmt)]) from None
            torch.jit.save(traced, output, _extra_files={META_FILE: text})
        return
    import onnx  # onnx: an optional extra (pip install -e '.[export]'), only for --format onnx

    buffer = io.BytesIO()
    torch.onnx.export(model, (example,), buffer, input_names=["inputs"], output_names=["logits"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
    exported = onnx.load_from_string(buffer.getvalue())
    onnx.helper.set_model_props(exported, {META_FILE: text})
    onnx.save(exported, output)


def export(run: str, *, trial: int | None = None, fmt: str = "torchscript", output: str | None = None) -> tuple[str, Chosen]:
    """Write the model of `run` (best.yaml's, or `trial`'s best) in `fmt` to `output`; returns (path, chosen)."""
    check_format(fmt)
    folder = open_run(run)
    chosen = chosen_checkpoint(folder, trial)
    output = output or f"{folder.name}-{'best' if trial is None else f'trial{trial}'}{FORMATS[fmt]}"
    write(model_of(chosen), metadata(chosen), fmt, output)
    return output, chosen


def describe(path: str, fmt: str, chosen: Chosen, metric: str) -> str:
    """What the CLI prints: the file, which epoch it holds, and what the model takes."""
    meta = metadata(chosen)
    inputs = meta["inputs"]
    prepared = (f"standardised (mean {inputs['mean']}, std {inputs['std']})" if "mean" in inputs
                else "as the dataset function returns them")
    value = chosen.metrics.get(metric)
    return (f"Wrote {path} ({fmt}): trial #{chosen.trial_number} ({chosen.trial_id}), epoch {chosen.epoch}"
            + (f", {metric} {value:.4f}" if value is not None else "") + f", from {chosen.checkpoint}\n"
            f"Inputs: float32 (N, {', '.join(map(str, meta['input_shape']))}), {prepared}; "
            f"outputs: {meta['outputs']}. The config and these facts: {META_FILE} in the file's metadata")
