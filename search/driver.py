"""The search driver: the short story of a search.

The space is valid when this runs. Check what the search needs and claim the run folder
(search/execution/preflight.py) -> start or join Ray (search/execution/session.py) -> size the GPUs and the slots
(search/execution/gpu_probe.py, search/execution/capacity.py) -> run the Tuner (search/execution/tuner.py) -> derive
results.parquet, best.yaml, the report and the summary (search/outputs/finish.py), while Ray shuts down.
Everything a user can get wrong fails before Ray starts.
"""

from __future__ import annotations

import errno
import sys
from contextlib import ExitStack
from typing import Callable

from search.definition.space import Space
from search.execution.capacity import check_capacity, plan_gpus
from search.execution.disk_guard import stop_reason
from search.execution.gpu_probe import resolve_auto
from search.execution.preflight import finished_run, prepare, released_on_failure
from search.execution.session import EarlyRay, ray_session
from search.execution.tuner import build_tuner, fit
from search.outputs.finish import Outcome, finish, resume_command, with_time
from search.outputs.phases import Phases
from search.outputs.summary import slot_count
from search.store.storage import Storage, check_storage
from trainable.adapter import tune_trial
from trainable.errors import DiskFull


def run_search(space: Space, *, name: str | None = None, address: str | None = None, resume: bool = False,
               trainable: Callable = tune_trial, early_ray: EarlyRay | None = None,
               started: float | None = None) -> Outcome:
    """Run (or resume) a search. Raises ConfigError, DataError or CapacityError before any trial starts,
    DiskFull if the run folder's disk filled (the search is then stopped and resumable).

    `early_ray`: the CLI's local Ray, begun beside its imports; `started`: when the command began
    (its imports count as the first phase), else the time of this call."""
    phases = Phases(started)  # where the command's time goes, in the summary and timing.yaml
    storage = Storage.at(space.experiment.storage_path)
    check_storage(storage, space.experiment.min_free_mb)
    with ExitStack() as held:  # the run folder, then Ray: released in reverse order
        # a resume runs its spec.yaml, whatever the space file says now
        space, folder, data, done = prepare(space, storage, name, resume, held, early_ray)
        if done is not None:  # a resume: every trial ended and the outputs read; said without starting Ray
            return finished_run(space, folder, phases, done)
        experiment = space.experiment
        trainable = space.kind.trainable(space, trainable)  # the given one, or the wrapper of the user's function
        phases.mark("checks")
        held.callback(phases.mark, "shutdown")  # after Ray's shutdown, before the run folder's release
        with released_on_failure(folder, resume=resume):  # an unreachable cluster, Ctrl-C: nothing ran
            session = held.enter_context(ray_session(address, experiment.connect_timeout, early_ray))  # shut down on leaving
        phases.mark("ray")
        with released_on_failure(folder, resume=resume):  # no capacity, a failed probe: no trial ran
            resources, auto_note = resolve_auto(space, data, folder, resume=resume, private=session.private)  # gpus: auto, measured
            capacity = check_capacity(resources, session.private)  # 0 only where an autoscaler will add the nodes
        slots = slot_count(experiment.max_concurrent, capacity)
        if slots < min(experiment.max_concurrent, experiment.num_samples):  # said now, not found in the Slots line
            each = f"{resources.workers} workers of " if resources.workers > 1 else ""
            print(f"note: experiment.max_concurrent is {experiment.max_concurrent}, but Ray's nodes hold {slots} "
                  f"trial(s) of {each}{resources.cpus:g} CPU and {resources.gpus:g} GPU at once: {slots} at a time",
                  file=sys.stderr, flush=True)
        gpu_plan = plan_gpus(resources, min(slots, experiment.num_samples), session.private)  # spread over every GPU
        phases.mark("probe")
        tuner = build_tuner(space, folder, data, trainable, gpus=gpu_plan.gpus, resume=resume)
        # what continues this run, on the cluster it runs on ($RAY_ADDRESS, if that chose it, stays set)
        again = resume_command(space, folder, address)
        try:
            grid, ran_to_end = fit(tuner, folder, again)
            phases.mark("trials")
            del tuner  # the trials are over: Ray shuts down while the results and the report are made
            session.release()
            outcome = finish(grid, folder, space, data, phases, slots, gpu_plan.gpus, (auto_note, gpu_plan.note),
                             resume=again, ran_to_end=ran_to_end, stopped=stop_reason())
        except OSError as error:
            if error.errno != errno.ENOSPC:
                raise
            raise DiskFull(folder.path, error, again) from None
    return with_time(outcome, phases, folder)
