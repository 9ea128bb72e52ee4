"""Hostile candidates (tests/attacks) against the sandbox.

Each attack reaches ``os`` past the static gate (run in ``report`` mode, so the gate does not stop
it before the sandbox) and tries to leave a trace on the host, read a secret, reach a socket, take
privileges or kill the engine. The tests look for the *effects* — files on the host, connections
to the test's listeners, canaries in anything the candidate can send back, processes alive — and
use what the attack says only as proof that it ran.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import select
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import ROOT, SOFTMAX_SPEC, identify, kept_folders, outliving, processes_under, run_cli
from nearmiss.engine.check import check
from nearmiss.engine.models import CheckReport
from nearmiss.engine.runner import cgroups, environment, spares, zygote
from nearmiss.engine.runner.candidate_child import CANDIDATE_ENV
from nearmiss.engine.runner.compile_cache import reference_cache_dir
from nearmiss.engine.runner.sandbox import Limits, SandboxChild

ATTACKS = Path(__file__).resolve().parent / "attacks"
PLACEHOLDER = "TARGETS = {}"


@pytest.fixture(autouse=True)
def sandboxed(monkeypatch) -> str:
    """The attacks are real (they unmount /proc, kill their parent): they run only sandboxed."""
    monkeypatch.delenv(environment.UNSAFE_ENV, raising=False)
    level = environment.isolation_level()
    assert level.startswith("bubblewrap"), f"no sandbox here: {environment.find_sandbox()}"
    return level


def arm(attack: str, folder: Path, **targets) -> Path:
    """A copy of the attack in ``folder`` with its targets written in."""
    source = (ATTACKS / attack).read_text()
    assert source.count(PLACEHOLDER) == 1
    armed = folder / attack
    armed.write_text(source.replace(PLACEHOLDER, f"TARGETS = {targets!r}"))
    return armed


def run_attack(candidate: Path, **limits) -> CheckReport:
    return check(SOFTMAX_SPEC, candidate, "compact", 1, Limits(**limits), integrity="report")


def outcomes(text: str) -> dict[str, str]:
    """What the attack said it got: its ``ATTACK key=value ...`` line."""
    found = re.search(r"ATTACK (.*)", text)
    assert found, f"the attack did not run to its report: {text[:2000]}"
    return dict(item.split("=", 1) for item in found.group(1).split())


def said(report: CheckReport) -> dict[str, str]:
    error = report.cases[0].error
    assert error is not None, report.diagnosis
    return outcomes(error.message)


def canary() -> str:
    return f"nearmiss-canary-{secrets.token_hex(8)}"


def test_files_planted_outside_the_sandbox_never_reach_the_host(tmp_path):
    token = secrets.token_hex(6)
    targets = {
        "tmp": f"/tmp/nearmiss-attack-{token}/planted.txt",  # the host's /tmp
        "tree": str(ROOT / f"nearmiss-attack-{token}.txt"),  # the project tree
        "site": str(Path(sysconfig.get_paths()["purelib"]) / f"nearmiss_planted_{token}.py"),
        "engine": str(environment.PACKAGE_DIR / f"planted_{token}.py"),  # the engine's package
        "home": str(ROOT / ".nearmiss" / f"planted-{token}"),  # the default NEARMISS_HOME
        "etc": f"/etc/nearmiss-planted-{token}",
        # The spec's child's compilation cache: writable for it, never seen by candidates.
        "cache": str(reference_cache_dir() / f"planted-{token}"),
    }
    planted = [Path(p) for path in targets.values() for p in (path, path + ".sh")]
    try:
        report = run_attack(arm("write_outside.py", tmp_path, **targets))
        got = said(report)
        assert got["own"] == "ok"  # it ran, and writes where it may: its own directory
        assert [str(path) for path in planted if path.exists()] == []
        assert not Path(f"/tmp/nearmiss-attack-{token}").exists()
    finally:  # only if the sandbox failed
        for path in planted:
            path.unlink(missing_ok=True)
        shutil.rmtree(f"/tmp/nearmiss-attack-{token}", ignore_errors=True)


def secret_setting(tmp_path: Path) -> tuple[dict[str, str], dict[str, str], str, dict]:
    """An engine environment and files holding canaries; (env, canaries, control, targets)."""
    canaries = {name: canary() for name in ("api", "dsn", "file", "home")}
    secret = tmp_path / "secret.txt"  # the host's /tmp: outside any bound path
    secret.write_text(canaries["file"])
    secret.chmod(0o600)
    home = tmp_path / "nearmiss-home"
    home.mkdir()
    password = home / "postgres.password"
    password.write_text(canaries["home"])
    password.chmod(0o600)
    control = canary()
    env = dict(
        os.environ,
        OPENAI_API_KEY=canaries["api"],
        NEARMISS_DATABASE_URL=f"postgresql://nearmiss:{canaries['dsn']}@127.0.0.1:5432/nearmiss",
        NEARMISS_HOME=str(home),
        TZ=control,  # allowlisted: it does reach the candidate, so the sweep must find it
    )
    env.pop(environment.UNSAFE_ENV, None)
    files = {
        "secret": str(secret),
        "home": str(password),
        "tree": str(ROOT / "pyproject.toml"),
        "git": str(ROOT / ".git" / "HEAD"),
    }
    return env, canaries, control, {"files": files}


def test_secrets_never_reach_anything_the_candidate_sends_back(tmp_path):
    env, canaries, control, targets = secret_setting(tmp_path)
    attack = arm("steal_secrets.py", tmp_path, **targets)
    result = run_cli(
        "check", SOFTMAX_SPEC, attack, "--json", "--suite", "compact", "--integrity", "report",
        env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    text = result.stdout + result.stderr
    got = outcomes(text)
    assert control in got["leaked"]  # the sweep works: what is passed through, it finds
    for name, value in canaries.items():
        assert value not in text, f"the {name} canary leaked"
    assert got["secret"] == got["home"] == got["tree"] == got["git"] == "ENOENT"
    assert not got["shadow"].startswith("read")


def test_the_child_log_holds_no_secret(tmp_path, monkeypatch):
    env, canaries, control, targets = secret_setting(tmp_path)
    for name in ("OPENAI_API_KEY", "NEARMISS_DATABASE_URL", "NEARMISS_HOME", "TZ"):
        monkeypatch.setenv(name, env[name])
    home = tmp_path / "child"
    home.mkdir()
    attack = arm("steal_secrets.py", home, **targets)
    child = SandboxChild(
        "nearmiss.engine.runner.candidate_child",
        home,
        Limits(),
        extra_env={CANDIDATE_ENV: str(attack)},
    )
    try:
        assert child.receive(120)["event"] == "ready"  # the sweep ran at import
        log = child.log_path.read_text()
    finally:
        child.close()
    assert control in outcomes(log)["leaked"]
    for name, value in canaries.items():
        assert value not in log, f"the {name} canary reached the log"


def test_no_socket_of_the_engine_is_reachable(tmp_path):
    token = secrets.token_hex(6)
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "engine.sock"))
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(f"\0nearmiss-attack-{token}")
    listeners = [tcp, unix, abstract]
    for listener in listeners:
        listener.listen(8)
    try:
        # Control: each listener does see a connection from here.
        for listener in listeners:
            with socket.socket(listener.family) as probe:
                probe.connect(listener.getsockname())
                listener.accept()[0].close()
        targets = {
            "tcp_port": tcp.getsockname()[1],
            "unix_socket": str(tmp_path / "engine.sock"),
            "abstract": f"nearmiss-attack-{token}",
            "pg_globs": [
                str(ROOT / ".nearmiss" / "*" / "socket" / ".s.PGSQL.*"),
                "/var/run/postgresql/.s.PGSQL.*",
                "/run/postgresql/.s.PGSQL.*",
                str(tmp_path / "*.sock"),
            ],
            "engine_pid": os.getpid(),
        }
        got = said(run_attack(arm("network.py", tmp_path, **targets)))
        pending, _, _ = select.select(listeners, [], [], 0.5)
        assert pending == [], "a listener of the engine received a connection"
    finally:
        for listener in listeners:
            listener.close()
    assert got["pg_seen"] == "0"  # no socket file of the host is even visible
    for name in ("tcp", "unix", "abstract", "setns", "setns_pid1", "tcp_after"):
        assert got[name] != "ok", name
    assert got["nsenter"] == "failed"


def test_privileges_cannot_be_taken(tmp_path, sandboxed):
    got = said(run_attack(arm("privileges.py", tmp_path)))
    for name in ("umount", "mount", "unshare", "ptrace", "setuid", "chroot"):
        assert got[name] != "ok", name
    for name in ("umount_sh", "mount_sh", "unshare_sh", "nsenter_sh"):
        assert got[name] == "failed", name
    assert got["uid"] == environment.SANDBOX_UID
    assert got["caps"] == "0000000000000000"
    assert got["proc"] == "ok"  # its /proc is still there: nothing was unmounted
    if sandboxed == "bubblewrap+seccomp":  # the filter answers before any other check
        denied = ("umount", "mount", "unshare", "ptrace", "keyctl", "bpf", "perf", "userfaultfd")
        for name in denied:
            assert got[name] == "EPERM", name
    assert Path("/proc/self/status").exists() and Path("/proc/1").exists()  # the host's /proc


def test_killing_the_engine_kills_nothing(tmp_path):
    bystander = subprocess.Popen(["sleep", "120"])
    try:
        attack = arm(
            "kill_parent.py", tmp_path, engine_pid=os.getpid(), bystander_pid=bystander.pid
        )
        report = run_attack(attack)
        assert report.cases[0].passed, report.diagnosis  # the child answered; we are alive
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_daemons_die_with_the_check(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    report = run_attack(arm("fork_storm.py", tmp_path, daemons=4), case_timeout_s=8)
    assert report.cases[0].failure_class in ("timeout", "runtime_error")
    assert processes_under(scratch) == []
    assert set(scratch.iterdir()) <= kept_folders()
    for home in zygote.kept_homes():  # a zygote's, kept for the next check: nothing of this one
        assert sorted(p.name for p in home.iterdir()) == ["code", "work"]
        assert not any((home / "code").iterdir()) and not any((home / "work").iterdir())


def test_the_sandbox_tmpfs_mounts_hold_no_hoard(tmp_path):
    got = said(run_attack(arm("hoard_tmpfs.py", tmp_path, mb=512)))
    written, error = got["tmp"].split(":")
    assert error == "ENOSPC" and int(written) <= environment.TMPFS_BYTES // 1024**2
    assert got["shm"].startswith("0:") and got["root"].startswith("0:")  # read-only


# Limits the kernel holds each child to (``runner.cgroups``): each attack below answers
# correctly, and each was certified before children ran in a cgroup of their own.


@pytest.fixture
def in_cgroups() -> None:
    """These attacks are stopped by the children's cgroups: where the engine cannot make them
    (no root, no delegation) the check says so in its isolation, and these tests cannot pass."""
    assert cgroups.available() is None, cgroups.available()


def own_groups() -> list[Path]:
    """The cgroups this test process's engine has made and not removed, once the executors
    kept for the next check (``spares.give_back``) are closed too."""
    spares.close_all()
    layout = cgroups._layout()
    assert not isinstance(layout, str)
    mine = f"{cgroups.PREFIX}{cgroups._pid_namespace()}-{os.getpid()}-*"
    return [folder for parent in layout.parents for folder in parent.glob(mine)]


def test_memory_no_process_maps_is_held_to_the_limit(in_cgroups, tmp_path):
    report = run_attack(arm("memfd_hoard.py", tmp_path, mb=2560), memory_mb=2048)
    assert not report.certified
    assert "memory limit exceeded" in report.cases[0].diagnosis, report.cases[0].diagnosis
    assert own_groups() == []


def test_processes_a_candidate_leaves_behind_are_held_to_the_limit(in_cgroups, tmp_path):
    armed = arm("fork_hog.py", tmp_path, hogs=3, mb=900)
    report = run_attack(armed, memory_mb=2048)
    assert not report.certified
    assert any("memory limit exceeded" in case.diagnosis for case in report.cases), [
        case.diagnosis for case in report.cases
    ]
    assert own_groups() == []


def test_a_process_flood_stops_at_the_limit_and_fails_the_check(in_cgroups, tmp_path):
    report = run_attack(arm("process_flood.py", tmp_path, processes=1200), max_tasks=256)
    assert not report.certified
    assert "process limit exceeded" in report.cases[0].diagnosis, report.cases[0].diagnosis
    assert own_groups() == []


VICTIM = """
import time
cpu, wall = time.process_time(), time.monotonic()
while time.monotonic() - wall < {seconds}:
    pass
