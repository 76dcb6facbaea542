"""The data of the example, in a file beside train.py: `from problem import make_data` works from any
folder the search starts in (hpsearch puts train.py's folder first on the path, as `python train.py` does)."""

from __future__ import annotations

import torch


def make_data(n: int = 1024, features: int = 10):
    """A fixed synthetic regression (the same for every trial): a smooth function of the inputs plus noise."""
    problem = torch.Generator().manual_seed(1234)
    inputs = torch.randn(n, features, generator=problem)
    weights = torch.randn(features, generator=problem)
    targets = torch.sin(inputs @ weights / 2) + 0.1 * torch.randn(n, generator=problem)
    split = n * 3 // 4
    return (inputs[:split], targets[:split]), (inputs[split:], targets[split:])
