"""Where a report's and a trial's driver time go: hpsearch against plain Ray Tune, side by side.

Both sides run N trials of the same user function, 2 at a time with 1 CPU each, which does no
work and reports R times (`train(config, report, checkpoint=None)`, trainable/function.py's
contract). What is left is the driver's cost of a report and of a trial:

- service: `search.api.run` on a space file naming that function (`trainable: noop.py:train`),
  written into a temporary folder; every default of a space file (the reproducible searcher,
  TensorBoard event files, num_to_keep 1);
- plain: Tune + OptunaSearch (the same seeded TPE) behind a ConcurrencyLimiter, reuse_actors,
  Tune's default loggers (TensorBoard, CSV, JSON), calling the same function with a `report`
  that is tune.report.

Each side runs in a process of its own, and the sides alternate which runs first, round by
round. In that process the bench wraps Tune's controller, its callbacks, the searcher and the
experiment-state snapshot with timers (wall time and the thread's CPU time, each part's own:
a part's time excludes the parts it calls), so the driver's time is split by part:

- Tune's own: TuneController.step less everything below and less its waits on the actors;
- each callback (hpsearch's: Progress, KeepCheckpoints, DiskGuard, EventFiles, the JSON logger;
  plain Tune's loggers), per hook;
- the searcher (suggest, on_trial_result, on_trial_complete: the ConcurrencyLimiter and below);
- the snapshot: TuneController.checkpoint (Tune's experiment state and the searcher's record);
- the writer thread (hpsearch's results parts and journal): off the controller thread, shown apart.

Printed: the driver's controller-thread busy time (wall less the waits on actors, and its CPU
time) per report and per trial on both sides with their ratio, then the table by part.

    .venv/bin/python bench/per_report.py --quick                  # 20 trials x 5 reports: about a minute
    .venv/bin/python bench/per_report.py --trials 1000 --reports 10 [--rounds 2] [--checkpoints]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == REPO / "bench":
    sys.path[0] = str(REPO)  # else bench/search.py hides the search package

SLOTS = 2
# the user's function: no work, R reports (a tiny checkpoint each with --checkpoints)
NOOP = '''
def train(config, report, checkpoint=None):
    import math
    start = checkpoint["epoch"] if checkpoint else 0
    for epoch in range(start, config["epochs"]):
        value = 1.0 - math.exp(-config["lr"] * (epoch + 1))
        if config["checkpoints"]:
            report(val_acc=value, checkpoint={"epoch": epoch + 1})
        else:
            report(val_acc=value)
'''
HOOKS = ("setup", "on_step_begin", "on_step_end", "on_trial_start", "on_trial_restore", "on_trial_save",
         "on_trial_result", "on_trial_complete", "on_trial_error", "on_trial_recover", "on_checkpoint",
         "on_experiment_end")
PER_REPORT_HOOKS = ("on_trial_result", "on_step_begin", "on_step_end", "on_checkpoint", "on_trial_save")


class Timers:
    """Each part's own time (wall and thread CPU), excluding the parts it calls, per thread kind."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.local = threading.local()
        self.first: float | None = None
        self.last: float | None = None

    def wrap(self, function, label: str):
        timers = self

        def timed(*args, **kwargs):
            stack = timers.local.__dict__.setdefault("stack", [])
            frame = [0.0, 0.0]  # the children's wall and CPU
            stack.append(frame)
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                stack.pop()
                where = "" if threading.current_thread() is threading.main_thread() else "thread: "
                timers.wall[where + label] += wall - frame[0]
                timers.cpu[where + label] += cpu - frame[1]
                timers.calls[where + label] += 1
                if stack:
                    stack[-1][0] += wall
                    stack[-1][1] += cpu

        timed.__wrapped__ = function
        return timed

    def patch(self, cls, name: str, label: str) -> None:
        if name in cls.__dict__ and getattr(cls.__dict__[name], "__wrapped__", None):
            return
        function = getattr(cls, name, None)
        if function is not None:
            setattr(cls, name, self.wrap(function, label))


def instrument(timers: Timers) -> None:
    """Wrap Tune's controller, the callbacks Tune is given, the searcher and the snapshot."""
    from ray.air.execution._internal.actor_manager import RayActorManager
    from ray.tune.callback import CallbackList
    from ray.tune.execution.tune_controller import TuneController
    from ray.tune.search import ConcurrencyLimiter

    step = TuneController.step

    def marked_step(self):
        timers.first = timers.first or time.perf_counter()
        try:
            return step(self)
        finally:
            timers.last = time.perf_counter()

    TuneController.step = timers.wrap(marked_step, "tune (own)")
    timers.patch(TuneController, "_process_trial_result", "tune (own): a result")  # one call per report
    timers.patch(RayActorManager, "next", "waiting on actors")
    timers.patch(TuneController, "checkpoint", "snapshot (experiment state + searcher record)")
    # called each step; it saves when Tune's rule says so (or a forced sync: num_to_keep): its calls are the saves
    timers.patch(TuneController, "save_to_dir", "snapshot (experiment state + searcher record), saves")
    for name in ("suggest", "on_trial_result", "on_trial_complete"):
        timers.patch(ConcurrencyLimiter, name, "searcher")
    init = CallbackList.__init__

    def wrapping_init(self, callbacks):
        for callback in callbacks:  # per class, not per instance: Tune pickles its callbacks
            for hook in HOOKS:
                timers.patch(type(callback), hook, f"callback {type(callback).__name__}.{hook}")
        init(self, callbacks)

    CallbackList.__init__ = wrapping_init
    try:  # hpsearch's writer thread: results parts and journal entries
        from search.execution.progress import Progress

        timers.patch(Progress, "_write", "results part (writer thread)")
        timers.patch(Progress, "_to_journal", "journal (writer thread)")
    except ImportError:
        pass


