"""Data-parallel training: one run on several workers (processes) with torch.distributed.

Framework-free, as loop.py is: who starts the workers is the caller's business (adapter.py starts
them as Ray actors in the trial's placement group; __main__.py as local processes). What a run of
N workers promises, and how:

- the same model on every worker: each seeds the same weight init, and DistributedDataParallel
  broadcasts rank 0's weights once more when it wraps the model;
- one global batch of `batch_size` split evenly: each worker takes `batch_size / workers` examples
  (resources.workers must divide batch_size), DDP averages the gradients, so a step is the step
  of one worker with the whole batch, up to the order of the additions;
- the data split by torch's DistributedSampler, seeded with the trial's seed and set to the epoch:
  the order of an epoch depends on (seed, epoch) only, so a resumed run shuffles as an
  uninterrupted one did;
- the training loss and metrics over every worker's examples (summed across workers); validation
  on the whole validation set by every worker (the same numbers on each, and the ones one worker
  would get: no example padded in, none counted twice);
- reports and checkpoints from rank 0 only; a checkpoint restored on every worker (the states are
  equal: every worker draws the same random numbers, since each takes the same number of examples).

Backends: gloo on CPU, nccl on CUDA (one GPU per worker).
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, DistributedSampler

from trainable.errors import ConfigError, problem

if TYPE_CHECKING:  # the canonical loop's data (torchvision: seconds of a process's start); a function's ranks
    # import this module for its process group only (ShardedBatches imports them when it is built)
    from trainable.data import Arrays, Standardize


@dataclass(frozen=True)
class World:
    """This process's place among a run's workers."""

    rank: int = 0  #: 0 reports and checkpoints
    size: int = 1  #: the number of workers (resources.workers); 1: no torch.distributed at all

    @property
    def distributed(self) -> bool:
        return self.size > 1


SINGLE = World()


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU ones."""
    return "nccl" if device.type == "cuda" else "gloo"


LOOPBACK = "127.0.0.1"  #: where a run whose workers all run on this host meets


def free_port() -> int:
    """A TCP port free on this host's loopback address now, for the rendezvous of a run on local processes
    (spawned: rank 0 binds it again in its own process)."""
    with rendezvous_socket(LOOPBACK) as probe:
        return probe.getsockname()[1]


def rendezvous_socket(address: str, port: int = 0) -> socket.socket:
    """Rank 0's rendezvous socket, bound to `address` alone and listening (port 0: any free one, then read it
    from the socket): the address its workers are given, the loopback address when all of them run on this
    host. torch's store has no authentication, and torch binds it to every interface whatever address it is
    given; bound here, it is reached at that address only (from this host alone, for the loopback address)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    except ValueError:  # a host name: every interface, as torch binds it
        family, address = socket.AF_INET, ""
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own store sets it
        listener.bind((address, port))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


def join(world: World, address: str, port: int, device: torch.device, timeout_s: float = 1800.0,
         listener: socket.socket | None = None) -> None:
    """Join the run's process group (rank 0 hosts its store at address:port, on `listener` if given, which the
    store then owns); returns once all have joined. A loopback `address` keeps the group on this host: the
    store and gloo's connections listen on the loopback address only.

    The timeout also bounds every collective: a worker that died leaves the others an error, not a hang
    (gloo sees a closed connection at once; a silent peer costs the timeout).
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    local = is_loopback(address)
    if world.rank == 0:
        listener = listener or rendezvous_socket(address, port)
        store = dist.TCPStore(address, port, world.size, True, timeout=timeout, master_listen_fd=listener.detach())
    else:
        store = dist.TCPStore(address, port, world.size, False, timeout=timeout)
    with gloo_interface(loopback_interface() if local and device.type != "cuda" else None):
        dist.init_process_group(backend_for(device), store=store, rank=world.rank, world_size=world.size,
                                timeout=timeout)


def is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: the network's
        return False


