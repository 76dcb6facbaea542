"""Model factories, the built-in ones and the user's (resolved by trainable/references.py), built and checked.

A model factory is checked before anything expensive starts: its signature takes the keyword
arguments the config gives, and one call on a tiny batch returns logits of the right shape. Every
failure is a ConfigError naming the key, with the file and line where the user's code failed.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from trainable.config import FACTORY_KEY, MODEL, REGRESSION_LOSSES, TrialConfig, is_reference
from trainable.errors import ConfigError, problem
from trainable.model import WIDTHS, width_rule
from trainable.references import keyword_problems, resolve, what_happened, where_it_failed

# keyword arguments a model factory gets from the data when its signature names them
DATA_ARGUMENTS = ("input_shape", "num_classes")


def model_keywords(function: Callable, config: TrialConfig, input_shape: tuple[int, ...],
                   num_classes: int) -> dict[str, Any]:
    """The factory's keyword arguments: the config's model.<key> plus the data's shape and classes."""
    names: Mapping[str, inspect.Parameter]
    try:
        names = inspect.signature(function).parameters
    except (TypeError, ValueError):
        names = {}
    data = {"input_shape": tuple(input_shape), "num_classes": num_classes}
    return {**{k: v for k, v in data.items() if k in names}, **config.model_args}


def build_model(config: TrialConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Call the factory of `config` (weights drawn from torch's global RNG, seeded by the caller)."""
    function = resolve(config.model, FACTORY_KEY)
    model = function(**model_keywords(function, config, input_shape, num_classes))
    if not isinstance(model, nn.Module):
        raise ConfigError([problem(FACTORY_KEY, "must return a torch.nn.Module",
                                   type(model).__name__)])
    return model


def width_problems(reference: str, keyword: str | None, values: Sequence[Any], path: str) -> list[str]:
    """Each value of a choice of a built-in model's width that the model would refuse: check_model
    builds the model with one value of each choice, so this says the others at once."""
    if reference not in WIDTHS or keyword not in WIDTHS[reference]:
        return []
    return [problem(f"{path}.values[{i}]", rule, value) for i, value in enumerate(values)
            if (rule := width_rule(keyword, value))]


def check_model(config: TrialConfig, sample: torch.Tensor, num_classes: int,
                searched: tuple[str, ...] = ()) -> None:
    """Resolve, check the signature, build once and run a tiny batch: logits must be (n, num_classes).

    `searched` are model keywords the search will set (their names are checked here; the
    config holds one of their values). Raises ConfigError naming the key.
    """
    key = FACTORY_KEY
    factory = resolve(config.model, key)
    given = tuple(n for n in DATA_ARGUMENTS if n in _parameter_names(factory))
    problems = keyword_problems(factory, {**config.model_args, **{k: "(searched in space)" for k in searched}},
                                f"{MODEL}.", config.model, given=given)
    if problems:
        raise ConfigError(problems)
    try:
        model = build_model(config, tuple(sample.shape[1:]), num_classes)
        model.eval()
        with torch.inference_mode():
            logits = model(sample)
    except ConfigError:
        raise
    except (Exception, SystemExit) as error:
        raise ConfigError([problem(key, f"building the model or running it on a batch of {tuple(sample.shape)} "
                                        f"failed: {what_happened(error)} ({where_it_failed(error)})",
                                   config.model)]) from None
    n = len(sample)
    got = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
    if config.loss in REGRESSION_LOSSES:  # float targets (n,) take (n, 1) or (n,); (n, k) take (n, k)
        allowed = [(n, num_classes)] + ([(n,)] if num_classes == 1 else [])
        if got not in allowed:
            raise ConfigError([problem(key, f"the model must return outputs of shape {' or '.join(map(str, allowed))} "
                                            f"for a batch of {tuple(sample.shape)} ({num_classes} target column(s) "
                                            f"for training.loss {config.loss})", got)])
    elif is_reference(config.loss):  # a loss of the user's: the shape is between the model and it
        if not isinstance(logits, torch.Tensor) or logits.dim() == 0 or len(logits) != n:
            raise ConfigError([problem(key, f"the model must return a tensor of {n} rows for a batch of "
                                            f"{tuple(sample.shape)}", got)])
    elif got != (n, num_classes):
        raise ConfigError([problem(key, f"the model must return logits of shape {(n, num_classes)} for a batch of "
                                        f"{tuple(sample.shape)} ({num_classes} classes in the data)", got)])


def _parameter_names(function: Callable) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return ()
