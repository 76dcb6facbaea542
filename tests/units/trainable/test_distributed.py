"""trainable/distributed.py: the process group of a run's workers, here two local processes (spawned, as a
replay of a multi-worker trial runs them)."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import pytest
import torch.multiprocessing as mp

from trainable.distributed import World, free_port, join, leave

WILDCARDS = {"0.0.0.0", "::"}


def listening() -> set[tuple[str, int]]:
    """This process's listening TCP sockets (address, port)."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet") if c.status == "LISTEN"}


def facing_interface() -> tuple[str, str] | None:
    """(name, IPv4 address) of an interface of this host that faces the network, if it has one."""
    return next(((name, a.address) for name, addresses in psutil.net_if_addrs().items() for a in addresses
                 if a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback), None)


def _rank(rank: int, address: str, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    before = listening()
    join(World(rank, 2), address, port, torch.device("cpu"), timeout_s=120)
    total = torch.full((1,), float(rank + 1))
    dist.all_reduce(total)
    out.put((rank, sorted(listening() - before), float(total)))
    dist.barrier()  # neither leaves while the other still lists its sockets
    leave()


def joined(address: str) -> list[tuple[int, list[tuple[str, int]], float]]:
    """Each rank's (rank, the sockets joining made it listen on, its all-reduced 1 + 2) for a group at `address`."""
    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(rank, address, port, out)) for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        said = sorted(out.get(timeout=180) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=60)
    assert [total for _, _, total in said] == [3.0, 3.0], "the group works: 1 + 2 summed on both ranks"
    assert ((address, port) in said[0][1]), f"rank 0 hosts the store at the address it was given: {said[0][1]}"
    return said


def test_the_workers_of_a_run_on_one_host_listen_on_the_loopback_address_only(monkeypatch):
    """torch's rendezvous store has no authentication, and gloo's connections none either: a run whose workers
    are all on this host (a laptop's search, a replay) keeps them off the network (issue 49 item 11)."""
    # gloo listens where this host's name resolves to, here the loopback address; pointed at an interface that
    # faces the network, as a cluster user's shell may point it, it would listen there
    facing = facing_interface()
    if facing is not None:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", facing[0])  # the spawned workers inherit it
    exposed = [(rank, ip, p) for rank, sockets, _ in joined("127.0.0.1") for ip, p in sockets
               if not ipaddress.ip_address(ip).is_loopback]
    assert not exposed, f"listening beyond this host: {exposed}"


def test_the_workers_of_a_run_across_hosts_meet_at_rank_0s_address_not_on_every_interface():
    """Workers on several nodes meet at rank 0's node address (the nodes must reach it): the store listens there
    alone, as gloo does, never on every interface."""
    facing = facing_interface()
    if facing is None:
        pytest.skip("this host has no interface beside the loopback one")
    anywhere = [(rank, ip, p) for rank, sockets, _ in joined(facing[1]) for ip, p in sockets if ip in WILDCARDS]
    assert not anywhere, f"listening on every interface: {anywhere}"
