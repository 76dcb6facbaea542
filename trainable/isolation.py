"""The process-wide state one trial can change and the next trial on a reused actor would inherit.

Tune runs trial after trial in one actor process (reuse_actors=True). Torch, NumPy and Python
keep some settings per process: a trial that calls `torch.set_default_dtype(torch.float64)`
would make the next, innocent trial fail with a dtype error and be recorded as FAIL. The
adapter captures this state when a trial starts and restores it when the trial ends, however
it ends (`finally`: a return, an error, or Tune's stop, which is a SystemExit raised in
`tune.report`). Restoring is cheaper than refusing reuse (a new actor costs seconds and the
data fetch again), and it covers the settings users actually change; what is not listed here
(environment variables, imported modules' globals) still leaks.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class GlobalState:
    """torch's defaults, flags and RNGs, NumPy's and Python's RNGs, thread count, working directory."""

    default_dtype: torch.dtype
    default_device: torch.device
    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None  #: None while CUDA is not initialised (reading it would initialise it)
    numpy_rng: Any
    python_rng: Any
    deterministic: bool
    warn_only: bool
    fill_uninitialized_memory: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    cudnn_allow_tf32: bool
    matmul_allow_tf32: bool
    matmul_precision: str
    num_threads: int
    cwd: str

    @classmethod
    def capture(cls) -> "GlobalState":
        return cls(
            default_dtype=torch.get_default_dtype(),
            default_device=torch.get_default_device(),
            torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
            numpy_rng=np.random.get_state(),
            python_rng=random.getstate(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            # a property of the module's class (torch/utils/deterministic.py), which mypy does not see
            fill_uninitialized_memory=torch.utils.deterministic.fill_uninitialized_memory,  # type: ignore[attr-defined]
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cudnn_allow_tf32=torch.backends.cudnn.allow_tf32,
            matmul_allow_tf32=torch.backends.cuda.matmul.allow_tf32,
            matmul_precision=torch.get_float32_matmul_precision(),
            num_threads=torch.get_num_threads(),
            cwd=os.getcwd(),
        )

    def restore(self) -> None:
        """Put everything back; settings that did not change are not touched."""
        if torch.get_default_dtype() != self.default_dtype:
            torch.set_default_dtype(self.default_dtype)
        if torch.get_default_device() != self.default_device:
            # None removes the device mode; setting "cpu" would add one that every op then passes through
            torch.set_default_device(None if self.default_device.type == "cpu" else self.default_device)
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        np.random.set_state(self.numpy_rng)
        random.setstate(self.python_rng)
        if (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()) != (
                self.deterministic, self.warn_only):
            # only when changed: the call imports torch._inductor's config, the biggest import of a function
            # trial's process otherwise (docs/performance.md)
            torch.use_deterministic_algorithms(self.deterministic, warn_only=self.warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = self.fill_uninitialized_memory  # type: ignore[attr-defined]  # see capture
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.backends.cudnn.allow_tf32 = self.cudnn_allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.matmul_allow_tf32
        torch.set_float32_matmul_precision(self.matmul_precision)
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        if _cwd() != self.cwd:
            os.chdir(self.cwd)  # last: if the folder is gone, the error names it after the rest is restored


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except FileNotFoundError:  # the trial deleted the folder it was in
        return None
