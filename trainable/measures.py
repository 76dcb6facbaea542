"""What the canonical loop minimises and measures: training.loss and training.metrics, built.

- `training.loss`: cross_entropy (integer class targets; the default), mse or smooth_l1 (float
  targets (N,) or (N, k)), or the user's `FILE.py:CALLABLE` / `package.module:CALLABLE`, called as
  `loss(outputs, targets)` and returning a scalar tensor (resolved like model and data references).
- `training.metrics`: torchmetrics classes by name with their keyword arguments. A classification
  metric that takes `num_classes` gets the data's when the space file does not give it. Each is
  reported as train_<column> and val_<column> (trainable/metrics.py metric_column names it).
- Accuracy (train_acc, val_acc: micro, correct / total) only with cross_entropy.

Outputs meet targets through `fit_outputs`: a model's (n, 1) output for float targets (n,) is
squeezed to (n,), so the default MLP with one output fits a one-number regression.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from torch import nn

from trainable.config import LOSSES, REGRESSION_LOSSES, TrialConfig, is_reference
from trainable.errors import ConfigError, problem
from trainable.metrics import metric_column, metric_problems, reports_accuracy

if TYPE_CHECKING:
    # torchmetrics is imported where a metric is built or checked (accuracy_metric, metric_class): it takes
    # about 100 MB and 1.4 s to import (scipy.signal and torchvision with it), which a search of a function
    # trainable's driver does not pay
    from torchmetrics import Metric
    from torchmetrics.classification import MulticlassAccuracy

    from trainable.data import Data

LOSS_KEY = "training.loss"
METRICS_KEY = "training.metrics"
ACCURACY = "acc"  #: the loop's own accuracy metric's name (train_acc, val_acc)

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def fit_outputs(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Outputs shaped as float targets: (n, 1) becomes (n,) when the targets are (n,)."""
    if targets.is_floating_point() and outputs.dim() == targets.dim() + 1 and outputs.shape[-1] == 1:
        return outputs.squeeze(-1)
    return outputs


def build_loss(reference: str) -> LossFunction:
    """The loss of training.loss: a built-in module, or the user's callable (resolved and checked)."""
    if reference == "cross_entropy":
        return nn.CrossEntropyLoss()
    if reference == "mse":
        return nn.MSELoss()
    if reference == "smooth_l1":
        return nn.SmoothL1Loss()
    if not is_reference(reference):
        raise ConfigError([problem(LOSS_KEY, f"must be one of {', '.join(LOSSES)} or FILE.py:CALLABLE", reference)])
    from trainable.references import resolve

    return resolve(reference, LOSS_KEY)


def import_torchmetrics() -> None:
    """Import torchmetrics (and the torchvision it brings) now. A canonical loop's trial calls this before its
    first epoch is timed (trainable/adapter.py run_trial): on a loaded machine the import takes seconds, which
    experiment.trial_timeout would count against the first epoch and stop a trial that does not hang."""
    import torchmetrics  # noqa: F401


def accuracy_metric(num_classes: int, device: torch.device) -> MulticlassAccuracy:
    """Plain accuracy (micro average: correct / total); torchmetrics' default is macro.

    validate_args=False: the check runs torch.unique on every update, a device sync per
    batch; labels are checked once, when the dataset loads.
    """
    from torchmetrics.classification import MulticlassAccuracy

    return MulticlassAccuracy(num_classes=num_classes, average="micro", validate_args=False).to(device)


def metric_class(name: str) -> type[Metric]:
    """torchmetrics' class `name` (top level or torchmetrics.classification / regression); ConfigError if none."""
    import torchmetrics
    from torchmetrics import Metric

    for module in (torchmetrics, torchmetrics.classification, torchmetrics.regression):
        found = getattr(module, name, None)
        if isinstance(found, type) and issubclass(found, Metric):
            return found
    raise ConfigError([problem(f"{METRICS_KEY}.{name}", "must name a torchmetrics Metric class (e.g. "
                                                         "MulticlassF1Score, MeanAbsoluteError, R2Score)", name)])


