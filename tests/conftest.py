"""Shared paths and helpers for the engine tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from nearmiss.engine.runner import cgroups, scratch, spares
from nearmiss.engine.runner.blas_threads import one_blas_thread
from nearmiss.engine.runner.compile_cache import CACHE_ENV
from nearmiss.engine.runner.process_table import start_time
from nearmiss.engine.targets.libtpu_env import prepare_environment

# The tests' PostgreSQL clusters skip fsync (a machine crash is not what they test); a server
# crash still loses no commit (infra.devstack).
os.environ.setdefault("NEARMISS_POSTGRES_NO_FSYNC", "1")
# JAX in the test processes computes on the CPU, and libtpu (TPU targets) stays quiet when loaded.
prepare_environment()
# The test processes and the workers they start compute on one BLAS thread, as the command does
# (``nearmiss.cli``): xdist's workers inherit it before they import NumPy.
one_blas_thread()

ROOT = Path(__file__).resolve().parent.parent
PLANTED = ROOT / "tests" / "planted"
OPS = ROOT / "pallas_ops"
SOFTMAX_SPEC = OPS / "softmax_rows" / "spec.py"
MATMUL_SPEC = OPS / "matmul" / "spec.py"


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess:
    """Run ``nearmiss`` as a user would, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "nearmiss.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=ROOT,
    )


