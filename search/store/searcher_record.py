"""searcher.json: the reproducible searcher's record, as JSON, in the run folder.

OrderedSearch (search/searching/ordered.py) saves it at each of Tune's snapshots; the run folder
reads it back to check a resume and to show where slots waited. Its format lives here, below both.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from optuna.distributions import distribution_to_json, json_to_distribution

RECORD_FILE = "searcher.json"  # in Tune's experiment folder, beside its experiment state
# What save() writes: the record. The rest comes from the constructor, so a resumed search
# takes its settings from its spec, and the in-memory study is never pickled.
RECORD = ("numbers", "asked", "curves", "finished", "study_attrs", "waits", "suggested", "measures", "planned",
          "kernels")
def record_to_json(record: Mapping[str, Any]) -> str:
    """The record as JSON text: distributions as Optuna's JSON, int keys as strings (JSON's only keys)."""
    out = {key: record[key] for key in RECORD}
    out["asked"] = [[params, {name: distribution_to_json(d) for name, d in distributions.items()}, attrs]
                    for params, distributions, attrs in record["asked"]]
    return json.dumps(out)


def by_number(mapping: Mapping[str, Any]) -> dict[int, Any]:
    """A JSON object keyed by trial numbers, keyed by ints again."""
    return {int(key): value for key, value in mapping.items()}


def record_from_json(text: str | bytes) -> dict[str, Any]:
    """record_to_json's inverse: the record as the searcher holds it (int keys, tuples, distributions).

    ValueError (json.JSONDecodeError is one) if the text is not such a record.
    """
    raw = json.loads(text)
    try:
        return {
            "numbers": {str(trial_id): int(n) for trial_id, n in raw["numbers"].items()},
            "asked": [(dict(params), {name: json_to_distribution(d) for name, d in distributions.items()},
                       dict(attrs)) for params, distributions, attrs in raw["asked"]],
            "curves": {n: by_number(curve) for n, curve in by_number(raw["curves"]).items()},
            "finished": by_number(raw["finished"]),
            "study_attrs": dict(raw["study_attrs"]),
            "waits": by_number(raw["waits"]),
            "suggested": {n: tuple(pair) for n, pair in by_number(raw["suggested"]).items()},
            "measures": {n: by_number(m) for n, m in by_number(raw.get("measures", {})).items()},  # absent before
            "planned": by_number(raw.get("planned", {})),  # absent before
            "kernels": by_number(raw.get("kernels", {})),  # absent before (search/searching/gp_kernels.py)
        }
    except (KeyError, TypeError, AttributeError) as error:  # valid JSON, not our record
        raise ValueError(f"not a searcher record ({type(error).__name__}: {error})") from None