def metric_arguments(cls: type[Metric], args: Mapping[str, Any] | None, num_classes: int | None) -> dict[str, Any]:
    """The keyword arguments of one metric: the space file's, plus num_classes from the data where it takes one."""
    kwargs = dict(args or {})
    takes: Mapping[str, inspect.Parameter]
    try:
        takes = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        takes = {}
    if num_classes is not None and "num_classes" in takes and "num_classes" not in kwargs:
        kwargs["num_classes"] = num_classes
    return kwargs


def build_metrics(config: TrialConfig, num_classes: int, device: torch.device) -> dict[str, Metric]:
    """column name (acc, f1_score, ...) -> a fresh metric on `device`; ConfigError naming every bad one.

    num_classes is filled in except for mse and smooth_l1: with their float targets it is the
    target width, no class count.
    """
    problems = [problem(*p) for p in metric_problems(config.loss, config.metrics)]
    metrics: dict[str, Metric] = {}
    if reports_accuracy(config.loss):
        metrics[ACCURACY] = accuracy_metric(num_classes, device)
    classes = None if config.loss in REGRESSION_LOSSES else num_classes
    for name, args in config.metrics.items():
        key = f"{METRICS_KEY}.{name}"
        try:
            cls = metric_class(name)
        except ConfigError as error:
            problems += error.problems
            continue
        kwargs = metric_arguments(cls, args, classes)
        try:
            metrics[metric_column(name)] = cls(**kwargs).to(device)
        except Exception as error:  # torchmetrics raises ValueError / TypeError for bad arguments
            problems.append(problem(key, f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) failed: "
                                         f"{type(error).__name__}: {error}", dict(args or {})))
    if problems:
        raise ConfigError(problems)
    return metrics


def check_measures(config: TrialConfig, data: Data, n: int = 2) -> None:
    """training.loss and training.metrics, tried once before the search: the loss resolves and gives
    a scalar on the two training examples the model check tried (a model need work on no more
    before the search), every metric builds and gives one number. ConfigError naming the key."""
    from trainable.factories import build_model
    from trainable.references import what_happened, where_it_failed

    loss_fn = build_loss(config.loss)
    metrics = build_metrics(config, data.num_classes, torch.device("cpu"))
    inputs = data.sample(min(n, len(data.train)))
    targets = torch.from_numpy(data.train.labels[:len(inputs)].copy())
    model = build_model(config, data.input_shape, data.num_classes)
    model.eval()
    with torch.inference_mode():
        outputs = fit_outputs(model(inputs), targets)
        try:
            loss = loss_fn(outputs, targets)
        except Exception as error:
            raise ConfigError([problem(LOSS_KEY, f"the loss on the model's outputs {tuple(outputs.shape)} and targets "
                                                 f"{tuple(targets.shape)} {targets.dtype} failed: {what_happened(error)} "
                                                 f"({where_it_failed(error)})", config.loss)]) from None
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise ConfigError([problem(LOSS_KEY, "must return a scalar tensor (loss(outputs, targets))", got)])
        problems = []
        written = {metric_column(k): k for k in config.metrics}  # column -> the class name the space file gives
        for name, metric in metrics.items():
            key = f"{METRICS_KEY}.{written.get(name, name)}"
            args = dict(config.metrics.get(written[name]) or {}) if name in written else {}
            try:
                metric.update(outputs if name != ACCURACY else outputs.argmax(dim=1), targets)
                value = metric.compute()
            except Exception as error:
                problems.append(problem(key, f"does not take the model's outputs {tuple(outputs.shape)} and the "
                                             f"targets {tuple(targets.shape)} {targets.dtype}: {what_happened(error)}",
                                        args))
                continue
            if value.numel() != 1:
                problems.append(problem(key, f"must give one number per epoch, it gives {tuple(value.shape)} (set its "
                                             "average, e.g. average: macro)", args))
    if problems:
        raise ConfigError(problems)
