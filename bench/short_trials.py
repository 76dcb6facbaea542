"""Short trials, 2 at a time: are both slots busy? hpsearch against plain Optuna n_jobs=2 and plain Tune, side by side.

The new user's task of issue 38: a tiny MLP regression on a synthetic problem, 20 trials x 40
epochs of a few tens of milliseconds (trials of 1-3 s), 2 at a time. One function,
`train(config, report, checkpoint=None)` (trainable/function.py's contract), written into a
temporary folder, runs on every side:

- service: `python -m search --space space.yaml --quiet` (`trainable: mlp.py:train`, the
  reproducible searcher, max_concurrent 2; `--shapes` picks fifo, asha, asha-free);
- optuna: a plain script, `study.optimize(objective, n_trials=20, n_jobs=2)` with a seeded TPE,
  the objective calling the same function with a `report` that keeps the values; `optuna-sha`: the same
  with Optuna's SuccessiveHalvingPruner (min_resource 1, reduction_factor 2: hpsearch's asha defaults),
  the `report` calling trial.report and raising TrialPruned where it says so: the asha shapes' peer
  among thread-based searches, whose hand-over between two trials costs next to nothing;
- tune: a plain Ray Tune script, a Tuner over the same function (a `report` that is tune.report)
  with OptunaSearch (the same seeded TPE) behind a ConcurrencyLimiter of 2, reuse_actors, 1 CPU a
  trial, Tune's default loggers, as the Ray docs show it; `tune-asha`: the same with Tune's
  ASHAScheduler (grace_period 1, reduction_factor 2: hpsearch's defaults), the peer of the asha shapes.

Each side is a subprocess timed from outside (its imports included); the sides alternate which
runs first, round by round. Printed per side: the whole command's wall, the trials' span (the
first epoch's start to the last report) and the share of that span during which two trials
were running (from each trial's first epoch start and last report: results.parquet's
finished_at and epoch_seconds for the service, the same times kept by the other sides), that share
split at the last trial's start (before it a trial always waited for a slot, so an idle slot was a
hand-over; after it none was left to start, so an idle slot is the search's end, its last trials
running alone), then each side's ratio to plain Optuna. The canonical loop is not a side: it trains a model.factory model
on a data.dataset, not this function (bench/default_search.py compares it with plain Optuna on MNIST).

The service runs in three shapes by default (issue 49 item 3: an ASHA search of this size ran one trial
at a time): `fifo`, `asha` (reproducible) and `asha-free` (`experiment.reproducible: false`, Ray's own
ASHA and OptunaSearch); the other sides run once a round, and plain Optuna (no pruner: what a user who
writes a plain loop gets) is every shape's reference.

    .venv/bin/python bench/short_trials.py [--rounds 2] [--trials 20] [--epochs 40]
        [--shapes fifo asha asha-free] [--lag 2] [--sides service optuna optuna-sha tune tune-asha] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the project's packages

from search.outputs.summary import busy_share, trial_spans  # noqa: E402  (the summary's own Slots: figure)

SLOTS = 2


def before_and_after_last_start(spans: list[tuple[float, float]], slots: int) -> tuple[float, float]:
    """The share of the span before the last trial's start during which `slots` trials ran (a trial was always
    waiting for a slot then: an idle slot is the service's hand-over), and the share of the whole span after it
    with a slot idle (no trial was left to start: the search's own end, as when its last trial runs alone)."""
    first, last_start = min(s for s, _ in spans), max(s for s, _ in spans)
    clipped = [(s, min(e, last_start)) for s, e in spans if s < last_start]
    before = math.prod(busy_share(clipped, slots)) if clipped else 0.0  # seconds with `slots` running
    whole, share = busy_share(spans, slots)
    idle_after = whole * (1 - share) - ((last_start - first) - before)
    return before / (last_start - first) if last_start > first else 1.0, idle_after / whole if whole > 0 else 0.0
MLP = '''
import torch


def train(config, report, checkpoint=None):
    generator = torch.Generator().manual_seed(1234)  # one problem for every trial
    x = torch.randn(2048, 16, generator=generator)
    y = (x[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(2048, 1, generator=generator)).tanh()
    torch.manual_seed(config["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(16, config["hidden"]), torch.nn.ReLU(), torch.nn.Linear(config["hidden"], 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    for epoch in range(config["epochs"]):
        for i in range(0, 1536, 64):
            loss = torch.nn.functional.mse_loss(model(x[i:i + 64]), y[i:i + 64])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = torch.nn.functional.mse_loss(model(x[1536:]), y[1536:]).item()
        report(val_loss=val_loss)
'''
OPTUNA = '''
import json, sys, time
import optuna
sys.path.insert(0, sys.argv[1])
from mlp import train

optuna.logging.set_verbosity(optuna.logging.WARNING)
spans = []


def objective(trial):
    config = {"lr": trial.suggest_float("lr", 1e-3, 0.3, log=True), "hidden": trial.suggest_categorical("hidden", [16, 32, 64]),
              "epochs": int(sys.argv[3]), "seed": trial.number}
    values, started = [], time.time()

    def report(val_loss):
        values.append(val_loss)
        trial.report(val_loss, len(values))
        if trial.should_prune():
            raise optuna.TrialPruned()

    try:
        train(config, report)
    finally:
        spans.append((started, time.time()))
    return min(values)


# sha: Optuna's asynchronous successive halving with hpsearch's asha defaults (min_resource 1, reduction_factor 2)
pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=2) if sys.argv[5] == "sha" else None
study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=0), pruner=pruner)
study.optimize(objective, n_trials=int(sys.argv[2]), n_jobs=2)
json.dump({"spans": spans, "best": min(min(t.intermediate_values.values()) for t in study.trials)}, open(sys.argv[4], "w"))
'''

TUNE = '''
import json, sys, time
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch
import optuna

folder, trials, epochs, out, scheduler = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]


def trial(config):
    sys.path.insert(0, folder)
    from mlp import train

    started = time.time()
    train({**config, "epochs": epochs}, lambda **m: tune.report({**m, "started": started, "now": time.time()}))


ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=2)
try:
    search = OptunaSearch(sampler=optuna.samplers.TPESampler(seed=0))
    grid = tune.Tuner(
        tune.with_resources(trial, {"cpu": 1}),
        param_space={"lr": tune.loguniform(1e-3, 0.3), "hidden": tune.choice([16, 32, 64]), "seed": 0},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", num_samples=trials, reuse_actors=True,
                                    search_alg=ConcurrencyLimiter(search, max_concurrent=2),
                                    # hpsearch's asha defaults: grace_period 1, reduction_factor 2, max_t the epochs
                                    scheduler=ASHAScheduler(time_attr="training_iteration", max_t=epochs, grace_period=1,
                                                            reduction_factor=2) if scheduler == "asha" else None),
        run_config=tune.RunConfig(name="plain", storage_path=folder + "/tune", verbose=0),
    ).fit()
    frames = [r.metrics_dataframe for r in grid]
    spans = [(float(f["started"].iloc[0]), float(f["now"].iloc[-1])) for f in frames]
    json.dump({"spans": spans, "best": min(float(f["val_loss"].min()) for f in frames)}, open(out, "w"))
finally:
    ray.shutdown()
'''


def service(folder: Path, trials: int, epochs: int, scheduler: str, experiment: dict, name: str = "short") -> dict:
    import pandas as pd
    import yaml

    space = {
        "trainable": "mlp.py:train",
        "experiment": {"name": "short", "metric": "val_loss", "mode": "min", "num_samples": trials,
                       "max_concurrent": SLOTS, "seed": 0, "scheduler": scheduler,
                       "storage_path": str(folder / "runs"), **experiment},
        "resources": {"cpus": 1},
        "training": {"epochs": epochs},
        "space": {"lr": {"distribution": "float", "low": 1e-3, "high": 0.3, "log": True},
                  "hidden": {"distribution": "choice", "values": [16, 32, 64]}},
    }
    (folder / "space.yaml").write_text(yaml.safe_dump(space))
    log = folder / "service.log"
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run([sys.executable, "-m", "search", "--space", str(folder / "space.yaml"), "--name", name,
                               "--quiet"], cwd=REPO, stdout=handle, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"the service failed (exit {code}); see {log}:\n{log.read_text()[-3000:]}")
    frame = pd.read_parquet(folder / "runs" / name / "results.parquet")
    spans = trial_spans(frame)
    summary = [line for line in log.read_text().splitlines() if line.startswith("Slots:") or "waited" in line]
    return {"wall": wall, "spans": spans, "best": float(frame["val_loss"].min()), "lines": summary}


def optuna_side(folder: Path, trials: int, epochs: int, pruner: str = "none") -> dict:
    (folder / "objective.py").write_text(OPTUNA)
    out = folder / "optuna.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, str(folder / "objective.py"), str(folder), str(trials), str(epochs), str(out),
                    pruner], cwd=folder, check=True)
    wall = time.perf_counter() - started
    measured = json.loads(out.read_text())
    return {"wall": wall, "spans": measured["spans"], "best": measured["best"], "lines": []}


