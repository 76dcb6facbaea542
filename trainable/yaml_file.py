"""Reading YAML files written by people: syntax errors become ConfigErrors with a line number."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from trainable.errors import ConfigError, problem


class Loader(yaml.SafeLoader):
    """SafeLoader that also reads 1e-3 as a number (YAML 1.2 does; PyYAML's 1.1 rules need a dot)."""


Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9_]+(?:[eE][-+]?[0-9]+)?
               |[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file (an empty file is an empty mapping)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError([problem(str(path), "cannot be read", error.strerror)]) from None
    try:
        data = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        reason = getattr(error, "problem", None) or str(error)
        raise ConfigError([f"{path}: invalid YAML at {where}: {reason}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([problem(str(path), "must hold a mapping of keys to values", type(data).__name__)])
    return data


def parse_value(text: str) -> Any:
    """A command-line value read as YAML: `0.1`, `null`, `[256, 128]`, `true`, `sgd`."""
    try:
        return yaml.load(text, Loader=Loader)
    except yaml.YAMLError:
        return text
