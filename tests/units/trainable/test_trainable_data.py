"""Datasets (built-in and a user's dataset function), the fixed train/validation split and the two batch sources."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torchvision.datasets import cifar

from trainable.batches import InMemoryBatches, make_loader
from trainable.config import BUILTIN_DATASETS, SOURCES, TrialConfig
from trainable.data import (BUILTIN_CLASSES, RAW_FILES, TORCHVISION_SETS, Arrays, Data, Standardize, load_data,
                            load_dataset, prepare_inputs, split, torchvision_class)
from trainable.errors import ConfigError, DataError
from trainable.loop import build_run, make_batches, train_and_evaluate

CPU = torch.device("cpu")
MNIST = Standardize(*TORCHVISION_SETS["mnist"][1:])
# the folder torchvision reads each dataset from, under the data root
FOLDERS = {"mnist": "MNIST/raw", "fashion_mnist": "FashionMNIST/raw", "kmnist": "KMNIST/raw",
           "cifar10": "cifar-10-batches-py"}


@pytest.fixture(scope="module")
def indexed_1000(mnist_train) -> Arrays:
    """1000 real images whose labels are their own index, so every batch says which samples it holds."""
    return Arrays(mnist_train.inputs[:1000], np.arange(1000, dtype=np.int64))


def mnist_data(train: Arrays, val: Arrays) -> Data:
    return Data(train, val, None, BUILTIN_CLASSES, (1, 28, 28), MNIST)


# --- loading the built-in sets ---------------------------------------------------------------

def test_mnist_loads_as_uint8_arrays(mnist_train):
    assert mnist_train.inputs.shape == (60_000, 28, 28)
    assert mnist_train.inputs.dtype == np.uint8
    assert mnist_train.labels.shape == (60_000,)
    assert mnist_train.labels.dtype == np.int64
    assert set(np.unique(mnist_train.labels)) == set(range(10))


def test_load_data_splits_mnist_and_keeps_the_test_part_apart(data_root, mnist_train):
    config = TrialConfig(train_size=2000, val_size=500)
    data = load_data(config, data_root)
    assert (len(data.train), len(data.val), len(data.test)) == (2000, 500, 10_000)
    assert (data.num_classes, data.input_shape, data.standardize) == (10, (1, 28, 28), MNIST)
    expected_train, expected_val = split(mnist_train, 2000, 500, config.split_seed)
    np.testing.assert_array_equal(data.val.inputs, expected_val.inputs)
    np.testing.assert_array_equal(data.train.labels, expected_train.labels)
    assert data.for_trials().test is None  # trials never get the test part
    assert load_data(config, data_root, with_test=False).test is None


def test_default_sizes_are_a_sixth_for_validation_and_the_rest_for_training(data_root):
    data = load_data(TrialConfig(), data_root, with_test=False)
    assert (len(data.train), len(data.val)) == (50_000, 10_000)


@pytest.mark.parametrize("name", BUILTIN_DATASETS)
def test_missing_files_give_a_data_error_naming_folder_and_files(name, tmp_path, monkeypatch):
    # a refused connection instead of the real mirrors: the same failure as offline, at once,
    # and no download on a machine that is online
    cls = torchvision_class(name)
    if name == "cifar10":
        monkeypatch.setattr(cls, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    else:
        monkeypatch.setattr(cls, "mirrors", ["http://127.0.0.1:9/"])
    with pytest.raises(DataError) as caught:
        load_dataset(name, tmp_path)
    message = str(caught.value)
    assert str(tmp_path / FOLDERS[name]) in message
    files = ["cifar-10-python.tar.gz"] if name == "cifar10" else RAW_FILES
    for file in files:
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


# prints what it loaded, in brief: its size and a checksum of images and labels
LOAD = ("import sys, numpy as np; from trainable.data import load_dataset; "
        "a = load_dataset('mnist', sys.argv[1]); print(len(a), int(a.inputs.sum()), int(np.bincount(a.labels)[0]))")


def test_searches_started_at_once_on_a_fresh_data_root_all_read_it(data_root, tmp_path):
    # the first read unpacks the .gz files in place; a process that came meanwhile once found
    # them half written (two jobs at once on a shared cluster)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for packed in (data_root / "MNIST" / "raw").glob("*.gz"):
        shutil.copyfile(packed, raw / packed.name)
    readers = [subprocess.Popen([sys.executable, "-c", LOAD, str(tmp_path)], cwd=Path(__file__).parents[3],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outputs = [reader.communicate(timeout=300) for reader in readers]
    for reader, (_, err) in zip(readers, outputs):
        assert reader.returncode == 0, err[-2000:]
    assert len({out for out, _ in outputs}) == 1 and outputs[0][0].startswith("60000 "), outputs


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
        raw = tmp_path / FOLDERS[name]
        raw.mkdir(parents=True)
        for part, (images, labels) in parts.items():
            write_idx(raw / f"{part}-images-idx3-ubyte", images)
            write_idx(raw / f"{part}-labels-idx1-ubyte", labels)
    return tmp_path, parts


def expected_inputs(images: np.ndarray, standardize: Standardize) -> torch.Tensor:
    """(x / 255 - mean) / std per channel, channels first: torchvision's ToDtype(scale=True) + Normalize."""
    x = torch.from_numpy(images).float() / 255
    x = x.permute(0, 3, 1, 2) if x.dim() == 4 else x.unsqueeze(1)
    mean = torch.tensor(standardize.mean).view(-1, 1, 1)
    std = torch.tensor(standardize.std).view(-1, 1, 1)
    return (x - mean) / std


