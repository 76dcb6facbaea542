"""The space file: what to tune, validated at the edge into frozen, typed objects.

A space file has five optional sections and a required `space` (defaults below):

    experiment: name, metric, mode, num_samples, max_concurrent, seed, scheduler, ...
    resources:  cpus, gpus, spread, workers, placement   (cpus and gpus per worker; gpus may be fractional,
                e.g. 0.25, or auto; workers: data-parallel processes per trial, placed pack or spread)
    model:      factory (mlp, cnn, FILE.py:CALLABLE, package.module:CALLABLE) + its keyword arguments
    data:       root, dataset (built-in or FILE.py:FUNCTION), args + the trial config's data fields
    training:   fixed trial config fields (epochs, optimizer, lr, ...)
    space:      searched fields: {distribution: loguniform|uniform|randint|choice, ...}
                or plain values (fixed); a factory keyword is `model.<key>`

and one key: `trainable: FILE.py:FUNCTION` (or package.module:FUNCTION), the user's own training
function instead of the canonical loop (trainable/function.py). Then `training` and `space` hold
free names passed to it, and `model` and `data` do not apply.

Every problem is collected and reported at once as `path.to.key: rule, got value`.
Nothing here touches Ray, data or user code, so a bad file fails in a second, not after
start-up (search/execution/preflight.py check_search then imports the references and tries the model once).
`to_raw` writes a Space back as a space file: the run folder's spec.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from optuna.distributions import FloatDistribution, IntDistribution

from search.definition.enqueue import enqueue_problems
from search.definition.objectives import HALVING, names, objectives_of
from search.definition.objectives import problems as objective_problems
from search.definition.overrides import set_keys
from search.definition.schema import (STOP_WHEN_RULE, DataRoot, Experiment, Resources, Searched, bad_targets, entry_problems,
                                field_value, label, parse_searched, stop_when_valid, training_metric_problems,
                                validated, worker_problems)
from trainable.config import (FACTORY_KEY, FIELDS, MODEL, MOVED, MUTABLE, TrialConfig, absolute_reference,
                              cross_field_problems, fields_in, is_plain_data, is_reference, keyword_of, model_key,
                              plain, searchable, section)
from trainable.errors import ConfigError, problem
from search.definition.reserved import COLUMNS, metric_names_taken, why_taken
from trainable.function import RESERVED, TRAINABLE_KEY, FunctionConfig

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
    trainable: str | None = None  #: the user's training function (absolute FILE.py:FUNCTION); None: the canonical loop
    asked: tuple[str, ...] = ()  #: the keys this command's flags and --set gave (a resume takes those it may change)
    #: `sampler: auto`'s choice, the line the summary prints (search/searching/choice.py); None: the user named it
    sampler_choice: str | None = None

    def trial_defaults(self) -> TrialConfig | FunctionConfig:
        """The trial config with the fixed fields set and searched ones at their defaults."""
        if self.trainable:
            return FunctionConfig(self.trainable, dict(self.fixed), workers=self.resources.workers)
        # workers is the driver's (resources.workers), a config field so that best.yaml replays with as many
        return TrialConfig.from_mapping({**self.fixed, "workers": self.resources.workers})


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
        if d.name == "epochs":  # a conditional epochs runs the default where its condition fails
            return max(int(d.largest()), fixed_epochs) if d.when else int(d.largest())
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
            "is set by resources.workers" if name == "workers" else
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
    where = {"data": "the data section", "model": "the model section", "driver": "the driver",
             "training": "the training section, the same for every trial (training.loss and training.metrics "
                         "decide the reported columns and their scale)"}
    if not searchable(key):
        return problem(path, f"cannot be searched: it is set by {where[section(key)]}", value)
    if key in fixed:
        return problem(path, f"is also fixed in the {section(key)} section; set it in one place", value)
    return None


def pbt_problems(experiment: Experiment, searched: tuple[Searched, ...], epochs: int) -> list[str]:
    """What scheduler pbt needs: a searched key it can change mid-run, epochs it can perturb between,
    and a checkpoint at every perturbation (a copied trial continues from it)."""
    problems = []
    names = {d.name for d in searched}
    if not names & set(MUTABLE):
        problems.append(problem("space", f"must search at least one of {', '.join(MUTABLE)} for scheduler pbt "
                                         "(the values it changes between epochs)", sorted(names)))
    if "epochs" in names:
        problems.append(problem("space.epochs", "cannot be searched with scheduler pbt: the population trains "
                                                "in step, every trial the same epochs", "searched"))
    elif experiment.perturbation_interval >= epochs:
        problems.append(problem("experiment.perturbation_interval", f"must be < the epochs a trial runs ({epochs}) "
                                "for pbt: no perturbation happens at or after the last epoch",
                                experiment.perturbation_interval))
    if "num_to_keep" in experiment.model_fields_set and experiment.num_to_keep is not None:
        problems.append(problem("experiment.num_to_keep", "must be null (keep all) for pbt: a trial that copies "
                                "another restores a checkpoint the other may since have replaced (Ray warns of "
                                "the same)", experiment.num_to_keep))
    for d in searched:
        if d.when:  # Ray's PBT gives every trial every key, and perturbs and copies whole configs
            problems.append(problem(f"space.{d.name}.when", "is not supported with scheduler pbt: its trials copy "
                                    "and perturb whole configs, so every searched key must be drawn in every trial",
                                    {k: list(v) if len(v) > 1 else v[0] for k, v in d.when}))
    for key in ("time_budget", "stop_when", "enqueue", "warm_start"):  # they act through the searcher pbt lacks
        if getattr(experiment, key):
            problems.append(problem(f"experiment.{key}", "is not supported with scheduler pbt: Ray's PBT takes no "
                                    "searcher, and the population is drawn up front", getattr(experiment, key)))
    if experiment.perturbation_interval % experiment.checkpoint_every:
        problems.append(problem("experiment.checkpoint_every", f"must divide perturbation_interval "
                                f"({experiment.perturbation_interval}) for pbt: a copied trial continues from "
                                "that epoch's checkpoint", experiment.checkpoint_every))
    return problems


def parse_space(raw: Mapping[str, Any], source: str = "<memory>") -> Space:
    """Validate a whole space mapping; raise one ConfigError listing every problem.

    One path for both kinds of trial: the canonical loop (model, data, training fields) and a
    function trainable (`trainable: FILE.py:FUNCTION`, free names). Each kind reads its own keys
    (_canonical_keys, _function_keys); every check on the experiment, the schedule and the
    searcher is made once, for both (schedule_problems, searcher_problems)."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        raise ConfigError([problem("(top level)", "must be a mapping of sections", raw)], source)
    function = raw.get(TRAINABLE_KEY) is not None
    base = _base_folder(source)
    reference = _function_reference(raw[TRAINABLE_KEY], base, problems) if function else None
    problems += _section_problems(raw, function)
    experiment = (_function_experiment if function else _canonical_experiment)(raw, problems)
    resources = validated(Resources, "resources", _section(raw, "resources", problems), problems)
    if function and resources.gpus == "auto":
        problems.append(problem("resources.gpus", "auto measures the canonical loop's model; give a number with a "
                                                  "function trainable", "auto"))
    if function:
        fixed, searched, data_root = *_function_keys(raw, problems), None
    else:
        fixed, searched, data_root = _canonical_keys(raw, base, problems)
    problems += when_problems(searched, fixed)
    problems += worker_problems(resources, batch_sizes(fixed, searched, function))
    if experiment.scheduler == "pbt" and resources.workers > 1:
        # a trial that takes another's checkpoint goes on shuffling with its own seed on each worker, while
        # best.yaml replays every epoch with the best trial's: the replay would not give its val_acc
        problems.append(problem("resources.workers", "must be 1 with experiment.scheduler pbt (several workers "
                                                     "per pbt trial are not built yet)", resources.workers))
    if function:
        problems += _own_metric_problems(experiment, [*fixed, *(d.name for d in searched)])
    if not function:
        experiment, metric_problems = training_metric_problems(experiment, fixed)  # experiment.metric vs the columns
        problems += metric_problems
        if not problems:
            problems += cross_field_problems(fixed, "data.")
    epochs = _epochs(reference, fixed, function)
    if epochs is not None or function:  # else the fixed keys' own problems are said: the schedule's wait
        experiment, schedule = schedule_problems(experiment, tuple(searched), epochs, function)
        said = {p.split(":", 1)[0] for p in problems}  # a key said wrong once: not again through a default
        problems += [p for p in schedule if p.split(":", 1)[0] not in said]
    problems += searcher_problems(experiment, searched, problems, free_names=function)
    if not problems and not searched:
        problems.append(problem("space", "must search at least one key (e.g. lr: {distribution: float, "
                                         "low: 0.01, high: 0.3, log: true})", raw.get("space")))
    if problems:
        raise ConfigError(problems, source)
    return Space(experiment, resources, data_root, fixed, tuple(searched), source, trainable=reference)


