"""The default search against plain Optuna with n_jobs=2, on the same loop and space, side by side.

Both sides run spaces/mnist.yaml as shipped: 16 trials x 5 epochs of the canonical loop (the MLP
(128,), SGD, the cosine schedule, MNIST 50,000 / 10,000 in memory), 2 at a time, each trial on
one torch thread, TPE seeded with 0 over lr, batch_size, t_max and clip_norm:

- service: `python -m search --space spaces/mnist.yaml` (Ray Tune, trial actors, checkpoints,
  results.parquet, best.yaml with test accuracy, the report, the journal);
- optuna: this file with --optuna, a plain Optuna script: `study.optimize(objective, n_trials=16,
  n_jobs=2)`, two threads of one process, each trial calling trainable.loop's build_run and
  train_and_evaluate on the data loaded once, no checkpoints and no files.

Each side is a subprocess timed from outside (Python's start and imports included). Printed per
round: both wall times, each side's floor (its trials' training and validation seconds, summed
over trials, over the 2 slots: what the command would take with nothing else to do), wall /
floor, optuna / service, both best val_acc, the service's phases (timing.yaml), and each side's
busy core-seconds with the same work packed on every core (bench/commands.py): what bounds it.
Goals (issue 21): service wall <= 1.15x its floor, optuna / service >= 1.3x.

    .venv/bin/python bench/default_search.py --data-root DIR [--rounds 1] [--keep]

The sides alternate, the order flipping every round. The exit code is 0 whenever both sides ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)  # else bench/search.py hides the search package
from bench.commands import cores, import_core_seconds, least_work, timed  # noqa: E402

SPACE_FILE = REPO / "spaces" / "mnist.yaml"
SEED = 0


def optuna_side(data_root: str, out: str) -> None:
    """The plain Optuna side (runs in its own process): the space file's trial defaults and searched keys."""
    import optuna
    import torch

    from search.cli import load_space
    from trainable.config import TrialConfig
    from trainable.data import load_data
    from trainable.loop import build_run, train_and_evaluate

    space = load_space(str(SPACE_FILE), [("data.root", data_root)])
    fixed = space.trial_defaults().to_flat()
    data = load_data(space.trial_defaults(), data_root, with_test=False)
    epoch_seconds: list[float] = []

    def objective(trial: optuna.Trial) -> float:
        drawn: dict = {}
        for d in space.searched:
            if d.holds(drawn):
                drawn[d.name] = d.ask(trial)
        config = TrialConfig.from_mapping({**fixed, **drawn, "seed": SEED + trial.number, "num_threads": 1})
        best = 0.0
        for record in train_and_evaluate(build_run(config, data, torch.device("cpu"))):
            epoch_seconds.append(record.epoch_seconds)
            best = max(best, record.val_acc)
            trial.report(record.val_acc, record.epoch)
        return best

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=SEED))
    study.optimize(objective, n_trials=space.experiment.num_samples, n_jobs=space.experiment.max_concurrent)
    Path(out).write_text(json.dumps({"best_val_acc": study.best_value, "epoch_seconds": epoch_seconds,
                                     "slots": space.experiment.max_concurrent}))


def run_service(folder: Path, data_root: str) -> dict:
    import pandas as pd
    import yaml

    command = timed([sys.executable, "-m", "search", "--space", str(SPACE_FILE), "--storage-path", str(folder),
                     "--name", "service", "--data-root", data_root], folder / "service.log")
    run = folder / "service"
    frame = pd.read_parquet(run / "results.parquet")
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    timing = yaml.safe_load((run / "timing.yaml").read_text())
    return {"wall": command.wall_s, "run": command,
            "training": float(frame["epoch_seconds"].sum()),
            "slots": spec["experiment"]["max_concurrent"], "best": float(frame["val_acc"].max()),
            "phases": timing["phases"]}


