"""Two batch sources with one interface: an iterable of (X, y) batches.

- InMemoryBatches: the whole split as one float tensor on the trial's device, shuffled
  with `torch.randperm(generator=...)` and sliced. For MNIST-sized data this is the fast
  default: no per-sample Python work, no host-to-device copy per batch.
- make_loader: a torch DataLoader over the same arrays, for data that does not fit in
  memory or needs per-sample work; exposes the knobs users expect.

Both prepare inputs the same way (data.prepare_inputs), so they feed the model the same numbers.
InMemoryBatches prepares a split once per process (`prepared`): a reused actor's next trial takes it as it is.
"""

from __future__ import annotations

import warnings
from typing import Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from trainable.data import Arrays, Standardize, prepare_inputs
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


# Per process: the splits InMemoryBatches prepared last, by the id of their stored inputs. A reused actor runs
# trial after trial on the same arrays (trainable/adapter.py keeps the data it fetched), and preparing them again
# was most of a trial's setup: ~90 ms for MNIST's 50,000 training images, as long as one epoch of a short trial
# (docs/performance.md). Two entries, a trial's training and validation splits: a running trial holds them
# anyway, so an idle actor holds no more than its last trial did. Nothing writes to them: a batch is an indexed copy.
_prepared: dict[int, tuple[np.ndarray, Standardize | None, torch.device, torch.Tensor]] = {}
PREPARED_KEPT = 2


def prepared(inputs: np.ndarray, standardize: Standardize | None, device: torch.device) -> torch.Tensor:
    """data.prepare_inputs of a whole split on `device`, made once per process for the same arrays."""
    kept = _prepared.get(id(inputs))
    # the array itself is kept with it: an id is reused once its array is gone
    if kept is not None and kept[0] is inputs and kept[1] == standardize and kept[2] == device:
        return kept[3]
    tensor = prepare_inputs(as_tensor(inputs).to(device), standardize)
    _prepared.pop(id(inputs), None)
    while len(_prepared) >= PREPARED_KEPT:
        del _prepared[next(iter(_prepared))]  # the oldest: dicts keep their order of insertion
    _prepared[id(inputs)] = (inputs, standardize, device, tensor)
    return tensor


class InMemoryBatches:
    """Batches sliced from tensors already on the device, in a fresh random order each epoch."""

    def __init__(self, arrays: Arrays, batch_size: int, device: torch.device, *,
                 standardize: Standardize | None, shuffle: bool, drop_last: bool = False,
                 generator: torch.Generator | None = None):
        # one conversion for the whole split, done on the device that will use it, once per process
        self.inputs = prepared(arrays.inputs, standardize, device)
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
        order = order.to(self.inputs.device)
        for batch in range(len(self)):
            index = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            yield self.inputs[index], self.labels[index]


class ArrayDataset(Dataset):
    """Per-sample access to stored arrays, prepared one input at a time."""

    def __init__(self, arrays: Arrays, standardize: Standardize | None):
        self.inputs = as_tensor(arrays.inputs)
        self.labels = as_tensor(arrays.labels)
        self.standardize = standardize

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return prepare_inputs(self.inputs[index:index + 1], self.standardize)[0], self.labels[index]


def make_loader(arrays: Arrays, batch_size: int, *, standardize: Standardize | None, shuffle: bool,
                generator: torch.Generator | None = None, drop_last: bool = False,
                num_workers: int = 0, pin_memory: bool = False,
                persistent_workers: bool = False) -> DataLoader:
    """A DataLoader over `arrays`, seeded through `generator=` and `worker_init_fn`."""
    return DataLoader(
        ArrayDataset(arrays, standardize),
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=drop_last,
        generator=generator,
        worker_init_fn=seed_worker,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=persistent_workers and num_workers > 0,
    )
