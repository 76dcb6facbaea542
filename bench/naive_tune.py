"""The baseline for bench/search.py: a plain Ray Tune script in the style of Ray's docs.

It follows https://docs.ray.io/en/latest/tune/examples/tune-pytorch-cifar.html, adapted to
MNIST and to the same work the service does: every trial builds its own torchvision
dataset with per-sample v2 transforms, splits it 50,000/10,000 with a fixed generator (the service's validation images),
iterates DataLoaders (num_workers=0), trains the same MLP (128,) with SGD (momentum
0.9), gradient clipping and a cosine schedule stepped per epoch, and reports val_acc plus
a checkpoint after each epoch. The search is OptunaSearch (seeded TPE) behind a
ConcurrencyLimiter, over the space of spaces/mnist.yaml.

    python bench/naive_tune.py --data-root /tmp/data --storage-path /tmp/naive --out naive.json

It writes the best val_acc, each trial's best and the epoch times to --out as JSON; bench/search.py times the
whole command from outside.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # else bench/search.py hides the search package

from search.outputs.phases import Phases, command_start  # noqa: E402

STARTED = command_start()  # the command's time counts from the process's start, as the service's does

import ray  # noqa: E402
import torch  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.search import ConcurrencyLimiter  # noqa: E402
from ray.tune.search.optuna import OptunaSearch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, random_split  # noqa: E402
from torchvision import datasets  # noqa: E402
from torchvision.transforms import v2  # noqa: E402


def load_data(data_dir: str):
    """MNIST's 60,000 training images, decoded and transformed one sample at a time."""
    transform = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize((0.1307,), (0.3081,))])
    return datasets.MNIST(root=data_dir, train=True, download=False, transform=transform)


def make_net(hidden_sizes=(128,)) -> nn.Sequential:
    layers, width = [nn.Flatten()], 28 * 28
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, 10))


def train_mnist(config, data_dir=None, epochs=2):
    torch.manual_seed(0)
    net = make_net()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=config["lr"], momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["t_max"])

    trainset = load_data(data_dir)
    # validation first: the same 10,000 images the service validates on (trainable/data.py split)
    val_subset, train_subset = random_split(trainset, [10_000, 50_000],
                                            generator=torch.Generator().manual_seed(0))
    trainloader = DataLoader(train_subset, batch_size=int(config["batch_size"]), shuffle=True, num_workers=0)
    valloader = DataLoader(val_subset, batch_size=int(config["batch_size"]), shuffle=False, num_workers=0)

    for epoch in range(epochs):
        start = time.perf_counter()
        net.train()
        for inputs, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(inputs), labels)
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), config["clip_norm"])
            optimizer.step()
        scheduler.step()

        net.eval()
        val_loss, correct, total = 0.0, 0, 0
        with torch.no_grad():
            for inputs, labels in valloader:
                outputs = net(inputs)
                val_loss += criterion(outputs, labels).item() * len(labels)
                correct += (outputs.argmax(1) == labels).sum().item()
                total += len(labels)

        with tempfile.TemporaryDirectory() as checkpoint_dir:
            with open(Path(checkpoint_dir) / "data.pkl", "wb") as fp:
                pickle.dump({"epoch": epoch, "net_state_dict": net.state_dict(),
                             "optimizer_state_dict": optimizer.state_dict()}, fp)
            tune.report({"val_loss": val_loss / total, "val_acc": correct / total, "epoch": epoch + 1,
                         "epoch_seconds": time.perf_counter() - start},
                        checkpoint=tune.Checkpoint.from_directory(checkpoint_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("HPSEARCH_DATA", "/tmp/data"))
    parser.add_argument("--storage-path", required=True)
    parser.add_argument("--out", required=True, help="JSON file for the best val_acc and epoch times")
    parser.add_argument("--num-samples", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-concurrent", type=int, default=2)
    parser.add_argument("--cpus-per-trial", type=float, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    timing = Phases(STARTED)  # where this command's time goes, as the service counts it (search/outputs/phases.py)

    # the service's Ray start options ("local": a fresh Ray, never a cluster someone else
    # started here), so the comparison is about the trials, not the dashboard
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    timing.mark("ray")
    param_space = {  # spaces/mnist.yaml (bench/search.py pins the service to these)
        "lr": tune.loguniform(0.01, 0.3),
        "batch_size": tune.choice([64, 128, 256]),
        "t_max": tune.randint(4, 11),  # upper bound excluded: 4..10
        "clip_norm": tune.loguniform(0.5, 10.0),
    }
    # the service's sampler for its asynchronous mode (TPE, settings pinned), so both sides draw
    # the same configs; everything else here is the Ray-docs style
    from search.searching.ordered import make_sampler

    searcher = OptunaSearch(sampler=make_sampler("tpe", args.seed, 0))
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(train_mnist, data_dir=str(Path(args.data_root).resolve()),
                                                 epochs=args.epochs),
                            {"cpu": args.cpus_per_trial}),
        param_space=param_space,
        tune_config=tune.TuneConfig(metric="val_acc", mode="max", num_samples=args.num_samples,
                                    search_alg=ConcurrencyLimiter(searcher, max_concurrent=args.max_concurrent)),
        run_config=tune.RunConfig(name="naive", storage_path=str(Path(args.storage_path).resolve())),
    )
    results = tuner.fit()
    timing.mark("trials")

    best = results.get_best_result(metric="val_acc", mode="max", scope="all")
    frames = [r.metrics_dataframe for r in results if r.metrics_dataframe is not None]
    timing.mark("results")
    ray.shutdown()
    timing.mark("shutdown")
    Path(args.out).write_text(json.dumps({
        "timing": timing.record(),
        "best_val_acc": float(best.metrics_dataframe["val_acc"].max()),
        "trial_best_val_acc": [float(f["val_acc"].max()) for f in frames],
        "configs": [r.config for r in results],
        "epoch_seconds": [float(s) for f in frames for s in f["epoch_seconds"]],
        "best_config": best.config,
        "trials": len(results),
        "errors": len(results.errors),
    }))
    print(f"best val_acc {best.metrics_dataframe['val_acc'].max():.4f} with {best.config}")


if __name__ == "__main__":
    main()
