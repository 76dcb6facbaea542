"""`resources.gpus: auto`: trials per GPU sized from one short probe, measured before Tune starts.

The probe trains the largest configuration of the space (the largest batch size, the model
with the most parameters) for a few seconds in k = 1, 2, 4, ... processes at once on one
GPU. Each copy stands in for a trial: its own process and CUDA context, as Tune's trial
actors have. Per round it measures
- per copy: the device memory in use once its CUDA context exists (torch.cuda.mem_get_info,
  so it counts the context, and any other process on the GPU: an upper bound) and its
  peak reserved memory (torch.cuda.max_memory_reserved);
- all copies together: training steps per second, and the device memory in use while all
  of them hold their memory.
`choose_trials_per_gpu` (pure) then takes the most copies that fit memory with MARGIN to
spare and still raise throughput by MIN_GAIN over the round before (the knee); each GPU
gets that many trials (gpus 1/k). The figures are written to the run folder as gpu_probe.json.

Where it runs: always in a Ray task that asks for 1 GPU, also on a local Ray. On a cluster
the driver's head node often has no GPU; locally it keeps the driver free of a CUDA context
that would hold memory on GPU 0 for the whole search. A task that finds no CUDA device
(Ray nodes that advertise GPUs torch cannot use, like the tests' fake GPUs) measures on the
CPU: throughput only, and says so. A cluster with no GPU and no autoscaler gets CPU trials.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
import pickle
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator

import ray

from search.definition.schema import AUTO, Resources
from search.definition.space import Space, example_config
from search.execution.capacity import alive_nodes, fraction, has_autoscaler
from search.store.run_folder import PROBE_FILE, RunFolder
from trainable.config import TrialConfig, keyword_of
from trainable.errors import ConfigError, problem

if TYPE_CHECKING:  # torch and the loop: imported where the probe measures, as only `gpus: auto` does (a
    # driver that sizes no GPU, a search of a function trainable among them, has no use for them)
    from trainable.data import Data

MARGIN = 0.10  #: share of the GPU's memory left free (fragmentation, evaluation batches, a larger draw)
MIN_GAIN = 0.10  #: a round must raise steps/s by this share over the one before to count
MAX_COPIES = 16  #: the most trials per GPU the probe tries
WARMUP_STEPS = 20  #: untimed: CUDA context, cuBLAS handles and the caching allocator settle
WINDOW_S = 3.0  #: timed training per round
CHUNK_STEPS = 10  #: steps between clock reads (each chunk ends with a device sync)
WAIT_S = 300.0  #: a copy waits this long for the others at a barrier before giving up
PROBE_TIMEOUT_S = 1800.0  #: the whole probe, an autoscaler starting a GPU node included


@dataclass(frozen=True)
class Round:
    """k copies trained at once."""

    copies: int
    steps_per_s: float | None  #: all copies together; None: the round failed
    context_mb: float | None = None  #: device memory in use once a copy's CUDA context existed (max over copies)
    peak_reserved_mb: float | None = None  #: torch.cuda.max_memory_reserved of a copy (max over copies)
    device_used_mb: float | None = None  #: device memory in use while every copy held its memory
    error: str = ""  #: why the round failed


@dataclass(frozen=True)
class Choice:
    trials_per_gpu: int  #: 0: CPU trials
    reason: str


def footprint_mb(alone: Round) -> float | None:
    """What one more trial costs the GPU: its context plus its peak reserved memory (measured alone)."""
    if alone.context_mb is None or alone.peak_reserved_mb is None:
        return None
    return alone.context_mb + alone.peak_reserved_mb


def fits(copies: int, rounds: list[Round], total_mb: float | None, margin: float = MARGIN) -> bool:
    """Would `copies` copies fit the GPU's memory with `margin` to spare? Unknown memory (CPU) fits."""
    alone = next((r for r in rounds if r.copies == 1), None)
    per_copy = footprint_mb(alone) if alone else None
    if total_mb is None or per_copy is None:
        return True
    return copies * per_copy <= (1 - margin) * total_mb


