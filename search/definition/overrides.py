"""Overrides of a space file: `section.key=value` pairs put into its mapping before validation.

The CLI's flags and --set items, and the Python API's `overrides`, go through here, so a
bad override reads like a bad file.
"""

from __future__ import annotations

from typing import Any

from trainable.config import model_key
from trainable.errors import ConfigError, problem


def set_keys(raw: dict[str, Any], pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The space file's mapping with `section.key` values put in.

    In the model section and in space, a key may itself hold a dot: `model.hidden_sizes`
    in `space` is set with `space.model.hidden_sizes.values=[...]` or `space.model.hidden_sizes=[64]`.
    """
    problems = []
    for key, value in pairs:
        parts = key.split(".")
        if parts[0] == "space" and len(parts) > 2 and parts[1] == "model":  # space.model.<key>[.<setting>]
            parts = ["space", model_key(parts[2]), *parts[3:]]
        *parents, last = parts
        node = raw
        for i, part in enumerate(parents):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                problems.append(problem(".".join(parents[:i + 1]), "is not a mapping, cannot set a key in it", child))
                break
            node = child
        else:
            node[last] = value
    if problems:
        raise ConfigError(problems)
    return raw
