"""Your own loop with two objectives and a constraint: `trainable: train.py:train` in space.yaml.

A small MLP regression: R2 on the validation split up (`r2`, max), the parameter count down
(`params`, min), and a constraint on the time one validation pass takes (`latency_ms <= 5`).
The data come from problem.py beside this file. Runs offline, in seconds, on the CPU.

    python -m search --space examples/own_loop_front/space.yaml
"""

from __future__ import annotations

import time

import torch
from torch import nn

from problem import make_data


def train(config: dict, report, checkpoint: dict | None = None) -> None:
    torch.manual_seed(config["seed"])
    (x_train, y_train), (x_val, y_val) = make_data()
    model = nn.Sequential(nn.Linear(x_train.shape[1], config["hidden"]), nn.Tanh(), nn.Linear(config["hidden"], 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    start = 0
    if checkpoint is not None:  # Tune restarted this trial: continue where it stopped
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = checkpoint["epoch"]
    params = sum(p.numel() for p in model.parameters())
    order = torch.Generator().manual_seed(config["seed"])
    for epoch in range(start, config["epochs"]):
        model.train()
        for batch in torch.randperm(len(x_train), generator=order).split(config["batch_size"]):
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x_train[batch]).squeeze(1), y_train[batch])
            loss.backward()
            optimizer.step()
        model.eval()
        began = time.perf_counter()
        with torch.no_grad():
            predicted = model(x_val).squeeze(1)
        latency_ms = (time.perf_counter() - began) * 1000
        val_loss = nn.functional.mse_loss(predicted, y_val).item()
        r2 = 1 - val_loss / y_val.var(unbiased=False).item()
        report(r2=r2, params=params, val_loss=val_loss, latency_ms=latency_ms,
               checkpoint={"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1})
