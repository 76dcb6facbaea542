"""The space file: what to tune, validated at the edge into frozen, typed objects.

A space file has six sections, all optional (defaults below):

    experiment: name, metric, mode, num_samples, max_concurrent, seed, scheduler, ...
    resources:  cpus, gpus, spread     (per trial; gpus may be fractional, e.g. 0.25, or auto)
    model:      factory (mlp, cnn, FILE.py:CALLABLE, package.module:CALLABLE) + its keyword arguments
    data:       root, dataset (built-in or FILE.py:FUNCTION), args + the trial config's data fields
    training:   fixed trial config fields (epochs, optimizer, lr, ...)
    space:      searched fields: {distribution: loguniform|uniform|randint|choice, ...}
                or plain values (fixed); a factory keyword is `model.<key>`

Every problem is collected and reported at once as `path.to.key: rule, got value`.
Nothing here touches Ray, data or user code, so a bad file fails in a second, not after
start-up (search/driver.check_search then imports the references and tries the model once).
`to_raw` writes a Space back as a space file: the run folder's spec.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from search.objectives import problems as objective_problems
from search.schema import DataRoot, Experiment, Resources, Searched, field_value, parse_searched, validated
from trainable.config import (FACTORY_KEY, FIELDS, MODEL, MOVED, TrialConfig, absolute_reference,
                              cross_field_problems, fields_in, keyword_of, model_key, plain, searchable, section)
from trainable.errors import ConfigError, problem

SECTIONS = ("experiment", "resources", "model", "data", "training", "space")
DATA_KEYS = {"args": "data_args"}  # data section key -> trial config field, where they differ


@dataclass(frozen=True)
class Space:
    """A validated space file."""

    experiment: Experiment
    resources: Resources
    data_root: str | None
    fixed: Mapping[str, Any]  #: every fixed trial config field (data, training, plain space values)
    searched: tuple[Searched, ...]
    source: str = "<memory>"  #: the file it came from, for messages

    def trial_defaults(self) -> TrialConfig:
        """The trial config with the fixed fields set and searched ones at their defaults."""
        return TrialConfig.from_mapping(self.fixed)


def _section(raw: Mapping[str, Any], name: str, problems: list[str]) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(problem(name, "must be a mapping of keys to values", value))
        return {}
    return value


def max_epochs(searched: tuple[Searched, ...], fixed_epochs: int) -> int:
    """The most epochs any trial of the search runs (epochs may be searched)."""
    for d in searched:
        if d.name == "epochs":
            return int(d.largest())
    return fixed_epochs


def _base_folder(source: str) -> Path:
    """Where a relative FILE.py reference points from: the space file's folder."""
    path = Path(source)
    return path.parent.resolve() if path.is_file() else Path.cwd()


MOVED_KEYS = {key: f"{to} (in the model section, or space: {to})" for key, to in MOVED.items()}


def _key_problem(sec: str, key: Any, value: Any) -> str:
    """Why `key` is not a key of the data or training section: moved, elsewhere, the driver's, unknown."""
    name = DATA_KEYS.get(key, key) if sec == "data" else key
    elsewhere = section(name) if name in FIELDS and name not in ("model", "model_args") else None
    rule = (f"moved to {MOVED_KEYS[key]}" if key in MOVED_KEYS else
            "is set by the driver per trial" if elsewhere == "driver" else
            f"belongs in the {elsewhere} section" if elsewhere and elsewhere != sec else
            f"unknown key (known: {', '.join(_section_keys(sec))})")
    return problem(f"{sec}.{key}", rule, value)


def _section_keys(sec: str) -> list[str]:
    if sec == "data":
        return ["root", *[{v: k for k, v in DATA_KEYS.items()}.get(f, f) for f in fields_in("data")]]
    return list(fields_in("training"))


def _space_key_problem(key: Any, value: Any, fixed: Mapping[str, Any]) -> str | None:
    """Why `space.<key>` cannot be searched or fixed there, or None."""
    path = f"space.{key}"
    if not isinstance(key, str) or (key not in FIELDS and key != FACTORY_KEY and keyword_of(key) is None) \
            or key in ("model", "model_args"):
        rule = f"moved to {MOVED_KEYS[key]}" if key in MOVED_KEYS else "unknown field of the trial config"
        return problem(path, rule, value)
    where = {"data": "the data section", "model": "the model section", "driver": "the driver"}
    if not searchable(key):
        return problem(path, f"cannot be searched: it is set by {where[section(key)]}", value)
    if key in fixed:
        return problem(path, f"is also fixed in the {section(key)} section; set it in one place", value)
    return None


