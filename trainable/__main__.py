"""`python -m trainable`: one training run from flags or a YAML file, one line per epoch.

The debugging path before a search: same code, same seed, same numbers as a trial.
`python -m trainable --config runs/<name>/best.yaml` re-runs a search's best trial (a function
trainable's best.yaml: the user's function, called with that config; trainable/function.py); a PBT
search's best.yaml has a `schedule:` too, the hyperparameter changes the trial's weights went through.
`--config runs/<name>/pareto.yaml --pick N` re-runs trial N of a search's Pareto front (several objectives).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Sequence

from trainable.config import FACTORY_KEY, FIELDS, SCHEDULE_KEY, TrialConfig, parse_schedule, schedule_note
from trainable.data import load_data
from trainable.factories import check_model
from trainable.measures import check_measures
from trainable.function import is_function, replay
from trainable.device import get_default_device
from trainable.errors import ConfigError, DataError, problem
from trainable.loop import build_run
from trainable.replay import print_epochs, replay_worker
from trainable.kept_code import copies, relocated
from trainable.kept_code import read_record as read_code_record
from trainable.yaml_file import flag_value, parse_value, read_yaml_mapping

# best.yaml keeps the trial's outcome beside its config; it is read, not trained on
INFORMATIONAL_KEYS = ("result",)
# fields given through their own flag shape: --model FACTORY and --set model.KEY=VALUE / data_args=...
NESTED = ("model", "model_args", "data_args")


def yaml_text(value) -> str:
    """A default as the user would type it: [128], false, null."""
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def default_of(f: dataclasses.Field):
    """A field's default, made by its factory where it has one (training.metrics: {})."""
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING  # every trial config field has a default or a factory
    return f.default_factory()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainable",
        description="Train one model once. Precedence: defaults < --config file < flags.")
    parser.add_argument("--config", help="YAML file of trial config fields (a search's best.yaml works)")
    parser.add_argument("--pick", type=int, metavar="N",
                        help="with --config pareto.yaml: the config of trial N of the Pareto front")
    parser.add_argument("--data-root", help="dataset folder (default: $HPSEARCH_DATA or ~/.cache/hpsearch)")
    parser.add_argument("--model", metavar="FACTORY",
                        help="model.factory: mlp, cnn, FILE.py:CALLABLE or package.module:CALLABLE")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="any field, e.g. model.hidden_sizes=[256,128] or data_args={n: 3} (repeatable)")
    fields = parser.add_argument_group("trial config fields (values are read as YAML: 0.1, null, [256, 128])")
    for name, f in FIELDS.items():
        if name not in NESTED:
            fields.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar="VALUE",
                                type=flag_value, help=f"default {yaml_text(default_of(f))}")
    return parser.parse_args(argv)


def picked(document, number: int) -> dict:
    """pareto.yaml's config of trial `number` (its `trials` entry with that trial_number)."""
    if not isinstance(document.get("trials"), list):  # a best.yaml (or another trial config): one trial, no front
        raise ConfigError([problem("--pick", "is for a Pareto front (--config pareto.yaml); this --config is one "
                                             "trial's config, which runs as it is: leave --pick out", number)])
    trials = document["trials"]
    for entry in trials:
        if isinstance(entry, dict) and entry.get("trial_number") == number and isinstance(entry.get("config"), dict):
            return entry["config"]
    raise ConfigError([problem("--pick", f"must be a trial_number of the front in --config (it holds "
                                         f"{front_numbers(trials)})", number)])


def front_numbers(trials: list) -> list:
    """The trial_numbers of pareto.yaml's `trials` entries."""
    return [e.get("trial_number") for e in trials if isinstance(e, dict)]


def read_config(path: str) -> dict:
    """--config's mapping, each FILE.py it names that is gone pointed at its run folder's copy (a note each,
    said once; trainable/kept_code.py): a best.yaml replays after the cluster that ran it is gone."""
    raw = read_yaml_mapping(path)
    if "://" in path:  # on an object store: its files as they are named (the run folder's copies are not local)
        return raw
    folder = Path(path).resolve().parent
    notes: list[str] = []
    raw = relocated(raw, copies(folder), notes, read_code_record(folder))
    for note in dict.fromkeys(notes):
        if note not in _said:
            _said.add(note)
            print(f"note: {note}", file=sys.stderr, flush=True)
    return raw


_said: set[str] = set()


def trial_config(args: argparse.Namespace) -> TrialConfig:
    values = {}
    if args.config:
        document = read_config(args.config)
        if args.pick is not None:
            document = picked(document, args.pick)
        elif isinstance(document.get("trials"), list) and "objectives" in document:  # a pareto.yaml
            raise ConfigError([problem("--pick", f"must name the trial to re-run when --config is a Pareto front "
                                                 f"(pareto.yaml; its trial_numbers: "
                                                 f"{front_numbers(document['trials'])})", None)])
        values = TrialConfig.from_mapping({k: v for k, v in document.items()
                                           if k not in (*INFORMATIONAL_KEYS, SCHEDULE_KEY)}).to_flat()
    elif args.pick is not None:
        raise ConfigError([problem("--pick", "needs --config pareto.yaml", args.pick)])
    values.update({name: getattr(args, name) for name in FIELDS
                   if name not in NESTED and getattr(args, name) is not None})
    if args.model is not None:
        values[FACTORY_KEY] = args.model
    for item in args.sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError([problem("--set", "must be KEY=VALUE", item)])
        values[key] = parse_value(value)
    config = TrialConfig.from_mapping(values)
    if config.workers > 1 and config.batch_size % config.workers:  # said here, not by each worker's traceback
        raise ConfigError([problem("workers", f"must divide batch_size ({config.batch_size}): each worker takes "
                                              "batch_size / workers examples of every batch", config.workers)])
    return config


