"""Seeding: one call per trial makes weight init and shuffling reproducible; RNG states for checkpoints.

A trial draws from its own generator (shuffling) and from the global ones: weight init, and
every `nn.Dropout` (torch's global CPU or CUDA RNG), plus NumPy's and Python's for user code.
A checkpoint holds all of them, so a resumed run draws what the uninterrupted one drew.

torch is imported by the functions that use it: the driver derives seeds (derive_seed) and, for a
search of a function trainable, has no other use for torch (about 1.5 s of its start).
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import torch


def set_seed(seed: int, *, deterministic: bool = True, benchmark: bool = False,
             warn_only: bool = True) -> torch.Generator:
    """Seed Python, NumPy and torch; return a generator for shuffling seeded the same way.

    The returned generator drives shuffling; a model may still draw from the global RNGs
    (dropout), so checkpoints also save global_rng_states().
    """
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    # cuBLAS is deterministic only with a fixed workspace; it reads this when CUDA starts, so a
    # trial sets it before its first CUDA call (a no-op on CPU)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # warn_only: some CUDA kernels have no deterministic version; warn rather than fail.
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    # filling fresh memory with NaN adds a kernel to many ops and protects nothing here: every
    # tensor the loop reads is written first
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]  # a property its module's class adds
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = benchmark
    return torch.Generator().manual_seed(seed)


def derive_seed(experiment_seed: int, index: int, stream: int = 0) -> int:
    """The seed of trial number `index` of an experiment: stable, distinct, 31 bits.

    SeedSequence mixes the numbers well, so trials 0, 1, 2 get unrelated seeds. `stream`
    gives other uses (the searcher's sampler) seeds unrelated to the trials' own.
    """
    entropy = [experiment_seed, index] if stream == 0 else [experiment_seed, index, stream]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)


def seed_worker(worker_id: int) -> None:
    """DataLoader worker_init_fn: seed Python and NumPy from the worker's torch seed.

    torch seeds each worker from the loader's generator; libraries using `random` or
    NumPy inside a worker would otherwise repeat the same draws in every worker.
    """
    import torch

    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)


def global_rng_states() -> dict[str, Any]:
    """torch's CPU (and, once initialised, CUDA) RNG, NumPy's and Python's: plain data and
    tensors only, so torch.load(weights_only=True) reads them back."""
    import torch

    # legacy=True, the default, returns the tuple; numpy's stubs also allow the dict of legacy=False
    name, keys, position, has_gauss, cached = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    version, python_state, gauss = random.getstate()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(position),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "python": {"version": version, "state": list(python_state), "gauss": gauss},
    }
    if torch.cuda.is_initialized():  # reading it before would initialise CUDA in a CPU trial
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_global_rng_states(states: dict[str, Any]) -> str | None:
    """Restore what global_rng_states() saved; a note when part of it cannot be restored here."""
    import torch

    torch.set_rng_state(states["torch"])
    numpy = states["numpy"]
    np.random.set_state((numpy["name"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))
    python = states["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    cuda = states.get("cuda")
    if cuda:
        here = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for index, state in enumerate(cuda[:here]):
            torch.cuda.set_rng_state(state, index)
        if here < len(cuda):
            return (f"the checkpoint holds the CUDA RNG states of {len(cuda)} GPU(s), this process sees {here}: "
                    "randomness drawn on a GPU (dropout) differs from the uninterrupted run")
    return None