def check_json(
    spec: Path, candidate: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[int, dict]:
    result = run_cli("check", spec, candidate, "--json", "--seed", "7", *extra, env=env)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


@pytest.fixture
def softmax_spec() -> Path:
    return SOFTMAX_SPEC


SWEEP_KINDS = {
    "test_golden_certifies": "goldens certified",
    "test_playbook_over_the_corpus": "variants failing with their labelled class, then repaired",
    "test_corpus_variant_fails_with_its_label": "variants failing with their labelled class",
    "test_integrity_case": "integrity cases (cheats rejected with their rule, honest clean)",
}


# One cache (the spec's compiled programs and kept answers) for the whole run, shared by its
# xdist workers and removed at its end: tests neither read nor fill the user's ~/.cache.
def pytest_configure(config) -> None:
    _interrupt_on_sigterm()
    given = getattr(config, "workerinput", {}).get(CACHE_ENV)
    if given is not None:  # an xdist worker: its controller's cache
        os.environ[CACHE_ENV] = given
    elif CACHE_ENV not in os.environ:
        config.nearmiss_cache = tempfile.mkdtemp(prefix="nearmiss-test-cache-")
        os.environ[CACHE_ENV] = config.nearmiss_cache


def _interrupt_on_sigterm() -> None:
    """SIGTERM (a CI job's timeout, ``kill``) unwinds a test process as Ctrl-C does, so the
    fixtures' finalizers stop the servers it started (PostgreSQL, Temporal) and its children;
    Python's default would end it at once and leave them running."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        with contextlib.suppress(ValueError):  # not the main thread: leave it as it is
            signal.signal(signal.SIGTERM, interrupt)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    node.workerinput[CACHE_ENV] = os.environ[CACHE_ENV]


def pytest_unconfigure(config) -> None:
    made = getattr(config, "nearmiss_cache", None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(CACHE_ENV, None)


# Nothing a run started may outlive it: an engine child whose engine died (a killed worker, a
# test's own engine) and is still running after the run is a leak, and fails the run.
LEAK_GRACE_S = 15.0


def pytest_sessionstart(session) -> None:
    session.config.nearmiss_started = start_time(os.getpid()) or 0
    # Checks run one after another in each test process, as in a worker: their executors and
    # spec's children are kept between checks (``runner.spares``), and every test runs that way.
    spares.keep_warm()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session) -> None:
    spares.close_all()
    if hasattr(session.config, "workerinput"):
        return  # the controller looks, once every worker has finished
    started = getattr(session.config, "nearmiss_started", 0)
    deadline = time.monotonic() + LEAK_GRACE_S  # a child exits soon after its engine
    while (left := scratch.orphaned_children(started)) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        _report_leaks(session, left)
    finally:
        cgroups.remove_orphaned_groups()  # of engines the tests killed on purpose: empty now


def _report_leaks(session, left: list[int]) -> None:
    if not left:
        return
    commands = []
    for pid in left:
        with contextlib.suppress(OSError):
            commands.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:300])
            os.kill(pid, signal.SIGKILL)  # the inner bwrap goes with the outer: read first
    print(f"\nnearmiss: {len(left)} engine children outlived their engines (killed now):")
    for command in filter(None, commands):
        print("  " + command.decode(errors="replace"))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    """Tally the corpus sweep (its reports reach here from every xdist worker)."""
    tally: dict[str, list[int]] = {}
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            swept = ("test_corpus_sweep.py::", "test_playbook.py::test_playbook_over_the_corpus")
            swept += ("test_playbook.py::test_corpus_variant_fails_with_its_label",)
            if report.when != "call" or not any(part in report.nodeid for part in swept):
                continue
            name = report.nodeid.split("::", 1)[1].split("[", 1)[0]
            counts = tally.setdefault(name, [0, 0])
            counts[0] += outcome == "passed"
            counts[1] += 1
    if not tally:
        return
    terminalreporter.section("corpus sweep")
    right = sum(c[0] for c in tally.values())
    total = sum(c[1] for c in tally.values())
    for name, (passed, count) in tally.items():
        terminalreporter.write_line(f"{SWEEP_KINDS.get(name, name)}: {passed}/{count}")
    terminalreporter.write_line(f"accuracy: {right}/{total} = {right / total:.1%}")


# The slow groups, marked here so a run can leave them out (`-m "not stack and not corpus"`):
# tests on a real Temporal server or PostgreSQL cluster (by the fixtures they use), and the
# sweeps over the bundled corpus and the planted sets (by where they are).
STACK_FIXTURES = {"temporal_address", "postgres_cluster"}
CORPUS_FILES = {"test_corpus_sweep.py", "test_planted_sets.py"}  # and the planted sets' files


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if STACK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.stack)
        file = item.path.name
        planted_set = file.startswith("test_playbook_")
        if planted_set or file in CORPUS_FILES or item.name.startswith("test_playbook_over_"):
            item.add_marker(pytest.mark.corpus)


def kept_children() -> set[int]:
    """The processes of children the engine keeps waiting for the next check on purpose
    (``runner.spares``: executors, spec's children; never one that held a candidate)."""
    from nearmiss.engine.runner import zygote
    from nearmiss.engine.runner.sandbox import _process_tree

    waiting = {p for pid in spares.waiting_pids() for p in _process_tree(pid)}
    return waiting | zygote.kept_processes()


def kept_folders() -> set[Path]:
    """The scratch folders of the children kept waiting (``kept_children``): the spares' work
    directories and the zygotes' homes."""
    from nearmiss.engine.runner import zygote

    with spares._lock:
        roots = {spares.root(c) for children in spares._spares.values() for c in children}
    return roots | zygote.kept_homes()


Process = tuple[int, str | None]  # a pid and its start time: a pid alone may be reused


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def identify(pids) -> list[Process]:
    """Each process as itself: on a busy machine (pid_max 32768, every JAX thread takes a
    pid) a pid freed during a check can belong to another process by its end."""
    return [(pid, (_stat(pid) or [None] * 20)[19]) for pid in pids]


def alive(process: int | Process) -> bool:
    """Running: a zombie left to the host's init to reap is not, nor another process that was
    given the pid since it was identified."""
    pid, started = process if isinstance(process, tuple) else (process, None)
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return False
    return started is None or fields[19] == started


def outliving(processes: list[Process], seconds: float = 10) -> list[Process]:
    """Those of the processes still running after up to ``seconds``: a process killed a moment
    ago (SIGKILL is delivered, not yet acted on under load) is given the time to go."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in processes) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in processes if alive(p)]


def processes_under(folder: Path) -> list[int]:
    """PIDs whose working directory lies under ``folder``, but for the children the engine
    keeps waiting (``kept_children``)."""
    found = []
    kept = kept_children()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in kept:
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(str(folder)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def private_stack(home: Path):
    """A dev-stack configuration of its own: state under ``home``, free loopback ports."""
    from infra.devstack import StackConfig

    return StackConfig(home=home, temporal_port=free_port(), postgres_port=free_port())


@pytest.fixture(scope="session")
def postgres_cluster(tmp_path_factory) -> str:
    """A real PostgreSQL cluster of this test process, stopped (and waited for) at the end."""
    from infra.devstack import PostgresService

    config = private_stack(tmp_path_factory.mktemp("pg-home"))
    service = PostgresService(config)
    service.start()
    try:
        yield config.connect_dsn  # with the generated password: never print it
    finally:
        service.stop()
        service.remove_data()


@pytest.fixture
def postgres_dsn(postgres_cluster) -> str:
    """A fresh database per test: what one test's repairs teach the knowledge base (learned
    patches, negative knowledge) must not change what another test's model is asked."""
    import asyncio
    import uuid

    import asyncpg

    name = f"test_{uuid.uuid4().hex[:12]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(postgres_cluster)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f"CREATE DATABASE {name}"))
    yield postgres_cluster.rsplit("/", 1)[0] + f"/{name}"
    asyncio.run(admin(f"DROP DATABASE {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def temporal_address(tmp_path_factory) -> str:
    """A real Temporal dev server of this test process, stopped (and waited for) at the end."""
    from infra.devstack import TemporalService

    config = private_stack(tmp_path_factory.mktemp("temporal-home"))
    service = TemporalService(config)
    service.start()
    try:
        yield config.temporal_address
    finally:
        service.stop()


@pytest.fixture
async def store(postgres_dsn):
    """The event store on this test's own database."""
    from kb.events import EventStore

    store = await EventStore.connect(postgres_dsn)
    yield store
    await store.close()


@pytest.fixture
async def seeded_store(store):
    """The event store with the shipped seed knowledge loaded, as a fresh install has it."""
    from kb.knowledge import load_seed

    await load_seed(store)
    return store


@pytest.fixture
async def client(temporal_address, postgres_dsn):
    """A Temporal client with the project's data converter and search attributes."""
    from nearmiss.client.service import connect
    from nearmiss.client.settings import Settings

    return await connect(Settings(temporal_address, postgres_dsn, False, None))
