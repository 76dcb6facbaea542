"""A kind of trial: what the rest of search/ asks instead of branching on which kind a search runs.

Two kinds implement it: the canonical loop (search/definition/loop_kind.py) and the user's own training
function, `trainable: FILE.py:FUNCTION` (search/definition/function_kind.py). Each owns its facts: how its
keys parse and validate, its defaults and trial config, its columns and reserved names, the trainable
Tune runs, and how its checkpoint loads and exports. `kind_of` is the one place that tells them apart;
tests/project/test_layout.py counts the branches on the kind elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

from search.definition.function_kind import OwnFunction
from search.definition.loop_kind import CanonicalLoop
from search.definition.schema import Experiment, Resources, Searched
from trainable.function import TRAINABLE_KEY

if TYPE_CHECKING:
    from search.definition.space import Space
    from trainable.config import TrialConfig
    from trainable.function import FunctionConfig


class TrialKind(Protocol):
    """What a kind of trial answers (each method's own docstring, in either implementation, says how)."""

    name: str  #: loop or function: what a message calls it

    @property
    def reference(self) -> str | None:
        """The function's absolute FILE.py:FUNCTION; None for the canonical loop."""

    @property
    def load_checkpoint(self) -> Callable[[str], Any]:
        """Reads a checkpoint folder of its trials (trainable/report.py's, or a function's dict)."""

    # the space file: sections, keys, experiment, defaults (search/definition/space.py parse_space, to_raw)
    def section_problems(self, raw: Mapping[str, Any]) -> list[str]: ...
    def experiment(self, raw: Mapping[str, Any], problems: list[str]) -> Experiment: ...
    def resource_problems(self, resources: Resources) -> list[str]: ...
    def keys(self, raw: Mapping[str, Any], base: Path, problems: list[str]
             ) -> tuple[dict[str, Any], list[Searched], str | None]: ...
    def default_batch_size(self, fixed: Mapping[str, Any]) -> list[tuple[str, Any]]: ...
    def metric_problems(self, experiment: Experiment, fixed: Mapping[str, Any], searched: list[Searched],
                        problems: list[str]) -> tuple[Experiment, list[str]]: ...
    def default_epochs(self, fixed: Mapping[str, Any]) -> tuple[bool, int | None]: ...
    def pbt(self, experiment: Experiment, searched: tuple[Searched, ...], epochs: int | None
            ) -> tuple[Experiment, list[str]]: ...
    def typed_key(self, key: str) -> str: ...
    def config(self, values: Mapping[str, Any], workers: int = 1) -> TrialConfig | FunctionConfig: ...
    def to_raw(self, space: Space) -> dict[str, Any]: ...

    # results.parquet, best.yaml, pareto.yaml (search/store/results.py, search/outputs/)
    def config_columns(self, space: Space) -> list[str]: ...
    def report_columns(self, space: Space) -> list[str]: ...
    def column_type(self, name: str, searched: Searched | None, defaults: Mapping[str, Any]) -> str | list[Any]: ...
    def config_names(self, names: list[str]) -> list[str]: ...
    def report_row(self, report: Mapping[str, Any], config: Mapping[str, Any], first: Mapping[str, Any]
                   ) -> dict[str, Any]: ...
    def reported_columns(self, names: list[str], rows: Iterable[Mapping[str, Any]]) -> list[str]: ...
    def best_metrics(self, space: Space, columns: list[str], schema_names: list[str]) -> tuple[str, ...]: ...
    def front_metrics(self, space: Space, columns: list[str], schema_names: list[str]) -> list[str]: ...
    def tested(self, row: Any, saved: Any, data: Any, notes: list[str]) -> tuple[Any, dict[str, float] | None, str]: ...
    def test_metrics(self, test: Mapping[str, float] | None) -> dict[str, Any]: ...
    def replay_note(self, result: Mapping[str, Any]) -> str: ...
    def rerun_instead(self, space: Space, path: str) -> str | None: ...

    # the trainable Tune runs (search/driver.py) and the code it needs (search/execution/preflight.py)
    def trainable(self, space: Space, given: Callable) -> Callable: ...
    def runs_user_code(self, defaults: Any) -> bool: ...

    # its checkpoint and export (search/outputs/export.py)
    default_format: str
    no_checkpoint_why: str
    checkpoints_kept_by: str
    without_checkpoint: str
    def model_problem(self, where: str) -> str | None: ...
    def format_problem(self, fmt: str) -> str | None: ...
    def chosen(self, report: Mapping[str, Any], saved: Any) -> tuple[list[str], dict[str, Any] | None]: ...
    def facts(self, saved: Any, config: dict[str, Any] | None) -> dict[str, Any]: ...
    def write(self, saved: Any, meta: dict[str, Any], fmt: str, output: str) -> None: ...
    def contents(self, meta: dict[str, Any]) -> str: ...


def kind_of(reference: str | None) -> TrialKind:
    """The kind of a search whose `trainable:` is `reference` (None: the canonical loop)."""
    return OwnFunction(reference) if reference else CanonicalLoop()


def kind_of_raw(raw: Mapping[str, Any], base: Path, problems: list[str]) -> TrialKind:
    """The kind a space file names: a function where `trainable:` is set (its reference made absolute from
    `base`, the space file's folder, or a problem said), else the canonical loop."""
    if raw.get(TRAINABLE_KEY) is None:
        return CanonicalLoop()
    return OwnFunction(OwnFunction.reference_of(raw, base, problems))


def kind_of_columns(names: list[str]) -> TrialKind:
    """The kind whose results.parquet has these columns (a function's names its reference, `trainable`)."""
    return OwnFunction(None) if TRAINABLE_KEY in names else CanonicalLoop()


def kind_of_config(config: Mapping[str, Any] | None) -> TrialKind:
    """The kind of a trial's config as Tune holds it (a function's carries its reference)."""
    return kind_of((config or {}).get(TRAINABLE_KEY))
