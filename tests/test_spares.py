"""Spare children (``nearmiss.engine.runner.spares``): started between checks, each used by one
check.

The effects, not the bookkeeping: the processes a check used were started before it began, are
gone when it ends, and no two checks share one; a spare that died while waiting is never handed
out, and one that dies once handed out costs a restart, never a finding against the candidate;
nothing is left running or on disk once spares are switched off or their worker is killed.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from conftest import OPS, Process, alive, identify, outliving
from nearmiss.engine.check import check
from nearmiss.engine.runner import cgroups, spares, zygote
from nearmiss.engine.runner.environment import UNSAFE_ENV
from nearmiss.engine.runner.sandbox import Limits, _process_tree
from nearmiss.engine.runner.scratch import remove_tree, scratch_dir

MATMUL = OPS / "matmul"


@pytest.fixture
def golden():
    """The matmul golden in an engine scratch folder, as the knowledge base's checkouts and the
    search's edits are: only such a candidate can take a spare candidate child, which shows its
    file at the folder it was started with, never at a user's (``session.user_folder``)."""
    folder = scratch_dir("nearmiss-check-")
    try:
        copy = folder / "golden.py"
        copy.write_text((MATMUL / "golden.py").read_text())
        yield copy
    finally:
        remove_tree(folder)


def my_spare_homes() -> set[str]:
    kinds = ("executor", "candidate", "reference", "zygote")
    tags = [f"nearmiss-{kind}-p{os.getpid()}s" for kind in kinds]
    return {
        p.name
        for p in Path(tempfile.gettempdir()).iterdir()
        if any(p.name.startswith(tag) for tag in tags)
    }


def record_handed_out(monkeypatch) -> list[int]:
    """The pid of every spare handed to a check from now on (in this test)."""
    taken: list[int] = []
    original = spares.take

    def take(module, limits, platform, spec=()):
        child = original(module, limits, platform, spec)
        if child is not None:
            taken.append(child.process.pid)
        return child

    monkeypatch.setattr(spares, "take", take)
    return taken


