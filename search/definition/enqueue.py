"""experiment.enqueue: configs to run first, checked against the space's distributions with the space file.

`experiment.enqueue: [{lr: 0.05}, {lr: 0.1, batch_size: 64}]`: partial configs of searched keys, run
first as trials 0..k-1 (Optuna's `Study.enqueue_trial`, search/searching/warm_start.py); the keys they
leave out are drawn as usual. Each value must lie inside its key's distribution.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from optuna.distributions import CategoricalDistribution, IntDistribution

from search.definition.schema import Searched, field_value, holds
from trainable.errors import problem


def outside(d: Searched, param: Any) -> str | None:
    """Why Optuna's `param` is not a value `d` can draw (today's rule for it), or None."""
    dist = d.distribution
    if isinstance(dist, CategoricalDistribution):
        return None if param in dist.choices else f"must be one of {list(d.values)}"
    step = dist.step
    grid = "" if step is None or (isinstance(dist, IntDistribution) and step == 1) else f" on steps of {step} from {dist.low}"
    rule = f"must be {'an integer ' if isinstance(dist, IntDistribution) else ''}in [{dist.low}, {dist.high}]{grid}"
    if isinstance(param, bool) or not isinstance(param, (int, float)) or not math.isfinite(param):
        return rule
    if isinstance(dist, IntDistribution) and param != int(param):
        return rule
    if not dist.low <= param <= dist.high:
        return rule
    if step is not None:
        steps = (param - dist.low) / step
        if not math.isclose(steps, round(steps), rel_tol=0, abs_tol=1e-8):
            return rule
    return None


def enqueue_problems(enqueue: Sequence[Mapping[str, Any]], searched: Sequence[Searched],
                     num_samples: int, typed_as: Callable[[str], str] = lambda key: key) -> list[str]:
    """Every problem with experiment.enqueue, as `experiment.enqueue[i].KEY: rule, got value`. `typed_as`: the
    name whose type a key's value is checked as (the kind's typed_key: its own field, or plain data)."""
    by_name = {d.name: d for d in searched}
    problems: list[str] = []
    if len(enqueue) > num_samples:
        problems.append(problem("experiment.enqueue", f"must hold at most experiment.num_samples ({num_samples}) "
                                                      "configs", f"{len(enqueue)} configs"))
    for i, config in enumerate(enqueue):
        for key, value in config.items():
            path = f"experiment.enqueue[{i}].{key}"
            if key not in by_name:
                problems.append(problem(path, f"must be a searched key ({', '.join(by_name)})", value))
                continue
            before = len(problems)
            typed = field_value(path, typed_as(key), value, problems)
            if len(problems) > before:
                continue
            try:  # a range's value as given (param() would make 2.5 the int 2), a choice's as its label
                rule = outside(by_name[key], by_name[key].param(typed) if by_name[key].is_choice else typed)
            except (TypeError, ValueError):
                rule = outside(by_name[key], None)
            if rule:
                problems.append(problem(path, rule, value))
            # a `when:` this config's own values make false: the key would not be drawn, so its value not used
            for on, allowed in by_name[key].when:
                if on in config and not holds(((on, allowed),), config):
                    problems.append(problem(path, f"is drawn only when {on} is one of {list(allowed)}, and this "
                                                  f"config sets {on} to {config[on]!r}", value))
    return problems


def enqueued_params(enqueue: Sequence[Mapping[str, Any]], searched: Sequence[Searched],
                    typed_as: Callable[[str], str] = lambda key: key) -> list[dict[str, Any]]:
    """The enqueued configs as Optuna's params (a choice's label), for Study.enqueue_trial; values checked."""
    by_name = {d.name: d for d in searched}
    return [{key: by_name[key].param(field_value(key, typed_as(key), value, []))
             for key, value in config.items()}
            for config in enqueue]