def loopback_interface() -> str | None:
    """The name of this host's loopback interface: lo on Linux, lo0 on macOS; None where it has neither.

    By name, from the standard library: what lists an interface's addresses (psutil) is Ray's vendored copy in a
    Ray process, and absent from a replay's local processes."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)


@contextlib.contextmanager
def gloo_interface(name: str | None) -> Iterator[None]:
    """gloo's connections on interface `name` while a group is made (gloo reads GLOO_SOCKET_IFNAME then; by
    default it listens on the address this host's name resolves to, which may face the network). It replaces
    the user's own GLOO_SOCKET_IFNAME for that moment: a choice among the network's interfaces, for workers on
    several hosts, which a group on one host does not need."""
    if name is None:
        yield
        return
    before = os.environ.get(GLOO_INTERFACE)
    os.environ[GLOO_INTERFACE] = name
    try:
        yield
    finally:
        if before is None:
            del os.environ[GLOO_INTERFACE]
        else:
            os.environ[GLOO_INTERFACE] = before


GLOO_INTERFACE = "GLOO_SOCKET_IFNAME"


def leave() -> None:
    """Leave the process group (a reused Ray actor runs the next trial in a fresh one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel around `model` (its parameters stay the model's: a checkpoint saves the model).

    DDP's default buffer handling: rank 0's buffers (batch norm's running statistics) are sent to the others
    before each training forward pass, so every worker's model is rank 0's, the one checkpointed."""
    ids = [device.index or 0] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def summed(*values: torch.Tensor) -> list[torch.Tensor]:
    """Each tensor summed over the workers (one all-reduce)."""
    flat = torch.stack([v.to(torch.float64) for v in values])
    dist.all_reduce(flat)
    return list(flat.unbind())


class ShardedBatches:
    """This worker's share of every training batch: DistributedSampler's order for the epoch, in batches of
    batch_size / workers. `epoch` is set by the loop before each epoch (the sampler's set_epoch)."""

    def __init__(self, arrays: Arrays, batch_size: int, device: torch.device, world: World, seed: int, *,
                 standardize: Standardize | None, drop_last: bool, source: str, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False):
        from trainable.batches import ArrayDataset, InMemoryBatches
        from trainable.seed import seed_worker

        # the sampler only draws indices: its dataset is a stand-in of the right length (it reads only len())
        self.sampler: DistributedSampler[int] = DistributedSampler(
            cast("Dataset[int]", range(len(arrays.labels))), num_replicas=world.size, rank=world.rank, shuffle=True,
            seed=seed, drop_last=drop_last)
        if batch_size % world.size:  # the space file is checked for this; a best.yaml edited by hand is not
            raise ConfigError([problem("batch_size", f"must be divisible by workers ({world.size}): each worker "
                                                     "takes batch_size / workers examples of every batch", batch_size)])
        self.per_worker = batch_size // world.size
        self.drop_last = drop_last
        self.loader: torch.utils.data.DataLoader | None
        if source == "loader":
            self.loader = torch.utils.data.DataLoader(
                ArrayDataset(arrays, standardize), batch_size=self.per_worker, sampler=self.sampler,
                drop_last=drop_last, num_workers=num_workers, pin_memory=pin_memory, worker_init_fn=seed_worker,
                persistent_workers=persistent_workers and num_workers > 0)
            self.memory = None
        else:
            self.loader = None
            self.memory = InMemoryBatches(arrays, self.per_worker, device, standardize=standardize, shuffle=False)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        n, b = self.sampler.num_samples, self.per_worker
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.loader is not None:
            yield from self.loader
            return
        assert self.memory is not None  # built whenever the loader is not
        order = torch.tensor(list(self.sampler), dtype=torch.long, device=self.memory.inputs.device)
        for batch in range(len(self)):
            index = order[batch * self.per_worker:(batch + 1) * self.per_worker]
            yield self.memory.inputs[index], self.memory.labels[index]


# ---- for your own training function (trainable: FILE.py:FUNCTION, resources.workers > 1) ----------------

def rank() -> int:
    """This worker's rank (0 reports and checkpoints); 0 outside a run of several workers."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The run's workers; 1 outside a run of several workers."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def prepare_model(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` on `device`, wrapped in DistributedDataParallel when the run has several workers (train with
    what comes back; checkpoint `model` itself); unchanged otherwise, so one function serves both."""
    model = model.to(device)
    return wrap_model(model, device) if world_size() > 1 else model


def shard(size: int, seed: int, epoch: int) -> list[int]:
    """This worker's indices of a dataset of `size` examples for `epoch`: torch's DistributedSampler, shuffled
    with (seed, epoch), so every worker takes a different share and a resumed epoch the same one; with one
    worker, a permutation of all of them drawn the same way."""
    # a stand-in of the right length: the sampler reads only len() of its dataset
    sampler: DistributedSampler[int] = DistributedSampler(cast("Dataset[int]", range(size)), num_replicas=world_size(),
                                                          rank=rank(), shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)