def tune_side(folder: Path, trials: int, epochs: int, scheduler: str = "fifo") -> dict:
    (folder / "plain_tune.py").write_text(TUNE)
    out = folder / "tune.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, str(folder / "plain_tune.py"), str(folder), str(trials), str(epochs), str(out),
                    scheduler],
                   cwd=folder, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    measured = json.loads(out.read_text())
    return {"wall": wall, "spans": measured["spans"], "best": measured["best"], "lines": []}


#: the service's shapes: (experiment.scheduler, experiment.reproducible)
SHAPES = {"fifo": ("fifo", True), "asha": ("asha", True), "asha-free": ("asha", False)}
SIDES = {"service": "hpsearch (`python -m search`)", "optuna": "plain Optuna n_jobs=2",
         "optuna-sha": "plain Optuna n_jobs=2 + SuccessiveHalvingPruner",
         "tune": "plain Ray Tune + OptunaSearch", "tune-asha": "plain Ray Tune + OptunaSearch + ASHAScheduler"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--shapes", nargs="+", choices=tuple(SHAPES), default=list(SHAPES),
                        help="the service's scheduler and reproducibility, each a row")
    parser.add_argument("--lag", type=int, help="the service's experiment.lag (default: max_concurrent - 1)")
    parser.add_argument("--sides", nargs="+", choices=tuple(SIDES), default=["service", "optuna"],
                        help="which sides run (tune, tune-asha: plain Tune without and with its ASHAScheduler; "
                             "optuna-sha: plain Optuna with its SuccessiveHalvingPruner)")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if "optuna" not in args.sides:
        parser.error("--sides: the ratios are to plain Optuna, so it runs")
    root = Path(tempfile.mkdtemp(prefix="hpsearch-short-"))
    rows = [f"service {shape}" for shape in args.shapes] if "service" in args.sides else []
    runs: dict[str, list[dict]] = {row: [] for row in [*rows, *(side for side in SIDES if side in args.sides
                                                                  and side != "service")]}
    try:
        for r in range(args.rounds):
            folder = root / f"round-{r + 1}"
            folder.mkdir()
            (folder / "mlp.py").write_text(MLP)
            order = list(runs) if r % 2 == 0 else list(reversed(runs))  # which runs first alternates
            for side in order:
                if side.startswith("service "):
                    scheduler, reproducible = SHAPES[side.split(" ", 1)[1]]
                    experiment = {**({"lag": args.lag} if args.lag is not None else {}), "reproducible": reproducible}
                    runs[side].append(service(folder, args.trials, args.epochs, scheduler, experiment,
                                              name=side.replace(" ", "-")))
                else:
                    runs[side].append(optuna_side(folder, args.trials, args.epochs,
                                                  "sha" if side == "optuna-sha" else "none")
                                      if side.startswith("optuna") else tune_side(folder, args.trials, args.epochs,
                                                     "asha" if side == "tune-asha" else "fifo"))
            for side in runs:
                run = runs[side][-1]
                span, share = busy_share(run["spans"], SLOTS)
                trial = statistics.mean(e - s for s, e in run["spans"])
                waiting, end = before_and_after_last_start(run["spans"], SLOTS)
                print(f"round {r + 1} {side}: wall {run['wall']:.1f} s, trials' span {span:.1f} s, two running "
                      f"{100 * share:.0f}% of it ({100 * waiting:.0f}% before the last trial's start; after it "
                      f"{100 * end:.0f}% of the span with a slot idle), mean trial {trial:.2f} s, best val_loss "
                      f"{run['best']:.4f}", flush=True)
                for line in run["lines"]:
                    print(f"      {line.strip()}")
    finally:
        if args.keep:
            print(f"kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    walls = {side: statistics.median(r["wall"] for r in runs[side]) for side in runs}
    shares = {side: statistics.median(busy_share(r["spans"], SLOTS)[1] for r in runs[side]) for side in runs}
    waits = {side: statistics.median(before_and_after_last_start(r["spans"], SLOTS)[0] for r in runs[side])
             for side in runs}
    ends = {side: statistics.median(before_and_after_last_start(r["spans"], SLOTS)[1] for r in runs[side])
            for side in runs}
    print(f"\n{args.trials} trials x {args.epochs} epochs, {SLOTS} at a time, medians of {args.rounds} round(s):")
    print("| | whole command | / plain Optuna | two trials running (share of the trials' span) | two running before "
          "the last trial's start | the end: a slot idle, no trial left to start |\n|---|---:|---:|---:|---:|---:|")
    for side in runs:
        shape = side.split(" ", 1)[1] if side.startswith("service ") else None
        name = f"{SIDES['service']}, {shape}" if shape else SIDES[side]
        goal = " (goal <= 2x)" if shape else ""
        share_goal = " (goal >= 85%)" if shape else ""
        print(f"| {name} | {walls[side]:.1f} s | {walls[side] / walls['optuna']:.2f}x{goal} | "
              f"{100 * shares[side]:.0f}%{share_goal} | {100 * waits[side]:.0f}% | {100 * ends[side]:.0f}% of the span |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
