"""results.parquet: one row per trial per epoch, derived from Tune's record of the trial.

Tune keeps every report a trial made in the trial folder's result.json (its record, which
survives a killed driver and a resume). `trial_rows` turns one trial's record into rows,
and every results file is made by it: live, one Parquet part per trial when the trial ends;
at the end of a search, every part again from the finished record.

results.parquet is a folder of parts (`<trial_id>.parquet`) with one schema, so the cost
of a finished trial does not grow with the trials before it, and `pandas.read_parquet`
(or `pyarrow.dataset`) reads the folder as one table, mid-search too.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any, Iterable, Mapping, cast

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from search.definition.function_kind import OwnFunction
from search.definition.kind import kind_of_columns, kind_of_config
from search.definition.objectives import FEASIBLE
from search.definition.reserved import BEST_KEYS, SEARCH_COLUMNS, metric_names_taken, result_columns  # noqa: F401
from search.definition.schema import conditions, not_drawn
from search.definition.space import Space
from search.definition.status import COMPLETED, DIVERGED, ERROR, INTERRUPTED, LOST, STOPPED  # noqa: F401 (re-exported)
from trainable.config import TrialConfig, json_text
from trainable.function import FunctionConfig, trial_config
from trainable.report import unpacked

RESULTS_FILE = "results.parquet"
RECORD_FILE = "result.json"  # Tune's per-trial record: one JSON line per report
# How each trial ended: search/definition/status.py, the one list (COMPLETED, ..., LOST are imported from here too)


def config_columns(space: Space) -> list[str]:
    """The trial config's flat names for this space (the kind's: search/definition/kind.py)."""
    return space.kind.config_columns(space)


def report_columns(space: Space) -> list[str]:
    """The columns of a trial's reports that every trial has (a function's own metrics join them as reported)."""
    return space.kind.report_columns(space)


def columns(space: Space) -> list[str]:
    return result_columns(config_columns(space), report_columns(space))


def reserved_names(space: Space) -> frozenset[str]:
    """The names a function trainable's metrics cannot take (search/definition/function_kind.py)."""
    return OwnFunction.reserved_names(space)


JSON = {b"json": b"1"}  # field metadata: the column holds JSON text of nested or mixed values


def _field(name: str, values: list[Any]) -> pa.Field:
    """One Arrow type for every value a column can hold; JSON text where they don't agree.

    Values of several Python types (a choice of [0.5, true, 2.5], of [16, 1.5]) are JSON text too, although
    Arrow would take them as one type: it would turn true into 1.0 and 16 into 16.0, and best.yaml would then
    replay a value that never ran. A null beside values of one type keeps their type."""
    if len({type(v) for v in values if v is not None}) > 1:
        return pa.field(name, pa.string(), metadata=JSON)
    try:
        kind = pa.array(values).type
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.field(name, pa.string(), metadata=JSON)
    if pa.types.is_struct(kind) or pa.types.is_null(kind):
        return pa.field(name, pa.string(), metadata=JSON)
    return pa.field(name, kind)


def is_json(f: pa.Field) -> bool:
    return (f.metadata or {}).get(b"json") == b"1"


def results_schema(space: Space) -> pa.Schema:
    """The schema every part of results.parquet shares, known before the first trial ends.

    A field's column has the field's type; a model keyword's, the type its distribution draws
    (an int distribution: int64), or its fixed value's.
    """
    searched = {d.name: d for d in space.searched}
    defaults = space.trial_defaults().to_flat()
    types = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "str": pa.string()}
    out = [pa.field("trial_id", pa.string()), pa.field("status", pa.string())]
    for name in config_columns(space):
        column = space.kind.column_type(name, searched.get(name), defaults)  # its type, or the values it may hold
        out.append(_field(name, column) if isinstance(column, list) else
                   pa.field(name, pa.string(), metadata=JSON) if column == "json" else pa.field(name, types[column]))
    report_types = {"epoch": pa.int64(), "params": pa.int64(), "diverged": pa.bool_(), "node": pa.string(), "hostname": pa.string(),
                    "device": pa.string(), "accelerator_ids": pa.string(), "world_size": pa.int64()}
    out += [pa.field(c, report_types.get(c, pa.float64())) for c in report_columns(space) + SEARCH_COLUMNS]
    out.append(pa.field(FEASIBLE, pa.bool_()))  # the trial's point meets experiment.constraints
    # the `when:` of conditional keys, so that every writer and reader of rows nulls the keys a trial did not draw
    gated = conditions(space.searched)
    return pa.schema(out, metadata={WHEN: json.dumps(gated)} if gated else None)


