"""Your own training loop on several workers (data-parallel), tuned by hpsearch: `resources.workers: 2`.

The loop of examples/own_loop/ with three changes, each from trainable.distributed (it never imports Ray):
- `prepare_model(model, device)`: DistributedDataParallel around the model when the trial has several
  workers (the gradients are averaged across them), the model itself with one;
- `shard(n, seed, epoch)`: this worker's indices of the epoch (torch's DistributedSampler, seeded with the
  trial's seed and the epoch, so a restarted trial shuffles its epochs as before);
- `config["rank"]`, `config["world_size"]` (with several workers): each worker takes batch_size / world_size
  examples of a batch. Every worker calls `report`; hpsearch keeps rank 0's reports and checkpoints and hands
  every worker the checkpoint when a trial restarts.

Validation runs on the whole validation set on every worker, so each reports the same val_acc.
"""

from __future__ import annotations

import torch
from torch import nn

from trainable.distributed import prepare_model, shard


def make_data(n: int = 2048, features: int = 20, classes: int = 4):
    """A fixed synthetic problem (the same for every trial): points around random class centres."""
    problem = torch.Generator().manual_seed(1234)
    centres = torch.randn(classes, features, generator=problem) * 0.5
    labels = torch.randint(0, classes, (n,), generator=problem)
    inputs = centres[labels] + torch.randn(n, features, generator=problem)
    split = n * 5 // 6
    return (inputs[:split], labels[:split]), (inputs[split:], labels[split:])


def train(config: dict, report, checkpoint: dict | None = None) -> None:
    torch.manual_seed(config["seed"])  # the same initial weights on every worker
    device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
    (x_train, y_train), (x_val, y_val) = make_data()
    x_train, y_train, x_val, y_val = (t.to(device) for t in (x_train, y_train, x_val, y_val))
    world_size = config.get("world_size", 1)
    per_worker = config["batch_size"] // world_size  # hpsearch checks that world_size divides batch_size

    model = nn.Sequential(nn.Linear(x_train.shape[1], config["hidden"]), nn.ReLU(), nn.Linear(config["hidden"], 4))
    trained = prepare_model(model, device)  # train through this one; checkpoint `model`
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config.get("momentum", 0.9))
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    if checkpoint is not None:  # a restarted trial: every worker continues from rank 0's last checkpoint
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = checkpoint["epoch"]

    for epoch in range(start, config["epochs"]):
        trained.train()
        order = torch.tensor(shard(len(x_train), config["seed"], epoch), device=device)
        for batch in order.split(per_worker):
            loss = loss_fn(trained(x_train[batch]), y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.inference_mode():
            logits = model(x_val)
            val_loss = loss_fn(logits, y_val).item()
        val_acc = (logits.argmax(1) == y_val).float().mean().item()
        report(val_loss=val_loss, val_acc=val_acc, train_loss=loss.item(),
               checkpoint={"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1})
