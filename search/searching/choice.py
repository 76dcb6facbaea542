"""`sampler: auto`: which of Optuna's samplers a search runs, chosen once, before its first trial.

A pure function of what the search is: its searched keys, its objectives and constraints, its
scheduler and its trial budget. The rules are OptunaHub's AutoSampler's, with TPE under early
stopping and a lower trial bound (200, not 250); bench/numeric.py and bench/quality.py measure them
(docs/search-quality.md, "Which sampler"):

- a Gaussian process (Optuna's GPSampler: logEI, logEHVI for several objectives, the constrained
  variants where constraints exist) for a space of numbers only, while the search is at most
  GP_TRIALS trials: it models how the numbers interact, where TPE models each side of a split;
- TPE (multivariate, constant liar, as ordered.py pins it) where a key is a choice or has a `when:`:
  GPSampler would treat a choice as unordered one-hot dimensions and draws conditional keys at random;
- TPE under asha and hyperband: it learns from a stopped trial (told PRUNED, with its curve); a GP
  sees only complete trials, so its model would hold the few that ran to the end;
- TPE under bohb, as BOHB's own model (kernel densities), fit on the highest rung that holds enough results;
- past GP_TRIALS trials the cheaper model: TPE for one objective, NSGA-II for several (a GP's fit
  grows with the cube of the trials it holds);
- pbt: TPE, which draws the whole population before any result, as a random sampler would.

The choice is written into spec.yaml (experiment.sampler holds the sampler chosen; the run
section's `sampler_choice` the one-line reason), so a resume reads it back and never chooses again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from search.definition.objectives import HALVING, names
from search.definition.space import Space

AUTO = "auto"
# A GP's suggestion costs about 0.2 s of CPU at 50 trials with the batched acquisition (bench/gp_cost.py) and
# grows with the trials its model holds; past this budget the cheaper models (docs/search-quality.md).
GP_TRIALS = 200


@dataclass(frozen=True)
class Choice:
    """The sampler a search runs, and why, in the line the summary, spec.yaml and the report print."""

    sampler: str
    reason: str


def choose_sampler(*, choices: int, conditional: int, numbers: int, objectives: int, constraints: int,
                   num_samples: int, scheduler: str) -> Choice:
    """The sampler for a search of `numbers` numeric keys and `choices` choice keys (`conditional` of
    all of them with a `when:`), `objectives` metrics, `constraints`, `num_samples` trials and `scheduler`."""
    keys = numbers + choices
    plural = lambda count, word: f"{count} {word}{'' if count == 1 else 's'}"  # noqa: E731
    budget = plural(num_samples, "trial")
    extra = (f", {plural(objectives, 'objective')}" if objectives > 1 else "") + \
        (f", {plural(constraints, 'constraint')}" if constraints else "")
    if scheduler == "pbt":
        return Choice("tpe", f"sampler auto: tpe (pbt draws its population before any result{extra})")
    if conditional:
        return Choice("tpe", f"sampler auto: tpe ({plural(conditional, 'conditional key')} of "
                             f"{plural(keys, 'searched key')}, {budget}{extra})")
    if choices:
        return Choice("tpe", f"sampler auto: tpe ({plural(choices, 'choice')} among "
                             f"{plural(keys, 'searched key')}, {budget}{extra})")
    if scheduler == "bohb":  # BOHB's model: a TPE (its KDEs) fit on the highest rung that holds enough results
        return Choice("tpe", f"sampler auto: tpe (bohb: the model fit on the highest rung with results enough; "
                             f"{plural(numbers, 'numeric parameter')}, {budget}{extra})")
    if scheduler in HALVING:
        return Choice("tpe", f"sampler auto: tpe ({scheduler}: tpe learns from stopped trials, a gp does not; "
                             f"{plural(numbers, 'numeric parameter')}, {budget}{extra})")
    if num_samples > GP_TRIALS:
        cheaper = "nsga2" if objectives > 1 else "tpe"
        return Choice(cheaper, f"sampler auto: {cheaper} ({plural(numbers, 'numeric parameter')}, {budget}{extra}: "
                               f"past {GP_TRIALS} trials a gp's fit grows with the cube of the trials)")
    return Choice("gp", f"sampler auto: gp ({plural(numbers, 'numeric parameter')}, {budget}{extra})")


def resolved(space: Space, chosen: str | None = None, reason: str | None = None) -> Space:
    """`space` with `sampler: auto` replaced by its choice (search/definition/space.py Space.sampler_choice holds why);
    a space that names its sampler is returned as it is. `chosen`, `reason`: a choice made before (a resume's,
    read back from spec.yaml), taken instead of choosing again."""
    experiment = space.experiment
    if experiment.sampler != AUTO:
        return space
    if chosen is None:
        choice = choose_sampler(choices=sum(1 for d in space.searched if d.is_choice),
                                conditional=sum(1 for d in space.searched if d.when),
                                numbers=sum(1 for d in space.searched if not d.is_choice),
                                objectives=len(names(experiment.metric)), constraints=len(experiment.constraints),
                                num_samples=experiment.num_samples, scheduler=experiment.scheduler)
        chosen, reason = choice.sampler, choice.reason
    # a sampler name the schema validated already: nothing else of the section changes
    return replace(space, experiment=experiment.model_copy(update={"sampler": chosen}), sampler_choice=reason)
