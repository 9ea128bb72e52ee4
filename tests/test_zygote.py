"""Candidate's children forked from a zygote (``runner.zygote``): what one candidate does in its
child reaches neither the next candidate checked in the same worker nor the zygote that forks
them. The suite keeps children between checks (``conftest``), so every check here of a folder
checked before runs in a forked child; these tests check the effects across two checks."""

from __future__ import annotations

import signal

import pytest
from test_attacks_containment import arm, canary, run_attack, said

from conftest import OPS, SOFTMAX_SPEC, processes_under
from nearmiss.engine.check import check
from nearmiss.engine.runner import cgroups, spares, zygote

GOLDEN = (OPS / "softmax_rows" / "golden.py").read_text()
WRONG = GOLDEN.replace(
    "jnp.sum(e, axis=-1, keepdims=True)", "jnp.sum(e, axis=-1, keepdims=True) * 0.99"
)
assert WRONG != GOLDEN


@pytest.fixture(autouse=True)
def in_cgroups() -> None:
    """A zygote serves only where each forked child gets a cgroup of its own."""
    assert cgroups.available() is None, cgroups.available()


@pytest.fixture
def forks(monkeypatch) -> dict[str, int]:
    """How many zygotes were started and children forked during the test."""
    counts = {"zygotes": 0, "forked": 0}
    start, fork = zygote._start_zygote, zygote.ForkedChild.__init__

    def counted_start(*args, **kwargs):
        counts["zygotes"] += 1
        return start(*args, **kwargs)

    def counted_fork(self, *args, **kwargs):
        counts["forked"] += 1
        return fork(self, *args, **kwargs)

    monkeypatch.setattr(zygote, "_start_zygote", counted_start)
    monkeypatch.setattr(zygote.ForkedChild, "__init__", counted_fork)
    return counts


def honest_and_wrong(folder) -> tuple[bool, bool]:
    """Whether the golden, then the same kernel off by 1 %, are certified from ``folder``."""
    (folder / "honest.py").write_text(GOLDEN)
    (folder / "wrong.py").write_text(WRONG)
    honest = check(SOFTMAX_SPEC, folder / "honest.py", "compact", 3).certified
    wrong = check(SOFTMAX_SPEC, folder / "wrong.py", "compact", 3).certified
    return honest, wrong


def test_what_a_candidate_leaves_reaches_neither_the_next_one_nor_the_zygote(tmp_path, forks):
    secret = canary()
    victim = tmp_path / "victim"  # a host folder the engine's user can write
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("kept")
    attack = arm(
        "zygote_leave.py",
        tmp_path,
        canary=secret,
        victim=str(victim),
        honest=GOLDEN,
        next_name="wrong.py",
    )
    left = said(run_attack(attack))
    # The attack was live: it wrote a file in each place a plain run can, and links where the
    # next children's work folders will be.
    live = ("tmp", "cwd", "deep", "plant", "next1", "xattr_tmp", "time_cwd", "lock_tmp", "lock_cwd")
    assert {left[k] for k in live} == {"done"}, left
    # The zygote's home is read-only to its children; System V IPC is refused (EPERM); its
    # ancestors (the middle process and the zygote) refuse even to open their memory.
    assert "done" not in {left[k] for k in ("move_code", "link_code", "home_file")}, left
    assert left["shm"] == "errno1"
    memories = {k: v for k, v in left.items() if k.startswith("mem")}
    assert len(memories) >= 2 and set(memories.values()) == {"PermissionError"}, left

    seen = said(run_attack(arm("zygote_look.py", tmp_path, canary=secret)))
    assert seen == {"seen": "nothing", "segments": "0"}
    # The honest kernel planted under the next candidate's name is not what is checked.
    assert honest_and_wrong(tmp_path) == (True, False)
    assert sorted(p.name for p in victim.rglob("*")) == ["precious.txt", "sub"]
    assert forks == {"zygotes": 1, "forked": 4}  # one zygote forked every child of the folder


@pytest.mark.parametrize("sent", [signal.SIGSTOP, signal.SIGKILL], ids=["SIGSTOP", "SIGKILL"])
def test_a_candidate_that_signals_every_process_it_sees_harms_only_itself(tmp_path, forks, sent):
    run_attack(arm("zygote_kill_all.py", tmp_path, signal=int(sent)), case_timeout_s=10)
    assert honest_and_wrong(tmp_path) == (True, False)
    assert processes_under(tmp_path) == []
    assert forks["forked"] >= 1


def test_a_forked_child_loads_what_a_fresh_one_does_and_draws_its_own_numbers(
    tmp_path, forks, monkeypatch
):
    tells = arm("zygote_tells.py", tmp_path)
    # Twice: the zygote's work between two forks (emptying /tmp) must load nothing either.
    forked = [said(run_attack(tells)) for _ in range(2)]
    assert forks["forked"] == 2
    monkeypatch.setattr(spares, "forks_candidates", lambda platform: False)
    fresh = said(run_attack(tells))
    assert forks["forked"] == 2  # that one was started afresh
    loaded = [{k: said[k] for k in ("modules", "count")} for said in (*forked, fresh)]
    assert loaded[0] == loaded[1] == loaded[2], loaded
    assert forked[0]["numpy"] != forked[1]["numpy"]  # numpy's generator seeded in each fork