def choose_trials_per_gpu(rounds: list[Round], total_mb: float | None, *, margin: float = MARGIN,
                          min_gain: float = MIN_GAIN) -> Choice:
    """The knee: walk the rounds by copies, keep the next while it fits memory and gains throughput."""
    ordered = sorted(rounds, key=lambda r: r.copies)
    if not ordered or ordered[0].copies != 1 or ordered[0].steps_per_s is None:
        why = ordered[0].error if ordered else "no round ran"
        return Choice(1, f"one trial alone could not be measured ({why}): 1 per GPU")
    best = ordered[0]
    reason = "the only round measured"
    for candidate in ordered[1:]:
        budget = f"{(1 - margin) * total_mb:.0f} MiB" if total_mb else ""
        if candidate.steps_per_s is None:
            reason = f"{candidate.copies} at once failed ({candidate.error})"
            break
        if not fits(candidate.copies, ordered, total_mb, margin) or (
                total_mb and candidate.device_used_mb and candidate.device_used_mb > (1 - margin) * total_mb):
            reason = f"{candidate.copies} at once would not fit {budget} ({100 * (1 - margin):.0f}% of the GPU)"
            break
        assert best.steps_per_s is not None  # ordered[0] or a candidate before, each measured (checked above)
        gain = candidate.steps_per_s / best.steps_per_s - 1
        if gain < min_gain:
            reason = (f"{candidate.copies} at once gained {100 * gain:+.0f}% steps/s over {best.copies} "
                      f"(less than {100 * min_gain:.0f}%)")
            break
        best = candidate
        reason = f"{best.copies} at once was the largest round tried"
    return Choice(best.copies, f"{best.steps_per_s:.0f} steps/s at {best.copies} per GPU; {reason}")


def rounds_to_try(max_copies: int) -> list[int]:
    """1, 2, 4, ... up to max_copies (and MAX_COPIES)."""
    top = max(1, min(max_copies, MAX_COPIES))
    return [2 ** i for i in range(int(math.log2(top)) + 1)]


def parameter_count(config: TrialConfig, input_shape: tuple[int, ...], num_classes: int) -> int:
    """Parameters of the model `config` builds, counted on the meta device (no memory, no compute)."""
    import torch

    from trainable.factories import build_model

    with torch.device("meta"):
        model = build_model(config, input_shape, num_classes)
    return sum(p.numel() for p in model.parameters())


def largest_config(space: Space, input_shape: tuple[int, ...], num_classes: int) -> TrialConfig:
    """The trial config of the space that needs the most memory, as far as it can be told.

    The largest batch size; for each searched model keyword, the value whose model (with the
    others as in example_config) has the most parameters, or the high end of a range. Other
    searched fields (lr, ...) do not change memory and keep example_config's value.
    """
    values = {}
    example = example_config(space).to_flat()
    for d in space.searched:
        if d.name == "batch_size":
            values[d.name] = d.largest()
        elif keyword_of(d.name) is not None and not d.is_choice:
            values[d.name] = d.high
        elif keyword_of(d.name) is not None:
            sizes = []
            for value in d.values:
                try:
                    config = TrialConfig.from_mapping({**example, d.name: value})
                    sizes.append(parameter_count(config, input_shape, num_classes))
                except Exception:  # a model the meta device cannot build: keep the first value
                    sizes = []
                    break
            if sizes:
                values[d.name] = d.values[sizes.index(max(sizes))]
    threads = max(1, math.floor(space.resources.cpus))
    return replace(TrialConfig.from_mapping({**example, **values}), num_threads=threads)


def _forever(batches) -> Iterator:
    while True:
        yield from batches


def _copy(flat: dict[str, Any], data_file: str, barrier, results, window_s: float) -> None:
    """One copy of the probe, in its own process: warm up, wait for all, train window_s, report."""
    import torch

    from trainable.device import get_default_device
    from trainable.loop import build_run, train

    figures: dict[str, Any] = {}
    try:
        with open(data_file, "rb") as stream:
            data = pickle.load(stream)
        config = TrialConfig.from_mapping(flat)
        device = get_default_device()
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.init()
            free, total = torch.cuda.mem_get_info(device)
            context = (total - free) / 2**20
            figures.update(device=torch.cuda.get_device_name(device), total_mb=total / 2**20)
        run = build_run(config, data, device)
        batches = _forever(run.train_batches)

        def steps(n: int) -> None:  # train() ends with .item(): the clock reads after the GPU is done
            train(run.model, itertools.islice(batches, n), run.loss_fn, run.optimizer, run.train_metric,
                  device, config.clip_norm)

        steps(WARMUP_STEPS)
        barrier.wait(WAIT_S)  # every copy timed while all train
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < window_s:
            steps(CHUNK_STEPS)
            done += CHUNK_STEPS
        rate = done / (time.perf_counter() - start)
        barrier.wait(WAIT_S)  # all still hold their memory while each reads the device
        figures["steps_per_s"] = rate
        if cuda:
            free, total = torch.cuda.mem_get_info(device)
            figures.update(context_mb=context, peak_reserved_mb=torch.cuda.max_memory_reserved(device) / 2**20,
                           device_used_mb=(total - free) / 2**20)
        barrier.wait(WAIT_S)
        results.put(figures)
    except BaseException as error:  # an out-of-memory copy ends the round for all of them
        barrier.abort()
        results.put({**figures, "error": f"{type(error).__name__}: {str(error)[:300]}"})