def batch_sizes(fixed: Mapping[str, Any], searched: list[Searched], function: bool) -> list[tuple[str, Any]]:
    """Every batch_size a trial may get, each with the key that gives it: the fixed one (the canonical loop's
    default where none is given; a function's only if it has one), a choice's values, an int range's low and
    step (every drawn value is a multiple of what divides both). A batch_size searched under `when:` adds the
    fixed one: a trial whose condition fails trains on it."""
    if function:
        default = [("training.batch_size", fixed["batch_size"])] if "batch_size" in fixed else []
    else:
        default = [("training.batch_size", fixed.get("batch_size", FIELDS["batch_size"].default))]
    for d in searched:
        if d.name == "batch_size":
            if d.is_choice:
                drawn = [(f"space.batch_size.values[{i}]", v) for i, v in enumerate(d.values)]
            else:
                step = getattr(d.distribution, "step", None)
                drawn = [("space.batch_size.low", d.low), ("space.batch_size.step", 1 if step is None else step)]
            return drawn + (default if d.when else [])
    return default


def _epochs(reference: str | None, fixed: Mapping[str, Any], function: bool) -> int | None:
    """The epochs a trial runs by default (a function's `epochs` key, if it has one); None where the
    fixed keys do not make a valid trial config (their problems are said on their own)."""
    try:
        epochs = (FunctionConfig(reference, fixed) if function else TrialConfig.from_mapping(fixed)).epochs
    except (ConfigError, TypeError, ValueError):
        return None
    return epochs if isinstance(epochs, int) and not isinstance(epochs, bool) and epochs > 0 else None


