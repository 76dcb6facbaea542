"""bench/commands.py: how the benches time a command and say which processes kept the cores busy."""

import os
import sys

import pytest

from bench.commands import _kind, least_work, timed

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\nprint('burnt')"


def test_a_command_is_timed_and_its_own_cpu_counted(tmp_path):
    log = tmp_path / "burn.log"
    run = timed([sys.executable, "-c", BURN], log)
    assert log.read_text().strip() == "burnt"
    own = run.processes["the command's process"]
    assert own >= 0.5  # 0.6 s of CPU, sampled every 0.1 s
    assert run.busy_core_s >= own - 0.05  # the machine's busy time holds the command's (ticks: 10 ms)
    assert run.wall_s >= own / 2 and 0 < run.busy_share <= 1.05


def test_what_a_search_cannot_do_without_is_its_actors_the_drivers_imports_and_rays_processes():
    cores = len(os.sched_getaffinity(0))
    processes = {"trial actors": 30.0, "the command's process": 12.0, "Ray: raylet": 1.0, "Ray: node agents": 2.0,
                 "other processes": 5.0}
    said = least_work(processes, 9.0, wanted_s=100.0)
    assert "trial actors 30.0 + the driver's imports 9.0 + Ray's processes 3.0 = 42.0 core-s" in said
    assert f"packed {42.0 / cores:.1f} s <= 100.0 s" in said
    assert "out of reach" in least_work(processes, 9.0, wanted_s=42.0 / cores - 0.5)


def test_a_failing_command_ends_the_bench_with_its_log(tmp_path):
    with pytest.raises(SystemExit) as ended:
        timed([sys.executable, "-c", "print('the last words'); raise SystemExit(3)"], tmp_path / "fail.log")
    assert "exited with 3" in str(ended.value) and "the last words" in str(ended.value)


@pytest.mark.parametrize("command, kind", [
    ("ray::ImplicitFunc.train", "trial actors"),
    ("ray::IDLE", "Ray's idle workers"),
    ("ray::DashboardAgent", "Ray: node agents"),
    ("ray::SomeOtherActor", "Ray: other workers"),
    # the raylet's own arguments name the worker script: its program decides
    ("/v/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet --python_worker_command=python "
     "/v/ray/_private/workers/default_worker.py", "Ray: raylet"),
    ("/v/bin/python -u /v/lib/python3.11/site-packages/ray/dashboard/agent.py --raylet-name=raylet", "Ray: node agents"),
    ("/v/bin/python /v/lib/python3.11/site-packages/ray/dashboard/dashboard.py --host=127.0.0.1", "Ray: dashboard head"),
    ("/v/bin/python -u /v/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py", "Ray: monitors"),
    ("/usr/bin/sshd -D", "other processes"),
    ("", "other processes"),
])
def test_processes_are_told_apart_by_program_and_title(command, kind):
    assert _kind(command, pid=10, command_pid=11) == kind


def test_the_command_itself_is_named_by_its_pid():
    assert _kind("ray::ImplicitFunc.train", pid=11, command_pid=11) == "the command's process"
