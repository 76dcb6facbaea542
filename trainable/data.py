"""Datasets as arrays: torchvision's 28x28 grayscale sets, a fixed train/validation split.

Loading returns uint8 arrays (47 MB for MNIST's training set, a quarter of float32), the
form the driver ships to trials through Ray's object store; trials convert on their device.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision import datasets

from trainable.errors import DataError

# config.DATASETS name -> (torchvision class, per-pixel mean and std of its training set)
TORCHVISION_SETS: dict[str, tuple[type, float, float]] = {
    "mnist": (datasets.MNIST, 0.1307, 0.3081),
    "fashion_mnist": (datasets.FashionMNIST, 0.2860, 0.3530),
    "kmnist": (datasets.KMNIST, 0.1918, 0.3483),
}
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
NUM_CLASSES = 10


@dataclass(frozen=True)
class Arrays:
    """Images (N, 28, 28) uint8 and labels (N,) int64 of one dataset part."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, index: np.ndarray) -> "Arrays":
        return Arrays(self.images[index], self.labels[index])


def default_data_root() -> Path:
    """$HPSEARCH_DATA, else a per-user cache folder."""
    if os.environ.get("HPSEARCH_DATA"):
        return Path(os.environ["HPSEARCH_DATA"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "hpsearch"


def raw_folder(name: str, root: str | Path) -> Path:
    return Path(root).expanduser() / TORCHVISION_SETS[name][0].__name__ / "raw"


def load_dataset(name: str, root: str | Path | None = None, *, train: bool = True) -> Arrays:
    """The training (60,000) or test (10,000) part of dataset `name` as uint8 arrays.

    torchvision reads the unpacked raw files if present; otherwise `download=True` checks
    the md5 of the four .gz files in the raw folder and unpacks them (no network), and only
    downloads what is missing. If that fails too, a DataError says where to put which files.
    """
    root = Path(root).expanduser() if root is not None else default_data_root()
    cls = TORCHVISION_SETS[name][0]
    try:
        dataset = cls(str(root), train=train, download=True)
    except Exception as error:  # no network, bad md5, a truncated or corrupt file (torchvision asserts)
        files = ", ".join(f"{f}.gz" for f in RAW_FILES)
        raise DataError(
            f"{name}: could not load the dataset from {raw_folder(name, root)} "
            f"({type(error).__name__}: {error}).\n"
            f"Put its four raw files there ({files}) or the same files unpacked, "
            f"or choose another folder with --data-root or HPSEARCH_DATA."
        ) from None
    return Arrays(dataset.data.numpy(), dataset.targets.numpy().astype(np.int64))


def split(arrays: Arrays, train_size: int, val_size: int, split_seed: int) -> tuple[Arrays, Arrays]:
    """A fixed, disjoint train/validation split drawn with its own generator.

    The validation part is the first `val_size` of one permutation, so it depends only on
    `val_size` and `split_seed`: every trial of a search, whatever its seed or train_size,
    is judged on the same images.
    """
    if train_size + val_size > len(arrays):
        raise DataError(f"train_size + val_size must be <= {len(arrays)}, got {train_size} + {val_size}")
    order = torch.randperm(len(arrays), generator=torch.Generator().manual_seed(split_seed)).numpy()
    return arrays.take(order[val_size:val_size + train_size]), arrays.take(order[:val_size])


def normalization(name: str) -> tuple[float, float]:
    """Mean and std used to standardise pixels of dataset `name` (scaled to [0, 1])."""
    _, mean, std = TORCHVISION_SETS[name]
    return mean, std
