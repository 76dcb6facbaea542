"""A user's dataset function: MNIST as float tensors, standardised here rather than by hpsearch.

hpsearch calls `mnist(root, **args)` once, in the driver, and ships what it returns to every
trial through Ray's object store. It returns (train, val, test); val is None, so hpsearch
draws the validation examples from train with data.split_seed, the same for every trial.
"""

from __future__ import annotations

import torch
from torchvision import datasets


def mnist(root: str, mean: float = 0.1307, std: float = 0.3081):
    """((X, y), None, (X_test, y_test)) with X float32 of shape (N, 1, 28, 28)."""

    def tensors(train: bool) -> tuple[torch.Tensor, torch.Tensor]:
        # download=True finds the raw files under root/MNIST/raw and unpacks them (no network)
        part = datasets.MNIST(root, train=train, download=True)
        images = part.data.unsqueeze(1).float().div_(255).sub_(mean).div_(std)
        return images, part.targets

    return tensors(True), None, tensors(False)
