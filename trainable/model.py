"""The template's model: a multilayer perceptron over flattened 28x28 images."""

from __future__ import annotations

from torch import nn


def make_mlp(hidden_sizes: tuple[int, ...], in_features: int = 28 * 28, num_classes: int = 10) -> nn.Sequential:
    """Flatten, then Linear+ReLU per hidden size, then a Linear to the class logits."""
    layers: list[nn.Module] = [nn.Flatten()]
    width = in_features
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
