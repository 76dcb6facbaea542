"""A run printed epoch by epoch (`python -m trainable`), on one process or on several workers.

replay_worker lives in an importable module, not in __main__: torch.multiprocessing.spawn starts
each worker in a fresh interpreter, which finds the function by its module's name.
"""

from __future__ import annotations

import torch

from trainable.config import TrialConfig
from trainable.distributed import World, join, leave
from trainable.loop import Run, build_run, train_and_evaluate


def replay_worker(rank: int, config: TrialConfig, schedule: dict[int, dict], data, device_type: str, port: int) -> None:
    """One worker of a replay (torch.multiprocessing.spawn calls it with its rank)."""
    world = World(rank, config.workers)
    device = torch.device(device_type, rank) if device_type == "cuda" else torch.device(device_type)
    join(world, "127.0.0.1", port, device)
    try:
        run = build_run(config, data, device, world)
        if rank == 0:
            print_epochs(run, schedule)
        else:
            for _ in train_and_evaluate(run, schedule):
                pass
    finally:
        leave()


def print_epochs(run: Run, schedule: dict[int, dict]) -> None:
    """Train `run` to its end, one line per epoch."""
    config = run.config
    width = len(str(config.epochs))
    for r in train_and_evaluate(run, schedule):
        # training's columns without train_ (loss, acc, ...), validation's as they are (val_loss, val_acc, ...)
        shown = " | ".join(f"{name.removeprefix('train_')} {value:.4f}" for name, value in r.metrics.items())
        print(f"Epoch [{r.epoch:>{width}}/{config.epochs}] | {shown} | lr {r.epoch_lr:.5f}"
              f" | {r.epoch_seconds:.2f}s", flush=True)
        if r.diverged:
            print("stopped: the training loss is no longer finite (diverged)", flush=True)