def write_function(folder: Path) -> Path:
    path = folder / "noop.py"
    path.write_text(NOOP)
    return path


def service(folder: Path, trials: int, reports: int, checkpoints: bool) -> dict:
    import yaml

    from search import api

    space = {
        "trainable": "noop.py:train",
        "experiment": {"name": "per-report", "metric": "val_acc", "mode": "max", "num_samples": trials,
                       "max_concurrent": SLOTS, "seed": 0, "storage_path": str(folder / "runs")},
        "resources": {"cpus": 1},
        "training": {"epochs": reports, "checkpoints": checkpoints},
        "space": {"lr": {"distribution": "float", "low": 0.001, "high": 0.5, "log": True}},
    }
    write_function(folder)
    space_file = folder / "space.yaml"
    space_file.write_text(yaml.safe_dump(space))
    api.run(str(space_file), name="service")  # a progress line per report, as the CLI's default (to a file)
    return {}


def plain(folder: Path, trials: int, reports: int, checkpoints: bool) -> dict:
    import importlib.util
    import tempfile as tmp

    import ray
    import torch
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from search.searching.ordered import make_sampler

    spec = importlib.util.spec_from_file_location("noop", write_function(folder))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = module.train

    def trial(config):
        def report(checkpoint=None, **metrics):
            if checkpoint is None:
                tune.report(metrics)
                return
            with tmp.TemporaryDirectory() as where:
                torch.save(checkpoint, os.path.join(where, "state.pt"))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(where))

        restored = tune.get_checkpoint()
        state = None
        if restored is not None:
            with restored.as_directory() as where:
                state = torch.load(os.path.join(where, "state.pt"))
        function(config, report, checkpoint=state)

    ray.init(address="local", include_dashboard=False, log_to_driver=False, num_cpus=SLOTS)
    try:
        tuner = tune.Tuner(
            tune.with_resources(trial, {"cpu": 1}),
            param_space={"lr": tune.loguniform(0.001, 0.5), "epochs": reports, "checkpoints": checkpoints},
            tune_config=tune.TuneConfig(metric="val_acc", mode="max", num_samples=trials, reuse_actors=True,
                                        search_alg=ConcurrencyLimiter(OptunaSearch(sampler=make_sampler("tpe", 0, 0)),
                                                                      max_concurrent=SLOTS)),
            run_config=tune.RunConfig(name="plain", storage_path=str(folder / "plain"), verbose=0,
                                      checkpoint_config=tune.CheckpointConfig(num_to_keep=1 if checkpoints else None)),
        )
        grid = tuner.fit()
        return {"errors": len(grid.errors)}
    finally:
        ray.shutdown()