def parse_space(raw: Mapping[str, Any], source: str = "<memory>") -> Space:
    """Validate a whole space mapping; raise one ConfigError listing every problem."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        raise ConfigError([problem("(top level)", "must be a mapping of sections", raw)], source)
    for key in raw:
        if key == "run":  # spec.yaml's record of where the run lives: not part of the space
            continue
        if key not in SECTIONS:
            problems.append(problem(str(key), f"unknown section (known: {', '.join(SECTIONS)})", raw[key]))
    base = _base_folder(source)
    experiment = validated(Experiment, "experiment", _section(raw, "experiment", problems), problems)
    resources = validated(Resources, "resources", _section(raw, "resources", problems), problems)
    problems += objective_problems(experiment)

    fixed: dict[str, Any] = {}
    for key, value in _section(raw, MODEL, problems).items():
        name = model_key(key)
        fixed[name] = field_value(name, name, absolute_reference(value, base) if key == "factory" else value, problems)

    data = dict(_section(raw, "data", problems))
    data_root = validated(DataRoot, "data", {"root": data.pop("root")} if "root" in data else {}, problems).root
    for sec, values in (("data", data), ("training", _section(raw, "training", problems))):
        for key, value in values.items():
            name = DATA_KEYS.get(key, key) if sec == "data" else key
            if name not in fields_in(sec) or (sec == "data" and key in DATA_KEYS.values()):
                problems.append(_key_problem(sec, key, value))
            else:
                fixed[name] = field_value(f"{sec}.{key}", name, absolute_reference(value, base)
                                           if name == "dataset" else value, problems)

    searched = []
    for key, value in _section(raw, "space", problems).items():
        wrong = _space_key_problem(key, value, fixed)
        if wrong:
            problems.append(wrong)
        # a model keyword may itself be a mapping: searched only with a distribution key
        elif isinstance(value, dict) and (keyword_of(key) is None or "distribution" in value):
            found = parse_searched(key, value, problems)
            if found:
                searched.append(found)
        else:
            fixed[key] = field_value(f"space.{key}", key, value, problems)
    if not problems:
        problems += cross_field_problems(fixed, "data.")
    if not problems and experiment.scheduler in ("asha", "hyperband"):
        epochs = max_epochs(tuple(searched), TrialConfig.from_mapping(fixed).epochs)
        if experiment.grace_period > epochs:
            problems.append(problem("experiment.grace_period", f"must be <= the epochs a trial runs ({epochs}) "
                                                               f"for {experiment.scheduler}", experiment.grace_period))
        if experiment.reproducible and experiment.grace_period % experiment.checkpoint_every:
            problems.append(problem("experiment.checkpoint_every", f"must divide grace_period "
                                    f"({experiment.grace_period}) for a reproducible {experiment.scheduler}: a trial "
                                    "that waits at a rung resumes from that rung's checkpoint",
                                    experiment.checkpoint_every))
    if not problems and not searched:
        problems.append(problem("space", "must search at least one field (e.g. lr: {distribution: float, "
                                         "low: 0.01, high: 0.3, log: true})", raw.get("space")))
    if problems:
        raise ConfigError(problems, source)
    return Space(experiment, resources, data_root, fixed, tuple(searched), source)


def to_raw(space: Space) -> dict[str, Any]:
    """A space file that parses back to an equivalent space (the same trials), defaults written out.

    The run folder's spec.yaml: what a resumed search runs, whatever the space file says now.
    """
    defaults = space.trial_defaults().to_dict()
    model = defaults.pop(MODEL)
    data_section = {"root": space.data_root}
    for name in fields_in("data"):
        data_section[{v: k for k, v in DATA_KEYS.items()}.get(name, name)] = defaults.pop(name)
    searched = {d.name for d in space.searched}
    training = {k: v for k, v in defaults.items() if k in fields_in("training") and k not in searched}
    model = {k: v for k, v in model.items() if model_key(k) not in searched}
    return {
        "experiment": plain(space.experiment.model_dump()),
        "resources": space.resources.model_dump(),
        MODEL: model,
        "data": data_section,
        "training": training,
        "space": {d.name: d.to_raw() for d in space.searched},
    }


def example_config(space: Space) -> TrialConfig:
    """A trial config the search could produce: fixed fields plus each searched field's first value
    (a range's low end, of the type the distribution draws).

    Used to try the model once before Ray starts.
    """
    return TrialConfig.from_mapping({**space.fixed, **{d.name: d.example() for d in space.searched}})
