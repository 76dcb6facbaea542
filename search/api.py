"""The Python API: `search.run(...)`, the same search as `python -m search`, from code.

    import search
    outcome = search.run("spaces/mnist.yaml", overrides={"experiment.num_samples": 4})
    outcome.results   # the results.parquet rows as a DataFrame
    outcome.best      # best.yaml's content

    model = search.load_best("runs/mnist-20261130-101500")   # best.yaml's model, eval mode, CPU

A space may also be a dict with the space file's sections. Bad input raises ConfigError
(or DataError, CapacityError) before Ray starts, with every problem listed.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Mapping

from trainable.errors import ConfigError, problem
from trainable.yaml_file import read_yaml_mapping


def run(space: str | Path | Mapping[str, Any], *, overrides: Mapping[str, Any] | None = None,
        name: str | None = None, resume: bool = False, address: str | None = None, verbose: bool = False,
        quiet: bool = False):
    """Run (or resume) a search and return its Outcome (name, path, results, best, timing, summary).

    `space`: a space file's path, or a mapping with its sections (a relative FILE.py
    reference is then relative to the current folder). `overrides`: `{"section.key": value}`,
    as `--set`. `name`, `resume`, `address`, `verbose`, `quiet`: as the CLI's flags (`quiet`: one progress
    line per finished trial instead of one per epoch).
    """
    # torch, Ray and pandas: only on a call; `import search` must not load them
    from search.definition.space import with_overrides
    from search.driver import run_search
    from search.execution.progress import quiet_progress
    from search.execution.session import quiet as quiet_ray

    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError([problem("overrides", 'must be a mapping of "section.key" to a value, as --set',
                                   overrides)])
    if not isinstance(quiet, bool):
        raise ConfigError([problem("quiet", "must be True or False, as the --quiet flag", quiet)])
    if not isinstance(space, (str, Path, Mapping)):
        raise ConfigError([problem("space", "must be a space file's path or a mapping of its sections", space)])
    pairs = list((overrides or {}).items())
    if isinstance(space, Mapping):
        parsed = with_overrides(copy.deepcopy(dict(space)), pairs, "<python>")
    else:
        parsed = with_overrides(read_yaml_mapping(space), pairs, str(space))
    quiet_ray(verbose)
    with quiet_progress(quiet):
        return run_search(parsed, name=name, address=address, resume=resume)


def restore(path: str, *, trainable: Callable | None = None):
    """A run folder's `tune.Tuner`, restored with the trainable its trials ran, which Tuner.restore needs.

    `path`: the run folder (local or a storage URI), e.g. "runs/mnist-20261130-101500".
    `restore(path).get_results()` is Tune's ResultGrid of the search. The data is loaded and put
    in Ray's object store as the search did (Ray starts if it is not running), so `fit()` would
    continue the trials as Tune does, without hpsearch's results.parquet, best.yaml and summary:
    continue a search with `search.run(..., name=NAME, resume=True)` (`--resume`) instead.
    `trainable`: the trial function given to driver.run_search, if it was not the default.
    """
    # torch and Ray: only on a call; `import search` must not load them
    from search.execution.preflight import check_search
    from search.execution.tuner import build_tuner
    from search.store.run_folder import NotARunFolder, open_run
    from trainable.adapter import tune_trial

    try:
        folder = open_run(str(path), results=False)  # Tune's record is what it continues
    except NotARunFolder as error:
        raise ConfigError([problem("path", f"must be a run folder of hpsearch ({error})", str(path))]) from None
    space, _ = folder.read_spec()  # an edited spec.yaml is refused, as on --resume: this Tuner continues it
    gpus = space.resources.gpus if isinstance(space.resources.gpus, (int, float)) else 0  # Tune keeps each trial's
    return build_tuner(space, folder, check_search(space), trainable or tune_trial, gpus=gpus, resume=True)


def load_best(run: str | Path, *, trial: int | None = None):
    """The model of best.yaml's checkpoint (or of trial number `trial`'s best readable epoch) of the
    run folder `run`, as a torch.nn.Module in eval mode on the CPU.

    It takes inputs as the trials' models got them (docs/outputs.md, "Export the model").
    Raises ConfigError (no best.yaml, no such trial, no readable checkpoint) or
    search.outputs.export.NotARunFolder.
    """
    # torch and Ray: only on a call; `import search` must not load them
    from search.outputs.export import chosen_checkpoint, model_of
    from search.store.run_folder import open_run

    return model_of(chosen_checkpoint(open_run(str(run)), trial))