def measure_round(flat: dict[str, Any], data_file: str, copies: int,
                  window_s: float = WINDOW_S) -> tuple[Round, dict[str, Any] | None]:
    """Train `copies` copies at once, each in a fresh process (spawned: no CUDA state is inherited).

    The copies read the data from `data_file` (a pickled Data): a spawned process's arguments go
    through a pipe it reads only once its imports are done, so passing the arrays themselves made
    each start() wait for the copy before it, and the copies started one by one (12 s apart on an
    H200 node: a round of 4 took 53 s where its copies' training took 4).

    Returns the round and the CUDA device the copies saw ({"device": name, "total_mb": ...}; None: none).
    """
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(copies), context.Queue()
    processes = [context.Process(target=_copy, args=(flat, data_file, barrier, results, window_s), daemon=True)
                 for _ in range(copies)]
    for process in processes:
        process.start()
    reports = []
    for _ in processes:
        try:
            reports.append(results.get(timeout=3 * WAIT_S))
        except Exception:  # queue.Empty: a copy died without a word (killed for memory)
            reports.append({"error": "a copy ended without reporting"})
    for process in processes:
        process.join(timeout=WAIT_S)
        if process.is_alive():
            process.kill()
    errors = [r["error"] for r in reports if "error" in r]
    seen = next(({"device": r["device"], "total_mb": r["total_mb"]} for r in reports if "device" in r), None)
    if errors:
        first = next((e for e in errors if "BrokenBarrierError" not in e), errors[0])
        return Round(copies, None, error=first), seen

    def most(key: str) -> float | None:
        values = [r[key] for r in reports if r.get(key) is not None]
        return max(values) if values else None

    return Round(copies, sum(r["steps_per_s"] for r in reports), most("context_mb"), most("peak_reserved_mb"),
                 most("device_used_mb")), seen


def probe(flat: dict[str, Any], data: Data, max_copies: int, window_s: float = WINDOW_S) -> dict[str, Any]:
    """Rounds of 1, 2, 4, ... copies until one no longer pays; the figures as plain data.

    This process never touches CUDA (the copies report the device): a context of its own
    would sit on the GPU during every round and count in the copies' figures.
    """
    rounds: list[Round] = []
    seen: dict[str, Any] = {"device": "cpu", "total_mb": None}
    with tempfile.TemporaryDirectory(prefix="hpsearch-probe-") as folder:
        data_file = os.path.join(folder, "data.pickle")
        with open(data_file, "wb") as stream:
            pickle.dump(data, stream, protocol=pickle.HIGHEST_PROTOCOL)
        for copies in rounds_to_try(max_copies):
            if not fits(copies, rounds, seen["total_mb"]):
                break  # predicted from one copy alone: not worth starting
            measured, now = measure_round(flat, data_file, copies, window_s)
            rounds.append(measured)
            seen = now or seen
            if choose_trials_per_gpu(rounds, seen["total_mb"]).trials_per_gpu != copies:
                break
    return {**seen, "max_copies": max_copies, "window_s": window_s, "config": flat,
            "rounds": [asdict(r) for r in rounds]}


def probe_on_this_node(flat: dict[str, Any], data: Data, cpus_per_trial: float, wanted: int) -> dict[str, Any]:
    """The Ray task's body: as many copies as this node's CPUs allow per GPU, and no more than `wanted`
    (the trials per GPU the search can run at once), then probe()."""
    node_id = ray.get_runtime_context().get_node_id()
    node: dict[str, float] = next((n.get("Resources", {}) for n in ray.nodes() if n["NodeID"] == node_id), {})
    per_gpu = node.get("CPU", 1) / max(node.get("GPU", 1), 1) / cpus_per_trial
    return probe(flat, data, max(1, min(math.floor(per_gpu), wanted)))


def copies_wanted(max_concurrent: int, num_samples: int, gpus: float) -> int:
    """The most trials per GPU worth measuring: the trials the search runs at once, over the GPUs, rounded
    up to the probe's next round (1, 2, 4, ...). Each round costs a fresh process per copy (seconds on a
    GPU), so measuring 16 at once for a search that runs 2 is time the user waits for nothing."""
    per_gpu = math.ceil(min(max_concurrent, num_samples) / max(1.0, gpus))
    return 2 ** math.ceil(math.log2(max(1, per_gpu)))


