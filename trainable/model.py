"""The built-in models: an MLP (the template) and a small CNN in the style of pytorch/examples.

Each is a factory `f(input_shape, num_classes, **settings) -> nn.Module`; a user's factory
has the same form (input_shape and num_classes are passed only if its signature names them).
"""

from __future__ import annotations

import math
from typing import Sequence

from torch import nn

MAX_WIDTH = 65_536  # wider layers only exhaust memory on the way to an error


WIDTHS = {"mlp": ("hidden_sizes",), "cnn": ("channels", "hidden")}  # the width settings of each factory


def width_rule(name: str, value: object) -> str | None:
    """The rule a width setting's value breaks (hidden is one width, the others lists); None if it keeps it."""
    values = [value] if name == "hidden" else value
    if (not isinstance(values, (list, tuple)) or not values
            or any(isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_WIDTH for v in values)):
        return f"must be an integer in [1, {MAX_WIDTH}]" if name == "hidden" else \
            f"must be a non-empty list of integers in [1, {MAX_WIDTH}]"
    return None


def _widths(name: str, values: Sequence[int]) -> tuple[int, ...]:
    rule = width_rule("widths", values)
    if rule:
        raise ValueError(f"{name} {rule}, got {values!r}")
    return tuple(values)


def make_mlp(input_shape: Sequence[int] = (1, 28, 28), num_classes: int = 10,
             hidden_sizes: Sequence[int] = (128,)) -> nn.Sequential:
    """Flatten, then Linear+ReLU per hidden size, then a Linear to the class logits (784-128-10 on MNIST)."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in _widths("hidden_sizes", hidden_sizes):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def make_cnn(input_shape: Sequence[int] = (1, 28, 28), num_classes: int = 10,
             channels: Sequence[int] = (32, 64), hidden: int = 128, dropout: float = 0.25) -> nn.Sequential:
    """Conv3x3+ReLU per channel count, a 2x2 max-pool, dropout, then Linear+ReLU and Linear.

    pytorch/examples' MNIST net is channels (32, 64), hidden 128 (it uses dropout 0.25 and 0.5).
    """
    if not 0 <= dropout < 1:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    in_channels, height, width = input_shape
    layers: list[nn.Module] = []
    for out in _widths("channels", channels):
        layers += [nn.Conv2d(in_channels, out, 3, 1), nn.ReLU()]
        in_channels, height, width = out, height - 2, width - 2
    if height < 2 or width < 2:
        raise ValueError(f"{len(channels)} conv layers leave nothing of a {input_shape} input")
    hidden = _widths("hidden", [hidden])[0]
    layers += [nn.MaxPool2d(2), nn.Dropout(dropout), nn.Flatten(),
               nn.Linear(in_channels * (height // 2) * (width // 2), hidden), nn.ReLU(),
               nn.Dropout(dropout), nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)
