"""The one error type for bad user input: a list of problems, each naming key, rule and value.

Callers collect every problem before raising, so a user fixes a file in one pass.
The CLIs turn it into a message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import itertools
import reprlib

MAX_SHOWN = 200  # characters of a key or a value that a message shows


class _BoundedRepr(reprlib.Repr):
    """reprlib.Repr that shows at most `budget` values in all and keeps a mapping's key order.

    reprlib's limits alone still visit maxlist ** maxlevel values of an alias-shared structure;
    the budget bounds the work whatever the shape. Below the limits the text is exactly repr's.
    """

    def __init__(self, budget: int = 500):
        super().__init__()
        self.maxlevel = 6
        self.maxtuple = self.maxlist = self.maxarray = self.maxdict = 10
        self.maxset = self.maxfrozenset = self.maxdeque = 10
        self.maxstring = self.maxlong = self.maxother = MAX_SHOWN
        self.budget = budget

    def repr1(self, x, level):
        if self.budget <= 0:
            return self.fillvalue
        self.budget -= 1
        return super().repr1(x, level)

    def repr_dict(self, x, level):
        if not x:
            return "{}"
        if level <= 0:
            return "{" + self.fillvalue + "}"
        pieces = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}"
                  for k, v in itertools.islice(x.items(), self.maxdict)]
        if len(x) > self.maxdict:
            pieces.append(self.fillvalue)
        return "{" + ", ".join(pieces) + "}"


def shown(value: object) -> str:
    """repr(value), cut to about MAX_SHOWN characters: `'aaa...'... (42000000 characters)`.

    A huge string is cut without building its whole repr; containers are shown 10 items and
    6 levels deep at most (a recursive or alias-shared structure too), then the text is cut.
    """
    if isinstance(value, (str, bytes, bytearray)) and len(value) > MAX_SHOWN:
        return f"{repr(value[:MAX_SHOWN])[:MAX_SHOWN]}... ({len(value)} characters)"
    try:
        text = _BoundedRepr().repr(value)
    except Exception as error:  # a value whose repr fails (an int past 4300 digits) still gets a message
        text = f"<{type(value).__name__} object, repr failed: {type(error).__name__}>"
    if len(text) > MAX_SHOWN:
        return f"{text[:MAX_SHOWN]}... (cut at {MAX_SHOWN} characters)"
    return text


def problem(key: str, rule: str, value: object) -> str:
    """One line of the form `path.to.key: rule, got value`; a huge key or value is cut."""
    key = str(key)
    if len(key) > MAX_SHOWN:
        key = f"{key[:MAX_SHOWN]}... ({len(key)} characters)"
    return f"{key}: {rule}, got {shown(value)}"


class ConfigError(ValueError):
    """Bad input: `problems` holds one `key: rule, got value` line per problem."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s){where}:\n{lines}")


class DataError(RuntimeError):
    """A dataset could not be found or read; the message says where to put the files."""


class DiskFull(Exception):
    """The disk of the run folder filled after all (a write ran out of space): stopped, resumable."""

    def __init__(self, path: str, error: OSError, resume_hint: str):
        super().__init__(f"the disk of {path} is full ({error.strerror or error}); the search stopped as Ctrl-C "
                         f"stops it, and Tune's record of it is saved. Free space, then continue with:\n  {resume_hint}")
