"""Can the cluster ever run one trial? Answer before starting, instead of PENDING forever."""

from __future__ import annotations

import os

import ray

from search.space import Resources

# Ray's unit for fractional resources is 1/10000; compare in those units to avoid 0.1+0.2 noise.
UNIT = 10_000


class CapacityError(RuntimeError):
    """No node can hold one trial and no autoscaler will add one."""


def has_autoscaler() -> bool:
    """True on a cluster made with the cluster launcher (`ray up`).

    Ray Tune uses the same test (ray.tune.execution.insufficient_resources_manager):
    the launcher leaves its bootstrap config on the head node.
    """
    return os.path.exists(os.path.expanduser("~/ray_bootstrap_config.yaml"))


def trials_fit(node_resources: dict[str, float], resources: Resources) -> int:
    """Trials of `resources` that one node with `node_resources` (Ray's CPU/GPU counts) holds at once."""
    fits = round(node_resources.get("CPU", 0) * UNIT) // round(resources.cpus * UNIT)
    if resources.gpus:
        fits = min(fits, round(node_resources.get("GPU", 0) * UNIT) // round(resources.gpus * UNIT))
    return fits


def trials_per_node(resources: Resources) -> dict[str, int]:
    """How many trials each alive node can hold at once (node id -> count)."""
    return {node["NodeID"]: trials_fit(node.get("Resources", {}), resources)
            for node in ray.nodes() if node.get("Alive")}


def check_capacity(resources: Resources) -> int:
    """Trials the cluster holds at once now; raise CapacityError if that is 0 for good."""
    counts = trials_per_node(resources)
    total = sum(counts.values())
    if total == 0 and not has_autoscaler():
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        largest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
        raise CapacityError(
            f"resources: each trial asks for {resources.cpus:g} CPU and {resources.gpus:g} GPU, "
            f"but no node of this cluster has that much (the largest has {largest.get('CPU', 0):g} CPU "
            f"and {largest.get('GPU', 0):g} GPU; {len(nodes)} node(s)), and no autoscaler will add one. "
            f"Lower --gpus-per-trial / --cpus-per-trial, or run on a cluster with GPUs (--address)."
        )
    return total

