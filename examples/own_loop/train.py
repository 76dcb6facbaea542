"""A training loop of your own, tuned by hpsearch: `trainable: train.py:train` in space.yaml.

A plain PyTorch loop as you would write it: a small MLP on a synthetic classification
problem it makes itself (so it runs offline, in seconds), mixed precision with torch.autocast
(bfloat16 on the CPU, float16 with a GradScaler on a GPU), and a checkpoint each epoch so a
restarted trial continues where it stopped. It never imports Ray.

Run it alone:
  python -c "from train import train; train({'lr': 0.05, 'hidden': 64, 'epochs': 3, 'seed': 0}, lambda checkpoint=None, **m: print(m))"
"""

from __future__ import annotations

import torch
from torch import nn


def make_data(generator: torch.Generator, n: int = 2048, features: int = 20, classes: int = 4):
    """A fixed synthetic problem (the same for every trial): points around random class centres."""
    problem = torch.Generator().manual_seed(1234)
    centres = torch.randn(classes, features, generator=problem) * 0.5
    labels = torch.randint(0, classes, (n,), generator=problem)
    inputs = centres[labels] + torch.randn(n, features, generator=problem)
    split = n * 5 // 6
    return (inputs[:split], labels[:split]), (inputs[split:], labels[split:])


def train(config: dict, report, checkpoint: dict | None = None) -> None:
    torch.manual_seed(config["seed"])
    generator = torch.Generator().manual_seed(config["seed"])
    device = torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")
    (x_train, y_train), (x_val, y_val) = make_data(generator)
    x_train, y_train, x_val, y_val = (t.to(device) for t in (x_train, y_train, x_val, y_val))

    model = nn.Sequential(nn.Linear(x_train.shape[1], config["hidden"]), nn.ReLU(),
                          nn.Linear(config["hidden"], 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config.get("momentum", 0.9))
    amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    if checkpoint is not None:  # hpsearch restarted this trial: continue from its last checkpoint
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        generator.set_state(checkpoint["generator"])
        start = checkpoint["epoch"]

    for epoch in range(start, config["epochs"]):
        model.train()
        order = torch.randperm(len(x_train), generator=generator).to(device)
        for batch in order.split(config.get("batch_size", 64)):
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = loss_fn(model(x_train[batch]), y_train[batch])
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        model.eval()
        with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype):
            logits = model(x_val)
            val_loss = loss_fn(logits.float(), y_val).item()
        val_acc = (logits.argmax(1) == y_val).float().mean().item()
        report(val_loss=val_loss, val_acc=val_acc, train_loss=loss.item(),
               checkpoint={"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                           "generator": generator.get_state(), "epoch": epoch + 1})
