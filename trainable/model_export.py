"""The canonical loop's model as a file: a checkpoint's model rebuilt, and written as a state dict, a
TorchScript file, a torch.export program or ONNX, with what a user needs beside it (search/outputs/export.py
chooses the checkpoint; a function's run writes the dict it reported instead: search/definition/function_kind.py).

The model takes inputs as the trials' models got them: a built-in image set's uint8 pixels as float32
(N, C, H, W), divided by 255 and standardised per channel with the recorded mean and std; a dataset
function's arrays as the function returned them (float64 read as float32).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch

from trainable.errors import ConfigError, problem
from trainable.factories import build_model
from trainable.metrics import reports_accuracy
from trainable.yaml_file import dump_yaml

META_FILE = "hpsearch.yaml"  # torchscript's and pt2's extra file, onnx's metadata key: the metadata as YAML
EXPORT_FORMAT = 1  # the state_dict file's layout; loads with torch.load(weights_only=True)
# torch.jit's own words in torch 2.14 (trace, and trace_method per submodule, then save): a TorchScript
# file is what --format torchscript promises (torch.jit.load, libtorch's torch::jit::load) and only torch.jit
# writes one, so these and nothing else are silenced; pt2 is the format without a deprecated call
JIT_DEPRECATED = r"`torch\.jit\.(trace|trace_method|save)` is deprecated"


def model_of(saved: Any) -> torch.nn.Module:
    """A checkpoint's (trainable.report.Checkpoint) model on the CPU in eval mode."""
    model = build_model(saved.config, saved.input_shape, saved.num_classes)
    model.load_state_dict(saved.state["model"])
    return model.eval()


def input_preparation(dataset: str) -> dict[str, Any]:
    """How raw inputs become what the model takes (trainable.data.prepare_inputs), as plain data."""
    from trainable.config import is_reference

    if not is_reference(dataset):
        # torchvision (about 1.3 s of imports) only for a built-in image set: a dataset function needs none
        from trainable.data import TORCHVISION_SETS

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


def model_facts(saved: Any) -> dict[str, Any]:
    """What goes in and what comes out of a checkpoint's model, and its config."""
    return {"input_shape": list(saved.input_shape), "num_classes": saved.num_classes,
            "inputs": input_preparation(saved.config.dataset),
            "outputs": outputs_of(saved.config.loss, saved.num_classes), "config": saved.config.to_dict()}


def write(model: torch.nn.Module, meta: dict[str, Any], fmt: str, output: str) -> None:
    # frozen weights: a traced model with grad-requiring weights fails under torch.inference_mode
    model.requires_grad_(False)
    example = torch.zeros(2, *meta["input_shape"])
    text = dump_yaml(meta)
    if fmt == "state_dict":
        torch.save({"format": EXPORT_FORMAT, **meta, "state_dict": model.state_dict()}, output)
        return
    if fmt == "torchscript":
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=JIT_DEPRECATED, category=FutureWarning)
            try:
                traced = torch.jit.trace(model, example)
            except Exception as error:
                raise ConfigError([problem("--format", f"torch.jit.trace could not trace the model "
                                                       f"({type(error).__name__}: {error}); use state_dict or pt2",
                                           fmt)]) from None
            torch.jit.save(traced, output, _extra_files={META_FILE: text})
        return
    if fmt == "pt2":
        try:  # a batch of any size
            program = torch.export.export(model, (example,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        except Exception as error:
            raise ConfigError([problem("--format", f"torch.export could not export the model "
                                                   f"({type(error).__name__}: {error}); use state_dict",
                                       fmt)]) from None
        torch.export.save(program, output, extra_files={META_FILE: text})
        return
    import onnx  # onnx: an optional extra (pip install -e '.[export]'), only for --format onnx

    buffer = io.BytesIO()
    # a file object works, though torch's annotation names paths only
    torch.onnx.export(model, (example,), buffer, input_names=["inputs"],  # type: ignore[arg-type]
                      output_names=["logits"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False)
    exported = onnx.load_from_string(buffer.getvalue())
    onnx.helper.set_model_props(exported, {META_FILE: text})
    onnx.save(exported, output)


def contents(meta: dict[str, Any]) -> str:
    """What the CLI says the file holds: what the model takes and gives."""
    inputs = meta["inputs"]
    prepared = (f"standardised (mean {inputs['mean']}, std {inputs['std']})" if "mean" in inputs
                else "as the dataset function returns them")
    return (f"Inputs: float32 (N, {', '.join(map(str, meta['input_shape']))}), {prepared}; "
            f"outputs: {meta['outputs']}. The config and these facts: {META_FILE} in the file's metadata. ")
