"""Datasets, the fixed train/validation split and the two batch sources."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from torchvision import datasets

from trainable.batches import InMemoryBatches, make_loader
from trainable.config import DATASETS, SOURCES, TrialConfig
from trainable.data import RAW_FILES, TORCHVISION_SETS, Arrays, load_dataset, normalization, split
from trainable.errors import DataError
from trainable.loop import build_run, make_batches, train_and_evaluate

CPU = torch.device("cpu")
MEAN, STD = normalization("mnist")
# the folder torchvision reads each dataset from, under the data root
FOLDERS = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST", "kmnist": "KMNIST"}


@pytest.fixture(scope="module")
def indexed_1000(mnist_train) -> Arrays:
    """1000 real images whose labels are their own index, so every batch says which samples it holds."""
    return Arrays(mnist_train.images[:1000], np.arange(1000, dtype=np.int64))


# --- loading ---------------------------------------------------------------------------------

def test_mnist_loads_as_uint8_arrays(mnist_train):
    assert mnist_train.images.shape == (60_000, 28, 28)
    assert mnist_train.images.dtype == np.uint8
    assert mnist_train.labels.shape == (60_000,)
    assert mnist_train.labels.dtype == np.int64
    assert set(np.unique(mnist_train.labels)) == set(range(10))


@pytest.mark.parametrize("name", DATASETS)
def test_missing_files_give_a_data_error_naming_folder_and_files(name, tmp_path, monkeypatch):
    # a refused connection instead of the real mirrors: the same failure as offline, at once,
    # and no download on a machine that is online
    monkeypatch.setattr(TORCHVISION_SETS[name][0], "mirrors", ["http://127.0.0.1:9/"])
    with pytest.raises(DataError) as caught:
        load_dataset(name, tmp_path)
    message = str(caught.value)
    assert str(tmp_path / FOLDERS[name] / "raw") in message
    for file in RAW_FILES:
        assert file in message
    assert "--data-root" in message and "HPSEARCH_DATA" in message


def test_unreadable_files_give_a_data_error(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for file in RAW_FILES:
        (raw / file).write_bytes(b"not an IDX file")
    with pytest.raises(DataError) as caught:
        load_dataset("mnist", tmp_path)
    assert str(raw) in str(caught.value)


def write_idx(path, array: np.ndarray) -> None:
    """An uncompressed IDX file: big-endian magic (2051 images, 2049 labels), dims, uint8 data."""
    magic = {3: 2051, 1: 2049}[array.ndim]
    header = struct.pack(f">{1 + array.ndim}i", magic, *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def tiny_raw_sets(tmp_path):
    """fashion_mnist and kmnist as tiny raw folders (120 train / 20 test images); no download."""
    rng = np.random.default_rng(0)
    parts = {
        "train": (rng.integers(0, 256, (120, 28, 28), dtype=np.uint8), rng.integers(0, 10, 120, dtype=np.uint8)),
        "t10k": (rng.integers(0, 256, (20, 28, 28), dtype=np.uint8), rng.integers(0, 10, 20, dtype=np.uint8)),
    }
    for name in ("fashion_mnist", "kmnist"):
        raw = tmp_path / FOLDERS[name] / "raw"
        raw.mkdir(parents=True)
        for part, (images, labels) in parts.items():
            write_idx(raw / f"{part}-images-idx3-ubyte", images)
            write_idx(raw / f"{part}-labels-idx1-ubyte", labels)
    return tmp_path, parts


@pytest.mark.parametrize("name", ["fashion_mnist", "kmnist"])
def test_other_datasets_load_and_train(name, tiny_raw_sets):
    root, parts = tiny_raw_sets
    for train, part in ((True, "train"), (False, "t10k")):
        arrays = load_dataset(name, root, train=train)
        images, labels = parts[part]
        assert arrays.images.dtype == np.uint8 and arrays.labels.dtype == np.int64
        np.testing.assert_array_equal(arrays.images, images)
        np.testing.assert_array_equal(arrays.labels, labels.astype(np.int64))

    config = TrialConfig(dataset=name, train_size=100, val_size=20, epochs=1, batch_size=32)
    train_arrays, val_arrays = split(load_dataset(name, root), 100, 20, config.split_seed)
    run = build_run(config, train_arrays, val_arrays, CPU)
    # pixels are standardised with the dataset's own statistics, not MNIST's
    mean, std = normalization(name)
    assert (mean, std) != normalization("mnist")
    expected = (torch.from_numpy(val_arrays.images).float() / 255 - mean) / std
    torch.testing.assert_close(run.val_batches.images, expected.unsqueeze(1))
    (record,) = train_and_evaluate(run)
    assert np.isfinite(record.train_loss) and np.isfinite(record.val_loss)


def test_every_dataset_has_plausible_normalization():
    for name in DATASETS:
        mean, std = normalization(name)
        assert 0 < mean < 1 and 0 < std < 1


# --- split -------------------------------------------------------------------------------------

def test_split_is_disjoint_sized_and_fixed_by_split_seed_and_val_size():
    arrays = Arrays(np.zeros((6000, 28, 28), np.uint8), np.arange(6000, dtype=np.int64))
    train, val = split(arrays, 4000, 1000, split_seed=0)
    assert (len(train), len(val)) == (4000, 1000)
    assert not set(train.labels) & set(val.labels)
    assert len(set(train.labels)) == 4000

    # the validation set depends neither on train_size nor on the global RNG a trial seeds
    torch.manual_seed(1)
    _, val_small = split(arrays, 500, 1000, split_seed=0)
    torch.manual_seed(2)
    _, val_again = split(arrays, 4000, 1000, split_seed=0)
    np.testing.assert_array_equal(val.labels, val_small.labels)
    np.testing.assert_array_equal(val.labels, val_again.labels)

    _, val_other = split(arrays, 4000, 1000, split_seed=1)
    assert set(val_other.labels) != set(val.labels)


def test_every_trial_seed_sees_the_same_validation_images(mnist_train):
    train, val = split(mnist_train, 2000, 500, split_seed=0)
    runs = [build_run(TrialConfig(train_size=2000, val_size=500, seed=seed), train, val, CPU) for seed in (1, 2)]
    assert torch.equal(runs[0].val_batches.images, runs[1].val_batches.images)
    assert torch.equal(runs[0].val_batches.labels, runs[1].val_batches.labels)
    # while the trials do differ in their shuffling
    assert not torch.equal(next(iter(runs[0].train_batches))[1], next(iter(runs[1].train_batches))[1])

    _, val_other = split(mnist_train, 2000, 500, split_seed=1)
    assert not np.array_equal(val.images, val_other.images)


def test_split_larger_than_the_dataset_is_a_data_error():
    arrays = Arrays(np.zeros((100, 28, 28), np.uint8), np.zeros(100, np.int64))
    with pytest.raises(DataError, match="train_size \\+ val_size must be <= 100, got 90 \\+ 20"):
        split(arrays, 90, 20, split_seed=0)


# --- batch sources ------------------------------------------------------------------------------

def batches_of(source: str, arrays: Arrays, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    if source == "loader":
        return make_loader(arrays, batch_size, mean=MEAN, std=STD, shuffle=shuffle, generator=generator,
                           drop_last=drop_last)
    return InMemoryBatches(arrays, batch_size, CPU, mean=MEAN, std=STD, shuffle=shuffle, drop_last=drop_last,
                           generator=generator)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("drop_last, samples, sizes", [
    (False, 1000, [64] * 15 + [40]),
    (True, 960, [64] * 15),
])
def test_batch_sources_yield_every_sample_once_and_respect_drop_last(indexed_1000, source, drop_last,
                                                                     samples, sizes):
    batches = batches_of(source, indexed_1000, 64, shuffle=True, drop_last=drop_last)
    assert len(batches) == len(sizes)
    for _ in range(2):  # every epoch, not just the first
        seen = [y for _, y in batches]
        assert [len(y) for y in seen] == sizes
        indices = torch.cat(seen)
        assert len(indices) == samples
        assert len(set(indices.tolist())) == samples  # no sample twice
    assert not torch.equal(indices, torch.arange(samples))  # shuffled


@pytest.mark.parametrize("source", SOURCES)
def test_config_drop_last_applies_to_training_batches_only(indexed_1000, source):
    config = TrialConfig(source=source, batch_size=64, drop_last=True)
    generator = torch.Generator().manual_seed(0)
    training = make_batches(config, indexed_1000, CPU, shuffle=True, generator=generator)
    validation = make_batches(config, indexed_1000, CPU, shuffle=False, generator=None)
    assert sum(len(y) for _, y in training) == 960
    assert sum(len(y) for _, y in validation) == 1000


def test_both_sources_yield_the_same_tensors_in_the_same_order(indexed_1000):
    memory = list(batches_of("memory", indexed_1000, 64, shuffle=False, drop_last=False))
    loader = list(batches_of("loader", indexed_1000, 64, shuffle=False, drop_last=False))
    assert len(memory) == len(loader) == 16
    for (X_m, y_m), (X_l, y_l) in zip(memory, loader):
        assert X_m.dtype == X_l.dtype == torch.float32
        assert X_m.shape == X_l.shape
        assert torch.equal(X_m, X_l)
        assert torch.equal(y_m, y_l)
    # standardised as torchvision's ToDtype(scale=True) + Normalize would
    expected = (torch.from_numpy(indexed_1000.images[:64]).float() / 255 - MEAN) / STD
    torch.testing.assert_close(memory[0][0], expected.unsqueeze(1))
    assert torch.equal(torch.cat([y for _, y in memory]), torch.arange(1000))


def test_in_memory_shuffle_is_driven_by_the_generator(indexed_1000):
    def order(seed):
        return torch.cat([y for _, y in batches_of("memory", indexed_1000, 100, shuffle=True, drop_last=False,
                                                   seed=seed)])

    assert torch.equal(order(5), order(5))
    assert not torch.equal(order(5), order(6))
