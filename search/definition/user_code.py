"""The user's code a space file names, checked on its own: `check` says its problems beside the file's.

A space file with a problem stops before anything it names is imported, so a user who fixed the file
met the code's problems only on the next `check`. `code_problems` imports every FILE.py:NAME and
package.module:NAME the file names, at the keys that take one, whether or not the rest of the file is
valid; what each callable must accept is checked later, by the search's own checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from trainable.config import absolute_reference, is_reference
from trainable.errors import ConfigError

# the keys whose value may name the user's code: (section or None for the top level, key)
CODE_KEYS = ((None, "trainable"), ("model", "factory"), ("data", "dataset"), ("training", "loss"))


def references(raw: Mapping[str, Any], base: Path) -> list[tuple[str, str]]:
    """(key, absolute reference) of each reference to code the raw space file holds at CODE_KEYS."""
    found = []
    for sec, key in CODE_KEYS:
        holder = raw if sec is None else raw.get(sec)
        value = holder.get(key) if isinstance(holder, Mapping) else None
        if isinstance(value, str) and is_reference(value):
            found.append((key if sec is None else f"{sec}.{key}", absolute_reference(value, base)))
    return found


def code_problems(raw: Mapping[str, Any], base: Path) -> list[str]:
    """One problem line per reference that does not import or name no callable (imports the user's code)."""
    named = references(raw, base)
    if not named:
        return []  # a file that names no code fails in a second: torch is not imported
    from trainable.references import resolve

    problems = []
    for key, reference in named:
        try:
            resolve(reference, key)
        except ConfigError as error:
            problems += error.problems
    return problems
