"""`python -m search --space FILE` (also the `hpsearch` command): flags, overrides, exit codes.

`python -m search report RUN_FOLDER` writes a search's report.html again; `python -m search check
--space FILE` checks a space without running it; `python -m search export RUN_FOLDER` writes its model.

Every flag is a shorthand for `--set section.key=value` on the space file; overrides are
applied to the file's contents and validated with it, so a bad flag reads like a bad file.
Exit codes: 0 done, 2 bad input (nothing started), 3 the search ran but no trial succeeded
(every trial failed or diverged: search/outputs/finish.py NO_SUCCESS_EXIT), 130 interrupted (Ctrl-C or
SIGTERM; the summary prints the --resume command), 1 the search itself failed.
"""

from __future__ import annotations

import argparse
import atexit
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Sequence

from search.definition.overrides import set_keys
from search.definition.schema import run_name_problem
from search.definition.space import Space, with_overrides
from search.execution.collector import start_up
from search.outputs.phases import command_start
from trainable.errors import ConfigError, DataError, DiskFull, problem
from trainable.yaml_file import flag_value, parse_value, read_yaml_mapping

# flag -> the space file key it overrides
SHORTHANDS = {
    "num_samples": "experiment.num_samples",
    "max_concurrent": "experiment.max_concurrent",
    "seed": "experiment.seed",
    "scheduler": "experiment.scheduler",
    "storage_path": "experiment.storage_path",
    "epochs": "training.epochs",
    "cpus_per_trial": "resources.cpus",
    "gpus_per_trial": "resources.gpus",
    "data_root": "data.root",
    "connect_timeout": "experiment.connect_timeout",
    "warm_start": "experiment.warm_start",
}


NOT_GIVEN = argparse.SUPPRESS  #: a shorthand flag not on the command line leaves no attribute (None is `null`)


COMMANDS = """commands:
  python -m search --space FILE [flags]     run (or --resume) a search
  python -m search check --space FILE       check a space without running it; prints the resolved spec
  python -m search report RUN               write report.html of a run folder again
  python -m search export RUN               write the best (or --trial N's) model: state_dict, torchscript, pt2, onnx
  python -m search runs [STORAGE]           list the runs in a storage: state, trials, best value, when
  python -m search compare RUN_A RUN_B      two runs' spec differences and best trials side by side
each takes --help"""


def parse_args(argv: Sequence[str] | None, prog: str = "python -m search",
               description: str = "Run an Optuna TPE search inside Ray Tune over a space file.") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=COMMANDS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--space", required=True, help="the space file (YAML), e.g. spaces/mnist.yaml")
    parser.add_argument("--name", help="run folder under the storage path (default: <experiment.name>-<date>-<time>)")
    parser.add_argument("--address", help="join this Ray cluster (e.g. auto) instead of starting a local Ray")
    parser.add_argument("--resume", action="store_true",
                        help="continue the interrupted run --name (default: the newest run of this space)")
    for flag, key in SHORTHANDS.items():
        parser.add_argument("--" + flag.replace("_", "-"), dest=flag, type=flag_value, metavar="VALUE",
                            default=NOT_GIVEN, help=f"sets {key}")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="set any key of the space file, e.g. training.momentum=0.8, "
                             "model.hidden_sizes=[64] or space.lr.high=0.5 (repeatable)")
    parser.add_argument("--verbose", action="store_true",
                        help="let Ray and Tune print everything they print (their hints, INFO lines)")
    parser.add_argument("--quiet", action="store_true",
                        help="one progress line per finished trial (its number, status, epochs, best value) "
                             "instead of one per epoch")
    parser.add_argument("--more-trials", dest="more_trials", type=int, metavar="N",
                        help="with --resume: N trials more than the run's experiment.num_samples (docs/budgets.md)")
    return parser.parse_args(argv)