def interpreter_tree(pid: int, timeout_s: float = 30) -> list[int]:
    """A spare's process tree, its sandboxed interpreter last, once that has started: a spare
    is started in the background after a check, so bwrap may not have exec'd Python yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        tree = _process_tree(pid)
        for p in tree:
            try:
                if b"python" in Path(f"/proc/{p}/cmdline").read_bytes():
                    return [q for q in tree if q != p] + [p]
            except OSError:  # gone between the listing and the read
                pass
        assert time.monotonic() < deadline, f"spare {pid} started no interpreter: {tree}"
        time.sleep(0.05)


@pytest.fixture(autouse=True)
def no_kept_answers(monkeypatch):
    """These tests count the spec's children a check takes: a kept answer takes none
    (``truth_cache``), so none is kept here unless a test says so."""
    monkeypatch.setenv("NEARMISS_CACHE_DIR", "off")


@pytest.fixture
def handed_out(monkeypatch):
    """Spares on for one test; the pid of every spare handed to a check."""
    spares.close_all()  # none kept from an earlier test
    taken = record_handed_out(monkeypatch)
    spares.enable()
    try:
        yield taken
    finally:
        spares.disable()


def test_each_check_gets_children_started_before_it_and_only_engine_children_serve_two(
    handed_out, golden
):
    homes_before = my_spare_homes()
    first = check(MATMUL / "spec.py", golden, "compact", 1, targets=("tpu-v5e",))
    assert first.certified
    assert handed_out == []  # nothing was waiting for the first check
    waiting = {module: spares.waiting_pids(module) for module in spares.DEPTH}
    # What one check uses, but a candidate's child where the zygote forks them (``zygote``).
    depth = {module: spares.spare_depth(module, "cpu") for module in spares.DEPTH}
    assert {module: len(pids) for module, pids in waiting.items()} == depth
    assert all(alive(pid) for pids in waiting.values() for pid in pids)
    processes = {module: identify(pids) for module, pids in waiting.items()}
    executors = set(waiting[spares.EXECUTOR_MODULE])

    second = check(MATMUL / "spec.py", golden, "compact", 2, targets=("tpu-v5e",))
    assert second.certified and second.targets["tpu-v5e"].ok
    # The second check ran on the children waiting after the first: the candidate's child
    # started for it, the first check's spec's child and runs' executor, kept, and a spare...
    assert sorted(handed_out) == sorted(pid for pids in waiting.values() for pid in pids)
    # ...the candidate's child and the target judge ended with it; the runs' executor (it never
    # imports a candidate, runs only vetted XLA) waits again, its home emptied, beside a new
    # spare, and so does the spec's child (it never sees a candidate), its spec loaded.
    assert not any(alive(process) for process in processes[spares.CANDIDATE_MODULE])
    assert not set(spares.waiting_pids(spares.CANDIDATE_MODULE)) & set(
        waiting[spares.CANDIDATE_MODULE]
    )
    assert spares.waiting_pids(spares.REFERENCE_MODULE) == waiting[spares.REFERENCE_MODULE]
    assert len(set(spares.waiting_pids(spares.EXECUTOR_MODULE)) & executors) == 1
    assert sum(alive(process) for process in processes[spares.EXECUTOR_MODULE]) == 1
    assert all(
        list(child.home.iterdir()) == []
        for children in spares._spares.values()
        for child in children
        if child.process.pid in executors
    )
    processes = identify(spares.waiting_pids())

    spares.disable()
    assert not any(alive(process) for process in processes)
    assert my_spare_homes() == homes_before  # every spare's home removed


def test_a_spare_that_died_while_waiting_is_never_handed_out(handed_out, golden):
    check(MATMUL / "spec.py", golden, "compact", 1)
    waiting = spares.waiting_pids()
    trees = [interpreter_tree(pid) for pid in waiting]
    processes = identify(pid for tree in trees for pid in tree)
    for tree in trees:  # the sandboxed interpreter dies (the OOM killer, say); bwrap follows
        os.kill(tree[-1], 9)
    time.sleep(0.5)
    report = check(MATMUL / "spec.py", golden, "compact", 2)
    assert report.certified  # its children were started for it
    assert handed_out == []
    assert not any(alive(process) for process in processes)  # nothing of them is left


def test_a_check_whose_spec_answer_is_kept_leaves_the_spec_spare_waiting(
    handed_out, monkeypatch, tmp_path
):
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(tmp_path / "cache"))
    assert check(MATMUL / "spec.py", MATMUL / "golden.py", "compact", 1).certified  # kept now
    waiting = {
        module: spares.waiting_pids(module)
        for module in spares.DEPTH
        if spares.spare_depth(module, "cpu")
    }
    assert all(waiting.values())
    assert check(MATMUL / "spec.py", MATMUL / "golden.py", "compact", 1).certified
    # The candidate's and an executor's spares served it; the spec's was not needed.
    others = {
        pid for module, pids in waiting.items() if module != spares.REFERENCE_MODULE for pid in pids
    }
    assert handed_out and set(handed_out) <= others
    assert spares.waiting_pids(spares.REFERENCE_MODULE) == waiting[spares.REFERENCE_MODULE]
    assert all(alive(pid) for pid in waiting[spares.REFERENCE_MODULE])


@pytest.mark.parametrize(
    "module", [spares.CANDIDATE_MODULE, spares.REFERENCE_MODULE, spares.EXECUTOR_MODULE]
)
def test_a_spare_that_dies_once_handed_out_costs_a_restart_not_a_finding(
    monkeypatch, module, golden
):
    """Killed between being handed out and its first answer (the candidate's import, the
    spec's description, an executor's ready — a kept one's too): the check starts a child for
    it and certifies, as it would have without spares — neither the candidate nor the spec is
    blamed for the worker's loss."""
    spares.close_all()  # none kept from an earlier test: only this test's spares are killed
    original = spares.take
    killed = []

    def take_and_kill(wanted, limits, platform, spec=()):
        child = original(wanted, limits, platform, spec)
        if child is not None and wanted == module:
            child.kill()
            killed.append(child.process.pid)
        return child

    monkeypatch.setattr(spares, "take", take_and_kill)
    # Where candidate's children are forked (``runner.zygote``), the forked one is killed.
    fork, forked = zygote.fork, []

    def fork_and_kill(limits, platform, shows_code_at):
        child = fork(limits, platform, shows_code_at)
        forked.append(child)
        if child is not None and module == spares.CANDIDATE_MODULE and len(forked) == 2:
            child.kill()  # the second check's
            killed.append(child.process.pid)
        return child

    monkeypatch.setattr(zygote, "fork", fork_and_kill)
    spares.enable()
    try:
        check(MATMUL / "spec.py", golden, "compact", 1)
        report = check(MATMUL / "spec.py", golden, "compact", 2)
    finally:
        spares.disable()
    assert len(killed) == 1
    assert report.certified, report.diagnosis


def test_a_users_file_is_never_shown_by_a_child_started_for_another_folder(handed_out, tmp_path):
    """A spare candidate's child, or a zygote, shows its file where it was started to; a file
    in its user's folder must show there (a plain import gives that ``__file__``), so a check
    of a file in another folder forks from a zygote of its own and leaves the first waiting."""
    check(MATMUL / "spec.py", MATMUL / "golden.py", "compact", 1)
    waiting = zygote.kept_homes() or set(spares.waiting_pids(spares.CANDIDATE_MODULE))
    assert waiting
    elsewhere = tmp_path / "golden.py"
    elsewhere.write_text((MATMUL / "golden.py").read_text())
    report = check(MATMUL / "spec.py", elsewhere, "compact", 2)
    assert report.certified
    if zygote.kept_homes():  # where the candidate's children are forked
        assert waiting < zygote.kept_homes()  # the first zygote waits beside the new one
    else:
        assert not set(handed_out) & waiting
        assert set(spares.waiting_pids(spares.CANDIDATE_MODULE)) == waiting


def test_a_check_that_ends_while_others_keep_the_cores_busy_starts_no_spares(monkeypatch):
    """Spares started while other checks run would slow them by what they save (two cores
    here): a check refills only when a check's worth of cores is free."""
    monkeypatch.setattr(spares, "cores", lambda: 2)
    spares.enable()
    try:
        spares.check_began()
        spares.check_began()  # two checks in flight in this process
        spares.refill_after(Limits(), "cpu")  # one ends; the other keeps both cores busy
        assert spares.waiting_pids() == []
        spares.refill_after(Limits(), "cpu")  # the last one ends: the cores are free
        waiting = spares.waiting_pids()
        depth = sum(spares.spare_depth(module, "cpu") for module in spares.DEPTH)
        assert len(waiting) == depth and all(alive(p) for p in waiting)
        processes = identify(waiting)
    finally:
        spares.disable()
    assert not any(alive(process) for process in processes)


KEEPER = r"""
import sys, time
from nearmiss.engine.runner import cgroups, spares, zygote
from nearmiss.engine.runner.sandbox import Limits
spares.enable()
spares.refill(Limits(), "cpu")
forked = zygote.fork(Limits(), "cpu", None)  # a zygote and a child it forked, where it forks
kept = [forked.zygote.process.pid, forked.process.pid] if forked else []
print(" ".join(map(str, spares.waiting_pids() + kept)), flush=True)
time.sleep(600)
"""


def test_spares_die_with_a_worker_killed_outright(tmp_path):
    """A worker killed with SIGKILL runs no exit handler: its spares must go all the same."""
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    keeper = subprocess.Popen(
        [sys.executable, "-c", KEEPER],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path)),
    )
    try:
        spare_pids = [int(p) for p in keeper.stdout.readline().split()]
        # Where candidate's children are forked: no candidate's spare, a zygote and its child.
        forks = cgroups.available() is None
        assert len(spare_pids) == sum(spares.DEPTH.values()) + (1 if forks else 0)
        assert all(alive(pid) for pid in spare_pids)
        time.sleep(1)  # the sandboxed interpreters under each bwrap are up by now
        pids = [pid for spare in spare_pids for pid in _process_tree(spare)]
        assert len(pids) > len(spare_pids)
        processes = identify(pids)
    finally:
        keeper.send_signal(signal.SIGKILL)
        keeper.wait()
        keeper.stdout.close()
    assert outliving(processes) == []