@pytest.mark.parametrize("name", ["fashion_mnist", "kmnist"])
def test_other_datasets_load_and_train(name, tiny_raw_sets):
    root, parts = tiny_raw_sets
    for train, part in ((True, "train"), (False, "t10k")):
        arrays = load_dataset(name, root, train=train)
        images, labels = parts[part]
        assert arrays.inputs.dtype == np.uint8 and arrays.labels.dtype == np.int64
        np.testing.assert_array_equal(arrays.inputs, images)
        np.testing.assert_array_equal(arrays.labels, labels.astype(np.int64))

    config = TrialConfig(dataset=name, train_size=100, val_size=20, epochs=1, batch_size=32)
    data = load_data(config, root)
    np.testing.assert_array_equal(data.test.inputs, parts["t10k"][0])
    run = build_run(config, data, CPU)
    # pixels are standardised with the dataset's own statistics, not MNIST's
    assert data.standardize == Standardize(*TORCHVISION_SETS[name][1:]) != MNIST
    torch.testing.assert_close(run.val_batches.inputs, expected_inputs(data.val.inputs, data.standardize))
    (record,) = train_and_evaluate(run)
    assert np.isfinite(record.train_loss) and np.isfinite(record.val_loss)


@pytest.fixture
def tiny_cifar(tmp_path, monkeypatch):
    """cifar10 as tiny pickled batches (5 x 12 train / 10 test images); md5 checks skipped, no download."""
    monkeypatch.setattr(cifar, "check_integrity", lambda *args, **kwargs: True)
    folder = tmp_path / FOLDERS["cifar10"]
    folder.mkdir()
    rng = np.random.default_rng(0)
    files = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for file in files:
        n = 10 if file == "test_batch" else 12
        entry = {"data": rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8),
                 "labels": rng.integers(0, 10, n).tolist()}
        (folder / file).write_bytes(pickle.dumps(entry))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    return tmp_path


def test_cifar10_loads_channels_last_and_trains_channels_first(tiny_cifar):
    arrays = load_dataset("cifar10", tiny_cifar)
    assert arrays.inputs.shape == (60, 32, 32, 3) and arrays.inputs.dtype == np.uint8
    config = TrialConfig(dataset="cifar10", train_size=50, val_size=10, epochs=1, batch_size=16)
    data = load_data(config, tiny_cifar)
    assert (data.input_shape, data.num_classes, len(data.test)) == ((3, 32, 32), 10, 10)
    assert len(data.standardize.mean) == len(data.standardize.std) == 3
    for model, model_args in (("mlp", {"hidden_sizes": [16]}), ("cnn", {"channels": [4], "hidden": 8})):
        run = build_run(dataclasses.replace(config, model=model, model_args=model_args), data, CPU)
        torch.testing.assert_close(run.val_batches.inputs, expected_inputs(data.val.inputs, data.standardize))
        (record,) = train_and_evaluate(run)
        assert np.isfinite(record.train_loss)


