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
from typing import Any, Mapping


def run(space: str | Path | Mapping[str, Any], *, overrides: Mapping[str, Any] | None = None,
        name: str | None = None, resume: bool = False, address: str | None = None):
    """Run (or resume) a search and return its Outcome (name, path, results, best, timing, summary).

    `space`: a space file's path, or a mapping with its sections (a relative FILE.py
    reference is then relative to the current folder). `overrides`: `{"section.key": value}`,
    as `--set`. `name`, `resume`, `address`: as the CLI's flags.
    """
    from search.driver import run_search
    from search.overrides import set_keys
    from search.space import parse_space
    from trainable.yaml_file import read_yaml_mapping

    pairs = list((overrides or {}).items())
    if isinstance(space, Mapping):
        parsed = parse_space(set_keys(copy.deepcopy(dict(space)), pairs), source="<python>")
    else:
        parsed = parse_space(set_keys(read_yaml_mapping(space), pairs), source=str(space))
    return run_search(parsed, name=name, address=address, resume=resume)


def load_best(run: str | Path, *, trial: int | None = None):
    """The model of best.yaml's checkpoint (or of trial number `trial`'s best readable epoch) of the
    run folder `run`, as a torch.nn.Module in eval mode on the CPU.

    It takes inputs as the trials' models got them (docs/outputs.md, "Export the model").
    Raises ConfigError (no best.yaml, no such trial, no readable checkpoint) or
    search.export.NotARunFolder.
    """
    from search.export import chosen_checkpoint, model_of, open_run

    return model_of(chosen_checkpoint(open_run(str(run)), trial))