def assignments(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """(key, value) pairs of the flags and --set items; a malformed --set is a problem."""
    # a flag given as null or "" sets null (--warm-start null drops the file's), which the key's rule then judges
    pairs = [(key, getattr(args, flag)) for flag, key in SHORTHANDS.items() if hasattr(args, flag)]
    for item in args.sets:
        key, sep, value = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError([problem("--set", "must be section.key=value", item)])
        pairs.append((key, parse_value(value)))
    return pairs


def apply_overrides(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return set_keys(raw, assignments(args))


def load_space(path: str, pairs: list[tuple[str, Any]]) -> Space:
    """Read, override and validate a space file (ConfigError listing every problem, the named code's too)."""
    raw = read_yaml_mapping(path)
    try:
        return with_overrides(raw, pairs, path)
    except ConfigError as error:
        try:
            overridden = set_keys(raw, pairs)  # the code the overrides name, where they name any
        except ConfigError:
            raise error from None
        raise with_code_problems(error, overridden, path) from None


def report_main(argv: Sequence[str]) -> int:
    """`python -m search report RUN_FOLDER`: write report.html and the PNGs again from the folder."""
    parser = argparse.ArgumentParser(prog="python -m search report",
                                     description="Write report.html and report/*.png of a search's run folder.")
    parser.add_argument("run", help="the run folder, e.g. runs/mnist-20261130-101500")
    args = parser.parse_args(argv)
    # pandas, matplotlib, torch and Ray: only for `report`; the CLI's other commands must not load them
    import pandas as pd

    from search.outputs.report import kept_summary, redrawn_summary, write_report
    from search.outputs.runs import best_result
    from search.store.results import RESULTS_FILE
    from search.store.run_folder import NotARunFolder, open_run
    from search.store.storage import LinkError

    try:
        folder = open_run(args.run)
        space, _ = folder.read_spec("RUN")
        frame = pd.read_parquet(f"{folder.path}/{RESULTS_FILE}")
    except (ConfigError, NotARunFolder) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as error:
        print(f"error: {folder.path}: no readable {RESULTS_FILE} ({error})", file=sys.stderr)
        return 2
    best = best_result(folder)  # {}: no best.yaml, or a damaged one: no trial marked
    # the search's own summary, kept; the figures are what is drawn again
    summary = kept_summary(folder) or redrawn_summary(frame, space, best)
    try:
        print(write_report(folder, space, frame, best.get("trial_id"), summary))
    except LinkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def export_main(argv: Sequence[str]) -> int:
    """`python -m search export RUN_FOLDER`: the best (or a chosen) trial's model, ready for inference."""
    from search.outputs.export import FORMATS  # torch and Ray: only for `export`

    parser = argparse.ArgumentParser(prog="python -m search export",
                                     description="Write the model of best.yaml's checkpoint (or of --trial N's best "
                                                 "epoch) with its config, ready for inference (docs/outputs.md).")
    parser.add_argument("run", help="the run folder, e.g. runs/mnist-20261130-101500")
    parser.add_argument("--trial", type=int, metavar="N", help="the trial_number to export (default: best.yaml's)")
    parser.add_argument("--format", dest="fmt", default=None, choices=list(FORMATS),
                        help="state_dict (torch.load), torchscript (torch.jit.load; the default for the canonical "
                             "loop), pt2 (torch.export.load, no deprecated call) or onnx (pip install -e "
                             "'.[export]'); a run of your own training function: state_dict (its default)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="where to write it (default: <run name>-best<ending> in the current folder)")
    args = parser.parse_args(argv)
    # torch and Ray: only for `export`, once its flags parsed
    from search.outputs.export import describe, export
    from search.store.run_folder import NotARunFolder

    try:
        path, chosen = export(args.run, trial=args.trial, fmt=args.fmt, output=args.output)
    except (ConfigError, NotARunFolder) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(describe(path, args.fmt, chosen, chosen.folder.read_spec("RUN")[0].experiment.metric))
    return 0


def check_main(argv: Sequence[str]) -> int:
    """`python -m search check --space FILE`: every check a search makes before its first trial, then the spec."""
    args = parse_args(argv, prog="python -m search check",
                      description="Check a space file as a search would before its first trial (the file, the "
                                  "storage path, user code, the data, the model on two inputs, this machine's "
                                  "capacity) without starting Ray; print the resolved spec. Exit 0 or 2.")
    try:
        space = load_space(args.space, assignments(args))
        check_name(args)  # as the search itself refuses it
    except ConfigError as error:  # in a second: neither torch nor Ray is imported yet, unless the file names code
        print(f"error: {error}", file=sys.stderr)
        return 2
    # torch and Ray's modules: only once the space file passed (a bad file fails in a second)
    from search.execution.capacity import CapacityError
    from search.execution.preflight import check_space

    try:
        print(check_space(space, address=args.address), end="")
    except (ConfigError, DataError, CapacityError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def with_code_problems(error: ConfigError, raw: dict[str, Any], path: str) -> ConfigError:
    """The space file's problems and, in the same answer, those of the code it names (search/definition/user_code.py):
    a key the file's own check already faulted is not said twice."""
    from search.definition.user_code import code_problems

    said = {line.split(":", 1)[0] for line in error.problems}
    more = [line for line in code_problems(raw, Path(path).resolve().parent) if line.split(":", 1)[0] not in said]
    return ConfigError(error.problems + more, error.source) if more else error


def check_name(args: argparse.Namespace) -> None:
    """--name must be a run folder's name (search/definition/schema.py run_name_problem); ConfigError if not."""
    if args.name is not None and (wrong := run_name_problem(args.name)):
        raise ConfigError([wrong])


def resume_assignments(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The overrides of a search; a --resume may change only search/searching/budget.py's RESUME_KEYS (and where
    the run is), and --more-trials N adds N to the run's stored experiment.num_samples (to the trials it
    holds where a budget or a target ended it: search/searching/budget.py more_trials_base)."""
    pairs = assignments(args)
    if not args.resume:
        if args.more_trials is not None:
            raise ConfigError([problem("--more-trials", "needs --resume (a new run sets experiment.num_samples)",
                                       args.more_trials)])
        return pairs
    # Ray and torch: only for a --resume, once the space file passed
    from search.searching.budget import LOCATION_KEYS, RESUME_KEYS, more_trials_base

    refused = [problem(f"--set {key}", f"a --resume runs the run's spec.yaml and may change only "
                                       f"{', '.join(RESUME_KEYS)}; start a new run to change {key}", value)
               for key, value in pairs if key not in RESUME_KEYS + LOCATION_KEYS]
    if refused:
        raise ConfigError(refused)
    if args.more_trials is not None:
        if args.more_trials < 1:
            raise ConfigError([problem("--more-trials", "must be an integer >= 1", args.more_trials)])
        pairs.append(("experiment.num_samples", more_trials_base(load_space(args.space, pairs), args.name)
                      + args.more_trials))
    return pairs


def runs_main(argv: Sequence[str]) -> int:
    """`python -m search runs`: the runs in a storage, read from their folders (search/outputs/runs.py)."""
    parser = argparse.ArgumentParser(prog="python -m search runs",
                                     description="List the runs in a storage: name, state (running, finished, "
                                                 "interrupted, ended by budget, target reached, failed), trials done/total, best "
                                                 "value, when its last trial ended (docs/runs.md).")
    # the storage as a positional too: `runs runs/` as `ls runs/` (argparse called it an unrecognized argument)
    parser.add_argument("storage", nargs="?", metavar="STORAGE", help="the storage, as --storage-path says it")
    parser.add_argument("--storage-path", help="the storage (default: ./runs)")
    args = parser.parse_args(argv)
    if args.storage and args.storage_path and args.storage != args.storage_path:
        print(f"error: {problem('--storage-path', f'names the storage once: the positional says {args.storage}', args.storage_path)}",
              file=sys.stderr)
        return 2
    key = "STORAGE" if args.storage else "--storage-path"  # what the messages below name: what the user wrote
    args.storage_path = args.storage or args.storage_path or "./runs"
    # torch, Ray and pyarrow: only for `runs`
    from search.outputs.runs import format_runs, list_runs
    from search.store.storage import Storage, is_uri

    storage = Storage.at(args.storage_path)
    if not is_uri(storage.uri) and os.path.exists(storage.uri) and not os.path.isdir(storage.uri):
        print(f"error: {problem(key, 'must be a folder of runs, and this is a file', args.storage_path)}",
              file=sys.stderr)
        return 2
    try:
        runs = list_runs(storage)
    except OSError as error:  # a URI that names a file, an unreachable bucket
        print(f"error: {problem(key, f'must be a folder of runs ({error})', args.storage_path)}",
              file=sys.stderr)
        return 2
    print(format_runs(runs, args.storage_path))
    return 0


def compare_main(argv: Sequence[str]) -> int:
    """`python -m search compare A B`: two runs' spec differences and best trials side by side."""
    parser = argparse.ArgumentParser(prog="python -m search compare",
                                     description="Two runs' spec differences and best trials side by side "
                                                 "(docs/runs.md).")
    parser.add_argument("runs", nargs=2, metavar="RUN", help="run folders, e.g. runs/mnist-20261130-101500")
    args = parser.parse_args(argv)
    # torch and Ray: only for `compare`
    from search.outputs.runs import compare
    from search.store.run_folder import NotARunFolder, open_run

    try:
        print(compare(*(open_run(run) for run in args.runs)))
    except (ConfigError, NotARunFolder) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None, started: float | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    commands = {"report": report_main, "check": check_main, "export": export_main, "runs": runs_main,
                "compare": compare_main}
    if argv[:1] and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    with start_up():  # Python's cyclic collector off until the trials begin (search/execution/collector.py)
        return search_main(argv, started)


def search_main(argv: list[str], started: float | None) -> int:
    """`python -m search --space FILE ...`: the search, its summary printed; the exit code."""
    args = parse_args(argv)
    try:
        space = load_space(args.space, resume_assignments(args))
        # pyarrow: only once the space file passed (a bad one fails in a second)
        from search.store.storage import Storage, check_storage

        check_name(args)

        # before a local Ray begins to start
        check_storage(Storage.at(space.experiment.storage_path), space.experiment.min_free_mb)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # SIGTERM (a scheduler, `kill`) stops the search as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda signum, frame: signal.raise_signal(signal.SIGINT))
    # imported only now: a bad file should fail in a second, without loading torch or Ray
    from search.execution.capacity import CapacityError
    from search.execution.progress import quiet_progress
    from search.execution.session import EarlyRay, quiet

    quiet(args.verbose)  # before Ray starts: Ray's and Tune's misleading hints stay unsaid

    early_ray = EarlyRay()
    if args.address is None and "RAY_ADDRESS" not in os.environ:
        defaults = space.trial_defaults()
        # FILE.py:NAME, module:NAME: the user's code runs before Ray starts, so an error in it costs seconds;
        # a --resume of a finished run starts no Ray at all
        if args.resume or space.kind.runs_user_code(defaults):
            early_ray.begin_after_checks()
        else:  # built-ins only: Ray comes up while the driver imports torch and loads the data
            early_ray.begin()
    try:
        # torch, Ray and pandas: the driver, only once the checks before Ray passed
        from search.driver import run_search
        from search.outputs.finish import NO_SUCCESS_EXIT

        with quiet_progress(args.quiet):
            outcome = run_search(space, name=args.name, address=args.address, resume=args.resume,
                                 early_ray=early_ray, started=started)
    except (ConfigError, CapacityError, DataError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before Tune started, or a second Ctrl-C (Tune handles the first)
        print("interrupted", file=sys.stderr)
        return 130
    except DiskFull as error:
        print(f"error: {error}", file=sys.stderr)
        return 130
    finally:
        early_ray.abandon()  # the search stopped before it took the local Ray over
    print(outcome.summary, flush=True)
    if outcome.interrupted:
        return 130
    return 0 if outcome.succeeded else NO_SUCCESS_EXIT


def run() -> None:
    """The command's entry point: main(), then exit with its code, at once.

    Python's own exit would wait for any non-daemon thread that user code left running (a
    dataset function, a model), and then spends seconds tearing down torch's and Ray's native
    state, after everything is written; a stopped search must end in seconds. So the exit
    handlers run and the process ends here.
    """
    started = command_start()  # the summary's wall time is the command's, from the process's start
    try:
        code = main(started=started)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except KeyboardInterrupt:  # a Ctrl-C outside the search's own handling (it says how a search stopped)
        code = 130
    except BaseException:  # a bug of ours: said with its traceback, and still no wait on user threads
        traceback.print_exc()
        code = 1
    left = [t.name for t in threading.enumerate()
            if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if left:
        print(f"note: exiting although user code left {len(left)} thread(s) running ({', '.join(left[:5])})",
              file=sys.stderr, flush=True)
    atexit._run_exitfuncs()  # what was registered (logging's flush, user code's) still runs
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
