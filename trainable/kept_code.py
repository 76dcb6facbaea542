"""The run folder's copy of the user's code: what a replay or a resume runs when the original file is gone.

A search copies each FILE.py its space file references (`trainable:`, `model.factory`, `data.dataset`)
into the run folder, with the Python files beside it (what `from data import ...` finds there), as an
experiment tracker saves code: `code/<folder>/<name>.py`, listed in `code.yaml` with the original path
and the file's sha256 (search/store/code_copy.py writes them). A `ray job submit --working-dir .` runs
the driver in Ray's temporary copy of `.`, which goes with the cluster; best.yaml, pareto.yaml and
spec.yaml name files there. So where a referenced file is gone, a replay (`python -m trainable --config
best.yaml`), a resume and its trials take the run folder's copy, and say so; where the file is there but
changed since the run, they run it as it is now and say that it changed.

Only FILE.py references are copied: a package.module reference names installed code.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Mapping

import yaml

from trainable.config import REFERENCE

CODE_FOLDER = "code"  #: in the run folder
CODE_RECORD = "code.yaml"  #: original absolute path -> {copy: path in the run folder, sha256: of the file}


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_record(run_folder: str | Path) -> dict[str, dict[str, str]]:
    """code.yaml of a local run folder ({} without one, or one that does not read)."""
    try:
        record = yaml.safe_load((Path(run_folder) / CODE_RECORD).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return record if isinstance(record, dict) else {}


def copies(run_folder: str | Path) -> dict[str, str]:
    """Original path -> the absolute path of its copy, for the copies that are there."""
    out = {}
    for original, entry in read_record(run_folder).items():
        copy = Path(run_folder) / str((entry or {}).get("copy", ""))
        if isinstance(entry, dict) and copy.is_file():
            out[str(original)] = str(copy)
    return out


def relocated(value: Any, code: Mapping[str, str], notes: list[str] | None = None,
              record: Mapping[str, Mapping[str, str]] | None = None) -> Any:
    """`value` (a config, a space file's mapping, a reference) with each FILE.py:NAME whose file is gone
    pointed at its copy in `code` (original -> copy); `notes` gets a line per file taken from the copy, and,
    given the `record`, per file that is there but changed since the run."""
    if isinstance(value, Mapping):
        return {k: relocated(v, code, notes, record) for k, v in value.items()}
    if isinstance(value, list):
        return [relocated(v, code, notes, record) for v in value]
    if not isinstance(value, str) or not (match := REFERENCE.fullmatch(value)) or not match["module"].endswith(".py"):
        return value
    path = match["module"]
    if os.path.isfile(path):
        kept = (record or {}).get(path) or {}
        if notes is not None and kept.get("sha256") and sha256(path) != kept["sha256"]:
            notes.append(f"{path} changed since the run (sha256 {kept['sha256'][:12]} then); it runs as it is now "
                         f"(the run's copy: {code.get(path, 'none')})")
        return value
    if path not in code:
        return value
    if notes is not None:
        notes.append(f"{path} is gone (a cluster job's temporary copy?); the run folder's copy runs: {code[path]}")
    return f"{code[path]}:{match['name']}"
