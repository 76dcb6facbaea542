"""A user's dataset function with float targets: a noisy nonlinear function of 8 inputs.

hpsearch calls `friedman(root, **args)` once, in the driver. The data are drawn here with their
own seed (root is not needed: nothing is read from disk), so every run of the example sees the
same examples. It returns (train, val, test), each a pair (X float32 (N, 8), y float32 (N,)):
float targets of shape (N,), for training.loss mse or smooth_l1. A model with one output fits
them (its (N, 1) output is squeezed to (N,)).
"""

from __future__ import annotations

import numpy as np


def friedman(root: str, n_train: int = 2000, n_val: int = 500, n_test: int = 500, noise: float = 0.5,
             seed: int = 0):
    """Friedman's #1 regression problem (5 of the 8 inputs matter), inputs uniform in [0, 1)."""
    rng = np.random.default_rng(seed)

    def part(n: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.random((n, 8), dtype=np.float32)
        y = (10 * np.sin(np.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4]
             + noise * rng.standard_normal(n))
        return x, y.astype(np.float32)

    return part(n_train), part(n_val), part(n_test)
