"""What the cluster holds: can it ever run one trial (answer before starting, instead of
PENDING forever), and what GPU fraction spreads the trials over every GPU.

Why spreading is needed: Ray places fractional GPU requests by best fit, so 8 trials at
0.125 GPU on an 8-GPU node all get GPU 0 while 7 GPUs idle (measured; see DESIGN.md).
Ray offers no per-trial placement by GPU id, so the lever is the fraction: the largest
1/k that still lets the cluster hold every trial that runs at once. Trials of a whole GPU
never share one; trials of 1/k fill a GPU k at a time.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import cast

import ray
from ray.tune import PlacementGroupFactory

from search.definition.schema import Resources
from search.execution.ray_internals import autoscaler_status

# Ray's unit for fractional resources is 1/10000; compare in those units to avoid 0.1+0.2 noise.
UNIT = 10_000


class CapacityError(RuntimeError):
    """No node can hold one trial and no autoscaler will add one."""


AUTOSCALER_SETTING = "HPSEARCH_AUTOSCALER"  #: 1: an autoscaler adds nodes, 0: none does (overrides detection)


def has_autoscaler(private: bool = False) -> bool:
    """True where an autoscaler can add nodes to the cluster this driver joined.

    Asked in order: a local Ray this search started for itself (`private`: none, whatever else says so);
    HPSEARCH_AUTOSCALER=1/0 (the user says so, for a provider we cannot see); `ray up`'s bootstrap
    config on the head (Ray Tune's own test, insufficient_resources_manager); then the cluster
    itself, as `ray status` reads it (autoscaler_status).
    """
    if private:  # a local Ray started by this search for itself, on a `ray up` head too: nothing adds nodes to it
        return False
    setting = os.environ.get(AUTOSCALER_SETTING, "").strip()
    if setting in ("0", "1"):
        return setting == "1"
    if os.path.exists(os.path.expanduser("~/ray_bootstrap_config.yaml")):
        return True
    if not ray.is_initialized():
        return False
    node_types, version = autoscaler_status()
    if node_types is None and version is None:  # neither record reads: a refusal would rest on no evidence
        print(f"note: cannot tell whether an autoscaler serves this cluster (Ray's status records do not read); "
              f"assuming one may add nodes. Set {AUTOSCALER_SETTING}=0 if none does", file=sys.stderr)
        return True
    # every head runs Ray's monitor; without an autoscaling config (ray.init, a plain `ray start
    # --head`) it runs a read-only one that names each node's type `node_<id>` and adds none.
    # An autoscaler with a config reports the node types of that config (head, gpu, headgroup...)
    return any(not name.startswith("node_") for name in node_types or ()) or version not in (None, "", "0")


def trial_resources(resources: Resources, gpus: float) -> dict[str, float] | PlacementGroupFactory:
    """What Tune reserves for one trial: `resources.cpus` CPU and `gpus` GPU; for several workers, a placement
    group of one such bundle per worker, placed as one unit (resources.placement: PACK fills as few nodes as
    hold them, SPREAD puts them on different nodes where it can). Bundle 0 holds the trial's actor (rank 0);
    trainable/adapter.py starts the other ranks in the others. One worker: the plain request, as always."""
    if resources.workers == 1:
        return {"cpu": resources.cpus, "gpu": gpus}
    bundle = {"CPU": resources.cpus, **({"GPU": gpus} if gpus else {})}
    return PlacementGroupFactory([dict(bundle) for _ in range(resources.workers)],
                                 strategy=resources.placement.upper())


def workers_fit(node_resources: dict[str, float], resources: Resources) -> int:
    """Workers of `resources` (cpus, gpus each) that one node with `node_resources` holds at once."""
    fits = round(node_resources.get("CPU", 0) * UNIT) // round(resources.cpus * UNIT)
    if resources.gpus:
        # a fraction must fit inside one GPU: 0.4 GPU is 2 trials per GPU, not 2.5
        # never auto here: resolved first (gpu_probe.resolve_auto), or skipped (preflight.check_local_capacity)
        gpus, share = round(node_resources.get("GPU", 0) * UNIT), round(cast(float, resources.gpus) * UNIT)
        fits = min(fits, gpus // UNIT * (UNIT // share) + gpus % UNIT // share)
    return fits


def trials_fit(node_resources: dict[str, float], resources: Resources) -> int:
    """Trials of `resources` (resources.workers workers each) that one node with `node_resources` holds at once."""
    return workers_fit(node_resources, resources) // resources.workers


def alive_nodes() -> list[dict[str, float]]:
    """Ray's resources (CPU, GPU, ...) of each alive node."""
    return [node.get("Resources", {}) for node in ray.nodes() if node.get("Alive")]


def check_capacity(resources: Resources, private: bool = False) -> int:
    """Trials the cluster's nodes hold at once; raise CapacityError if that is 0 for good.

    0 where an autoscaler adds nodes: how many trials run at once is then max_concurrent, not
    what happens to be up now. Also says (a note) when others hold what a trial needs: on a
    shared cluster another search's trials wait-list ours. The count stays the nodes' whole
    capacity, not what is free at this moment, so the same space gives the same trials (the
    searcher's order depends on the trials at once).
    """
    # a trial's workers may span nodes (PACK and SPREAD are Ray's soft strategies): count workers, then trials
    total = sum(workers_fit(node, resources) for node in alive_nodes()) // resources.workers
    autoscaler = has_autoscaler(private)
    if total == 0 and not autoscaler:
        nodes = alive_nodes()
        largest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
        if resources.workers > 1:
            held = sum(workers_fit(node, resources) for node in nodes)
            raise CapacityError(
                f"resources.workers: must be at most the workers of {resources.cpus:g} CPU and {resources.gpus:g} "
                f"GPU each that this cluster holds at once ({held}, over {len(nodes)} node(s)), and no autoscaler "
                f"will add nodes, got {resources.workers}. Lower resources.workers or resources.cpus, or set "
                f"{AUTOSCALER_SETTING}=1 if an autoscaler Ray cannot see adds nodes.")
        raise CapacityError(
            f"resources: each trial asks for {resources.cpus:g} CPU and {resources.gpus:g} GPU, "
            f"but no node of this cluster has that much (the largest has {largest.get('CPU', 0):g} CPU "
            f"and {largest.get('GPU', 0):g} GPU; {len(nodes)} node(s)), and no autoscaler will add one. "
            f"Lower --gpus-per-trial / --cpus-per-trial, or run on a cluster with GPUs (--address), "
            f"or set {AUTOSCALER_SETTING}=1 if an autoscaler Ray cannot see adds nodes."
        )
    if note := held_by_others(resources, total):
        print(f"note: {note}", file=sys.stderr, flush=True)
    return 0 if autoscaler else total


def held_by_others(resources: Resources, total: int) -> str:
    """A line when what is free now holds fewer trials than the nodes do ("" when all is free).

    Free is Ray's available resources over the whole cluster: what other drivers (another
    search, a Ray job) hold is not free. Summed over nodes, so a trial split across two nodes'
    leftovers counts as fitting: it can only say too much is free, never too little.
    """
    if total == 0:
        return ""
    free = ray.available_resources()
    fits = min(total, trials_fit(free, resources))
    if fits == total:
        return ""
    whole = ray.cluster_resources()
    held = ", ".join(f"{whole.get(k, 0) - free.get(k, 0):g} of {whole.get(k, 0):g} {k}"
                     for k in ("GPU", "CPU") if whole.get(k, 0) - free.get(k, 0) > 0)
    return (f"resources: other jobs on this cluster hold {held} (another search?); {fits} of the {total} "
            f"trial(s) the nodes hold at once can start now, the rest wait until they are free "
            f"(`ray status`, `ray job list` or the dashboard's Jobs page show who)")


@dataclass(frozen=True)
class GpuPlan:
    """The GPU fraction each trial gets, and why, for the summary."""

    gpus: float  #: GPUs per trial that Tune asks Ray for
    asked: float  #: resources.gpus (after auto)
    note: str = ""  #: one line for the summary; "" when there is nothing to say


def fraction(k: int) -> float:
    """1/k in Ray's units, rounded down so that k of them still fit on one GPU (1/3 -> 0.3333)."""
    return (UNIT // k) / UNIT


def spread_gpus(nodes: list[dict[str, float]], resources: Resources, trials: int, *,
                autoscaler: bool = False) -> GpuPlan:
    """The largest fraction 1/k (>= the one asked) at which `nodes` still hold `trials` at once.

    `trials`: how many run at once at most (max_concurrent, num_samples). Works per node, so
    on a cluster of unequal nodes (GPUs, CPUs) a fraction counts only where a trial fits.
    Not spread: no GPUs asked, resources.spread false, or a cluster whose capacity is 0 now
    because an autoscaler adds the nodes (their GPUs are not known at start).
    """
    asked = float(resources.gpus)
    if not asked:
        return GpuPlan(0.0, 0.0)
    holds = [n for n in nodes if trials_fit(n, resources)]
    if not holds:
        return GpuPlan(asked, asked, f"{asked:g} GPU per trial as asked: no node holds a trial yet; an "
                                     "autoscaler adds them, so the GPUs the search gets are not known at start"
                       if autoscaler else "")
    gpus = sum(n.get("GPU", 0) for n in holds)
    at_once = min(trials, sum(trials_fit(n, resources) for n in holds))
    k = 1
    while fraction(k) > asked and sum(trials_fit(n, resources.model_copy(update={"gpus": fraction(k)})) for n in holds) < at_once:
        k += 1
    chosen = max(fraction(k), asked)
    if chosen == asked:
        return GpuPlan(asked, asked)
    what = f"{at_once} trials at once over {gpus:g} GPUs: {chosen:g} GPU per trial instead of {asked:g}"
    if not resources.spread:
        return GpuPlan(asked, asked, f"{asked:g} GPU per trial as asked (resources.spread: false); spread over "
                                     f"the {gpus:g} GPUs, the {at_once} trials at once would get {chosen:g} each")
    return GpuPlan(chosen, asked, f"{what} (spread: at {asked:g} Ray packs them on the fewest GPUs; "
                                  "resources.spread: false keeps the fraction)")


def plan_gpus(resources: Resources, trials: int, private: bool = False) -> GpuPlan:
    """spread_gpus on the cluster Ray sees now."""
    return spread_gpus(alive_nodes(), resources, trials, autoscaler=has_autoscaler(private))
