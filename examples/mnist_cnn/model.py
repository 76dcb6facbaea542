"""A user's model file: a small CNN for 28x28 digits, written as anyone would write one.

hpsearch calls `Net(**kwargs)` with the model section's keys (channels, hidden, dropout)
plus num_classes, which it takes from the data because the signature names it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    """Two 3x3 convolutions with max-pooling, then two linear layers."""

    def __init__(self, channels: int = 16, hidden: int = 64, dropout: float = 0.1, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.dropout = nn.Dropout(dropout)
        self.fc1 = nn.Linear(2 * channels * 7 * 7, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 28 -> 14
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 14 -> 7
        x = self.dropout(torch.flatten(x, 1))
        return self.fc2(F.relu(self.fc1(x)))
