"""Datasets as arrays: the built-in torchvision sets or a user's dataset function, split once.

A dataset is loaded into memory as numpy arrays (the form the driver ships to trials
through Ray's object store) and checked once here: shapes, label range, sizes. Built-in
image sets stay uint8 (47 MB for MNIST's training part, a quarter of float32) and are
standardised on the trial's device; a user's arrays are used as given.

A dataset function is called as `f(root, **args)` and returns `(train, val)` or
`(train, val, test)`; each part is a `torch.utils.data.Dataset` of `(x, y)` pairs or a pair
`(X, y)` of tensors or arrays, and `val`/`test` may be None. Without `val`, the fixed split
with `split_seed` draws it from `train`.
"""

from __future__ import annotations

import fcntl
import gzip
import inspect
import os
import warnings
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from trainable.config import REGRESSION_LOSSES, TrialConfig
from trainable.errors import ConfigError, DataError, problem

# built-in name -> (its class's name in torchvision.datasets, per-channel mean and std of its training part);
# `torchvision_class` imports the class where a dataset is read: torchvision takes 160 MB and about 1.7 s to
# import, which a search of a function trainable, whose driver reads no built-in dataset, does not pay
TORCHVISION_SETS: dict[str, tuple[str, tuple[float, ...], tuple[float, ...]]] = {
    "mnist": ("MNIST", (0.1307,), (0.3081,)),
    "fashion_mnist": ("FashionMNIST", (0.2860,), (0.3530,)),
    "kmnist": ("KMNIST", (0.1918,), (0.3483,)),
    "cifar10": ("CIFAR10", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}
BUILTIN_CLASSES = 10  # every built-in set has ten classes
MAX_CLASSES = 100_000  # more is a stray label: 30,000,001 classes took 3.3 GB in a check
NUMERIC_KINDS = "biuf"  # numpy dtype kinds a tensor can be made of: bool, int, uint, float
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass(frozen=True)
class Arrays:
    """Inputs (N, ...) and targets of one dataset part: integer class labels (N,) int64, or float32
    values (N,) or (N, k) with a regression loss (training.loss mse, smooth_l1, or a loss of your own)."""

    inputs: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, index: np.ndarray) -> "Arrays":
        return Arrays(self.inputs[index], self.labels[index])


@dataclass(frozen=True)
class Standardize:
    """How uint8 images become model inputs: channels first, scaled to [0, 1], standardised."""

    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclass(frozen=True)
class Data:
    """A dataset as trials see it: the split, the optional test part and what a model needs to know."""

    train: Arrays
    val: Arrays
    test: Arrays | None
    num_classes: int  #: outputs a model gives: classes, or the width of float targets (1 for (N,))
    input_shape: tuple[int, ...]  #: shape of one prepared input (e.g. (1, 28, 28)): what the model gets
    standardize: Standardize | None  #: None: inputs are used as given (float64 read as float32)

    def sample(self, n: int = 2) -> torch.Tensor:
        """The first `n` training inputs exactly as a model gets them (to try a model once)."""
        return prepare_inputs(torch.from_numpy(self.train.inputs[:n].copy()), self.standardize)

    def for_trials(self) -> "Data":
        """Without the test part: trials never see it, so it need not travel to them."""
        return replace(self, test=None)


def expand_root(root: str | Path, key: str) -> Path:
    """`root` with ~ and ~user expanded; a ~user without a home is a ConfigError naming `key`
    (data.root, --data-root, HPSEARCH_DATA) rather than pathlib's RuntimeError."""
    try:
        return Path(root).expanduser()
    except RuntimeError:
        raise ConfigError([problem(key, "~user must name a user with a home folder", str(root))]) from None


def default_data_root() -> Path:
    """$HPSEARCH_DATA, else a per-user cache folder."""
    if os.environ.get("HPSEARCH_DATA"):
        return expand_root(os.environ["HPSEARCH_DATA"], "HPSEARCH_DATA")
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "hpsearch"


def torchvision_class(name: str) -> type[Any]:
    """The torchvision.datasets class of built-in dataset `name`."""
    from torchvision import datasets

    return getattr(datasets, TORCHVISION_SETS[name][0])