def _section_problems(raw: Mapping[str, Any], function: bool) -> list[str]:
    """Sections this kind of trial does not know (a function trainable: model and data do not apply)."""
    problems = []
    for key in raw:
        if key in ("run", TRAINABLE_KEY):  # run: spec.yaml's record of where the run lives: not part of the space
            continue
        if function and key in ("model", "data"):
            problems.append(problem(key, NOT_FOR_FUNCTIONS, raw[key]))
        elif function and key not in FUNCTION_SECTIONS:
            problems.append(problem(str(key), f"unknown section (known with a function trainable: "
                                              f"{', '.join(FUNCTION_SECTIONS)}, {TRAINABLE_KEY})", raw[key]))
        elif not function and key not in SECTIONS:
            problems.append(problem(str(key), f"unknown section (known: {', '.join(SECTIONS)}; and "
                                              f"{TRAINABLE_KEY}: FILE.py:FUNCTION, your own training function)",
                                    raw[key]))
    return problems


def _canonical_experiment(raw: Mapping[str, Any], problems: list[str]) -> Experiment:
    experiment = validated(Experiment, "experiment", _section(raw, "experiment", problems), problems)
    problems += objective_problems(experiment)
    return experiment


def _function_experiment(raw: Mapping[str, Any], problems: list[str]) -> Experiment:
    """experiment.metric, constraints and stop_when name what the function reports: any name, checked on
    its first report; the rest of the experiment as for the canonical loop (objective_problems too)."""
    settings = dict(_section(raw, "experiment", problems))
    metric = settings.pop("metric", Experiment().metric)
    stop_when = settings.pop("stop_when", None)  # targets on any name the function reports
    constraints = settings.pop("constraints", ())
    if not stop_when_valid(stop_when, None):
        rule = STOP_WHEN_RULE.format(metrics="a metric the function reports")
        bad = bad_targets(stop_when, any_name=True) if isinstance(stop_when, Mapping) else []
        problems += entry_problems("experiment.stop_when", rule, stop_when, bad)
        stop_when = None
    if not _own_names(metric):
        problems.append(problem("experiment.metric", "must name a metric the function reports (a Python "
                                                     "identifier), or a list of distinct ones", metric))
        metric = Experiment().metric
    if not isinstance(constraints, (list, tuple)):
        problems.append(problem("experiment.constraints", "must be a list of 'METRIC <= NUMBER' or "
                                                          "'METRIC >= NUMBER'", constraints))
        constraints = ()
    experiment = validated(Experiment, "experiment", settings, problems).model_copy(
        # numbers as floats, as the field's validation makes them for the canonical loop (model_copy skips it)
        update={"metric": metric if isinstance(metric, str) else tuple(metric), "constraints": tuple(constraints),
                "stop_when": {k: float(v) if isinstance(v, int) else v for k, v in stop_when.items()}
                if stop_when else None})
    problems += objective_problems(experiment, any_name=True)
    return experiment


