"""Small spaces for tests: MNIST subsets, few epochs, so a search takes seconds on 2 cores."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from search.space import Space, parse_space

SMALL: dict[str, Any] = {
    "experiment": {"name": "test", "num_samples": 4, "max_concurrent": 2, "seed": 7, "max_failures": 1},
    "resources": {"cpus": 1},
    "data": {"train_size": 2000, "val_size": 500},
    "training": {"epochs": 2},
    "model": {"hidden_sizes": [64]},
    "space": {
        "lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
        "batch_size": {"distribution": "choice", "values": [32, 64, 128]},
        "t_max": {"distribution": "randint", "low": 2, "high": 6},
        "clip_norm": {"distribution": "loguniform", "low": 0.5, "high": 5.0},
    },
}


def small_space(storage: Path, data_root: Path, **sections: dict[str, Any]) -> Space:
    """SMALL with `sections` merged in (section -> keys to set)."""
    raw = copy.deepcopy(SMALL)
    for section, values in sections.items():
        raw.setdefault(section, {}).update(values)
    raw["experiment"]["storage_path"] = str(storage)
    raw["data"]["root"] = str(data_root)
    return parse_space(raw, source="tests")