print((time.process_time() - cpu) / (time.monotonic() - wall))
"""


@contextlib.contextmanager
def attack_running(armed: Path) -> Iterator[tuple[threading.Thread, list[CheckReport]]]:
    """The attack's check running in a thread while the block measures what it does to the
    engine's side; the list holds its report once the thread has ended (waited for at exit)."""
    done: list[CheckReport] = []
    checking = threading.Thread(target=lambda: done.append(run_attack(armed)))
    checking.start()
    try:
        yield checking, done
    finally:
        checking.join(timeout=300)


def cpu_share(seconds: float = 2.0) -> float:
    """The share of one core a busy process outside every child's group gets now."""
    code = VICTIM.format(seconds=seconds)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(ran.stdout)


def cpu_used(pids: set[int]) -> float:
    """Seconds of CPU these processes have used so far (those gone count nothing)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def test_a_childs_busy_daemons_get_one_groups_share_of_the_cores(in_cgroups, tmp_path):
    # Measured on two cores: another process got 0.06 of a core while 24 daemons ran before the
    # cpu controller (every daemon counted as one process against it), 0.87 after. Whatever else
    # the machine runs slows both sides alike, so the victim is weighed against the daemons'
    # group over the same seconds: without the controller it gets about 1/24 of what they get.
    assert cgroups.cpu_shared(), "no cpu controller to share the cores out by group"
    hogs = 24
    armed = arm("cpu_hogs.py", tmp_path, hogs=hogs, hold=10)
    with attack_running(armed) as (checking, done):
        deadline, busy = time.monotonic() + 120, set()
        while time.monotonic() < deadline and len(busy) <= hogs and checking.is_alive():
            busy = {pid for group in own_groups() for pid in members(group)}
            time.sleep(0.1)
        daemons_seen = identify(busy)
        assert len(busy) > hogs, "the daemons never started"
        wall, before = time.monotonic(), cpu_used(busy)
        share = cpu_share()
        daemons = (cpu_used(busy) - before) / (time.monotonic() - wall)
    assert share > 0.25 * daemons, (
        f"{hogs} daemons of one child used {daemons:.2f} of a core and left another process "
        f"{share:.2f}"
    )
    assert done and done[0].passed, done and done[0].diagnosis  # they break no limit
    assert own_groups() == []
    # The group's kill is SIGKILL to each daemon; under load one may take a moment to act on it.
    assert outliving(daemons_seen) == [], "daemons outlived the check"


def test_a_candidates_text_cannot_draw_a_verdict_on_the_terminal(tmp_path):
    armed = arm("fake_verdict.py", tmp_path)
    result = run_cli("check", SOFTMAX_SPEC, armed, "--suite", "compact", "--seed", "1")
    assert result.returncode == 1, result.stderr
    printed = result.stdout + result.stderr
    assert "\x1b" not in printed  # shown as an escape, never sent to the terminal as one
    assert "\\x1b[2J" in result.stdout and "verdict: NOT CERTIFIED" in result.stdout


def engine_can_open_inotify_and_a_queue() -> list[str]:
    """What the engine's user cannot open now, of an inotify instance and a message queue."""
    libc = ctypes.CDLL(None, use_errno=True)
    refused = []
    fd = libc.inotify_init1(0)
    if fd < 0:
        refused.append(f"inotify: {os.strerror(ctypes.get_errno())}")
    else:
        os.close(fd)
    name = f"/nearmiss-test-{os.getpid()}".encode()
    queue = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    if queue < 0:
        refused.append(f"mqueue: {os.strerror(ctypes.get_errno())}")
    else:
        libc.mq_close(queue)
        libc.mq_unlink(name)
    return refused