async def test_a_repair_commands_own_worker_keeps_spares_and_closes_them_when_done(
    temporal_address, postgres_dsn, tmp_path, monkeypatch, capsys
):
    """`nearmiss repair` (and fleet, demo) runs its own worker: the session's later checks run
    on children started while the earlier ones' results were used, and when the command ends
    nothing of its spares is left running or on disk."""
    from nearmiss.client.service import repair
    from nearmiss.client.settings import Settings
    from workflows.loop import Guards

    taken = record_handed_out(monkeypatch)  # spares stay off: the command turns them on
    started: list[int] = []
    processes: list[Process] = []
    original_start = spares._start

    def start(module, limits, platform):
        child = original_start(module, limits, platform)
        started.append(child.process.pid)
        processes.extend(identify([child.process.pid]))
        return child

    monkeypatch.setattr(spares, "_start", start)
    original_give_back = spares.give_back

    def give_back(child, started_under, platform):
        kept = original_give_back(child, started_under, platform)
        if kept:  # an executor its check started, kept for the next
            started.append(child.process.pid)
            processes.extend(identify([child.process.pid]))
        return kept

    original_keep_spec = spares.keep_spec

    def keep_spec(child, started_under, platform, spec):
        kept = original_keep_spec(child, started_under, platform, spec)
        if kept:  # the spec's child its check started, kept for the next of the spec
            started.append(child.process.pid)
            processes.extend(identify([child.process.pid]))
        return kept

    original_zygote = zygote._start_zygote

    def start_zygote(*args):
        started_zygote = original_zygote(*args)  # forks the candidate's children (``zygote``)
        started.append(started_zygote.process.pid)
        processes.extend(identify([started_zygote.process.pid]))
        return started_zygote

    monkeypatch.setattr(spares, "give_back", give_back)
    monkeypatch.setattr(spares, "keep_spec", keep_spec)
    monkeypatch.setattr(zygote, "_start_zygote", start_zygote)
    candidate = tmp_path / "floor_grid.py"
    candidate.write_text((OPS / "softmax_rows" / "variants" / "floor_grid.py").read_text())
    settings = Settings.from_env(
        {"TEMPORAL_ADDRESS": temporal_address, "NEARMISS_DATABASE_URL": postgres_dsn}
    )
    homes_before = my_spare_homes()
    code = await repair(
        OPS / "softmax_rows" / "spec.py",
        candidate,
        model="playbook",
        guards=Guards(),
        out=None,
        as_json=True,
        settings=settings,
        use_kb=False,
    )
    assert code == 0, capsys.readouterr()
    # A check after the first ran on spares, or on executors an earlier check kept...
    assert taken and set(taken) <= set(started)
    assert len(set(started)) > len(set(taken))  # some were still waiting when it ended...
    assert spares.waiting_pids() == []  # ...and were closed with it
    assert not any(alive(process) for process in processes)
    # ...and every home removed. (Its end closes what this process kept before it too, as
    # a command's process ends: earlier tests' spares may be gone.)
    assert my_spare_homes() <= homes_before