def lease_returned(free_before: dict[str, float], bound_s: float = 5.0) -> None:
    """Wait (at most `bound_s`) until Ray has the probe's GPU and CPUs back: it returns a finished task's
    lease after ray.get has its result, and the capacity check that follows would count them as held
    by another job. Another job taking resources meanwhile ends the wait at the bound."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        free = ray.available_resources()
        if all(free.get(k, 0.0) >= free_before.get(k, 0.0) for k in ("GPU", "CPU")):
            return
        time.sleep(0.05)  # polling Ray's resource view: it has no event for a returned lease


def resolve_auto(space: Space, data: Data | None, folder: RunFolder, *, resume: bool,
                 private: bool = False) -> tuple[Resources, str]:
    """`resources` with gpus: auto replaced by a measured fraction, and a line for the summary.

    A resumed run keeps the choice recorded in its gpu_probe.json. Raises ConfigError when
    the probe cannot run (no GPU node came up, or the largest configuration fails alone).
    """
    resources = space.resources
    if resources.gpus != AUTO:
        return resources, ""
    stored = (folder.read_probe() or {}) if resume else {}
    k = stored.get("choice", {}).get("trials_per_gpu") if isinstance(stored.get("choice"), dict) else None
    if isinstance(k, int) and k >= 0:
        return (resources.model_copy(update={"gpus": fraction(k) if k else 0.0}),
                f"auto: {k} trial(s) per GPU, as chosen when this run started ({PROBE_FILE})")
    if not any(n.get("GPU", 0) for n in alive_nodes()) and not has_autoscaler(private):
        choice = Choice(0, "no GPU in the cluster")
        folder.write_probe({"choice": asdict(choice), "gpus_per_trial": 0.0})
        return resources.model_copy(update={"gpus": 0.0}), "auto: no GPU in the cluster, so CPU trials (gpus 0)"
    # a function trainable may not ask for auto (function_kind.resource_problems): the canonical loop's data are here
    assert data is not None
    config = largest_config(space, data.input_shape, data.num_classes).to_flat()
    experiment = space.experiment
    gpus = sum(n.get("GPU", 0) for n in alive_nodes())
    wanted = copies_wanted(experiment.max_concurrent, experiment.num_samples, gpus)
    # rounds of fresh processes, seconds each: said before, so a quiet terminal is not taken for a hang
    print(f"GPUs: auto: measuring how many trials share a GPU well (1 to {wanted} at once: max_concurrent "
          f"{experiment.max_concurrent} over {gpus:g} GPU(s)), about 20 s a round ...", flush=True)
    task = ray.remote(probe_on_this_node).options(num_gpus=1, num_cpus=resources.cpus, max_retries=0)
    free_before = ray.available_resources()
    pending = task.remote(config, data.for_trials(), resources.cpus, wanted)
    try:
        figures = ray.get(pending, timeout=PROBE_TIMEOUT_S)
        lease_returned(free_before)
    except ray.exceptions.GetTimeoutError:
        ray.cancel(pending, force=True)
        raise ConfigError([problem("resources.gpus", f"auto: no GPU could run the probe within "
                                                     f"{PROBE_TIMEOUT_S:g} s; set a fraction instead", AUTO)]) from None
    except ray.exceptions.RayError as error:  # the task itself died (its node lost, killed for memory)
        raise ConfigError([problem("resources.gpus", f"auto: the probe failed ({type(error).__name__}: "
                                                     f"{str(error).strip().splitlines()[-1][:300]}); set a "
                                                     "fraction instead", AUTO)]) from None
    rounds = [Round(**r) for r in figures["rounds"]]
    choice = choose_trials_per_gpu(rounds, figures["total_mb"])
    if not rounds or rounds[0].steps_per_s is None:
        folder.write_probe({**figures, "choice": asdict(choice)})
        raise ConfigError([problem("resources.gpus", "auto: the largest configuration of the space failed when "
                                                     f"trained alone on {figures['device']} ({choice.reason})", AUTO)])
    gpus = fraction(choice.trials_per_gpu)
    folder.write_probe({**figures, "choice": asdict(choice), "gpus_per_trial": gpus})
    where = "" if figures["total_mb"] else " (measured on the CPU: the GPU node has no CUDA device torch can use)"
    return (resources.model_copy(update={"gpus": gpus}),
            f"auto: {choice.trials_per_gpu} trial(s) per GPU{where}: {choice.reason} ({PROBE_FILE})")
