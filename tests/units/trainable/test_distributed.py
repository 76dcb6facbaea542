"""trainable/distributed.py: the process group of a run's workers, here two local processes (spawned, as a
replay of a multi-worker trial runs them)."""

from __future__ import annotations

import ipaddress
import socket

import psutil
import torch.multiprocessing as mp

from trainable.distributed import World, free_port, join, leave


def listening() -> set[tuple[str, int]]:
    """This process's listening TCP sockets (address, port)."""
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet") if c.status == "LISTEN"}


def _rank(rank: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist

    before = listening()
    join(World(rank, 2), "127.0.0.1", port, torch.device("cpu"), timeout_s=120)
    total = torch.full((1,), float(rank + 1))
    dist.all_reduce(total)
    out.put((rank, sorted(listening() - before), float(total)))
    dist.barrier()  # neither leaves while the other still lists its sockets
    leave()


def test_the_workers_of_a_run_on_one_host_listen_on_the_loopback_address_only(monkeypatch):
    """torch's rendezvous store has no authentication, and gloo's connections none either: a run whose workers
    are all on this host (a laptop's search, a replay) keeps them off the network (issue 49 item 11)."""
    # gloo listens where this host's name resolves to, here the loopback address; pointed at an interface that
    # faces the network, as a cluster user's shell may point it, it would listen there
    facing = next((name for name, addresses in psutil.net_if_addrs().items() if any(
        a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback for a in addresses)), None)
    if facing is not None:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", facing)  # the spawned workers inherit it
    context = mp.get_context("spawn")
    out = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, out)) for rank in range(2)]
    for process in ranks:
        process.start()
    try:
        said = sorted(out.get(timeout=180) for _ in ranks)
    finally:
        for process in ranks:
            process.join(timeout=60)
    assert [total for _, _, total in said] == [3.0, 3.0], "the group works: 1 + 2 summed on both ranks"
    assert (("127.0.0.1", port) in said[0][1]), f"rank 0 hosts the store at the port it was given: {said[0][1]}"
    exposed = [(rank, ip, p) for rank, sockets, _ in said for ip, p in sockets if not ipaddress.ip_address(ip).is_loopback]
    assert not exposed, f"listening beyond this host: {exposed}"