def test_a_kept_executor_carries_nothing_of_one_check_into_the_next(monkeypatch, golden):
    """The same executors run the golden's check and then a wrong kernel's, with the same spec
    and seed (the same cases, the same case folders): the wrong kernel must be judged on its
    own artifacts, never on the golden's left in the executor's home or memory."""
    spares.close_all()
    taken = record_handed_out(monkeypatch)
    assert check(MATMUL / "spec.py", golden, "compact", 7).certified
    kept = spares.waiting_pids(spares.EXECUTOR_MODULE)
    assert kept  # the golden's executor, waiting for the next check
    wrong = golden.parent / "missing_init.py"
    wrong.write_text((MATMUL / "variants" / "missing_init.py").read_text())
    report = check(MATMUL / "spec.py", wrong, "compact", 7)
    assert set(kept) <= set(taken)  # the second check ran on it
    assert not report.certified and report.failure_class is not None


def test_an_executor_started_unsandboxed_never_serves_a_sandboxed_check(monkeypatch, golden):
    """`--unsafe-no-sandbox` starts children without bubblewrap; an executor kept from such a
    check must never run the artifacts of a check that asked for the sandbox."""
    spares.close_all()
    monkeypatch.setenv(UNSAFE_ENV, "1")
    assert check(MATMUL / "spec.py", golden, "compact", 1).certified
    unsandboxed = spares.waiting_pids(spares.EXECUTOR_MODULE)
    assert unsandboxed  # kept, for the next unsandboxed check
    monkeypatch.delenv(UNSAFE_ENV)
    taken = record_handed_out(monkeypatch)
    report = check(MATMUL / "spec.py", golden, "compact", 2)
    assert report.certified and "bubblewrap" in report.isolation
    assert not set(taken) & set(unsandboxed)


