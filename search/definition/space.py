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
from typing import TYPE_CHECKING, Any, Mapping, cast

from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from search.definition.enqueue import enqueue_problems
from search.definition.kind import TrialKind, kind_of, kind_of_raw
from search.definition.objectives import HALVING
from search.definition.overrides import set_keys
from search.definition.schema import Experiment, Resources, Searched, label, section_of, validated, worker_problems
from trainable.config import plain
from trainable.errors import ConfigError, problem

if TYPE_CHECKING:
    from trainable.config import TrialConfig
    from trainable.function import FunctionConfig


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

    @property
    def kind(self) -> TrialKind:
        """The kind of trial it runs: what the rest of search/ asks (search/definition/kind.py)."""
        return kind_of(self.trainable)

    def trial_defaults(self) -> TrialConfig | FunctionConfig:
        """The trial config with the fixed fields set and searched ones at their defaults."""
        return self.kind.config(self.fixed, workers=self.resources.workers)


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


def parse_space(raw: Mapping[str, Any], source: str = "<memory>") -> Space:
    """Validate a whole space mapping; raise one ConfigError listing every problem.

    One path for both kinds of trial: the canonical loop (model, data, training fields) and a
    function trainable (`trainable: FILE.py:FUNCTION`, free names). Each kind reads its own keys
    (search/definition/loop_kind.py, function_kind.py); every check on the experiment, the schedule and
    the searcher is made once, for both (schedule_problems, searcher_problems)."""
    problems: list[str] = []
    if not isinstance(raw, Mapping):
        raise ConfigError([problem("(top level)", "must be a mapping of sections", raw)], source)
    base = _base_folder(source)
    kind = kind_of_raw(raw, base, problems)
    problems += kind.section_problems(raw)
    experiment = kind.experiment(raw, problems)
    resources = validated(Resources, "resources", section_of(raw, "resources", problems), problems)
    problems += kind.resource_problems(resources)
    fixed, searched, data_root = kind.keys(raw, base, problems)
    problems += when_problems(searched, fixed)
    problems += worker_problems(resources, batch_sizes(fixed, searched, kind))
    if experiment.scheduler == "pbt" and resources.workers > 1:
        # a trial that takes another's checkpoint goes on shuffling with its own seed on each worker, while
        # best.yaml replays every epoch with the best trial's: the replay would not give its val_acc
        problems.append(problem("resources.workers", "must be 1 with experiment.scheduler pbt (several workers "
                                                     "per pbt trial are not built yet)", resources.workers))
    experiment, metric_problems = kind.metric_problems(experiment, fixed, searched, problems)
    problems += metric_problems
    checked, epochs = kind.default_epochs(fixed)
    if checked:  # else the fixed keys' own problems are said: the schedule's wait
        experiment, schedule = schedule_problems(experiment, tuple(searched), epochs, kind)
        said = {p.split(":", 1)[0] for p in problems}  # a key said wrong once: not again through a default
        problems += [p for p in schedule if p.split(":", 1)[0] not in said]
    problems += searcher_problems(experiment, searched, problems, kind)
    if not problems and not searched:
        problems.append(problem("space", "must search at least one key (e.g. lr: {distribution: float, "
                                         "low: 0.01, high: 0.3, log: true})", raw.get("space")))
    if problems:
        raise ConfigError(problems, source)
    return Space(experiment, resources, data_root, fixed, tuple(searched), source, trainable=kind.reference)


def batch_sizes(fixed: Mapping[str, Any], searched: list[Searched], kind: TrialKind) -> list[tuple[str, Any]]:
    """Every batch_size a trial may get, each with the key that gives it: the fixed one (the kind's default,
    kind.default_batch_size), a choice's values, an int range's low and step (every drawn value is a multiple
    of what divides both). A batch_size searched under `when:` adds the fixed one: a trial whose condition
    fails trains on it."""
    default = kind.default_batch_size(fixed)
    for d in searched:
        if d.name == "batch_size":
            if d.is_choice:
                drawn = [(f"space.batch_size.values[{i}]", v) for i, v in enumerate(d.values)]
            else:
                step = getattr(d.distribution, "step", None)
                drawn = [("space.batch_size.low", d.low), ("space.batch_size.step", 1 if step is None else step)]
            return drawn + (default if d.when else [])
    return default


def schedule_problems(experiment: Experiment, searched: tuple[Searched, ...], epochs: int | None,
                      kind: TrialKind) -> tuple[Experiment, list[str]]:
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
    elif experiment.scheduler == "pbt":  # the canonical loop's: the function kind refuses it
        experiment, found = kind.pbt(experiment, searched, epochs)
        problems += found
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
    if isinstance(d, CategoricalDistribution):
        return None if label(value) in d.choices else f"one of {plain(list(target.values))}"
    if isinstance(d, FloatDistribution) and d.step is None:
        return "a float key without a step takes any one value with probability 0; name a choice or an int key"
    if not isinstance(value, (int, float)) or isinstance(value, bool) or \
            (isinstance(d, IntDistribution) and value != int(value)):
        return f"a number in [{d.low}, {d.high}]"
    steps = (value - d.low) / cast(float, d.step)  # not None: an int's never is, a float's was said above
    if not d.low <= value <= d.high or abs(steps - round(steps)) > 1e-8:
        return f"a number in [{d.low}, {d.high}]" + (f" on steps of {d.step} from {d.low}" if d.step != 1 else "")
    return None


def searcher_problems(experiment: Experiment, searched: list[Searched], problems: list[str],
                      kind: TrialKind) -> list[str]:
    """What the searcher is given besides the space (lag, enqueue), checked against the space; the
    canonical loop's and a function trainable's alike. `problems`: those found so far."""
    found = []
    if experiment.lag is not None and not experiment.reproducible:
        found.append(problem("experiment.lag", "applies to the reproducible searcher only (experiment.reproducible: "
                             "true); Tune's OptunaSearch tells each result as it arrives", experiment.lag))
    if not problems and not found:  # experiment.enqueue's values, against the distributions just parsed
        found += enqueue_problems(experiment.enqueue, searched, experiment.num_samples, kind.typed_key)
    return found


def to_raw(space: Space) -> dict[str, Any]:
    """A space file that parses back to an equivalent space (the same trials), defaults written out.

    The run folder's spec.yaml: what a resumed search runs, whatever the space file says now.
    """
    return space.kind.to_raw(space)


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
    return space.kind.config(values)