def test_every_dataset_has_plausible_standardisation():
    for name, (_, mean, std) in TORCHVISION_SETS.items():
        assert len(mean) == len(std) == (3 if name == "cifar10" else 1)
        assert all(0 < m < 1 for m in mean) and all(0 < s < 1 for s in std)


def test_prepare_inputs_standardises_per_channel_and_leaves_user_inputs_alone():
    images = torch.randint(0, 256, (5, 8, 8, 3), dtype=torch.uint8)
    standardize = Standardize((0.1, 0.5, 0.9), (0.2, 0.3, 0.4))
    prepared = prepare_inputs(images, standardize)
    assert prepared.shape == (5, 3, 8, 8) and prepared.dtype == torch.float32
    torch.testing.assert_close(prepared, expected_inputs(images.numpy(), standardize))
    assert images.dtype == torch.uint8  # a fresh tensor: the stored images are not changed
    # a user's inputs are used as given; float64 becomes float32, which models take
    user = torch.randn(4, 6, dtype=torch.float64)
    assert prepare_inputs(user, None).dtype == torch.float32
    torch.testing.assert_close(prepare_inputs(user, None), user.float())
    floats = torch.randn(4, 6)
    assert prepare_inputs(floats, None) is floats


# --- a user's dataset function ------------------------------------------------------------

DATASETS_PY = '''
import torch
from torch.utils.data import Dataset


def tensors(root, n=300, classes=3, with_test=False):
    """(X, y) pairs: n examples of shape (4,), float64 as numpy users often have them."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = torch.arange(n) % classes
    test = (torch.randn(30, 4, generator=g), torch.arange(30) % classes)
    return ((X, y), None, test) if with_test else ((X, y), None)


class Pairs(Dataset):
    def __init__(self, X, y):
        self.X, self.y = X, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.X[i], int(self.y[i])


def datasets(root):
    """Datasets of (x, y) pairs, with a given validation part."""
    g = torch.Generator().manual_seed(1)
    X, y = torch.randn(100, 2, 5, generator=g), torch.arange(100) % 4
    Xv, yv = torch.randn(40, 2, 5, generator=g), torch.arange(40) % 4
    return Pairs(X, y), Pairs(Xv, yv)


def single(root):
    return torch.zeros(10, 4)


def numpy_parts(root):
    import numpy as np

    X, y = np.zeros((60, 1, 8, 8)), np.arange(60) % 10
    return (X[:50], y[:50]), (X[50:], y[50:])


def numpy_pair(root):
    import numpy as np

    return np.zeros((60, 1, 8, 8)), np.arange(60) % 10


def four(root):
    part = (torch.zeros(10, 4), torch.zeros(10, dtype=torch.long))
    return part, None, None, None


def negative(root):
    return (torch.zeros(4, 2), torch.tensor([0, 1, -1, 0])), None


def float_labels(root):
    return (torch.zeros(4, 2), torch.zeros(4)), None


def shapes(root):
    return ((torch.zeros(10, 4), torch.zeros(10, dtype=torch.long)),
            (torch.zeros(5, 3), torch.zeros(5, dtype=torch.long)))


def raises(root):
    raise FileNotFoundError(f"nothing in {root}")


def bare_tensor(root):
    """A train part that is one tensor, not a pair (X, y): rows of two numbers, all in [0, 1)."""
    return torch.rand(60, 2, generator=torch.Generator().manual_seed(0)), None


class FloatLabels(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return torch.zeros(3), 0.5 + i % 2  # 0.5 and 1.5: not class indices


def dataset_of_float_labels(root):
    return FloatLabels(), None


def string_inputs(root):
    import numpy as np
    return (np.array([["a", "b"]] * 10), np.zeros(10, dtype=np.int64)), None


def object_inputs(root):
    import numpy as np
    return (np.array([None, 1.0] * 5, dtype=object), np.zeros(10, dtype=np.int64)), None


def dataset_of_strings(root):
    return Pairs(["text"] * 10, [0, 1] * 5), None


def string_labels(root):
    import numpy as np
    return (torch.zeros(10, 2), np.array(["cat", "dog"] * 5)), None


def stray_label(root):
    return (torch.zeros(12, 2), torch.tensor([0, 1] * 5 + [1, 30_000_000])), None


def exits(root):
    import sys
    sys.exit(0)


def one_class(root):
    return (torch.randn(12, 2), torch.full((12,), 2)), None


def no_root(n=100):
    return (torch.randn(n, 2), torch.zeros(n, dtype=torch.long)), None


def nothing_positional(*, n=100):
    return (torch.randn(n, 2), torch.zeros(n, dtype=torch.long)), None
'''


