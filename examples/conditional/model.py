"""An MLP whose depth is a keyword and each extra layer's width another: the model of
examples/conditional/space.yaml, where `width_2` and `width_3` are searched only at the depths
that use them (`when: {model.layers: ...}`)."""

from __future__ import annotations

import math

from torch import nn


def mlp(input_shape=(1, 28, 28), num_classes=10, layers: int = 1, width_1: int = 128, width_2: int = 64,
        width_3: int = 32) -> nn.Sequential:
    """Flatten, then `layers` Linear+ReLU of widths width_1, width_2, width_3 (the first `layers` of them)."""
    if layers not in (1, 2, 3):
        raise ValueError(f"layers must be 1, 2 or 3, got {layers!r}")
    modules: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for hidden in (width_1, width_2, width_3)[:layers]:
        modules += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    modules.append(nn.Linear(width, num_classes))
    return nn.Sequential(*modules)
