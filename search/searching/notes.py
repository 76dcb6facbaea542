"""What the searching side tells the summary at a search's end: each feature's own note, gathered here.

The end of a search (search/outputs/finish.py) asks this module and no feature: how reproducible the
search was and what that cost in waiting slots (OrderedSearch's waits, the halving rungs', or pbt's rule),
which sampler ran and why (`sampler: auto`), whether the searcher's own time was a tenth of the slots' or
more, why a budget or failing trials ended it (budget.py, failing.py), and what a warm start told the study.
"""

from __future__ import annotations

import pandas as pd

from search.definition.objectives import HALVING
from search.definition.space import Space
from search.searching import halving, pbt
from search.searching.budget import ended_note, read_ended  # noqa: F401  (the notes of an ended search)
from search.searching.failing import failed_lines  # noqa: F401  (the summary's Failed lines)
from search.searching.warm_start import summary_line as warm_start_line  # noqa: F401
from search.store.run_folder import RunFolder

# the cheaper sampler the summary names when the searcher's own time is a tenth of the slots' or more
CHEAPER = {"gp": "tpe", "tpe": "random", "nsga2": "random", "cmaes": "random", "qmc": "random"}
SEARCHER_SHARE = 0.10


def search_notes(space: Space, folder: RunFolder, slot_seconds: float, frame: pd.DataFrame | None = None) -> str:
    """How reproducible the search was, what reproducibility cost in waiting slots, which sampler ran and
    why (`sampler: auto`), and whether the searcher's own time was a tenth of the slots' or more.
    `slot_seconds`: the search's wall time times its slots."""
    line = reproducibility(space, folder, slot_seconds)
    if space.sampler_choice:  # search/searching/choice.py
        line += f"\n      {space.sampler_choice}"
    return line + searcher_cost(space.experiment.sampler, frame, slot_seconds)


def searcher_cost(sampler: str, frame: pd.DataFrame | None, slot_seconds: float) -> str:
    """A line when the searcher's suggestions took SEARCHER_SHARE of the slots' time or more, naming a cheaper
    sampler; else nothing. One suggestion per trial (results.parquet's suggest_seconds, on every row of it)."""
    if frame is None or "suggest_seconds" not in frame or not slot_seconds or sampler not in CHEAPER:
        return ""
    suggesting = float(frame.groupby("trial_id")["suggest_seconds"].first().fillna(0).sum())
    if suggesting < SEARCHER_SHARE * slot_seconds:
        return ""
    return (f"\n      the searcher's own time was {100 * suggesting / slot_seconds:.0f}% of the slots' time "
            f"({suggesting:.1f} s of suggestions): experiment.sampler {CHEAPER[sampler]} costs less a suggestion")


def reproducibility(space: Space, folder: RunFolder, slot_seconds: float) -> str:
    """The summary's Search: line: pbt's rule, an asynchronous search's, or the reproducible one's waits
    (searcher.json, search/searching/ordered.py) and, under a halving scheduler, the rungs' (halving.json)."""
    experiment = space.experiment
    if experiment.scheduler == "pbt":
        return pbt.summary_note(experiment.seed)
    if not experiment.reproducible:
        return ("Search: asynchronous (experiment.reproducible: false): Optuna saw results in arrival order, "
                "so a rerun with the same seed can pick other configs" if experiment.max_concurrent > 1 else
                "Search: one trial at a time, reproducible")
    waits = folder.record.searcher_state().get("waits", {})
    line = (f"Search: reproducible ({experiment.sampler}, seed {experiment.seed}): trial n's config depends only "
            f"on the seed and n; {len(waits)} trial(s) waited for earlier results, {sum(waits.values()):.1f} s "
            f"in all ({100 * sum(waits.values()) / slot_seconds if slot_seconds else 0:.0f}% of slot time)")
    if experiment.scheduler in HALVING:  # trial n judged at a rung against trials below n
        line += halving.summary_note(folder.storage, f"{folder.name}/{halving.RECORD_FILE}", experiment.scheduler)
    return line
