"""The cgroup each sandbox child runs in (``runner.cgroups``): made, enforced, removed, swept; and
what a check does where there are none. The attacks these stop are in test_attacks_containment."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import PLANTED, ROOT, SOFTMAX_SPEC, run_cli
from nearmiss.engine.check import check
from nearmiss.engine.runner import cgroups
from nearmiss.engine.runner.sandbox import Limits, _running

GOLDEN = SOFTMAX_SPEC.parent / "golden.py"


@pytest.fixture(autouse=True)
def in_cgroups() -> None:
    assert cgroups.available() is None, cgroups.available()


def _sleeper_in(group: cgroups.ChildGroup) -> subprocess.Popen:
    return subprocess.Popen(group.command(["sleep", "300"]), start_new_session=True)


# An engine that makes a group, starts a process in it, and dies without removing either (a
# worker killed outright). It prints the group's folders.
DYING_ENGINE = """
import json, subprocess
from nearmiss.engine.runner import cgroups
group = cgroups.ChildGroup.create(256, 64)
sleeper = subprocess.Popen(
    group.command(["sleep", "300"]), start_new_session=True, stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
)
import time
while not group.members():
    time.sleep(0.01)
print(json.dumps({"folders": [str(f) for f in group.folders], "pid": sleeper.pid}), flush=True)
"""


def test_a_dead_engines_group_is_emptied_and_removed_and_a_live_ones_is_kept():
    dead = subprocess.run(
        [sys.executable, "-c", DYING_ENGINE], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert dead.returncode == 0, dead.stderr
    left = json.loads(dead.stdout)
    assert all(Path(folder).is_dir() for folder in left["folders"])
    assert _running(left["pid"])
    live = cgroups.ChildGroup.create(256, 64)
    mine = _sleeper_in(live)
    try:
        while not live.members():
            time.sleep(0.01)
        assert cgroups.remove_orphaned_groups() >= 1
        deadline = time.monotonic() + 10
        while _running(left["pid"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(left["pid"])
        assert not any(Path(folder).exists() for folder in left["folders"])
        assert mine.poll() is None and live.members() == [mine.pid]
        assert all(folder.is_dir() for folder in live.folders)
    finally:
        live.remove()
        mine.wait(timeout=10)
    assert mine.returncode == -signal.SIGKILL
    assert not any(folder.exists() for folder in live.folders)


def test_a_group_kill_reaches_what_left_the_process_tree():
    """A daemon that double-forked out of the child's tree is still in its group."""
    group = cgroups.ChildGroup.create(256, 64)
    script = textwrap.dedent(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(300)
            os._exit(0)
        """
    )
    subprocess.run(group.command([sys.executable, "-c", script]), timeout=60, check=True)
    daemons = group.members()
    assert len(daemons) == 1 and os.getppid() != daemons[0]
    group.remove()
    assert not _running(daemons[0])
    assert not any(folder.exists() for folder in group.folders)


def test_without_cgroups_the_check_says_so_and_the_engine_watches_memory(tmp_path):
    """Where no group can be made (no root, no delegation), children still run, the report's
    isolation drops "+cgroups", and a memory bomb is still stopped."""
    env = {**os.environ, cgroups.CGROUP_ENV: str(tmp_path / "not-a-cgroup")}
    result = run_cli(
        "check", SOFTMAX_SPEC, GOLDEN, "--suite", "compact", "--json", "--seed", "7", env=env
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] and "+cgroups" not in report["isolation"]
    result = run_cli(
        "check", SOFTMAX_SPEC, PLANTED / "memory_bomb.py", "--suite", "compact", "--json",
        "--memory-mb", "1536", "--integrity", "report", "--seed", "7", env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    diagnosis = json.loads(result.stdout)["cases"][0]["diagnosis"]
    assert "memory" in diagnosis.lower(), diagnosis


def test_without_a_cpu_hierarchy_children_get_memory_and_process_limits_alone(
    tmp_path, monkeypatch
):
    """The fair share of the cores is kept only where the cpu controller is mounted; its absence
    costs the children nothing else, and the isolation says which applied."""
    from nearmiss.engine.runner import environment

    table = [
        line
        for line in cgroups.MOUNTS.read_text().splitlines()
        if "cpu" not in line.split(" - ")[-1].split()[-1].split(",")
    ]
    (tmp_path / "mountinfo").write_text("\n".join(table) + "\n")
    monkeypatch.setattr(cgroups, "MOUNTS", tmp_path / "mountinfo")
    cgroups._layout.cache_clear()
    try:
        assert cgroups.available() is None and not cgroups.cpu_shared()
        assert environment.isolation_level().endswith("+cgroups")
        group = cgroups.ChildGroup.create(256, 64)
        try:
            assert len(group.folders) == 2  # memory and pids
            sleeper = _sleeper_in(group)
            while not group.members():
                time.sleep(0.01)
            joined = Path(f"/proc/{sleeper.pid}/cgroup").read_text()
            assert group.folders[0].name in joined and "cpu:/nearmiss-" not in joined
        finally:
            group.remove()
            sleeper.wait(timeout=10)
        assert not any(folder.exists() for folder in group.folders)
    finally:
        monkeypatch.undo()
        cgroups._layout.cache_clear()
    assert cgroups.cpu_shared()  # the real table again: this machine has the cpu hierarchy


def test_a_small_memory_limit_binds_memory_not_the_address_space():
    """Where a group holds the memory, the children get no address-space limit: it counted
    what XLA reserves (threads' stacks, arenas), not what it uses, and aborted the spec's child
    of a golden below about 2 GB (SIGABRT at 1,024 MB). A bomb is still stopped at the limit."""
    report = check(SOFTMAX_SPEC, GOLDEN, "compact", 7, Limits(memory_mb=768))
    assert report.certified, report.diagnosis
    bomb = PLANTED / "memory_bomb.py"
    report = check(SOFTMAX_SPEC, bomb, "compact", 7, Limits(memory_mb=768), integrity="report")
    assert not report.certified
    assert "memory limit exceeded" in report.cases[0].diagnosis, report.cases[0].diagnosis