def test_a_child_cannot_take_the_engines_users_inotify_or_queues(tmp_path):
    """Per-user kernel counts are charged to the user that made the sandbox's namespace: a
    child holding them all locked the engine's user out until it died (before seccomp refused
    the system calls, this test saw the engine refused both with EMFILE while the check ran on:
    128 instances and 9 default-sized queues are a user's whole allowance here)."""
    assert engine_can_open_inotify_and_a_queue() == []
    armed = arm("kernel_count_hoard.py", tmp_path, hold=8)
    refused: list[str] = []
    with attack_running(armed) as (checking, done):
        while checking.is_alive():
            refused += engine_can_open_inotify_and_a_queue()
            time.sleep(0.05)
    assert refused == [], sorted(set(refused))
    assert done and done[0].passed, done and done[0].diagnosis


def members(group: Path) -> set[int]:
    with contextlib.suppress(OSError):
        return {int(pid) for pid in (group / "cgroup.procs").read_text().split()}
    return set()


def test_a_home_nested_deeper_than_python_recurses_is_cleaned_up(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    armed = arm("deep_home.py", tmp_path, depth=1500)
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    report = run_attack(armed)
    assert report.passed, report.diagnosis  # nesting folders is no offence; leaving them is
    spares.close_all()  # the executors kept for a next check have their homes here too
    assert processes_under(scratch) == []
    assert set(scratch.iterdir()) <= kept_folders()
    for home in zygote.kept_homes():  # a zygote's, kept for the next check: nothing of this one
        assert sorted(p.name for p in home.iterdir()) == ["code", "work"]
        assert not any((home / "code").iterdir()) and not any((home / "work").iterdir())