def raw_folder(name: str, root: str | Path) -> Path:
    cls = torchvision_class(name)
    return expand_root(root, "data.root") / (cls.base_folder if name == "cifar10" else f"{cls.__name__}/raw")


def load_dataset(name: str, root: str | Path | None = None, *, train: bool = True) -> Arrays:
    """The training or test part of built-in dataset `name` as uint8 arrays, labels checked.

    torchvision reads the unpacked raw files if present; otherwise `download=True` checks
    the md5 of the packed files in the raw folder and unpacks them (no network), and only
    downloads what is missing. If that fails too, a DataError names the folder and files.
    """
    root = expand_root(root, "data.root") if root is not None else default_data_root()
    cls = torchvision_class(name)
    try:
        with unpacking_lock(root):
            dataset = cls(str(root), train=train, download=True)
    except Exception as error:  # no network, bad md5, a truncated or corrupt file (torchvision asserts)
        folder = raw_folder(name, root)
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        corrupt = [p.name for p in sorted(folder.glob("*.gz")) if not gzip_intact(p)] if folder.is_dir() else []
        files = ("cifar-10-python.tar.gz or its unpacked batches" if name == "cifar10"
                 else ", ".join(f"{f}.gz" for f in RAW_FILES))
        if corrupt:  # torchvision would blame a failed download
            raise DataError(f"dataset {name}: {', '.join(corrupt)} in {folder} is corrupt or truncated; "
                            f"replace it with an intact copy (and delete its unpacked file, if any)") from None
        raise DataError(
            f"dataset {name}: could not read it from {folder} ({type(error).__name__}: {error}); "
            f"files there: {', '.join(present) or 'none'}.\n"
            f"Put its files there ({files}), or choose another folder with --data-root or HPSEARCH_DATA."
        ) from None
    arrays = Arrays(np.asarray(dataset.data), np.asarray(dataset.targets, dtype=np.int64))
    check_labels(arrays, BUILTIN_CLASSES, f"dataset {name} ({'train' if train else 'test'})")
    return arrays


@contextmanager
def unpacking_lock(root: Path) -> Iterator[None]:
    """Held while torchvision reads a built-in set under `root`: only one process at a time.

    On first use torchvision unpacks the .gz files beside themselves, writing in place, and a
    process that comes to the folder meanwhile finds the unpacked files half written and fails
    (two searches started at once on one data root did). Where `root` cannot hold a lock file (a
    read-only copy), nothing can be unpacked there either, so there is nothing to wait for.
    """
    try:
        handle = open(root / ".hpsearch-unpack.lock", "a")
    except OSError:
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes, or by the kernel if the process dies
        except OSError:  # a file system without locks (some network mounts): read as before
            pass
        yield


def gzip_intact(path: Path) -> bool:
    """True if the .gz file decompresses to its end (a truncated download does not)."""
    try:
        with gzip.open(path, "rb") as stream:
            while stream.read(1 << 20):
                pass
        return True
    except (OSError, EOFError, zlib.error):
        return False


def check_labels(arrays: Arrays, num_classes: int, where: str) -> None:
    """Labels must lie in [0, num_classes): a wrong one would crash training mid-search."""
    if len(arrays) and (arrays.labels.min() < 0 or arrays.labels.max() >= num_classes):
        bad = arrays.labels[(arrays.labels < 0) | (arrays.labels >= num_classes)]
        raise DataError(f"{where}: labels must lie in [0, {num_classes}), got {bad.size} outside it "
                        f"(e.g. {int(bad[0])})")