@pytest.fixture
def user_file(tmp_path):
    """A dataset module the test wrote: FILE.py references to its functions."""
    path = tmp_path / "my_data.py"
    path.write_text(textwrap.dedent(DATASETS_PY))
    return lambda name: f"{path}:{name}"


def user_data(reference: str, root, **fields) -> Data:
    return load_data(TrialConfig(dataset=reference, **fields), root, key="data.dataset")


def test_a_dataset_function_of_tensor_pairs_loads_with_shape_and_classes_from_the_data(user_file, tmp_path):
    data = user_data(user_file("tensors"), tmp_path)
    assert (data.input_shape, data.num_classes, data.standardize) == ((4,), 3, None)
    assert (len(data.train), len(data.val)) == (250, 50)  # a sixth for validation, the rest for training
    assert data.train.inputs.dtype == np.float32 and data.train.labels.dtype == np.int64
    assert data.test is None
    # disjoint parts of the 300 examples (all inputs differ)
    rows = {tuple(x) for x in np.concatenate([data.train.inputs, data.val.inputs])}
    assert len(rows) == 300
    # keyword arguments come from data_args, and a test part is kept apart
    data = user_data(user_file("tensors"), tmp_path, data_args={"n": 120, "classes": 5, "with_test": True})
    assert (len(data.train) + len(data.val), data.num_classes, len(data.test)) == (120, 5, 30)
    assert load_data(TrialConfig(dataset=user_file("tensors"), data_args={"with_test": True}), tmp_path,
                     with_test=False).test is None


def test_a_dataset_function_of_pair_datasets_uses_its_validation_part(user_file, tmp_path):
    data = user_data(user_file("datasets"), tmp_path)
    assert (data.input_shape, data.num_classes) == ((2, 5), 4)
    assert (len(data.train), len(data.val)) == (100, 40)  # the given val part, all of it
    np.testing.assert_array_equal(data.val.labels, np.arange(40) % 4)
    # sizes draw that many examples of the given parts, with the split seed
    data = user_data(user_file("datasets"), tmp_path, train_size=60, val_size=10)
    assert (len(data.train), len(data.val)) == (60, 10)
    with pytest.raises(DataError, match="val_size must be <= 40"):
        user_data(user_file("datasets"), tmp_path, val_size=41)


def test_user_data_trains_end_to_end(user_file, tmp_path):
    config = TrialConfig(dataset=user_file("tensors"), epochs=1, batch_size=32, model_args={"hidden_sizes": [8]})
    data = load_data(config, tmp_path, key="data.dataset")
    run = build_run(config, data, CPU)
    assert run.model[-1].out_features == 3  # the MLP's width and classes come from the data
    assert run.model[1].in_features == 4
    (record,) = train_and_evaluate(run)
    assert np.isfinite(record.train_loss)


