"""The names a run folder uses for itself: one home, read by the space check, a function's reports and results.

A function trainable names its config keys and metrics freely, and results.parquet holds both as columns
beside hpsearch's own; best.yaml holds the config at its top level and the metrics in its `result` block,
beside keys of its own. A name taken twice overwrote one of them: a config key `device` made the end of a
search crash on results.parquet (two columns of one name), a metric `search` crashed best.yaml's summary.
So, from the same lists as the columns themselves (trainable/report.py, trainable/function.py):

- `COLUMNS`: results.parquet's columns that are not a config's (a trial's id, status, epoch, where it ran,
  its phases, the searcher's times, feasibility), and best.yaml's own top-level key (`result`): a config
  key may not take one;
- `metric_names_taken()`: those, and best.yaml's `result` keys (BEST_KEYS) and the driver's per-trial keys:
  a metric may not take one (the function's own config keys are added where the space is known).

A metric the wrapper measures itself (gpu_memory_reserved_mb) may still be named by a constraint: it is the
wrapper's number, which the function does not report.
"""

from __future__ import annotations

from search.definition.objectives import FEASIBLE
from trainable.function import DRIVER_KEYS, FUNCTION_REPORT_COLUMNS, METRIC_NAMES, TRAINABLE_KEY
from trainable.report import EPOCH_COLUMNS, PACKED, REPORT_COLUMNS

# Derived where the searcher's record meets the trial's, on the first row of each run of a
# trial: the searcher's time to suggest it, its wait for an actor, the actor's wait for it,
# the actor's start or reuse.
SEARCH_COLUMNS = ["suggest_seconds", "queue_seconds", "idle_seconds", "start_seconds"]
# best.yaml's `result` keys beside the metrics: a metric of the same name would overwrite one
BEST_KEYS = ("trial_number", "trial_id", "epoch", "metric", "checkpoint", "note", "search", "trials")
WRAPPER_MEASURES = ("gpu_memory_reserved_mb",)  #: measured by the wrapper, a number a constraint may name

#: results.parquet's own columns (not a config's), and best.yaml's own top-level key
COLUMNS = frozenset(["trial_id", "status", *FUNCTION_REPORT_COLUMNS, METRIC_NAMES,
                     *REPORT_COLUMNS[len(EPOCH_COLUMNS) + 1:], *SEARCH_COLUMNS, FEASIBLE, PACKED, "result"])


def result_columns(config_columns: list[str], report_columns: list[str]) -> list[str]:
    """results.parquet's columns in order, around a kind's config and report columns (search/definition/kind.py)."""
    return ["trial_id", "status", *config_columns, *report_columns, *SEARCH_COLUMNS, FEASIBLE]


def metric_names_taken() -> frozenset[str]:
    """What a function's metric may not be named, its config keys aside (add them where they are known)."""
    return (COLUMNS | frozenset(BEST_KEYS) | {TRAINABLE_KEY, *DRIVER_KEYS}) - frozenset(WRAPPER_MEASURES)


def why_taken(name: str) -> str | None:
    """Why the run folder keeps `name` for itself, as a message says it; None if it does not."""
    if name in (TRAINABLE_KEY, *DRIVER_KEYS):
        return "a key the driver sets per trial"
    if name == "result":
        return "best.yaml's key for the trial's result"
    if name in COLUMNS:
        return "a column results.parquet holds for itself"
    if name in BEST_KEYS:
        return "a key of best.yaml's result"
    return None