def run_optuna(folder: Path, data_root: str) -> dict:
    out = folder / "optuna.json"
    command = timed([sys.executable, __file__, "--optuna", "--data-root", data_root, "--out", str(out)],
                    folder / "optuna.log")
    measured = json.loads(out.read_text())
    return {"wall": command.wall_s, "run": command,
            "training": sum(measured["epoch_seconds"]), "slots": measured["slots"],
            "best": measured["best_val_acc"], "phases": {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("HPSEARCH_DATA"),
                        help="folder holding MNIST/raw (default: $HPSEARCH_DATA)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each side, alternating")
    parser.add_argument("--keep", action="store_true", help="keep the run folders and logs (printed)")
    parser.add_argument("--optuna", action="store_true", help=argparse.SUPPRESS)  # internal: the optuna side
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.data_root:
        parser.error("--data-root (or HPSEARCH_DATA) must name a folder holding MNIST/raw")
    data_root = str(Path(args.data_root).expanduser().resolve())
    if args.optuna:
        optuna_side(data_root, args.out)
        return 0

    base = Path(tempfile.mkdtemp(prefix="hpsearch-default-"))
    # what every new process of the service pays before its first step: the driver once, each trial actor once
    trial_imports = import_core_seconds("trainable.adapter")
    print(f"a new process importing a trial's modules (trainable.adapter): {trial_imports:.1f} core-s", flush=True)
    rows = []
    try:
        for round_ in range(1, args.rounds + 1):
            folder = base / f"round{round_}"
            folder.mkdir()
            order = ["service", "optuna"] if round_ % 2 else ["optuna", "service"]
            measured = {}
            for side in order:
                print(f"round {round_}: {side} ...", flush=True)
                measured[side] = (run_service if side == "service" else run_optuna)(folder, data_root)
                m = measured[side]
                print(f"  {m['wall']:.1f} s, floor {m['training'] / m['slots']:.1f} s, best val_acc {m['best']:.4f}, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                if m["run"].busy_core_s is not None:
                    print(m["run"].cpu_lines())
                if m["phases"]:
                    print("  phases: " + ", ".join(f"{k} {v:.1f}" for k, v in m["phases"].items()) + " s")
            rows.append(measured)
    finally:
        if args.keep:
            print(f"run folders and logs: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)

    def median(side: str, value) -> float:
        return statistics.median(value(row[side]) for row in rows)

    print(f"\n16 trials x 5 epochs, 2 at a time (spaces/mnist.yaml); wall = the whole command; "
          f"floor = training and validation seconds / slots; medians of {len(rows)} round(s)")
    print("| | wall | floor | wall / floor | busy core-s | packed | best val_acc |\n|---|---:|---:|---:|---:|---:|---:|")
    for side in ("service", "optuna"):
        busy = median(side, lambda m: m["run"].busy_core_s or 0.0)
        print(f"| {side} | {median(side, lambda m: m['wall']):.1f} s | "
              f"{median(side, lambda m: m['training'] / m['slots']):.1f} s | "
              f"{median(side, lambda m: m['wall'] * m['slots'] / m['training']):.2f}x | "
              f"{busy:.1f} | {busy / cores():.1f} s | {median(side, lambda m: m['best']):.4f} |")
    ratio = statistics.median(row["optuna"]["wall"] / row["service"]["wall"] for row in rows)
    over = median("service", lambda m: m["wall"] * m["slots"] / m["training"])
    print(f"service wall / floor <= 1.15x: {'met' if over <= 1.15 else 'MISSED'} ({over:.2f}x)")
    print(f"optuna / service >= 1.3x: {'met' if ratio >= 1.3 else 'MISSED'} ({ratio:.2f}x)")
    # what bounds the goals: what the service cannot do without (its trial actors' imports and training, the
    # driver's imports, Ray's own processes), packed on every core, against the wall times the goals allow
    slots = rows[0]["service"]["slots"]
    kinds = dict.fromkeys(kind for row in rows for kind in row["service"]["run"].processes)
    processes = {kind: median("service", lambda m: m["run"].processes.get(kind, 0.0)) for kind in kinds}  # noqa: B023 (called here)
    for goal, wanted in (("wall <= 1.15x floor", 1.15 * median("service", lambda m: m["training"]) / slots),
                         ("optuna / service >= 1.3x", median("optuna", lambda m: m["wall"]) / 1.3)):
        print(f"{goal} needs {wanted:.1f} s;\n{least_work(processes, trial_imports, wanted)}")
    phases = {name: statistics.median(row["service"]["phases"].get(name, 0.0) for row in rows)
              for name in rows[0]["service"]["phases"]}
    print("service phases (median s): " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    for side in ("service", "optuna"):
        kinds = dict.fromkeys(kind for row in rows for kind in row[side]["run"].processes)
        print(f"{side} CPU by process (median s): "
              + ", ".join(f"{kind} {median(side, lambda m: m['run'].processes.get(kind, 0.0)):.1f}" for kind in kinds))  # noqa: B023
    return 0


if __name__ == "__main__":
    sys.exit(main())