def test_without_a_validation_part_the_split_seed_fixes_the_split(user_file, tmp_path):
    first = user_data(user_file("tensors"), tmp_path, split_seed=3)
    again = user_data(user_file("tensors"), tmp_path, split_seed=3)
    other = user_data(user_file("tensors"), tmp_path, split_seed=4)
    np.testing.assert_array_equal(first.val.inputs, again.val.inputs)
    np.testing.assert_array_equal(first.train.inputs, again.train.inputs)
    assert not np.array_equal(first.val.inputs, other.val.inputs)
    # the validation examples do not depend on train_size
    smaller = user_data(user_file("tensors"), tmp_path, split_seed=3, train_size=100)
    np.testing.assert_array_equal(first.val.inputs, smaller.val.inputs)
    assert len(smaller.train) == 100


@pytest.mark.parametrize("name, returned", [
    ("single", "Tensor(10, 4)"),
    ("four", "tuple of 4:"),
])
def test_a_dataset_function_returning_the_wrong_shape_is_a_config_error(user_file, tmp_path, name, returned):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file(name), tmp_path)
    (message,) = caught.value.problems
    assert message.startswith("data.dataset: a dataset function must return (train, val) or (train, val, test)")
    assert returned in message  # says what it did return


def test_parts_of_the_wrong_form_are_config_errors(user_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("float_labels"), tmp_path)
    assert caught.value.problems[0].startswith("data.dataset: its train part must hold N >= 1 inputs and N "
                                               "integer labels")
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("shapes"), tmp_path)
    assert caught.value.problems == ["data.dataset: every part must hold inputs of one shape, got [(3,), (4,)]"]


def test_a_bare_tensor_part_is_a_config_error(user_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("bare_tensor"), tmp_path)
    (message,) = caught.value.problems
    assert message.startswith("data.dataset: a dataset function must return (train, val) or (train, val, test)")
    assert "its train part is Tensor(60, 2)" in message


def test_float_labels_of_a_dataset_are_a_config_error(user_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("dataset_of_float_labels"), tmp_path)
    assert caught.value.problems[0].startswith("data.dataset: its train")


def test_negative_labels_are_a_data_error(user_file, tmp_path):
    with pytest.raises(DataError, match="data.dataset: labels must be >= 0"):
        user_data(user_file("negative"), tmp_path)


@pytest.mark.parametrize("name, returned", [
    ("string_inputs", "<U1"), ("object_inputs", "object"), ("dataset_of_strings", "<U4"),
])
def test_inputs_that_are_not_numbers_are_a_config_error_saying_what_was_returned(user_file, tmp_path, name, returned):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file(name), tmp_path)
    (message,) = caught.value.problems
    assert message.startswith("data.dataset: its train part must hold numeric inputs (bool, integer or float)")
    assert returned in message


def test_labels_that_are_not_integers_are_a_config_error_naming_their_type(user_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("string_labels"), tmp_path)
    (message,) = caught.value.problems
    assert message.startswith("data.dataset: its train part must hold N >= 1 inputs and N integer labels")
    assert "<U3" in message


def test_a_stray_label_that_would_make_millions_of_classes_is_refused(user_file, tmp_path):
    # 30,000,001 classes: a 3.3 GB output layer before the first epoch
    with pytest.raises(DataError) as caught:
        user_data(user_file("stray_label"), tmp_path)
    message = str(caught.value)
    assert message.startswith("data.dataset: at most 100000 classes (labels in [0, 100000)), got the label 30000000")


def test_data_of_a_single_class_is_loaded_with_a_warning(user_file, tmp_path):
    with pytest.warns(UserWarning, match=r"data.dataset: every training label is 2 \(one class\)"):
        data = user_data(user_file("one_class"), tmp_path)
    assert data.num_classes == 3


def test_a_dataset_function_that_raises_is_a_data_error_naming_it(user_file, tmp_path):
    with pytest.raises(DataError) as caught:
        user_data(user_file("raises"), tmp_path)
    message = str(caught.value)
    assert message.startswith("data.dataset: the dataset function")
    assert "my_data.py:raises raised FileNotFoundError: nothing in" in message
    assert "it is called as" not in message, "its root parameter got the root: nothing to add"


