"""One full MNIST training epoch three ways, timed side by side in one run.

  (a) memory: trainable's InMemoryBatches + train(), the default batch source of a trial;
  (b) loader: torchvision.datasets.MNIST with per-sample v2 transforms, as in PyTorch's
      MNIST example, through a DataLoader(num_workers=0) into the same train();
  (c) floor:  a bare loop over pre-loaded tensors (randperm slices, forward, loss,
      zero_grad, backward, step; no metric, no loss accumulation).

Same 50,000 training images, batch 128, the default TrialConfig model and optimizer (SGD)
for all three. The paths are interleaved and repeated, and the median per path is
compared, because a shared 2-core machine is noisy. Targets: a/c <= 1.10 (the canonical
loop costs little over the floor) and b/a >= 10 (per-sample transforms are the bottleneck).

    python bench/epoch.py [--data-root DIR] [--rounds 7] [--hidden-sizes 256,128]

--hidden-sizes sets the MLP's model.hidden_sizes (the built-in mlp factory's keyword).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from torchvision import datasets
from torchvision.transforms import v2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trainable.batches import InMemoryBatches  # noqa: E402
from trainable.config import TrialConfig  # noqa: E402
from trainable.data import (BUILTIN_CLASSES, TORCHVISION_SETS, Standardize, default_data_root,  # noqa: E402
                            load_dataset)
from trainable.factories import build_model  # noqa: E402
from trainable.loop import accuracy_metric, make_optimizer, train  # noqa: E402
from trainable.seed import set_seed  # noqa: E402

TRAIN_SIZE = 50_000
INPUT_SHAPE = (1, 28, 28)  # one MNIST image as the model gets it
TARGET_MEMORY_OVER_FLOOR = 1.10
TARGET_LOADER_OVER_MEMORY = 10.0


def fresh_model(config: TrialConfig) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The same initial weights and a new optimizer for every timed epoch."""
    torch.manual_seed(0)
    model = build_model(config, INPUT_SHAPE, BUILTIN_CLASSES)
    return model, make_optimizer(config, model)


def time_train(config: TrialConfig, batches, device: torch.device) -> float:
    model, optimizer = fresh_model(config)
    metric = accuracy_metric(BUILTIN_CLASSES, device)
    start = time.perf_counter()
    train(model, batches, nn.CrossEntropyLoss(), optimizer, metric, device, config.clip_norm)
    return time.perf_counter() - start


def time_floor(config: TrialConfig, images: torch.Tensor, labels: torch.Tensor,
               generator: torch.Generator) -> float:
    model, optimizer = fresh_model(config)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    n, b = len(labels), config.batch_size
    start = time.perf_counter()
    order = torch.randperm(n, generator=generator)
    for i in range(0, n, b):
        index = order[i:i + b]
        loss = loss_fn(model(images[index]), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-root", type=Path, default=None,
                        help="dataset folder (default: $HPSEARCH_DATA or ~/.cache/hpsearch)")
    parser.add_argument("--rounds", type=int, default=7, help="times each path is timed (median is kept)")
    parser.add_argument("--hidden-sizes", type=lambda text: tuple(int(h) for h in text.split(",")), default=None,
                        metavar="W1,W2", help="MLP hidden widths (default: TrialConfig's)")
    args = parser.parse_args(argv)
    root = args.data_root or default_data_root()

    config = TrialConfig()  # the defaults a trial starts from: batch 128, the template MLP, SGD
    if args.hidden_sizes:
        config = TrialConfig(model_args={"hidden_sizes": args.hidden_sizes})
    # the layers the factory builds: 784, model.hidden_sizes (else its default), the 10 logits
    widths = [m.out_features for m in fresh_model(config)[0].modules() if isinstance(m, nn.Linear)]
    layers = "-".join(map(str, [784, *widths]))
    device = torch.device("cpu")
    # as in a trial: seeded, deterministic algorithms on (the setting is global, so it applies to all paths)
    generator = set_seed(0)
    _, mean, std = TORCHVISION_SETS["mnist"]
    standardize = Standardize(mean, std)

    mnist = load_dataset("mnist", root, train=True)
    indices = torch.randperm(len(mnist), generator=torch.Generator().manual_seed(0))[:TRAIN_SIZE]
    arrays = mnist.take(indices.numpy())

    start = time.perf_counter()
    memory = InMemoryBatches(arrays, config.batch_size, device, standardize=standardize, shuffle=True,
                             generator=generator)
    convert_seconds = time.perf_counter() - start

    transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    template = Subset(datasets.MNIST(str(root), train=True, transform=transform), indices.tolist())
    loader = DataLoader(template, batch_size=config.batch_size, shuffle=True, num_workers=0, generator=generator)

    paths = {
        "a memory": lambda: time_train(config, memory, device),
        "b loader": lambda: time_train(config, loader, device),
        "c floor": lambda: time_floor(config, memory.inputs, memory.labels, generator),
    }
    print(f"one epoch of {TRAIN_SIZE:,} MNIST images, batch {config.batch_size}, {config.model} {layers}, "
          f"SGD; torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds")
    print(f"(a) converts the split to one float tensor once per trial: {convert_seconds:.3f}s, not counted")
    # untimed warm-up on 20 batches per path: thread pools, allocator and first-call costs are not an epoch's
    warm = mnist.take(indices[:20 * config.batch_size].numpy())
    warm_memory = InMemoryBatches(warm, config.batch_size, device, standardize=standardize, shuffle=True,
                                  generator=generator)
    time_train(config, warm_memory, device)
    time_train(config, DataLoader(Subset(template.dataset, indices[:20 * config.batch_size].tolist()),
                                  batch_size=config.batch_size), device)
    time_floor(config, warm_memory.inputs, warm_memory.labels, generator)

    times: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for round_ in range(args.rounds):
        # rotate the order so no path always runs first (warm caches) or last
        order = names[round_ % len(names):] + names[:round_ % len(names)]
        for name in order:
            times[name].append(paths[name]())
        print(f"round {round_ + 1}: " + "  ".join(f"{name} {times[name][-1]:.3f}s" for name in names), flush=True)

    median = {name: statistics.median(values) for name, values in times.items()}
    print("median:  " + "  ".join(f"{name} {median[name]:.3f}s" for name in names))
    # noise only ever adds time: the minimum is the other honest summary on a shared machine
    print("minimum: " + "  ".join(f"{name} {min(times[name]):.3f}s" for name in names)
          + f"  (a/c {min(times['a memory']) / min(times['c floor']):.2f})")
    a, b, c = median["a memory"], median["b loader"], median["c floor"]
    ok = {True: "ok", False: "MISSED"}
    print(f"a/c = {a / c:.2f}  (target <= {TARGET_MEMORY_OVER_FLOOR:.2f}: the canonical loop over the bare floor) "
          f"{ok[a / c <= TARGET_MEMORY_OVER_FLOOR]}")
    print(f"b/a = {b / a:.1f}  (target >= {TARGET_LOADER_OVER_MEMORY:.0f}: per-sample transforms over in-memory) "
          f"{ok[b / a >= TARGET_LOADER_OVER_MEMORY]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
