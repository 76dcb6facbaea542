"""The metrics every epoch reports: what a search may optimise (experiment.metric).

Kept apart from loop.py so that validating a space file does not import torch.
"""

METRICS = ("train_loss", "train_acc", "val_loss", "val_acc")
