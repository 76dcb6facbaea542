"""Two batch sources with one interface: an iterable of (X, y) batches.

- InMemoryBatches: the whole split as one float tensor on the trial's device, shuffled
  with `torch.randperm(generator=...)` and sliced. For MNIST-sized data this is the fast
  default: no per-sample Python work, no host-to-device copy per batch.
- make_loader: a torch DataLoader over the same arrays, for data that does not fit in
  memory or needs per-sample work; exposes the knobs users expect.

Both standardise pixels the same way, so they feed the model the same numbers.
"""

from __future__ import annotations

import warnings
from typing import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainable.data import Arrays
from trainable.seed import seed_worker

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A zero-copy tensor view of an array that may be read-only.

    Arrays read from Ray's object store are read-only; torch warns because writing through
    the view would fail. Nothing here writes to them (they are only read and converted).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array)


def standardize(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    """uint8 (..., 28, 28) -> float32 (..., 1, 28, 28), scaled to [0, 1] and standardised."""
    # in place on one fresh copy: a whole split in ~0.1 s instead of ~0.4 s for the
    # three temporaries of ((x / 255) - mean) / std
    pixels = images.to(torch.float32, copy=True)
    return pixels.mul_(1.0 / (255.0 * std)).sub_(mean / std).unsqueeze(-3)


class InMemoryBatches:
    """Batches sliced from tensors already on the device, in a fresh random order each epoch."""

    def __init__(self, arrays: Arrays, batch_size: int, device: torch.device, *,
                 mean: float, std: float, shuffle: bool, drop_last: bool = False,
                 generator: torch.Generator | None = None):
        # one conversion for the whole split, done on the device that will use it
        self.images = standardize(as_tensor(arrays.images).to(device), mean, std)
        self.labels = as_tensor(arrays.labels).to(device)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.generator = generator

    def __len__(self) -> int:
        n, b = len(self.labels), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = len(self.labels)
        # the permutation is drawn on the CPU generator (its state is checkpointed)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        order = order.to(self.images.device)
        for batch in range(len(self)):
            index = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            yield self.images[index], self.labels[index]


class ArrayDataset(Dataset):
    """Per-sample access to uint8 arrays, standardised one image at a time."""

    def __init__(self, arrays: Arrays, mean: float, std: float):
        self.images = as_tensor(arrays.images)
        self.labels = as_tensor(arrays.labels)
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return standardize(self.images[index], self.mean, self.std), self.labels[index]


def make_loader(arrays: Arrays, batch_size: int, *, mean: float, std: float, shuffle: bool,
                generator: torch.Generator | None = None, drop_last: bool = False,
                num_workers: int = 0, pin_memory: bool = False,
                persistent_workers: bool = False) -> DataLoader:
    """A DataLoader over `arrays`, seeded through `generator=` and `worker_init_fn`."""
    return DataLoader(
        ArrayDataset(arrays, mean, std),
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        generator=generator,
        worker_init_fn=seed_worker,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
    )
