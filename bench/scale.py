"""Thousands of small trials: the service's cost per trial against plain Ray Tune, side by side.

Both sides run N trials, 2 at a time with 1 CPU each, of the same near-empty work: build
the MLP (64,), train one step on 64 MNIST images, validate on 64, checkpoint, report once.
What is left is orchestration: the searcher, Tune, actors, checkpoints, results.

- service: `python -m search` on a space of that size (OrderedSearch over lr, batch_size,
  t_max, clip_norm; Tune's default snapshots; results.parquet parts);
- plain: this file with --plain: a Tune + OptunaSearch (seeded TPE) script in the style of
  Ray's docs, calling the same trainable.loop functions, every checkpoint kept, Tune's
  default snapshots.

Neither side writes TensorBoard event files (the service: `experiment.loggers: []`; plain Tune:
TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1, its CSV and JSON loggers given), so both write the same
trial files of Tune's.

Each side is a subprocess; the sides alternate which runs first, per N and per round, so
machine noise falls on both; with --rounds R every N runs R times and the tables give medians
(one run's plain side swings between about 19 and 38 ms a trial on these machines). Cost per trial = the span
from the first trial's start to the last trial's
report, over N (start-up and the end of the search excluded; the start-up comparison is
bench/search.py's). Printed per N: ms per trial for each side, their ratio, and for the service
the growth exponent of its span against N (1.0: flat cost per trial) and where its slot time
went (results.parquet's phase columns, ms per trial). Also the whole command's cost per trial
(its wall time from outside, start-up and end included, over N) for both sides, and the service's
end (timing.yaml: results, test, report and what was left of Ray's shutdown) with its growth.

    .venv/bin/python bench/scale.py --data-root DIR [--sizes 100 1000] [--rounds 3] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)  # else bench/search.py hides the search package from the plain side
from search.outputs.summary import PHASES as SUMMARY_PHASES  # noqa: E402  (after the sys.path fix above)

SLOTS = 2
SPACE = {
    "experiment": {"name": "scale", "max_concurrent": SLOTS, "seed": 0, "max_failures": 0, "loggers": []},
    "resources": {"cpus": 1},
    "data": {"dataset": "mnist", "train_size": 64, "val_size": 64},
    "model": {"factory": "mlp", "hidden_sizes": [64]},
    "training": {"epochs": 1, "batch_size": 64},
    "space": {
        "lr": {"distribution": "loguniform", "low": 0.01, "high": 0.3},
        "momentum": {"distribution": "uniform", "low": 0.5, "high": 0.99},
        "t_max": {"distribution": "randint", "low": 2, "high": 10},
        "clip_norm": {"distribution": "loguniform", "low": 0.5, "high": 10.0},
    },
}
# where the service's time goes: results.parquet's phase columns (search/outputs/summary.py names them)
PHASES = list(SUMMARY_PHASES)
WORK = ["setup_seconds", "train_seconds", "evaluate_seconds", "checkpoint_seconds"]  # the trial's own
END_PHASES = ["results", "test", "report", "shutdown"]  # the end of a search, in timing.yaml (search/outputs/phases.py)


def plain(n: int, data_root: str, storage: str, out: str) -> None:
    """The plain Tune side (runs in its own process)."""
    import ray
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from search.searching.ordered import make_sampler
    from trainable.config import TrialConfig
    from trainable.data import load_data
    from trainable.loop import build_run, train_and_evaluate
    from trainable.report import save_checkpoint

    fixed = TrialConfig.from_mapping({"train_size": 64, "val_size": 64, "batch_size": 64, "epochs": 1,
                                      "model.factory": "mlp", "model.hidden_sizes": [64], "num_threads": 1})
    data = load_data(fixed, data_root)

    def trial(config, data=None):
        started = time.time()
        run = build_run(TrialConfig.from_mapping({**fixed.to_flat(), **config}), data, torch_cpu())
        for record in train_and_evaluate(run):
            with tempfile.TemporaryDirectory() as folder:
                save_checkpoint(folder, run.config, run.input_shape, run.num_classes, run.state_dict())
                tune.report({"val_acc": record.val_acc, "started_at": started, "finished_at": time.time()},
                            checkpoint=tune.Checkpoint.from_directory(folder))

    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"  # no TensorBoard logger, as the service's loggers: []
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        space = {"lr": tune.loguniform(0.01, 0.3), "momentum": tune.uniform(0.5, 0.99),
                 "t_max": tune.randint(2, 11), "clip_norm": tune.loguniform(0.5, 10.0)}
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(trial, data=data), {"cpu": 1}),
            param_space=space,
            tune_config=tune.TuneConfig(metric="val_acc", mode="max", num_samples=n, reuse_actors=True,
                                        search_alg=ConcurrencyLimiter(OptunaSearch(sampler=make_sampler("tpe", 0, 0)),
                                                                      max_concurrent=SLOTS)),
            run_config=tune.RunConfig(name="plain", storage_path=storage, verbose=0,
                                      callbacks=[CSVLoggerCallback(), JsonLoggerCallback()]),
        )
        grid = tuner.fit()
        frame = grid.get_dataframe()
        Path(out).write_text(json.dumps({"started_at": frame["started_at"].tolist(),
                                         "finished_at": frame["finished_at"].tolist(), "errors": len(grid.errors)}))
    finally:
        ray.shutdown()


def torch_cpu():
    import torch

    return torch.device("cpu")


def run_side(side: str, n: int, data_root: str, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{side}-{n}.log"
    if side == "service":
        import yaml

        space = json.loads(json.dumps(SPACE))
        space["experiment"].update(num_samples=n, storage_path=str(folder / "runs"))
        space["data"]["root"] = data_root
        space_file = folder / f"space-{n}.yaml"
        space_file.write_text(yaml.safe_dump(space))
        command = [sys.executable, "-m", "search", "--space", str(space_file), "--name", f"service-{n}"]
    else:
        out = folder / f"plain-{n}.json"
        command = [sys.executable, __file__, "--plain", str(n), "--data-root", data_root,
                   "--storage-path", str(folder / "plain"), "--out", str(out)]
    start = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{side} at N={n} failed (exit {code}); see {log}")
    if side == "service":
        import pandas as pd

        frame = pd.read_parquet(folder / "runs" / f"service-{n}" / "results.parquet")
        spans = (frame["started_at"].min(), frame["finished_at"].max())
        per_trial = {p: frame[p].fillna(0).sum() / frame["trial_id"].nunique() for p in PHASES}
        timing = yaml.safe_load((folder / "runs" / f"service-{n}" / "timing.yaml").read_text())["phases"]
        end = sum(timing[phase] for phase in END_PHASES)
        return {"wall": wall, "span": spans[1] - spans[0], "trials": frame["trial_id"].nunique(), "phases": per_trial,
                "end": end}
    measured = json.loads((folder / f"plain-{n}.json").read_text())
    return {"wall": wall, "span": max(measured["finished_at"]) - min(measured["started_at"]),
            "trials": len(measured["finished_at"]), "phases": {}}


def median_side(runs: list[dict]) -> dict:
    """One side's runs of one N as one: the median of each figure."""
    return {"wall": statistics.median(r["wall"] for r in runs), "span": statistics.median(r["span"] for r in runs),
            "trials": min(r["trials"] for r in runs),
            "phases": {p: statistics.median(r["phases"][p] for r in runs) for p in runs[0]["phases"]},
            **({"end": statistics.median(r["end"] for r in runs)} if "end" in runs[0] else {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("HPSEARCH_DATA"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--rounds", type=int, default=1, help="run every size this many times; medians are printed")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    parser.add_argument("--plain", type=int, help=argparse.SUPPRESS)  # internal: run the plain side
    parser.add_argument("--storage-path", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.data_root:
        parser.error("--data-root (or HPSEARCH_DATA) must name a folder holding MNIST")
    data_root = str(Path(args.data_root).expanduser().resolve())
    if args.plain:
        plain(args.plain, data_root, str(Path(args.storage_path).resolve()), args.out)
        return 0

    folder = Path(tempfile.mkdtemp(prefix="hpsearch-scale-"))
    rounds: dict[int, list[dict[str, dict]]] = {n: [] for n in args.sizes}
    try:
        for r, n in ((r, n) for r in range(args.rounds) for n in args.sizes):
            # which side runs first flips from round to round and from one N to the next
            order = ["service", "plain"] if (r + args.sizes.index(n)) % 2 == 0 else ["plain", "service"]
            sides = {side: run_side(side, n, data_root, folder / f"round-{r + 1}") for side in order}
            rounds[n].append(sides)
            s, p = sides["service"], sides["plain"]
            print(f"round {r + 1}, N={n}: service {1000 * s['span'] / n:.0f} ms/trial ({s['trials']} trials, "
                  f"wall {s['wall']:.0f} s), plain {1000 * p['span'] / n:.0f} ms/trial ({p['trials']} trials, "
                  f"wall {p['wall']:.0f} s)", flush=True)
    finally:
        if args.keep:
            print(f"run folders kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    # one side's figure per N: the median over the rounds (a single run swings by half on these machines)
    results = {n: {side: median_side([sides[side] for sides in runs]) for side in ("service", "plain")}
               for n, runs in rounds.items()}

    print(f"\nmedians of {args.rounds} round(s), the sides alternating which runs first:")
    print("| trials | service | plain Tune | service/plain |\n|---:|---:|---:|---:|")
    for n, sides in results.items():
        s, p = 1000 * sides["service"]["span"] / n, 1000 * sides["plain"]["span"] / n
        print(f"| {n} | {s:.0f} ms/trial | {p:.0f} ms/trial | {s / p:.2f}x |")
    print("\nthe whole command (wall time from outside, start-up and end included), per trial:")
    print("| trials | round | service | plain Tune | service/plain | service's end (results, test, report, shutdown) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, runs in rounds.items():
        for label, sides in [*((str(r + 1), sides) for r, sides in enumerate(runs)), ("median", results[n])]:
            s, p = 1000 * sides["service"]["wall"] / n, 1000 * sides["plain"]["wall"] / n
            print(f"| {n} | {label} | {s:.0f} ms/trial | {p:.0f} ms/trial | {s / p:.2f}x | "
                  f"{sides['service']['end']:.1f} s |")
    sizes = sorted(results)
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        for side in ("service", "plain"):
            growth = math.log(results[b][side]["span"] / results[a][side]["span"]) / math.log(b / a)
            print(f"growth exponent of the {side}'s span, N={a} -> {b}: {growth:.2f} (1.00: flat cost per trial)")
        growth = math.log(results[b]["service"]["end"] / results[a]["service"]["end"]) / math.log(b / a)
        print(f"growth exponent of the service's end, N={a} -> {b}: {growth:.2f} (goal <= 1.00: at most linear)")
    print("\nwhere the service's slot time went, ms per trial (results.parquet columns):")
    print("| trials | " + " | ".join(p.removesuffix("_seconds") for p in PHASES) + " | slot overhead |")
    print("|---:|" + "---:|" * (len(PHASES) + 1))
    for n, sides in results.items():
        s = sides["service"]
        overhead = s["span"] * SLOTS / n - sum(s["phases"][p] for p in WORK)
        print(f"| {n} | " + " | ".join(f"{1000 * s['phases'][p]:.1f}" for p in PHASES) + f" | {1000 * overhead:.0f} |")
    print("slot overhead: span x slots / N minus the trial's own work (setup, train, evaluate, checkpoint); goal <= 100 ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