def run_side(side: str, trials: int, reports: int, checkpoints: bool, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    out, log = folder / "timers.json", folder / "side.log"
    command = [sys.executable, __file__, "--side", side, "--trials", str(trials), "--reports", str(reports),
               "--folder", str(folder), "--out", str(out)] + (["--checkpoints"] if checkpoints else [])
    started = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise SystemExit(f"the {side} side failed (exit {code}); see {log}:\n{log.read_text()[-3000:]}")
    measured = json.loads(out.read_text())
    measured["command"] = time.perf_counter() - started
    return measured


def side_main(args) -> int:
    timers = Timers()
    instrument(timers)
    folder = Path(args.folder)
    cpu = time.process_time()
    (service if args.side == "service" else plain)(folder, args.trials, args.reports, args.checkpoints)
    Path(args.out).write_text(json.dumps({
        "wall": dict(timers.wall), "cpu": dict(timers.cpu), "calls": dict(timers.calls),
        "fit": (timers.last or 0) - (timers.first or 0), "process_cpu": time.process_time() - cpu}))
    return 0


def busy(side: dict, kind: str = "wall", threads: bool = False) -> float:
    """The controller thread's busy time: every part on it, less its waits on the actors (`threads`: and
    the timed parts on other threads of the driver, hpsearch's writer thread)."""
    return sum(v for k, v in side[kind].items()
               if (threads or not k.startswith("thread: ")) and k != "waiting on actors")


def median_side(runs: list[dict]) -> dict:
    keys = {kind: set().union(*(r[kind] for r in runs)) for kind in ("wall", "cpu", "calls")}
    return {**{kind: {k: statistics.median(r[kind].get(k, 0) for r in runs) for k in keys[kind]}
               for kind in keys},
            "fit": statistics.median(r["fit"] for r in runs), "command": statistics.median(r["command"] for r in runs)}


def grouped(side: dict, share: float = 0.01) -> dict:
    """A callback's hooks each under 1% of the side's busy time, as one row per callback ("other hooks")."""
    total = busy(side)
    out = {kind: defaultdict(float) for kind in ("wall", "cpu", "calls")}
    for part in side["wall"]:
        small = part.startswith("callback ") and side["wall"][part] < share * total
        name = part.rsplit(".", 1)[0] + " (other hooks)" if small else part
        for kind in out:
            out[kind][name] += side[kind].get(part, 0)
    return out


def table(results: dict[str, dict], trials: int, reports: int, checkpoints: bool = False) -> None:
    s, p = results["service"], results["plain"]
    n_reports = trials * reports
    print(f"\n{trials} trials x {reports} reports, {SLOTS} at a time (medians over the rounds):")
    print("| | service | plain Tune | service/plain |\n|---|---:|---:|---:|")
    for name, kind, scale, threads in (("driver busy, ms per report (wall)", "wall", n_reports, False),
                                       ("driver busy, ms per report (CPU)", "cpu", n_reports, False),
                                       ("driver busy, ms per report (CPU, writer thread too)", "cpu", n_reports, True),
                                       ("driver busy, ms per trial (wall)", "wall", trials, False),
                                       ("driver busy, ms per trial (CPU, writer thread too)", "cpu", trials, True)):
        a, b = 1000 * busy(s, kind, threads) / scale, 1000 * busy(p, kind, threads) / scale
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    a, b = 1000 * s["fit"] / n_reports, 1000 * p["fit"] / n_reports
    print(f"| fit's span, ms per report | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    a, b = s["command"] / trials * 1000, p["command"] / trials * 1000
    print(f"| whole side's process, ms per trial | {a:.1f} | {b:.1f} | {a / b:.2f}x |")
    counted = [results[side]["calls"].get("tune (own): a result", 0) for side in ("service", "plain")]
    print(f"(results Tune processed: {counted[0]:.0f} and {counted[1]:.0f}, of {n_reports})")
    saves = [results[side]["calls"].get("snapshot (experiment state + searcher record), saves", 0)
             for side in ("service", "plain")]
    print(f"Tune's experiment-state snapshots: {saves[0]:.0f} (service) and {saves[1]:.0f} (plain)"
          + (" with a checkpoint per report, num_to_keep 1 on both sides" if checkpoints else ""))
    print("\nby part, ms per report (wall | CPU); a callback's or searcher's hooks on every report, the rest per trial:")
    print("| part | service wall | service CPU | plain wall | plain CPU | calls (service / plain) |")
    print("|---|---:|---:|---:|---:|---:|")
    s, p = grouped(s), grouped(p)
    parts = sorted(set(s["wall"]) | set(p["wall"]), key=lambda k: -max(s["wall"].get(k, 0), p["wall"].get(k, 0)))
    for part in parts:
        print(f"| {part} | {1000 * s['wall'].get(part, 0) / n_reports:.3f} | {1000 * s['cpu'].get(part, 0) / n_reports:.3f}"
              f" | {1000 * p['wall'].get(part, 0) / n_reports:.3f} | {1000 * p['cpu'].get(part, 0) / n_reports:.3f}"
              f" | {s['calls'].get(part, 0)} / {p['calls'].get(part, 0)} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--reports", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--checkpoints", action="store_true", help="a tiny checkpoint with every report (num_to_keep 1)")
    parser.add_argument("--quick", action="store_true", help="20 trials x 5 reports, one round: about a minute")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    parser.add_argument("--side", choices=("service", "plain"), help=argparse.SUPPRESS)  # internal
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return side_main(args)
    if args.quick:
        args.trials, args.reports, args.rounds = 20, 5, 1
    folder = Path(tempfile.mkdtemp(prefix="hpsearch-per-report-"))
    runs: dict[str, list[dict]] = {"service": [], "plain": []}
    try:
        for r in range(args.rounds):
            order = ("service", "plain") if r % 2 == 0 else ("plain", "service")
            for side in order:
                runs[side].append(run_side(side, args.trials, args.reports, args.checkpoints,
                                           folder / f"round-{r + 1}" / side))
            s, p = runs["service"][-1], runs["plain"][-1]
            n = args.trials * args.reports
            print(f"round {r + 1}: driver busy {1000 * busy(s) / n:.2f} ms/report (service) vs "
                  f"{1000 * busy(p) / n:.2f} (plain); whole side {s['command']:.0f} s vs {p['command']:.0f} s", flush=True)
    finally:
        if args.keep:
            print(f"run folders kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    table({side: median_side(r) for side, r in runs.items()}, args.trials, args.reports, args.checkpoints)
    return 0


if __name__ == "__main__":
    sys.exit(main())