def _own_metric_problems(experiment: Experiment, free_names: list[str]) -> list[str]:
    """A function's metric named like a config key, or like a name the run folder uses for itself
    (search/definition/reserved.py), would overwrite it in results.parquet and best.yaml (the trial refuses
    such a report too: trainable/function.py)."""
    named = [("experiment.metric", m) for m in names(experiment.metric)] + \
        [("experiment.constraints", c.metric) for c in objectives_of(experiment).constraints if c] + \
        [("experiment.stop_when", k) for k in experiment.stop_when or {}]
    from trainable.report import PACKED, PACKED_COLUMNS  # here: the spec is read without torch

    # where a trial ran and where its slot time went reach Tune packed in one value (trainable/report.py), so the
    # search cannot read them from a report; gpu_memory_reserved_mb is a number of its own
    bookkeeping = {PACKED, *PACKED_COLUMNS}
    taken = (set(free_names) | metric_names_taken()) - bookkeeping
    return [problem(key, "must name a metric of the function, not a config key or a column of hpsearch's own "
                         f"({'a config key of this space' if name in free_names else why_taken(name)})", name)
            for key, name in named if name in taken] + \
        [problem(key, "must name a metric of the function, not where a trial ran or when (results.parquet's "
                      f"{', '.join(PACKED_COLUMNS)}: not read during a search; gpu_memory_reserved_mb is)", name)
         for key, name in named if name in bookkeeping]


def _own_names(metric: Any) -> bool:
    """experiment.metric of a function: one identifier, or a list of distinct ones."""
    listed = [metric] if isinstance(metric, str) else metric if isinstance(metric, (list, tuple)) else None
    return bool(listed) and all(isinstance(m, str) and m.isidentifier() for m in listed) and \
        len(set(listed)) == len(listed)


def _canonical_keys(raw: Mapping[str, Any], base: Path, problems: list[str]
                    ) -> tuple[dict[str, Any], list[Searched], str | None]:
    """The canonical loop's trial config: model, data and training fields fixed, space fields searched."""
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
                                           if name in ("dataset", "loss") else value, problems)

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
    return fixed, searched, data_root


def schedule_problems(experiment: Experiment, searched: tuple[Searched, ...], epochs: int | None,
                      function: bool) -> tuple[Experiment, list[str]]:
    """What experiment.scheduler needs of the space, for both kinds of trial (`epochs`: the trial
    defaults'; None for a function without `epochs`). Returns the experiment as pbt runs it."""
    problems = []
    if experiment.scheduler == "bohb" and not experiment.reproducible:
        problems.append(problem("experiment.scheduler", "bohb needs experiment.reproducible: true (its model is the "
                                "reproducible searcher's, fit on the rungs' results)", "bohb"))
    if experiment.scheduler in HALVING:
        most = max_epochs(searched, epochs or 0)
        if not most:  # only a function trainable can leave epochs unsaid
            problems.append(problem("experiment.scheduler", f"{experiment.scheduler} with a function trainable needs "
                                    "`epochs` (training.epochs or space.epochs): the most reports a trial makes",
                                    experiment.scheduler))
        elif experiment.grace_period > most:
            problems.append(problem("experiment.grace_period", f"must be <= the epochs a trial runs ({most}) "
                                                               f"for {experiment.scheduler}", experiment.grace_period))
        if experiment.reproducible and experiment.grace_period % experiment.checkpoint_every:
            problems.append(problem("experiment.checkpoint_every", f"must divide grace_period "
                                    f"({experiment.grace_period}) for a reproducible {experiment.scheduler}: a trial "
                                    "that waits at a rung resumes from that rung's checkpoint",
                                    experiment.checkpoint_every))
    elif experiment.scheduler == "pbt" and function:
        problems.append(problem("experiment.scheduler", "pbt changes the canonical loop's lr, momentum, weight_decay "
                                "and clip_norm mid-run; it does not apply to a function trainable", "pbt"))
    elif experiment.scheduler == "pbt":
        problems += pbt_problems(experiment, searched, epochs)
        # every checkpoint kept: an exploit restores one the copied trial has moved past
        experiment = experiment.model_copy(update={"num_to_keep": None})
    return experiment, problems