WHEN = b"when"  #: schema metadata: JSON of [[key, [[earlier key, [values]], ...]], ...] in the space's order


def conditions_of(schema: pa.Schema) -> list:
    """results_schema's record of the space's conditional keys (not_drawn's input); [] without any."""
    return json.loads((schema.metadata or {}).get(WHEN, b"[]"))


def trial_status(config: TrialConfig | FunctionConfig, reports: list[Mapping[str, Any]], *, done: bool, error: bool) -> str:
    """COMPLETED (all epochs), STOPPED (early, by the scheduler), DIVERGED, ERROR or INTERRUPTED."""
    if error:
        return ERROR
    if reports and reports[-1].get("diverged"):
        return DIVERGED
    if not done:
        return INTERRUPTED
    last_epoch = max((int(r["epoch"]) for r in reports), default=0)
    if config.epochs is None:  # a function trainable without `epochs`: it ends when it returns
        return COMPLETED
    return COMPLETED if last_epoch >= config.epochs else STOPPED


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def search_phases(report: Mapping[str, Any], suggested: tuple[float, float] | None,
                  first: bool) -> dict[str, float | None]:
    """suggest/queue/idle/start seconds of a row: where a run of the trial began, else None.

    `suggested`: (unix time the searcher returned the trial, seconds it took), None if the
    searcher kept no record (reproducible: false). The actor was free from `ready_at` (its
    previous trial's last report). A trial suggested before that queued until then; an actor
    free before the suggestion idled until it (the driver was busy: results, snapshots, the
    searcher). From the later of the two the trial started, until `started_at`. Without a
    record, start_seconds holds the idle time too.
    """
    out = dict.fromkeys(SEARCH_COLUMNS)
    ready, started = report.get("ready_at"), report.get("started_at")
    if _missing(ready) or _missing(started):
        return out
    ready, started = cast(float, ready), cast(float, started)  # _missing ruled out None, which mypy cannot see
    if suggested is not None and first:  # a restart waited for a free slot again, not for the searcher
        at, out["suggest_seconds"] = suggested
        free = max(ready, at)
        out["queue_seconds"], out["idle_seconds"] = max(0.0, ready - at), max(0.0, at - ready)
    else:
        free = ready
    out["start_seconds"] = max(0.0, started - free)  # clocks of two machines may disagree by a little
    return out


def trial_rows(trial_id: str, config: Mapping[str, Any], reports: Iterable[Mapping[str, Any]], *,
               done: bool, error: bool, suggested: tuple[float, float] | None = None) -> list[dict[str, Any]]:
    """One row per reported epoch (the last report of an epoch wins, e.g. after a restart).

    A row's config is the one its epoch trained with: Tune records it with each report, and
    PBT (search/searching/pbt.py) changes a trial's config between epochs.
    """
    trial = trial_config(config)
    by_epoch = {int(r["epoch"]): unpacked(r) for r in reports if not _missing(r.get("epoch"))}
    ordered = [by_epoch[e] for e in sorted(by_epoch)]
    status = trial_status(trial, ordered, done=done, error=error)
    base = {"trial_id": trial_id, "status": status, **trial.to_flat()}
    if not ordered:  # failed before its first epoch: keep it visible (the schema gives its report columns, empty)
        return [{**base, **dict.fromkeys(SEARCH_COLUMNS)}]
    kind = kind_of_config(config)  # its report columns: the loop's, or the metrics a function names in each report
    return [{**base, **kind.report_row(r, config, ordered[0]), **search_phases(r, suggested, first=i == 0)}
            for i, r in enumerate(ordered)]


