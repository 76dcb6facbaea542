"""results.parquet: one row per trial per epoch, kept current while the search runs.

Rows come from the dicts the trainable reports (Tune results), plus the trial's full
config and final status. The same functions build the file live (ResultsCallback, after
every finished trial) and at the end (from Tune's ResultGrid, which includes trials of
earlier, interrupted runs of a resumed search).
"""

from __future__ import annotations

import io
import math
from typing import Any, Iterable, Mapping

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from ray.tune import Callback

from search.storage import Storage
from trainable.config import TrialConfig, is_integer_field
from trainable.loop import EpochRecord

RESULTS_FILE = "results.parquet"
CONFIG_COLUMNS = list(TrialConfig.__dataclass_fields__)
EPOCH_COLUMNS = list(EpochRecord.__dataclass_fields__)
WHERE_COLUMNS = ["node", "hostname", "device", "accelerator_ids", "gpu_memory_mb", "finished_at"]
COLUMNS = ["trial_id", "status", *CONFIG_COLUMNS, *EPOCH_COLUMNS, *WHERE_COLUMNS]
# Final statuses: how each trial ended.
COMPLETED, STOPPED, DIVERGED, ERROR, RUNNING = "COMPLETED", "STOPPED", "DIVERGED", "ERROR", "RUNNING"


def trial_config(config: Mapping[str, Any]) -> TrialConfig:
    """The TrialConfig of a Tune trial config (which may carry keys of its own)."""
    return TrialConfig.from_mapping({k: v for k, v in config.items() if k in CONFIG_COLUMNS})


def trial_status(config: TrialConfig, reports: list[Mapping[str, Any]], *, done: bool, error: bool) -> str:
    """COMPLETED (all epochs), STOPPED (early, by the scheduler), DIVERGED, ERROR or RUNNING."""
    if error:
        return ERROR
    if reports and reports[-1].get("diverged"):
        return DIVERGED
    if not done:
        return RUNNING
    last_epoch = max((int(r["epoch"]) for r in reports), default=0)
    return COMPLETED if last_epoch >= config.epochs else STOPPED


def trial_rows(trial_id: str, config: Mapping[str, Any], reports: Iterable[Mapping[str, Any]], *,
               done: bool, error: bool) -> list[dict[str, Any]]:
    """One row per reported epoch (the last report of an epoch wins, e.g. after a restart)."""
    trial = trial_config(config)
    by_epoch = {int(r["epoch"]): r for r in reports if r.get("epoch") is not None and not _missing(r["epoch"])}
    ordered = [by_epoch[e] for e in sorted(by_epoch)]
    status = trial_status(trial, ordered, done=done, error=error)
    base = {"trial_id": trial_id, "status": status, **trial.to_dict()}
    if not ordered:  # failed before its first epoch: keep it visible
        return [{**base, **{c: None for c in EPOCH_COLUMNS + WHERE_COLUMNS}}]
    return [{**base, **{c: r.get(c) for c in EPOCH_COLUMNS + WHERE_COLUMNS}} for r in ordered]


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def config_from_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A trial config back from a Parquet row (pandas turns nulls into NaN, ints into floats)."""
    config = {}
    for name in CONFIG_COLUMNS:
        value = row[name]
        if name == "hidden_sizes":
            value = [int(v) for v in value]
        elif _missing(value):
            value = None
        elif is_integer_field(name):
            value = int(value)
        elif hasattr(value, "item"):  # numpy scalar
            value = value.item()
        config[name] = value
    return config


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.sort_values(["trial_id", "epoch"], kind="stable").reset_index(drop=True)


def write_results(storage: Storage, name: str, rows: list[dict[str, Any]]) -> str:
    table = pa.Table.from_pandas(to_frame(rows), preserve_index=False)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return storage.write(f"{name}/{RESULTS_FILE}", buffer.getvalue())


def read_results(storage: Storage, name: str) -> pd.DataFrame | None:
    data = storage.read(f"{name}/{RESULTS_FILE}")
    return None if data is None else pq.read_table(io.BytesIO(data)).to_pandas()


def rows_from_result_grid(grid) -> list[dict[str, Any]]:
    """Rows of every trial Tune knows, this run's and, after a resume, the earlier runs'."""
    rows = []
    for result in grid:
        frame = result.metrics_dataframe
        reports = [] if frame is None else frame.to_dict("records")
        trial_id = (result.metrics or {}).get("trial_id") or result.path.rstrip("/").rsplit("/", 1)[-1]
        rows += trial_rows(trial_id, result.config, reports, done=True, error=result.error is not None)
    return rows


class ResultsCallback(Callback):
    """Writes results.parquet after every finished trial and prints a line per epoch.

    Runs in the driver. It starts from the existing file, if any (an interrupted run being
    resumed), so no finished trial's rows are lost and resumed trials keep their early epochs.
    """

    def __init__(self, storage: Storage, name: str, metric: str, mode: str, num_samples: int):
        self.storage, self.name = storage, name
        self.metric, self.mode, self.num_samples = metric, mode, num_samples
        self.reports: dict[str, list[dict[str, Any]]] = {}
        self.configs: dict[str, dict[str, Any]] = {}
        self.ended: dict[str, bool] = {}  # trial id -> errored
        self.best: float | None = None

    def setup(self, **info) -> None:
        earlier = read_results(self.storage, self.name)
        for row in [] if earlier is None else earlier.to_dict("records"):
            trial_id = row["trial_id"]
            self.configs[trial_id] = config_from_row(row)
            if row["epoch"] is not None and not _missing(row["epoch"]):
                self.reports.setdefault(trial_id, []).append(row)
            if row["status"] != RUNNING:
                self.ended[trial_id] = row["status"] == ERROR

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self.ended.pop(trial.trial_id, None)  # a restarted trial is running again
        self.reports.setdefault(trial.trial_id, []).append(dict(result))
        self.configs[trial.trial_id] = dict(trial.config)
        value = result.get(self.metric)
        if value is not None and not _missing(value):
            better = max if self.mode == "max" else min
            self.best = value if self.best is None else better(self.best, value)
        print(f"[{len(self.ended):>{len(str(self.num_samples))}}/{self.num_samples} done] "
              f"trial {trial.trial_id} epoch {result.get('epoch')}/{trial.config.get('epochs', TrialConfig.epochs)} "
              f"{self.metric} {value:.4f} | best {self.best:.4f}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended(trial, error=False)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended(trial, error=True)

    def _ended(self, trial, *, error: bool) -> None:
        self.ended[trial.trial_id] = error
        self.configs.setdefault(trial.trial_id, dict(trial.config))
        write_results(self.storage, self.name, self.rows())

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for trial_id, config in self.configs.items():
            rows += trial_rows(trial_id, config, self.reports.get(trial_id, []),
                               done=trial_id in self.ended, error=self.ended.get(trial_id, False))
        return rows