def when_problems(searched: list[Searched], fixed: Mapping[str, Any]) -> list[str]:
    """Why a `when:` cannot hold as written: it names a key not searched, one searched later (or a
    cycle), or a value the named key can never take. Naming only earlier keys is what lets a trial
    draw its keys in the space section's order, each condition already decided (define-by-run)."""
    problems = []
    order = {d.name: i for i, d in enumerate(searched)}
    for i, d in enumerate(searched):
        path = f"space.{d.name}.when"
        for key, allowed in d.when:
            cycle = _cycle(d.name, key, searched, order)
            if key not in order:
                why = "is fixed: the same in every trial" if key in fixed else "is not searched"
                problems.append(problem(path, f"must name a searched key of the space section ({key} {why})", key))
            elif cycle:
                problems.append(problem(path, f"must not make a cycle ({' -> '.join(cycle)})", key))
            elif order[key] > i:
                problems.append(problem(path, f"must name a key searched before {d.name} in the space section "
                                              f"({key} comes after it)", key))
            else:
                for value in allowed:
                    never = _never_taken(searched[order[key]], value)
                    if never:
                        problems.append(problem(f"{path}.{key}", f"must be a value {key} can take: {never}", value))
    return problems


def _cycle(start: str, key: str, searched: list[Searched], order: Mapping[str, int]) -> list[str] | None:
    """[start, key, ..., start] if following the when keys from `key` comes back to `start`."""
    seen: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str] | None:
        if node == start:
            return path
        if node not in order or node in seen:
            return None
        seen.add(node)
        return next(filter(None, (walk(k, [*path, k]) for k, _ in searched[order[node]].when)), None)

    return walk(key, [start, key])


def _never_taken(target: Searched, value: Any) -> str | None:
    """Why `target` can never draw `value`, or None if it can."""
    d = target.distribution
    if target.is_choice:
        return None if label(value) in d.choices else f"one of {plain(list(target.values))}"
    if isinstance(d, FloatDistribution) and d.step is None:
        return "a float key without a step takes any one value with probability 0; name a choice or an int key"
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            (isinstance(d, IntDistribution) and value != int(value)):
        return f"a number in [{d.low}, {d.high}]"
    steps = (value - d.low) / d.step
    if not d.low <= value <= d.high or abs(steps - round(steps)) > 1e-8:
        return f"a number in [{d.low}, {d.high}]" + (f" on steps of {d.step} from {d.low}" if d.step != 1 else "")
    return None


FUNCTION_SECTIONS = ("experiment", "resources", "training", "space")
NOT_FOR_FUNCTIONS = "does not apply with a function trainable: the function loads its own model and data"


def searcher_problems(experiment: Experiment, searched: list[Searched], problems: list[str],
                      free_names: bool = False) -> list[str]:
    """What the searcher is given besides the space (lag, enqueue), checked against the space; the
    canonical loop's and a function trainable's (`free_names`) alike. `problems`: those found so far."""
    found = []
    if experiment.lag is not None and not experiment.reproducible:
        found.append(problem("experiment.lag", "applies to the reproducible searcher only (experiment.reproducible: "
                             "true); Tune's OptunaSearch tells each result as it arrives", experiment.lag))
    if not problems and not found:  # experiment.enqueue's values, against the distributions just parsed
        found += enqueue_problems(experiment.enqueue, searched, experiment.num_samples, free_names)
    return found


