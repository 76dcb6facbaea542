"""Device choice, made once per trial and passed down."""

from __future__ import annotations

import torch


def get_default_device() -> torch.device:
    """The current accelerator (CUDA, MPS, XPU, ...) if one is usable, else the CPU.

    Inside a Ray trial the visible accelerators are the ones Ray assigned it, so
    index 0 here is the trial's own GPU.
    """
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator if accelerator is not None else torch.device("cpu")