def describe(value: Any) -> str:
    """What a dataset function returned, briefly: 'tuple of 2: (Tensor(100, 4), list of 3)'."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return f"{type(value).__name__}{tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(describe(v) for v in value[:4]) + (", ..." if len(value) > 4 else "")
        return f"{type(value).__name__} of {len(value)}: ({inner})"
    if value is None:
        return "None"
    return type(value).__name__


CONTRACT = ("a dataset function must return (train, val) or (train, val, test); each part a torch Dataset "
            "of (x, y) pairs or a pair (X, y) of tensors or numpy arrays, and val or test may be None")


def looks_like_one_part(returned: Any) -> bool:
    """(X, y) returned where (train, val) was meant: two arrays of N rows, the second of labels (N,)."""
    return (isinstance(returned, (tuple, list)) and len(returned) == 2
            and all(isinstance(p, (torch.Tensor, np.ndarray)) for p in returned)
            and returned[1].ndim == 1 and returned[0].ndim >= 1 and len(returned[0]) == len(returned[1]))


def as_arrays(part: Any, key: str, which: str, returned: Any = None, values: str | None = None) -> Arrays:
    """A Dataset of (x, y) pairs or a pair (X, y) as Arrays; anything else is a ConfigError naming the contract."""
    if isinstance(part, (tuple, list)) and len(part) == 2 and all(
            isinstance(p, (torch.Tensor, np.ndarray)) for p in part):
        inputs, labels = (p.detach().cpu().numpy() if isinstance(p, torch.Tensor) else np.asarray(p) for p in part)
    elif hasattr(part, "__getitem__") and hasattr(part, "__len__") and not isinstance(
            part, (tuple, list, str, torch.Tensor, np.ndarray)):
        try:
            pairs = [part[i] for i in range(len(part))]
            inputs = np.stack([np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x) for x, _ in pairs])
            labels = np.asarray([(y.item() if y.numel() == 1 else y.detach().cpu().numpy()) if isinstance(y, torch.Tensor)
                                 else y.item() if isinstance(y, np.generic) else y for _, y in pairs])
        except Exception as error:
            raise ConfigError([problem(key, f"its {which} Dataset must yield (x, y) pairs of arrays and "
                                            f"integer labels ({type(error).__name__}: {error})", describe(part))]) from None
    else:
        hint = (" (it returned one pair (X, y): return ((X, y), None) to split val off train with split_seed)"
                if looks_like_one_part(returned) else "")
        raise ConfigError([problem(key, f"{CONTRACT}; its {which} part is {describe(part)}, of the returned "
                                        f"{describe(returned) if returned is not None else '?'}{hint}",
                                   describe(part))])
    if values is not None:  # a loss that takes float targets (N,) or (N, k)
        return value_targets(inputs, labels, key, which, values)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or len(inputs) != len(labels) or not len(labels):
        raise ConfigError([problem(key, f"its {which} part must hold N >= 1 inputs and N integer labels (N,) "
                                        f"(inputs: {inputs.shape} {inputs.dtype}); labels", f"{labels.shape} {labels.dtype}")])
    if inputs.dtype.kind not in NUMERIC_KINDS:  # strings, objects: torch cannot make a tensor of them
        raise ConfigError([problem(key, f"its {which} part must hold numeric inputs (bool, integer or float): "
                                        "encode text or categories as numbers in the function",
                                   f"inputs {inputs.shape} {inputs.dtype}")])
    if inputs.dtype == np.float64:
        inputs = inputs.astype(np.float32)  # models are float32; a float64 input would not run
    return Arrays(inputs, labels.astype(np.int64))


def value_targets(inputs: np.ndarray, labels: np.ndarray, key: str, which: str, loss: str) -> Arrays:
    """Arrays for a loss other than cross_entropy: float targets (N,) or (N, k) as float32. With a loss
    of your own, integer targets (N,) stay int64 class labels; mse and smooth_l1 take any number as a value."""
    if (labels.ndim not in (1, 2) or labels.dtype.kind not in NUMERIC_KINDS or len(inputs) != len(labels)
            or not len(labels) or inputs.dtype.kind not in NUMERIC_KINDS):
        raise ConfigError([problem(key, f"its {which} part must hold N >= 1 numeric inputs and N numeric targets, "
                                        f"(N,) or (N, k), for training.loss {loss} (inputs: {inputs.shape} "
                                        f"{inputs.dtype}); targets", f"{labels.shape} {labels.dtype}")])
    inputs = inputs.astype(np.float32) if inputs.dtype == np.float64 else inputs
    if is_class_targets(labels, loss):
        return Arrays(inputs, labels.astype(np.int64))
    return Arrays(inputs, labels.astype(np.float32))


def is_class_targets(labels: np.ndarray, loss: str) -> bool:
    """Integer targets (N,) given to a loss of your own are class labels; mse and smooth_l1 take values."""
    return loss not in REGRESSION_LOSSES and labels.ndim == 1 and labels.dtype.kind in "biu"


def call_dataset_function(function: Callable, config: TrialConfig, root: Path, key: str
                          ) -> tuple[Arrays, Arrays | None, Arrays | None]:
    """train, val (or None), test (or None) from a user's dataset function, shapes checked."""
    from trainable.references import keyword_problems

    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        parameters = None
    positional = [p for p in parameters or []
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if parameters is not None and not positional:
        raise ConfigError([problem(key, "a dataset function takes the data root as its first argument, "
                                        "def f(root, ...)", config.dataset)])
    first = [positional[0].name] if positional and positional[0].kind is not positional[0].VAR_POSITIONAL else []
    # a first parameter with a default was likely meant for something else than the root it gets
    defaulted = bool(first) and positional[0].default is not positional[0].empty
    prefix = f"{key.rsplit('.', 1)[0]}.args." if "." in key else "data_args."
    problems = keyword_problems(function, config.data_args, prefix, config.dataset, given=tuple(first))
    if problems:
        raise ConfigError(problems)
    try:
        returned = function(root, **config.data_args)
    except SystemExit as error:  # the search would end with its code and no word
        raise DataError(f"{key}: the dataset function {config.dataset} called sys.exit({error.code!r})") from None
    except Exception as error:
        called = f" (it is called as f(root, **data.args): its parameter {first[0]!r} got {str(root)!r})" \
            if defaulted else ""
        raise DataError(f"{key}: the dataset function {config.dataset} raised "
                        f"{type(error).__name__}: {error}{called}") from None
    if not isinstance(returned, (tuple, list)) or len(returned) not in (2, 3):
        raise ConfigError([problem(key, CONTRACT, describe(returned))])
    parts = list(returned) + [None] * (3 - len(returned))
    if parts[0] is None:
        raise ConfigError([problem(key, "a dataset function must return a train part", describe(returned))])
    values = None if config.loss == "cross_entropy" else config.loss
    return tuple(None if p is None else as_arrays(p, key, which, returned, values)  # type: ignore[return-value]
                 for p, which in zip(parts, ("train", "val", "test")))


def split(arrays: Arrays, train_size: int | None, val_size: int | None, split_seed: int) -> tuple[Arrays, Arrays]:
    """A fixed, disjoint train/validation split drawn with its own generator.

    The validation part is the first `val_size` (default: a sixth) of one permutation, so
    it depends only on `val_size` and `split_seed`: every trial of a search, whatever its
    seed or train_size, is judged on the same examples.
    """
    val_size = len(arrays) // 6 if val_size is None else val_size
    train_size = len(arrays) - val_size if train_size is None else train_size
    if train_size + val_size > len(arrays) or train_size < 1 or val_size < 1:
        raise DataError(f"train_size + val_size must be <= {len(arrays)} (the examples of the training part), "
                        f"each >= 1, got {train_size} + {val_size}")
    order = torch.randperm(len(arrays), generator=torch.Generator().manual_seed(split_seed)).numpy()
    return arrays.take(order[val_size:val_size + train_size]), arrays.take(order[:val_size])


def subset(arrays: Arrays, size: int | None, split_seed: int, key: str) -> Arrays:
    """`size` examples of a given part, drawn with the split seed (all of it for None)."""
    if size is None:
        return arrays
    if size > len(arrays):
        raise DataError(f"{key} must be <= {len(arrays)} (the examples of the given part), got {size}")
    order = torch.randperm(len(arrays), generator=torch.Generator().manual_seed(split_seed)).numpy()
    return arrays.take(order[:size])


def prepare_inputs(inputs: torch.Tensor, standardize: Standardize | None) -> torch.Tensor:
    """Model inputs from stored ones: uint8 images (N, H, W[, C]) -> float (N, C, H, W), standardised."""
    if standardize is None:
        return inputs.to(torch.float32) if inputs.dtype == torch.float64 else inputs
    if inputs.dim() == 4:  # channels last, as torchvision keeps CIFAR
        inputs = inputs.permute(0, 3, 1, 2)
    else:
        inputs = inputs.unsqueeze(-3)
    mean = torch.tensor(standardize.mean, device=inputs.device).view(-1, 1, 1)
    std = torch.tensor(standardize.std, device=inputs.device).view(-1, 1, 1)
    # in place on one fresh copy: a whole split in ~0.1 s instead of ~0.4 s for the
    # three temporaries of ((x / 255) - mean) / std
    pixels = inputs.to(torch.float32, copy=True)
    return pixels.mul_(1.0 / (255.0 * std)).sub_(mean / std)


def load_data(config: TrialConfig, root: str | Path | None = None, *, key: str = "dataset",
              with_test: bool = True, root_key: str = "data.root") -> Data:
    """The dataset of `config`, split with `split_seed` and checked, ready for trials.

    `key` names the dataset setting in messages (`data.dataset` in a space file), `root_key`
    where `root` came from (None: $HPSEARCH_DATA or the cache folder).
    """
    from trainable.references import resolve  # user code is imported only when asked for

    root = expand_root(root, root_key) if root is not None else default_data_root()
    if config.dataset in TORCHVISION_SETS:
        _, mean, std = TORCHVISION_SETS[config.dataset]
        train_part, val_part = load_dataset(config.dataset, root, train=True), None
        test = load_dataset(config.dataset, root, train=False) if with_test else None
        num_classes, standardize = BUILTIN_CLASSES, Standardize(mean, std)
        if config.loss in REGRESSION_LOSSES:  # the class index as a value: (N,) float targets, one output
            train_part = Arrays(train_part.inputs, train_part.labels.astype(np.float32))
            test = None if test is None else Arrays(test.inputs, test.labels.astype(np.float32))
            num_classes = 1
    else:
        function = resolve(config.dataset, key)
        train_part, val_part, test = call_dataset_function(function, config, root, key)
        parts = [p for p in (train_part, val_part, test) if p is not None]
        shapes = {p.inputs.shape[1:] for p in parts}
        if len(shapes) > 1:
            raise ConfigError([problem(key, "every part must hold inputs of one shape", sorted(shapes))])
        standardize = None
        test = test if with_test else None
    if config.dataset not in TORCHVISION_SETS and train_part.labels.dtype.kind == "f":
        kinds = sorted({f"{p.labels.dtype} targets {p.labels.shape[1:] or '(N,)'}" for p in parts})
        if len(kinds) > 1:
            raise ConfigError([problem(key, "every part must hold targets of one shape and type", kinds)])
        num_classes = train_part.labels.shape[1] if train_part.labels.ndim == 2 else 1  # outputs: one per column
    elif config.dataset not in TORCHVISION_SETS:
        if min(int(p.labels.min()) for p in parts) < 0:
            raise DataError(f"{key}: labels must be >= 0 (class indices), got a negative one")
        largest = max(int(p.labels.max()) for p in parts)
        if largest >= MAX_CLASSES:  # the output layer alone would take gigabytes before the first epoch
            raise DataError(f"{key}: at most {MAX_CLASSES} classes (labels in [0, {MAX_CLASSES})), got the label "
                            f"{largest}; labels are class indices 0, 1, 2, ...")
        num_classes = largest + 1
        present = np.unique(train_part.labels)
        if len(present) == 1:
            warnings.warn(f"{key}: every training label is {int(present[0])} (one class): any model scores "
                          "accuracy 1.0 by always predicting it; check what the dataset function returns",
                          UserWarning, stacklevel=2)
    if val_part is None:
        train, val = split(train_part, config.train_size, config.val_size, config.split_seed)
    else:
        train = subset(train_part, config.train_size, config.split_seed, "train_size")
        val = subset(val_part, config.val_size, config.split_seed, "val_size")
    input_shape = tuple(prepare_inputs(torch.from_numpy(train.inputs[:1].copy()), standardize).shape[1:])
    return Data(train, val, test, num_classes, input_shape, standardize)