def test_a_dataset_function_without_a_root_parameter_is_told_how_it_is_called(user_file, tmp_path):
    with pytest.raises(DataError) as caught:
        user_data(user_file("no_root"), tmp_path)
    assert f"(it is called as f(root, **data.args): its parameter 'n' got '{tmp_path}')" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("nothing_positional"), tmp_path)
    assert caught.value.problems == [f"data.dataset: a dataset function takes the data root as its first argument, "
                                     f"def f(root, ...), got '{user_file('nothing_positional')}'"]


def test_a_dataset_function_that_calls_sys_exit_is_a_data_error(user_file, tmp_path):
    with pytest.raises(DataError, match=r"data.dataset: the dataset function .*my_data.py:exits called sys.exit\(0\)"):
        user_data(user_file("exits"), tmp_path)


def test_a_missing_dataset_function_is_a_config_error(user_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("nope"), tmp_path)
    (message,) = caught.value.problems
    assert message.startswith("data.dataset: ")
    assert "defines no nope (callables there: " in message and "datasets" in message  # what it does define


# --- the data root ---------------------------------------------------------------------------------

NO_SUCH_USER = "~no_such_user_hpsearch/data"


def test_a_data_root_of_an_unknown_users_home_is_a_config_error_naming_its_key(monkeypatch, user_file, tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_data(TrialConfig(), NO_SUCH_USER)
    assert caught.value.problems == [f"data.root: ~user must name a user with a home folder, got '{NO_SUCH_USER}'"]
    with pytest.raises(ConfigError, match="^1 problem.*\n  --data-root: ~user must name"):
        load_data(TrialConfig(dataset=user_file("tensors")), NO_SUCH_USER, root_key="--data-root")

    monkeypatch.setenv("HPSEARCH_DATA", NO_SUCH_USER)
    with pytest.raises(ConfigError) as caught:
        load_data(TrialConfig(), None)
    assert caught.value.problems == [f"HPSEARCH_DATA: ~user must name a user with a home folder, got '{NO_SUCH_USER}'"]


def test_a_reference_in_an_unknown_users_home_is_a_config_error(tmp_path):
    from trainable.config import absolute_reference

    reference = "~no_such_user_hpsearch/data.py:load"
    assert absolute_reference(reference, tmp_path) == reference  # left for resolve to report
    with pytest.raises(ConfigError) as caught:
        load_data(TrialConfig(dataset=reference), tmp_path, key="data.dataset")
    assert caught.value.problems[0].startswith("data.dataset: ~user must name a user with a home folder")


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


def test_split_defaults_are_a_sixth_and_the_rest():
    arrays = Arrays(np.zeros((600, 2), np.float32), np.arange(600, dtype=np.int64))
    train, val = split(arrays, None, None, split_seed=0)
    assert (len(train), len(val)) == (500, 100)
    assert not set(train.labels) & set(val.labels)
    train, val = split(arrays, None, 50, split_seed=0)
    assert (len(train), len(val)) == (550, 50)
    train, val = split(arrays, 200, None, split_seed=0)
    assert (len(train), len(val)) == (200, 100)


def test_every_trial_seed_sees_the_same_validation_images(mnist_train):
    train, val = split(mnist_train, 2000, 500, split_seed=0)
    data = mnist_data(train, val)
    runs = [build_run(TrialConfig(train_size=2000, val_size=500, seed=seed), data, CPU) for seed in (1, 2)]
    assert torch.equal(runs[0].val_batches.inputs, runs[1].val_batches.inputs)
    assert torch.equal(runs[0].val_batches.labels, runs[1].val_batches.labels)
    # while the trials do differ in their shuffling
    assert not torch.equal(next(iter(runs[0].train_batches))[1], next(iter(runs[1].train_batches))[1])

    _, val_other = split(mnist_train, 2000, 500, split_seed=1)
    assert not np.array_equal(val.inputs, val_other.inputs)


def test_split_larger_than_the_dataset_is_a_data_error():
    arrays = Arrays(np.zeros((100, 28, 28), np.uint8), np.zeros(100, np.int64))
    with pytest.raises(DataError, match=r"train_size \+ val_size must be <= 100 .*got 90 \+ 20"):
        split(arrays, 90, 20, split_seed=0)
    with pytest.raises(DataError, match=r"got 100 \+ 16"):  # the default val_size counts too
        split(arrays, 100, None, split_seed=0)


# --- batch sources ------------------------------------------------------------------------------

def batches_of(source: str, arrays: Arrays, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    if source == "loader":
        return make_loader(arrays, batch_size, standardize=MNIST, shuffle=shuffle, generator=generator,
                           drop_last=drop_last)
    return InMemoryBatches(arrays, batch_size, CPU, standardize=MNIST, shuffle=shuffle, drop_last=drop_last,
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
    training = make_batches(config, indexed_1000, MNIST, CPU, shuffle=True, generator=generator)
    validation = make_batches(config, indexed_1000, MNIST, CPU, shuffle=False, generator=None)
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
    torch.testing.assert_close(memory[0][0], expected_inputs(indexed_1000.inputs[:64], MNIST))
    assert torch.equal(torch.cat([y for _, y in memory]), torch.arange(1000))


@pytest.mark.parametrize("source", SOURCES)
def test_both_sources_pass_user_inputs_through(source):
    arrays = Arrays(np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32), np.arange(50))
    config = TrialConfig(source=source, batch_size=20)
    batches = list(make_batches(config, arrays, None, CPU, shuffle=False, generator=None))
    assert [tuple(X.shape) for X, _ in batches] == [(20, 4), (20, 4), (10, 4)]
    assert torch.equal(torch.cat([X for X, _ in batches]), torch.from_numpy(arrays.inputs))


def test_a_later_trial_on_the_same_arrays_takes_the_prepared_split_and_no_batch_changes_it(indexed_1000):
    first = InMemoryBatches(indexed_1000, 100, CPU, standardize=MNIST, shuffle=False)
    X, _ = next(iter(first))
    X.zero_()  # a model that writes to its input in place
    again = InMemoryBatches(indexed_1000, 64, CPU, standardize=MNIST, shuffle=False)
    assert again.inputs is first.inputs  # prepared once: a reused actor's next trial does not prepare it again
    torch.testing.assert_close(next(iter(again))[0], expected_inputs(indexed_1000.inputs[:64], MNIST))
    other = Standardize((0.5,), (0.25,))
    assert InMemoryBatches(indexed_1000, 64, CPU, standardize=other, shuffle=False).inputs is not first.inputs
    copy = Arrays(indexed_1000.inputs.copy(), indexed_1000.labels)  # equal arrays, another object: prepared anew
    assert InMemoryBatches(copy, 64, CPU, standardize=MNIST, shuffle=False).inputs is not first.inputs


def test_in_memory_shuffle_is_driven_by_the_generator(indexed_1000):
    def order(seed):
        return torch.cat([y for _, y in batches_of("memory", indexed_1000, 100, shuffle=True, drop_last=False,
                                                   seed=seed)])

    assert torch.equal(order(5), order(5))
    assert not torch.equal(order(5), order(6))


def test_numpy_pairs_are_parts_and_one_returned_pair_names_the_contract(user_file, tmp_path):
    data = user_data(user_file("numpy_parts"), tmp_path)
    assert (len(data.train), len(data.val), data.input_shape, data.num_classes) == (50, 10, (1, 8, 8), 10)
    with pytest.raises(ConfigError) as caught:
        user_data(user_file("numpy_pair"), tmp_path)
    (message,) = caught.value.problems
    assert message.startswith("data.dataset: a dataset function must return (train, val) or (train, val, test); "
                              "each part a torch Dataset of (x, y) pairs or a pair (X, y) of tensors or numpy arrays")
    assert "its train part is ndarray(60, 1, 8, 8)" in message  # what it got, by type and shape
    assert "return ((X, y), None)" in message  # and the fix for the common slip
