"""The one error type for bad user input: a list of problems, each naming key, rule and value.

Callers collect every problem before raising, so a user fixes a file in one pass.
The CLIs turn it into a message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations


def problem(key: str, rule: str, value: object) -> str:
    """One line of the form `path.to.key: rule, got value`."""
    return f"{key}: {rule}, got {value!r}"


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
