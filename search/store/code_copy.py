"""The run folder keeps the user's code it needs to replay: each referenced FILE.py, with the Python files
beside it, copied with its sha256 when the run starts (the format and the replay's side: trainable/kept_code.py).

A file over MAX_BYTES, or past MAX_FILES, is not copied: a folder of scripts is kept, a folder of data is not.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

from search.definition.space import Space
from search.store.run_folder import RunFolder
from trainable.config import REFERENCE
from trainable.kept_code import CODE_FOLDER, CODE_RECORD
from trainable.yaml_file import dump_yaml

MAX_BYTES = 1 << 20  #: a Python file larger than this (1 MB) beside a referenced one is not copied
MAX_FILES = 200  #: at most this many files in all


def referenced_files(space: Space) -> list[Path]:
    """The FILE.py files the space references: its trainable, its fixed values (model.factory, data.dataset)
    and its searched choices' values."""
    values: list[Any] = [space.trainable, *space.fixed.values(), *(v for d in space.searched for v in d.values)]
    found = {Path(match["module"]) for value in _strings(values)
             if (match := REFERENCE.fullmatch(value)) and match["module"].endswith(".py")}
    return sorted(path for path in found if path.is_absolute() and path.is_file())


def _strings(values: list[Any]) -> Iterator[str]:
    for value in values:
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            yield from _strings(list(value.values()))
        elif isinstance(value, (list, tuple)):
            yield from _strings(list(value))


def keep_code(folder: RunFolder, space: Space) -> int:
    """Copy the referenced files and the Python files beside them into the run folder; how many were copied."""
    record: dict[str, dict[str, str]] = {}
    for path in referenced_files(space):
        tag = hashlib.sha1(str(path.parent).encode()).hexdigest()[:8]
        for file in sorted(path.parent.glob("*.py")):
            if str(file) in record or len(record) >= MAX_FILES or not file.is_file() or \
                    (file.stat().st_size > MAX_BYTES and file != path):
                continue
            data = file.read_bytes()
            copy = f"{CODE_FOLDER}/{path.parent.name}-{tag}/{file.name}"
            folder.storage.write(f"{folder.name}/{copy}", data)
            record[str(file)] = {"copy": copy, "sha256": hashlib.sha256(data).hexdigest()}
    if record:
        folder.storage.write(f"{folder.name}/{CODE_RECORD}", dump_yaml(record).encode())
    return len(record)
