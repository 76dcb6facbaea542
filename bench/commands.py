"""One command of a bench, timed from outside: its wall time, the load around it, and the CPU it kept busy.

On a 2-core machine a small search keeps both cores busy for most of its run, so what bounds its
wall time is how much CPU work it does (imports in every new process, Ray's daemons, training),
not what it waits for. The busy core-seconds are the whole machine's (/proc/stat, every process,
Ray's daemons and trial actors included, which a child's rusage would miss once they are
reparented), so they mean what they say only on an otherwise idle machine: the load is printed
beside them for that reason.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def busy_seconds() -> float | None:
    """Core-seconds the machine has spent busy since boot (user, nice, system, irq, softirq); None without /proc."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = ticks
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


# what a process is: its title (Ray renames its workers ray::NAME), its program, or the script Python runs
KINDS = {
    "ray::ImplicitFunc": "trial actors",  # Tune's function trainables: the only actors a search starts
    "ray::IDLE": "Ray's idle workers", "default_worker.py": "Ray's idle workers",
    "ray::DashboardAgent": "Ray: node agents", "ray::RuntimeEnvAgent": "Ray: node agents",
    "gcs_server": "Ray: gcs_server", "raylet": "Ray: raylet",
    "dashboard/agent.py": "Ray: node agents", "runtime_env/agent/main.py": "Ray: node agents",
    "dashboard/dashboard.py": "Ray: dashboard head", "autoscaler/_private/monitor.py": "Ray: monitors",
    "_private/log_monitor.py": "Ray: monitors",
}


def _kind(command: str, pid: int, command_pid: int) -> str:
    if pid == command_pid:
        return "the command's process"
    words = command.split()
    if not words:
        return "other processes"
    title = words[0].split(".", 1)[0]  # ray::ImplicitFunc.train
    if title.startswith("ray::"):
        return KINDS.get(title, "Ray: other workers")
    program = words[0].rsplit("/", 1)[-1]
    script = next((w for w in words[1:3] if w.endswith(".py")), "")
    return KINDS.get(program) or next((kind for path, kind in KINDS.items() if path.endswith(".py")
                                       and script.endswith(path)), "other processes")


@dataclass
class ProcessSampler:
    """The CPU seconds of every process on the machine while a command runs, by kind (KINDS), sampled
    from /proc every `period` seconds: a process that ends between two samples loses at most its last
    period. Processes alive before the command count only what they spent during it."""

    period: float = 0.1
    command_pid: int = 0
    _start: dict[int, float] = field(default_factory=dict)  # CPU seconds at first sight, for processes already alive
    _last: dict[int, tuple[str, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _sample(self, first: bool = False) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                seconds = (int(fields[11]) + int(fields[12])) / tick
                # read every time: a Ray worker renames itself (ray::ImplicitFunc) once it holds an actor
                with open(f"/proc/{pid}/cmdline") as f:
                    command = f.read().replace("\0", " ")
            except (OSError, ValueError, IndexError):
                continue
            if first:
                self._start[pid] = seconds
            self._last[pid] = (command or self._last.get(pid, ("", 0.0))[0], seconds)

    def start(self) -> "ProcessSampler":
        self._sample(first=True)
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def stop(self) -> dict[str, float]:
        """CPU seconds per kind of process, largest first; the sampler itself is left out."""
        self._stop.set()
        self._sample()
        spent: Counter[str] = Counter()
        for pid, (command, seconds) in self._last.items():
            if pid != os.getpid():
                spent[_kind(command, pid, self.command_pid)] += seconds - self._start.get(pid, 0.0)
        return {kind: round(seconds, 1) for kind, seconds in spent.most_common() if seconds >= 0.05}


@dataclass(frozen=True)
class Timed:
    wall_s: float
    load: tuple[float, float]  #: 1-minute load average before and after
    busy_core_s: float | None  #: core-seconds the machine was busy during the command
    processes: dict[str, float] = field(default_factory=dict)  #: CPU seconds by kind of process (ProcessSampler)

    @property
    def busy_share(self) -> float | None:
        """The part of the machine's cores kept busy: near 1 means the command is bound by its CPU work."""
        return None if self.busy_core_s is None else self.busy_core_s / (self.wall_s * cores())

    @property
    def packed_s(self) -> float | None:
        """The wall time the same CPU work would take with no core ever idle: a floor for this command."""
        return None if self.busy_core_s is None else self.busy_core_s / cores()

    def cpu_lines(self) -> str:
        """The bench's two lines on where the cores went (with /proc only)."""
        return (f"  busy: {self.busy_core_s:.1f} core-s, {self.busy_share:.0%} of {cores()} cores over the wall "
                f"time; packed with no idle core: {self.packed_s:.1f} s\n"
                "  CPU by process (s): " + ", ".join(f"{kind} {seconds:.1f}" for kind, seconds in self.processes.items()))


def timed(command: list[str], log: Path, env: dict[str, str] | None = None) -> Timed:
    """Run `command` from the repo root, its output to `log`; exits with the log's tail if it fails."""
    load_before, busy_before = os.getloadavg()[0], busy_seconds()
    sampler = ProcessSampler().start() if busy_before is not None else None
    start = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
        if sampler is not None:
            sampler.command_pid = process.pid
        code = process.wait()
    wall = time.perf_counter() - start
    busy_after = busy_seconds()
    processes = sampler.stop() if sampler is not None else {}
    if code != 0:
        sys.exit(f"{' '.join(command)} exited with {code}; last lines of {log}:\n"
                 + "\n".join(log.read_text().splitlines()[-30:]))
    busy = None if busy_before is None or busy_after is None else busy_after - busy_before
    return Timed(wall, (load_before, os.getloadavg()[0]), busy, processes)


def least_work(processes: dict[str, float], imports_core_s: float, wanted_s: float) -> str:
    """What a search cannot do without, in CPU seconds from this run, packed on every core, against a goal:
    its trial actors (their imports and training), the driver's imports, and Ray's own processes."""
    actors = processes.get("trial actors", 0.0)
    ray = sum(seconds for kind, seconds in processes.items() if kind.startswith("Ray"))
    least = actors + imports_core_s + ray
    packed = least / cores()
    return (f"  what it cannot do without: trial actors {actors:.1f} + the driver's imports {imports_core_s:.1f} + "
            f"Ray's processes {ray:.1f} = {least:.1f} core-s, packed {packed:.1f} s "
            + (f"> {wanted_s:.1f} s: out of reach unless imports, training or Ray's start get cheaper"
               if packed > wanted_s else f"<= {wanted_s:.1f} s: the rest is the driver's own work and idle cores"))


def import_core_seconds(module: str, repeat: int = 3) -> float:
    """Median CPU seconds (user + system) of a new Python process that imports `module` and exits:
    what every trial actor pays before its first step, and the driver before its first check."""
    spent = []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return sorted(spent)[len(spent) // 2]
