"""Seeding: one call per trial makes weight init and shuffling reproducible."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def set_seed(seed: int, *, deterministic: bool = True, benchmark: bool = False,
             warn_only: bool = True) -> torch.Generator:
    """Seed Python, NumPy and torch; return a generator for shuffling seeded the same way.

    The returned generator is the only source of randomness the loop uses after model
    init, so its state (saved in checkpoints) is enough to resume a run bit for bit.
    """
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
    torch.utils.deterministic.fill_uninitialized_memory = False
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
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