def test_an_executor_that_ran_native_code_is_not_kept(golden):
    """An artifact that calls native code (here XLA's LAPACK, which the executor runs) is not
    plain XLA: the executor that ran it ends with its check."""
    spares.close_all()
    candidate = golden.parent / "with_lapack.py"
    wrapper = (
        "\n_pallas_kernel = kernel\n\n\ndef kernel(x, y):\n"
        "    q, _ = jnp.linalg.qr(jnp.eye(2, dtype=jnp.float32))\n"
        "    return _pallas_kernel(x, y) * jnp.abs(q[0, 0])\n"
    )
    candidate.write_text(golden.read_text() + wrapper)
    check(MATMUL / "spec.py", candidate, "compact", 1, integrity="off")
    assert spares.waiting_pids(spares.EXECUTOR_MODULE) == []
    assert check(MATMUL / "spec.py", golden, "compact", 1).certified
    assert spares.waiting_pids(spares.EXECUTOR_MODULE)  # a plain artifact's executor is kept


def kept_spec_pids() -> list[int]:
    return spares.waiting_pids(spares.REFERENCE_MODULE)


def test_a_kept_spec_child_serves_only_the_same_spec(monkeypatch, tmp_path, golden):
    """The spec's child of a check is kept for the next check of the same spec (its bytes and
    file name): it serves a check on another seed with the spec still loaded. A spec whose file
    now says something else — here a reference twice as large, which the golden no longer
    matches — must be answered by a child that read the new text, never by the one kept with
    the old: else a kernel would be certified against a spec that is not the user's."""
    spares.close_all()
    taken = record_handed_out(monkeypatch)
    spec = tmp_path / "spec.py"
    original = (MATMUL / "spec.py").read_text()
    spec.write_text(original)
    assert check(spec, golden, "compact", 1).certified
    kept = kept_spec_pids()
    assert len(kept) == 1 and all(alive(pid) for pid in kept)

    assert check(spec, golden, "compact", 2).certified
    assert set(kept) <= set(taken)  # the second check of the spec ran on the kept child
    assert kept_spec_pids() == kept  # and it waits again

    doubled = "return 2 * jnp.dot(a, b, preferred_element_type=jnp.float32)"
    spec.write_text(
        original.replace("return jnp.dot(a, b, preferred_element_type=jnp.float32)", doubled)
    )
    taken.clear()
    report = check(spec, golden, "compact", 2)
    assert not report.certified and report.failure_class == "wrong_values", report.diagnosis
    assert not set(kept) & set(taken)  # the new text got a child of its own


def test_a_kept_spec_child_carries_no_case_into_the_next_check(monkeypatch, golden):
    """The kept spec's child answers the next check with that check's own cases: its case
    folder emptied, a wrong kernel judged on fresh references of its own seed."""
    spares.close_all()
    taken = record_handed_out(monkeypatch)
    assert check(MATMUL / "spec.py", golden, "compact", 3).certified
    kept = kept_spec_pids()
    folders = [
        spares.root(c) / "cases"
        for cs in spares._spares.values()
        for c in cs
        if c.module == spares.REFERENCE_MODULE
    ]
    assert kept and folders and not any(any(f.iterdir()) for f in folders)
    wrong = golden.parent / "missing_init.py"
    wrong.write_text((MATMUL / "variants" / "missing_init.py").read_text())
    report = check(MATMUL / "spec.py", wrong, "compact", 4)
    assert set(kept) <= set(taken)
    assert not report.certified and report.failure_class is not None


def test_a_spec_child_near_its_memory_limit_is_not_kept(monkeypatch, golden):
    """A kept child's caches grow; one past its share of the limit ends with its check, so a
    later check's spec can never fail a limit a fresh child would have kept to (a spec's child
    holds about 200 MB of 4,096: a share of 1 % is passed)."""
    spares.close_all()
    monkeypatch.setattr(spares, "MAX_SPEC_MEMORY_SHARE", 0.01)
    report = check(MATMUL / "spec.py", golden, "compact", 1)
    assert report.certified, report.diagnosis
    assert kept_spec_pids() == []