def trial_id_of(result) -> str:
    """The Tune trial id of a Result, from its folder (trial_<id>, see search/execution/tuner.py trial_folder_name)."""
    return result.path.rstrip("/").rsplit("/", 1)[-1].removeprefix("trial_")


def read_record(fs: pafs.FileSystem, trial_path: str) -> list[dict[str, Any]]:
    """Every report in a trial folder's result.json (Tune's record); [] if it has none yet."""
    path = f"{trial_path.rstrip('/')}/{RECORD_FILE}"
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    with fs.open_input_stream(path) as stream:
        text = stream.read().decode("utf-8", errors="replace")
    reports = []
    for line in text.splitlines():
        try:
            reports.append(json.loads(line))
        except ValueError:  # a line cut short by a killed driver: the reports before it stand
            continue
    return reports


def table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows as a table of `schema`; values of JSON-text columns become JSON text."""
    gated = conditions_of(schema)
    schema = with_reported(schema, rows)
    text = {f.name for f in schema if is_json(f)}
    cells = [{k: (json_text(v) if k in text and v is not None else v)
              for k, v in {**row, **dict.fromkeys(not_drawn(gated, row))}.items()} for row in rows]
    return pa.Table.from_pylist(cells, schema=schema)


def with_reported(schema: pa.Schema, rows: Iterable[Mapping[str, Any]]) -> pa.Schema:
    """A function trainable's schema with a column for every metric these rows report (the canonical
    loop's schema already has them all). Given every trial's rows, it is the one schema all parts share:
    a reader of the folder takes the first part's columns, so a part without one would hide it."""
    extra = kind_of_columns(schema.names).reported_columns(schema.names, rows)
    if not extra:
        return schema
    return pa.schema([*schema, *(pa.field(k, pa.float64()) for k in extra)], metadata=schema.metadata)


def part_bytes(rows: list[dict[str, Any]], schema: pa.Schema) -> bytes:
    return table_bytes(table(rows, schema))


def table_bytes(written: pa.Table) -> bytes:
    """A part as Parquet, without column statistics or dictionary pages: a part is one trial's few rows, one
    row group, which a reader takes whole; both took a third of a part's write on the driver's writer thread."""
    buffer = io.BytesIO()
    pq.write_table(written, buffer, write_statistics=False, use_dictionary=False)
    return buffer.getvalue()


def records(rows: list[dict[str, Any]], schema: pa.Schema) -> list[dict[str, Any]]:
    """Rows as results.parquet holds them (typed, JSON-text columns as text), without pandas: a trial's
    entry in the journal is made from them at its start and end, five times faster than from a frame."""
    return table(rows, schema).to_pylist()


def to_frame(rows: list[dict[str, Any]], schema: pa.Schema) -> pd.DataFrame:
    frame = table(rows, schema).to_pandas()
    # trial_number first: Tune's trial ids are random, and ties (best epoch) go to the earlier trial
    return frame.sort_values(["trial_number", "trial_id", "epoch"], kind="stable").reset_index(drop=True)


def config_from_row(row: Mapping[str, Any], schema: pa.Schema) -> dict[str, Any]:
    """A trial config (nested plain data, as in best.yaml) back from a results row."""
    flat = {}
    names = kind_of_columns(schema.names).config_names(schema.names)
    for f in schema:
        name = f.name
        if name not in names:
            continue
        value = row[name]
        if hasattr(value, "tolist"):  # numpy arrays and scalars
            value = value.tolist()
        if isinstance(value, float) and math.isnan(value):
            value = None
        if is_json(f) and isinstance(value, str):
            value = json.loads(value)
        if pa.types.is_integer(f.type) and value is not None:
            value = int(value)
        flat[name] = value
    for name in not_drawn(conditions_of(schema), flat):  # null: the trial ran with the default
        flat.pop(name, None)
    return trial_config(flat).to_dict()