def _function_reference(reference: Any, base: Path, problems: list[str]) -> str | None:
    """`trainable: FILE.py:FUNCTION` (or package.module:FUNCTION), made absolute from the space file's folder."""
    if not isinstance(reference, str) or not is_reference(reference):
        problems.append(problem(TRAINABLE_KEY, "must be FILE.py:FUNCTION or package.module:FUNCTION", reference))
        return reference
    return absolute_reference(reference, base)


def _function_keys(raw: Mapping[str, Any], problems: list[str]) -> tuple[dict[str, Any], list[Searched]]:
    """A function trainable's free names in training (fixed) and space (searched), checked as plain data."""
    fixed: dict[str, Any] = {}
    searched: list[Searched] = []
    for sec in ("training", "space"):
        for key, value in _section(raw, sec, problems).items():
            path = f"{sec}.{key}"
            if not isinstance(key, str) or not key.isidentifier() or key in RESERVED or key in COLUMNS:
                rule = "is set by the driver per trial" if key in RESERVED else \
                    f"must not be {why_taken(key)} (search/definition/reserved.py)" if key in COLUMNS else \
                    "must be a Python identifier"
                problems.append(problem(path, rule, value))
            elif key in fixed or key in {d.name for d in searched}:
                problems.append(problem(path, "is set twice; set it in one place", value))
            elif sec == "space" and isinstance(value, dict) and "distribution" in value:
                # a free name checks as a model keyword does (plain data, no type): parse it as one
                before = len(problems)
                found = parse_searched(model_key(key), value, problems)
                problems[before:] = [p.replace(f"space.{model_key(key)}", path) for p in problems[before:]]
                if found:
                    searched.append(replace(found, name=key))
            elif not is_plain_data(value):
                problems.append(problem(path, "must be plain data (numbers, strings, lists, mappings)", value))
            else:
                fixed[key] = plain(value)
    return fixed, searched


def _function_to_raw(space: Space) -> dict[str, Any]:
    return {TRAINABLE_KEY: space.trainable, "experiment": plain(space.experiment.model_dump()),
            "resources": space.resources.model_dump(), "training": dict(space.fixed),
            "space": {d.name: d.to_raw() for d in space.searched}}


def to_raw(space: Space) -> dict[str, Any]:
    """A space file that parses back to an equivalent space (the same trials), defaults written out.

    The run folder's spec.yaml: what a resumed search runs, whatever the space file says now.
    """
    if space.trainable:
        return _function_to_raw(space)
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


ABSENT = "(absent)"  #: spec_differences' value of a key one side lacks


def with_overrides(raw: dict[str, Any], pairs: list[tuple[str, Any]], source: str) -> Space:
    """A space file's sections with a command's overrides (`--set` and flags, or search.run's `overrides`)
    applied and validated; `asked` keeps their keys: a resume takes the budget keys among them."""
    return replace(parse_space(set_keys(raw, pairs), source=source), asked=tuple(key for key, _ in pairs))


def spec_differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(section.key, value in a, value in b) wherever two space files (as to_raw writes them) differ.

    A top-level value that is not a section (`trainable: train.py:train`) is compared whole, under its own name."""
    out = []
    for sec in sorted(set(a) | set(b)):
        left, right = a.get(sec), b.get(sec)
        if not all(isinstance(side, dict) or side is None for side in (left, right)):
            if left != right:
                out.append((sec, ABSENT if sec not in a else left, ABSENT if sec not in b else right))
            continue
        left, right = left or {}, right or {}
        for key in sorted(set(left) | set(right)):
            if left.get(key, ABSENT) != right.get(key, ABSENT):
                out.append((f"{sec}.{key}", left.get(key, ABSENT), right.get(key, ABSENT)))
    return out


def example_config(space: Space) -> TrialConfig | FunctionConfig:
    """A trial config the search could produce: fixed fields plus each searched field's first value
    (a range's low end, of the type the distribution draws), where its `when:` holds for those.

    Used to try the model once before Ray starts.
    """
    drawn: dict[str, Any] = {}
    for d in space.searched:
        if d.holds(drawn):
            drawn[d.name] = d.example()
    values = {**space.fixed, **drawn}
    return FunctionConfig(space.trainable, values) if space.trainable else TrialConfig.from_mapping(values)
