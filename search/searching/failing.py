"""A search whose first trials all fail alike ends early: the same error on every try is the user's code.

A function that breaks its contract (report without the metric, say) or a model that cannot run fails
every trial the same way; before this, each trial failed and was restarted under experiment.max_failures,
one after another, for minutes. Now Tune ends a contract error at once (search/execution/ray_internals.py
no_retry_of_contract_errors), and once the first FAILING_AFTER trials to end have all ended ERROR with the
same error, and none has ended otherwise, the search starts no new trial, as a budget would
(budget.py end_search): the summary says the error once, the fix where the message has
one, and the command exits 3 (no trial succeeded). A trial that ends without an error first (a result of
any kind: the function and its data work) turns the rule off for the rest of the search.

"Alike" is the error's type and message with its numbers masked: a message that names a drawn value
(`lr 0.031 too high`) is still one error, while different errors are not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

FAILING_AFTER = 3  #: the first trials to end that must all fail alike; fewer when num_samples is smaller
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def last_line(error: object) -> str:
    """An error's last line (Tune's text ends with the exception's type and message), at most 300 characters;
    '?' for none: the line the progress, the summary and this rule compare."""
    text = "" if error is None else str(error).strip()
    return text.splitlines()[-1][:300] if text else "?"


def alike(line: str) -> str:
    """An error's last line with its numbers masked: what two failures must share to be one error."""
    return _NUMBER.sub("#", line.strip())


@dataclass
class FirstFailures:
    """The first trials' ends, until one succeeds or FAILING_AFTER of them failed alike."""

    needed: int  #: how many ends decide (min(FAILING_AFTER, num_samples))
    errors: list[tuple[int | None, str]] = field(default_factory=list)  #: (trial number, error line)
    decided: bool = False  #: one trial ended without an error, or the search was ended: no more to watch

    def ended(self, number: int | None, error: str | None) -> dict[str, Any] | None:
        """Record a trial's end (`error`: its error's last line, None when it ended without one); the
        search's ending record once the first `needed` ends all failed alike, else None."""
        if self.decided:
            return None
        if error is None:
            self.decided = True
            return None
        self.errors.append((number, error))
        if len({alike(line) for _, line in self.errors}) > 1:
            self.decided = True  # two different errors: not one fault of the code; the rule is off
            return None
        if len(self.errors) < self.needed:
            return None
        self.decided = True
        return {"ended_by": "failing", "error": error,
                "failed_trials": sorted(n for n, _ in self.errors if n is not None)}

    def same_as_before(self, error: str) -> int | None:
        """The number of an earlier trial that failed with this error (said once: later ones refer to it)."""
        return next((n for n, line in self.errors[:-1] if alike(line) == alike(error)), None)


def failing_note(ended: dict[str, Any], trials: int) -> str:
    """The summary's line for a search that ended so."""
    numbers = ", ".join(f"#{n}" for n in ended.get("failed_trials", []))
    return (f"ended after its first {len(ended.get('failed_trials', []))} trials ({numbers}) all failed with the "
            f"same error and none succeeded, so no more were started ({trials} of {ended['num_samples']} trials "
            f"ran): {ended['error']}. Fix that in your code (the traceback is in each trial's error.txt), then run "
            "the search again")


def failed_lines(grid, folder, trial_timeout: float | None) -> str:
    """The summary's Failed lines: each error once (alike), with the trials it ended."""
    groups: dict[str, list[tuple[str, str, str]]] = {}
    for result in grid:
        if result.error is not None:  # after max_failures restarts; Tune keeps the traceback
            line = last_line(result.error)
            groups.setdefault(alike(line), []).append((folder.trial_path(result.path), line, str(result.error)))
    out = ""
    for failures in groups.values():
        path, line, _ = failures[0]
        if len(failures) == 1:
            out += f"\nFailed: {path}: {line} (traceback in error.txt there)"
        else:
            out += (f"\nFailed: {len(failures)} trials with the same error: {line} (traceback in error.txt of "
                    f"{path}, and of the others: {', '.join(p.rsplit('/', 1)[-1] for p, _, _ in failures[1:])})")
        if trial_timeout is not None and any("process has died" in error for _, _, error in failures):
            out += (f"\n      its process ended: a trial blocked outside Python past experiment.trial_timeout "
                    f"({trial_timeout:g} s) ends so (trainable/watchdog.py), as does a crash")
    return out