def config_schedule(args: argparse.Namespace) -> dict[int, dict]:
    """The --config file's schedule (epoch -> values it changes), empty if it has none."""
    raw = read_yaml_mapping(args.config) if args.config else {}
    return parse_schedule(raw[SCHEDULE_KEY]) if SCHEDULE_KEY in raw else {}


def refuse_flags_of_a_function_replay(args: argparse.Namespace) -> None:
    """A function trainable's best.yaml (or pareto.yaml entry) is replayed with the config it ran with: the
    canonical loop's flags mean nothing to the user's function, and taking none silently would replay
    something else than was asked."""
    given = [(f"--{name.replace('_', '-')}", getattr(args, name)) for name in FIELDS
             if name not in NESTED and getattr(args, name) is not None]
    given += [("--model", args.model)] if args.model is not None else []
    given += [("--set", item) for item in args.sets] + ([("--data-root", args.data_root)] if args.data_root else [])
    if given:
        raise ConfigError([problem(flag, "does not apply to a function trainable's replay, which calls the function "
                                         "with the config it ran with (edit a copy of the file to change a value)",
                                   value) for flag, value in given])


def replayed_metric(raw: dict, pick: int | None) -> str | list[str] | None:
    """What a function's replay prints: best.yaml's metric, or pareto.yaml's objectives."""
    if pick is not None:
        objectives = raw.get("objectives")
        objectives = objectives if isinstance(objectives, dict) else {}
        return list(objectives) or None
    result = raw.get("result")
    result = result if isinstance(result, dict) else {}
    return result.get("metric")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        raw = read_config(args.config) if args.config else {}
        if args.config and not raw:  # else the defaults would train, as if no --config had been given
            raise ConfigError([problem("--config", "must hold a trial config (a search's best.yaml works), and "
                                                   "this file is empty", args.config)])
        if isinstance(raw.get("experiment"), dict) and "result" not in raw:  # spec.yaml or a space file
            raise ConfigError([problem("--config", "must be a trial config, and this is a space file (it has an "
                                                   "experiment section); re-run a trial with its run's best.yaml "
                                                   "(or pareto.yaml --pick N)", args.config)])
        entry = raw if args.pick is None else picked(raw, args.pick)  # best.yaml, or pareto.yaml's entry N
        if is_function(entry):  # a function trainable's: its function, called with that config
            refuse_flags_of_a_function_replay(args)
            return replay({k: v for k, v in entry.items() if k not in INFORMATIONAL_KEYS}, replayed_metric(raw, args.pick))
        config, schedule = trial_config(args), config_schedule(args)
        data = load_data(config, args.data_root, root_key="--data-root", with_test=False)
        # the model once on two inputs: a bad keyword or output shape is exit 2, not a crash mid-epoch
        check_model(config, data.sample(), data.num_classes)
        check_measures(config, data)
    except (ConfigError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if schedule_note(config):
        print(f"note: {schedule_note(config)}", file=sys.stderr, flush=True)
    device = get_default_device()
    print(f"device: {device} | dataset: {config.dataset} {len(data.train)} train / "
          f"{len(data.val)} val | model: {config.model} | seed: {config.seed}"
          + (f" | workers: {config.workers}" if config.workers > 1 else ""), flush=True)
    for epoch, changes in schedule.items():
        print(f"schedule: from epoch {epoch}: " + ", ".join(f"{k} {v}" for k, v in changes.items()), flush=True)
    if config.workers > 1:
        return train_on_workers(config, schedule, data, device)
    print_epochs(build_run(config, data, device), schedule)
    return 0


def train_on_workers(config: TrialConfig, schedule: dict[int, dict], data, device) -> int:
    """workers > 1: the run on that many local processes (gloo on CPU; on CUDA one GPU each), rank 0 printing;
    the same numbers as the trial's workers gave, as a replay of one worker gives a one-worker trial's."""
    import torch
    import torch.multiprocessing as mp

    from trainable.distributed import free_port

    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    if device.type == "cuda" and gpus < config.workers:
        print(f"error: workers: this run needs {config.workers} GPUs (one per worker, as its search had), and this "
              f"machine has {gpus}; run it on a node with {config.workers}, or on the CPU with "
              "CUDA_VISIBLE_DEVICES= (gloo; the numbers then differ from the GPU's)", file=sys.stderr)
        return 2
    # spawn: a fresh interpreter per worker, as the trial's Ray actors were; the data is pickled to each
    mp.spawn(replay_worker, args=(config, schedule, data, device.type, free_port()), nprocs=config.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
