"""The spec's answers, kept (``nearmiss.engine.runner.truth_cache``).

The effects: a second check of the same spec starts no spec child and says the same; a changed
spec is answered afresh; control experiments after a kept answer find what a fresh run finds;
a candidate cannot reach the kept answers; nothing is kept where the spec would run unsandboxed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import OPS
from nearmiss.engine.check import check
from nearmiss.engine.forensics.controls import CACHE as control_results
from nearmiss.engine.runner import session, truth_cache

SOFTMAX = OPS / "softmax_rows"
SPEC, GOLDEN = SOFTMAX / "spec.py", SOFTMAX / "golden.py"
# Fails its offset case; the controls that explain it are drawn by the spec's child.
STANDARDISE = Path(__file__).parent / "controls" / "standardise_spec.py"
UNMASKED = Path(__file__).parent / "controls" / "unmasked_variance.py"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(root))
    return root


@pytest.fixture
def spec_children(monkeypatch) -> list[Path]:
    """The work directory of every spec child started from now on."""
    started: list[Path] = []
    original = session.start_spec_child

    def start(workdir, limits, platform):
        started.append(workdir)
        return original(workdir, limits, platform)

    monkeypatch.setattr(session, "start_spec_child", start)
    return started


def kept_files(cache: Path) -> dict[str, str]:
    return {
        str(p.relative_to(cache)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((cache / "ground-truth").rglob("*"))
        if p.is_file()
    }


def verdicts(report) -> list[tuple]:
    return [(c.suite, c.name, c.passed, c.failure_class, c.diagnosis) for c in report.cases]


def test_a_second_check_of_the_same_spec_starts_no_spec_child_and_says_the_same(
    cache, spec_children
):
    first = check(SPEC, GOLDEN, "all", 1)
    assert first.certified and len(spec_children) == 1
    assert len(list((cache / "ground-truth").iterdir())) == 1
    again = check(SPEC, GOLDEN, "all", 1)
    assert again.certified and len(spec_children) == 1  # the kept answer: no spec child
    assert [c.leaves for c in again.cases] == [c.leaves for c in first.cases]
    assert again.integrity.ok and again.integrity == first.integrity  # probes kept too
    # Another seed is another request: answered by the spec's child the first check left
    # (``runner.spares.keep_spec``), and kept beside the first answer.
    check(SPEC, GOLDEN, "all", 2)
    assert len(list((cache / "ground-truth").iterdir())) == 2


def test_a_changed_spec_is_answered_afresh(cache, spec_children, tmp_path):
    spec = tmp_path / "spec.py"
    spec.write_text(SPEC.read_text())
    assert check(spec, GOLDEN, "compact", 1).certified
    source = spec.read_text()
    spec.write_text(source.replace("axis=-1).astype(x.dtype)", "axis=-1).astype(x.dtype) * 2"))
    assert spec.read_text() != source
    changed = check(spec, GOLDEN, "compact", 1)
    assert not changed.certified and changed.cases[0].failure_class == "wrong_values"
    assert len(spec_children) == 2


def test_controls_after_a_kept_answer_find_what_a_fresh_run_finds(
    cache, spec_children, monkeypatch
):
    monkeypatch.setenv("NEARMISS_CACHE_DIR", "off")
    control_results.entries.clear()  # the engine's own memory of control results: runs here
    fresh = check(STANDARDISE, UNMASKED, "all", 3)
    assert not fresh.certified and any(c.controls for c in fresh.cases), fresh.diagnosis
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(cache))
    check(STANDARDISE, UNMASKED, "all", 3)  # kept now
    children = len(spec_children)
    control_results.entries.clear()
    replayed = check(STANDARDISE, UNMASKED, "all", 3)
    # One spec child, started only for the controls (after answering the request again).
    assert len(spec_children) == children + 1
    assert verdicts(replayed) == verdicts(fresh)
    assert [c.controls for c in replayed.cases] == [c.controls for c in fresh.cases]
    assert {r.source for c in replayed.cases for r in c.controls} == {"run"}
    assert replayed.diagnosis == fresh.diagnosis


def test_a_check_asking_controls_asked_before_starts_no_spec_child(cache, spec_children):
    """The control rounds' answers are kept with the request's: the same failing check again
    (the engine's memory of control results cleared, so the candidate runs every control)
    starts no spec child at all, and finds what the first found."""
    control_results.entries.clear()
    first = check(STANDARDISE, UNMASKED, "all", 3)
    assert not first.certified and any(c.controls for c in first.cases), first.diagnosis
    assert len(spec_children) == 1
    rounds = len(list((cache / "ground-truth").iterdir())) - 1
    assert rounds >= 1  # the request's answer, and one entry per control round
    control_results.entries.clear()
    again = check(STANDARDISE, UNMASKED, "all", 3)
    assert len(spec_children) == 1
    assert verdicts(again) == verdicts(first)
    assert [c.controls for c in again.cases] == [c.controls for c in first.cases]
    assert {r.source for c in again.cases for r in c.controls} == {"run"}
    assert again.diagnosis == first.diagnosis


def test_a_candidate_cannot_reach_the_kept_answers(cache, tmp_path):
    assert check(SPEC, GOLDEN, "compact", 1).certified
    before = kept_files(cache)
    assert any(name.endswith("reference.npz") for name in before)
    planted = cache / "ground-truth" / "planted"
    # At import the candidate writes where the kept answers are, and overwrites each kept
    # reference with zeros: in the sandbox none of those paths exists. (Reported, not refused,
    # by the static rules, so that it runs.)
    attack = (
        "import glob\n"
        "import numpy as _np\n"
        f"for _path in [{str(planted)!r}, *glob.glob({str(cache)!r} + '/ground-truth/*/cases/"
        "*/reference.npz')]:\n"
        "    try:\n"
        "        _np.save(_path, _np.zeros(1))\n"
        "    except OSError:\n"
        "        print('REFUSED', _path, flush=True)\n"
    )
    candidate = tmp_path / "kernel.py"
    candidate.write_text(attack + GOLDEN.read_text())
    report = check(SPEC, candidate, "compact", 1, integrity="report")
    assert [c.passed for c in report.cases] == [True]  # it ran, and is right otherwise
    assert not planted.exists()
    assert kept_files(cache) == before
    assert check(SPEC, GOLDEN, "compact", 1).certified


def test_nothing_is_kept_where_the_spec_would_run_unsandboxed(cache, monkeypatch):
    monkeypatch.setenv("NEARMISS_UNSAFE_NO_SANDBOX", "1")
    assert check(SPEC, GOLDEN, "compact", 1).certified
    assert not (cache / "ground-truth").exists() or not any((cache / "ground-truth").iterdir())


def test_an_install_or_upgrade_on_sys_path_changes_the_key(tmp_path, monkeypatch):
    """A worker upgraded in place (a library's ``name-version.dist-info`` renamed) keys anew:
    an answer computed under the old library is never replayed under the new one."""
    site = tmp_path / "site"
    (site / "somelib-1.0.dist-info").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(site))
    request = {"seed": 1, "suite": "compact", "shown": "spec.py"}
    limits = session.Limits()

    def key() -> str | None:
        return truth_cache.entry_key(b"spec", request, "cpu", limits)

    def later(step: int) -> None:  # the folder's new time: a coarse clock may not have moved
        os.utime(site, ns=(step * 10**9, step * 10**9))

    later(1)
    before = key()
    assert before is not None and key() == before
    (site / "somelib-1.0.dist-info").rename(site / "somelib-1.1.dist-info")
    later(2)
    upgraded = key()
    assert upgraded not in (None, before)
    (site / "otherlib-2.0.dist-info").mkdir()
    later(3)
    assert key() not in (None, before, upgraded)


def test_a_system_package_upgrade_changes_the_key(tmp_path, monkeypatch):
    """The child maps the host's /usr: a system library upgraded (dpkg rewrites its status file)
    keys anew, as a Python library does."""
    status = tmp_path / "status"
    status.write_text("Package: libc6\nVersion: 2.36-9\n")
    monkeypatch.setattr(truth_cache, "PACKAGE_DATABASES", (status,))
    request = {"seed": 1, "suite": "compact", "shown": "spec.py"}
    before = truth_cache.entry_key(b"spec", request, "cpu", session.Limits())
    assert before is not None
    assert truth_cache.entry_key(b"spec", request, "cpu", session.Limits()) == before
    status.write_text("Package: libc6\nVersion: 2.36-9+deb12u13\n")
    os.utime(status, ns=(10**9, 10**9))  # a coarse clock may not have moved
    assert truth_cache.entry_key(b"spec", request, "cpu", session.Limits()) not in (None, before)


# --- the store itself, without checks ------------------------------------------------------


def answer(cases: Path, name: str, payload: bytes = b"x") -> list[dict]:
    """A full answer naming one case directory under ``cases``, with one file in it."""
    (cases / name).mkdir(parents=True, exist_ok=True)
    (cases / name / "reference.npz").write_bytes(payload)
    where = str(cases / name)
    return [
        {"event": "spec"},
        {"event": "case_ready", "dir": where, "probes": []},
        {"event": "done"},
    ]


def test_answers_round_trip_and_the_least_recently_used_go_first(cache, tmp_path, monkeypatch):
    cases, elsewhere = tmp_path / "cases", tmp_path / "elsewhere"
    monkeypatch.setattr(truth_cache, "MAX_ENTRIES", 2)
    for key in ("a", "b"):
        truth_cache.keep(key, answer(cases, key), cases)
    old = time.time() - 100
    os.utime(cache / "ground-truth" / "b", (old, old))
    replayed = truth_cache.replay("b", elsewhere)  # b is used now; a is the least recent
    assert replayed is not None and replayed[1]["dir"] == str(elsewhere / "b")
    assert (elsewhere / "b" / "reference.npz").read_bytes() == b"x"
    truth_cache.keep("c", answer(cases, "c"), cases)
    assert sorted(p.name for p in (cache / "ground-truth").iterdir()) == ["b", "c"]
    monkeypatch.setattr(truth_cache, "MAX_BYTES", 1)  # by bytes too: only the newest stays
    truth_cache.keep("d", answer(cases, "d"), cases)
    assert sorted(p.name for p in (cache / "ground-truth").iterdir()) == ["d"]


def test_an_unfinished_or_stray_answer_is_never_kept(cache, tmp_path):
    cases = tmp_path / "cases"
    full = answer(cases, "base")
    truth_cache.keep("unfinished", full[:-1], cases)  # no "done": the child stopped early
    stray = [*full[:-1], {"event": "case_ready", "dir": str(tmp_path), "probes": []}, full[-1]]
    truth_cache.keep("stray", stray, cases)  # names a directory outside its cases
    assert truth_cache.replay("unfinished", cases) is None
    assert truth_cache.replay("stray", cases) is None
    assert [p.name for p in (cache / "ground-truth").iterdir()] == []


def test_a_kept_reference_changed_on_disk_is_dropped_not_believed(cache, spec_children):
    assert check(SPEC, GOLDEN, "compact", 1).certified
    (kept,) = (cache / "ground-truth").glob("*/cases/*/reference.npz")
    forged = kept.parent / "forged.npz"
    np.savez(forged, np.zeros(1, np.float32))  # a well-formed file with other numbers
    forged.replace(kept)
    again = check(SPEC, GOLDEN, "compact", 1)
    assert again.certified and len(spec_children) == 2  # answered afresh, not from the forgery
    assert len(list((cache / "ground-truth").glob("*/cases/*/reference.npz"))) == 1  # re-kept


def test_the_cache_is_off_where_a_child_could_read_it_or_another_user_write_it(
    tmp_path, monkeypatch
):
    open_to_all = tmp_path / "shared"
    (open_to_all / "ground-truth").mkdir(parents=True)
    (open_to_all / "ground-truth").chmod(0o777)
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(open_to_all))
    assert truth_cache._entries() is None
    inside = Path(sys.prefix) / f"nearmiss-test-cache-{os.getpid()}"  # the interpreter's
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(inside))
    try:
        assert truth_cache._entries() is None
    finally:
        shutil.rmtree(inside, ignore_errors=True)
    monkeypatch.setenv("NEARMISS_CACHE_DIR", str(tmp_path / "mine"))
    assert truth_cache._entries() == (tmp_path / "mine" / "ground-truth").resolve()


def test_a_folder_holding_a_link_is_never_kept_nor_a_stray_path_replayed(cache, tmp_path):
    cases = tmp_path / "cases"
    secret = tmp_path / "secret.txt"
    secret.write_text("host file")
    linked = answer(cases, "base")
    (cases / "base" / "leak").symlink_to(secret)  # the engine must not copy the host's file
    truth_cache.keep("linked", linked, cases)
    assert not any((cache / "ground-truth").iterdir())
    truth_cache.keep("fine", answer(cases, "other"), cases)
    entry = cache / "ground-truth" / "fine" / truth_cache.MESSAGES_FILE
    kept = json.loads(entry.read_text())
    kept["messages"][1]["dir"] = "../outside"  # an entry edited to reach out of its cases
    entry.write_text(json.dumps(kept))
    (tmp_path / "outside").mkdir()
    elsewhere = tmp_path / "work" / "cases"
    assert truth_cache.replay("fine", elsewhere) is None
    assert (tmp_path / "outside").is_dir() and not (cache / "ground-truth" / "fine").exists()
