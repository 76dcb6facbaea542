"""pareto.yaml: a search with several objectives has no one best trial, but a front of them.

The file holds the feasible non-dominated trials (search/definition/objectives.py), each at its point (its
last epoch) with its config and metrics, in trial-number order:

    objectives: {val_acc: max, params: min}
    constraints: ['params <= 200000']
    trials:
    - trial_number: 3
      trial_id: 6c1f0_00003
      epoch: 2
      metrics: {val_acc: 0.91, params: 50890, latency_ms: 0.2, ...}
      checkpoint: trial_6c1f0_00003/checkpoint_000001
      config: {...}             # as in best.yaml

`python -m trainable --config pareto.yaml --pick 3` replays trial #3 (trainable/__main__.py).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
from ray.tune import Checkpoint

from search.definition.objectives import Objectives, pareto_front
from search.definition.space import Space
from search.store.results import config_from_row, results_schema, trial_id_of
from search.store.retention import on_storage
from search.store.run_folder import RunFolder
from trainable.metrics import score
from trainable.yaml_file import dump_yaml

PARETO_FILE = "pareto.yaml"


def checkpoints_by_epoch(grid) -> dict[tuple[str, int], Checkpoint]:
    """(trial_id, epoch) -> the checkpoint Tune lists for it (num_to_keep may have deleted it since)."""
    out = {}
    for result in grid:
        trial_id = trial_id_of(result)
        for checkpoint, metrics in result.best_checkpoints:
            out[(trial_id, metrics.get("epoch"))] = checkpoint
    return out


def relative_folder(checkpoint: Checkpoint | None) -> str | None:
    """A kept checkpoint's folder relative to the run folder (trial_<id>/checkpoint_<k>); None if none is kept."""
    if checkpoint is None or not on_storage(checkpoint):
        return None
    return "/".join(checkpoint.path.rstrip("/").split("/")[-2:])


def pareto_entries(frame: pd.DataFrame, space: Space, objectives: Objectives, grid=()) -> list[dict[str, Any]]:
    schema = results_schema(space)
    checkpoints = checkpoints_by_epoch(grid)
    # the canonical loop's objective columns; a function's: the names the search reads, then its other metrics
    shown = space.kind.front_metrics(space, list(frame.columns), schema.names)
    entries = []
    for _, row in pareto_front(frame, objectives).iterrows():
        entries.append({
            "trial_number": int(row["trial_number"]),
            "trial_id": str(row["trial_id"]),
            "status": str(row["status"]),
            "epoch": int(row["epoch"]),
            "metrics": {m: (int(v) if m == "params" and v is not None else v)
                        for m, v in ((m, score(row.get(m))) for m in shown)},
            "checkpoint": relative_folder(checkpoints.get((str(row["trial_id"]), int(row["epoch"])))),
            "config": config_from_row(row, schema),
        })
    return entries


def write_pareto(folder: RunFolder, space: Space, frame: pd.DataFrame, objectives: Objectives, grid=()) -> str:
    """Write pareto.yaml; return the summary's line about it."""
    entries = pareto_entries(frame, space, objectives, grid)
    path = folder.storage.join(folder.name, PARETO_FILE)
    replay = f"python -m trainable --config {path} --pick N" + (f" --data-root {space.data_root}"
                                                                   if space.data_root else "")
    wanted = ", ".join(f"{m} {mode}" for m, mode in zip(objectives.metrics, objectives.modes))
    header = (f"# Pareto front of search {folder.name} ({space.source}): the feasible trials that no other trial\n"
              f"# beats in every objective ({wanted}), each at its last epoch.\n"
              f"# Replay trial N: {replay}\n")
    body = {"search": folder.name,
            "objectives": dict(zip(objectives.metrics, objectives.modes)),
            "constraints": [str(c) for c in objectives.constraints],
            "trials": entries}
    folder.storage.write(f"{folder.name}/{PARETO_FILE}", (header + dump_yaml(body)).encode())
    trials = frame["trial_id"].nunique()
    numbers = ", ".join(f"#{e['trial_number']}" for e in entries) or "none"
    # the summary adds "; no best.yaml" to the last line
    if not entries:  # nothing to replay: say why instead of a command that cannot work
        why = (f"no trial met experiment.constraints ({', '.join(map(str, objectives.constraints))})"
               if objectives.constraints and len(frame) else "no trial reported every objective")
        return (f"Pareto front ({wanted}): 0 feasible non-dominated trial(s) of {trials}: {why}\n"
                f"      the front (empty): {path}")
    return (f"Pareto front ({wanted}): {len(entries)} feasible non-dominated trial(s) of {trials} ({numbers})\n"
            f"      replay one: {replay}\n      the front, each trial's config and metrics: {path}")

