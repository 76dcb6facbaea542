"""results.parquet of a run: a folder of Parquet parts, one per trial, derived from Tune's record of it (written
when the trial ends, and again by the end of the search), read as one table by every command that reads a run.
search/store/run_folder.py's RunFolder.parts gives it.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from search.definition.space import Space
from search.store.results import RESULTS_FILE, is_json, results_schema, table, table_bytes

if TYPE_CHECKING:
    from search.store.run_folder import RunFolder


class NotARunFolder(ValueError):
    """The folder named as a run folder holds no spec.yaml."""


class NoResults(NotARunFolder):
    """A run folder whose results.parquet cannot be read as a whole (ResultParts.read_all,
    damage): a NotARunFolder, so every command that refuses a folder with exit 2 refuses it."""


@dataclass(frozen=True)
class ResultParts:
    """The results parts of the run in `folder`."""

    folder: RunFolder

    def ended(self) -> list[str]:
        """Ids of the trials whose part of results.parquet is written (they ended)."""
        fs, base = self.folder.fs()
        parts = f"{base}/{RESULTS_FILE}"
        if fs.get_file_info(parts).type != pafs.FileType.Directory:
            return []
        return [i.base_name[:-len(".parquet")] for i in fs.get_file_info(pafs.FileSelector(parts))
                if i.base_name.endswith(".parquet")]

    def drop_unrecorded(self) -> list[str]:
        """Remove the results parts of trials that Tune's last snapshot does not hold; their ids.

        They ended after that snapshot (Tune's own rule, search/execution/tuner.py), before the driver was killed. A
        resume runs them again under new ids (with the same trial numbers, configs and seeds in
        a reproducible search) and writes their parts anew; kept, they would be counted twice.
        """
        recorded = set(self.folder.record.saved_statuses())
        dropped = [t for t in self.ended() if t not in recorded]
        fs, base = self.folder.fs()
        for trial_id in dropped:
            fs.delete_file(f"{base}/{RESULTS_FILE}/{trial_id}.parquet")
        return dropped

    def damage(self) -> str | None:
        """What makes results.parquet unreadable as a whole, said for the user; None if nothing does.

        Only a folder of parts with no part in it counts here (a crash before the first trial ended
        left it, or the parts were deleted): pandas reads it as a frame without a column, which
        every reader of the run then trips on. A run with no results.parquet at all has not ended
        a trial yet: that is a state, not damage (a running search, an interrupted one to resume).
        Listing the folder costs one call, so every command that opens a run can afford it."""
        fs, base = self.folder.fs()
        parts = f"{base}/{RESULTS_FILE}"
        if fs.get_file_info(parts).type != pafs.FileType.Directory or self.ended():
            return None
        return f"{RESULTS_FILE} holds no results part: no trial of this run ended, or its parts were deleted; " \
               + self.folder.rebuild_hint()

    def read_all(self) -> pd.DataFrame:
        """results.parquet as one frame, for the commands that read a run (runs, compare, report, export,
        a warm start); NoResults, naming the run and what is missing, where there is nothing to read
        (no results.parquet, a folder with no part, a part that does not read, no trial_id column)."""
        where = self.folder.storage.join(self.folder.name, RESULTS_FILE)
        if (damage := self.damage()) is not None:
            raise NoResults(f"{self.folder.path}: {damage}")
        if not self.folder.storage.exists(self.folder.name, RESULTS_FILE):
            raise NoResults(f"{self.folder.path}: has no {RESULTS_FILE} yet: no trial of this run has ended")
        try:
            frame = pd.read_parquet(where)
        except (OSError, ValueError) as error:  # ArrowInvalid is a ValueError: a part that is not Parquet
            raise NoResults(f"{self.folder.path}: {RESULTS_FILE} cannot be read ({type(error).__name__}: {error}); "
                            + self.folder.rebuild_hint()) from None
        if not {"trial_id", "status"} <= set(frame.columns):  # parts of another program, or empty ones
            raise NoResults(f"{self.folder.path}: {RESULTS_FILE} holds no trial_id and status columns (not results of "
                            "hpsearch); " + self.folder.rebuild_hint())
        return frame

    def write(self, space: Space, trial_id: str, rows: list[dict[str, Any]],
                   schema: pa.Schema | None = None) -> pa.Table:
        """One trial's rows as its part of results.parquet (replacing an earlier part); returns the part as
        written, whose to_pylist() is results.records(rows, schema) (its journal entry's, made once).

        `schema`: results_schema(space), if the caller holds it (it takes ms to make, per trial).
        """
        part = table(rows, schema or results_schema(space))
        self.folder.storage.write(f"{self.folder.name}/{RESULTS_FILE}/{trial_id}.parquet", table_bytes(part))
        return part

    def read(self, trial_id: str, schema: pa.Schema) -> list[dict[str, Any]]:
        """The rows of a trial's results part as written ([] if there is none or it does not read)."""
        data = self.folder.storage.read(f"{self.folder.name}/{RESULTS_FILE}/{trial_id}.parquet")
        if data is None:
            return []
        try:
            rows = pq.ParquetFile(io.BytesIO(data)).read().to_pylist()  # a third faster than pq.read_table
        except (pa.ArrowException, OSError):
            return []
        text = [f.name for f in schema if is_json(f)]
        for row in rows:  # back to values: table() writes them as JSON text again
            row.update({c: json.loads(row[c]) for c in text if isinstance(row.get(c), str)})
        return rows

    def epochs(self, trial_id: str) -> set[int]:
        """The epochs a trial's results part holds (none if there is no part or it does not read): the
        end of a search checks every part against Tune's record, and its epoch column alone reads in
        a fifth of the time of the whole part."""
        data = self.folder.storage.read(f"{self.folder.name}/{RESULTS_FILE}/{trial_id}.parquet")
        if data is None:
            return set()
        try:
            epochs = pq.ParquetFile(io.BytesIO(data)).read(columns=["epoch"]).column("epoch").to_pylist()
        except (pa.ArrowException, OSError, KeyError):
            return set()
        return {int(e) for e in epochs if e is not None}

    def say_unreadable(self) -> None:
        """A note for each part that does not read: the end of the search writes every trial's part again
        from Tune's records."""
        fs, base = self.folder.fs()
        parts = f"{base}/{RESULTS_FILE}"
        if fs.get_file_info(parts).type == pafs.FileType.Directory:
            for info in fs.get_file_info(pafs.FileSelector(parts)):
                if not info.base_name.endswith(".parquet"):
                    continue
                try:
                    with fs.open_input_file(info.path) as stream:
                        pq.read_table(io.BytesIO(stream.read()))
                except (pa.ArrowException, OSError) as error:
                    print(f"note: {info.path} is unreadable ({error}); it is rebuilt from Tune's records when "
                          "the search ends", file=sys.stderr, flush=True)
