"""Input files: a candidate or spec is a regular UTF-8 ``.py`` file in the user's tree, within
the size limit; anything else is exit 2 with one line, read no further than its metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SOFTMAX_SPEC, run_cli
from nearmiss.engine.check import admit
from nearmiss.engine.errors import UsageError
from nearmiss.engine.inputs import MAX_SOURCE_BYTES, read_source

CANARY = "nearmiss-canary-5f1d"
GOLDEN = ROOT / "pallas_ops" / "softmax_rows" / "golden.py"


def _refused(result, *words: str) -> str:
    """The one line a refused input gives: exit 2, no traceback, nothing on stdout."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert CANARY not in result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def tree(tmp_path) -> Path:
    """The user's tree (the candidate's own directory), and beside it a secret outside it."""
    (tmp_path / "tree").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "secret.py").write_text(f"KEY = '{CANARY}'\n")
    return tmp_path / "tree"


def test_a_symlink_leaving_the_tree_is_refused_and_not_read(tree):
    link = tree / "kernel.py"
    link.symlink_to(tree.parent / "elsewhere" / "secret.py")
    line = _refused(run_cli("check", SOFTMAX_SPEC, link), "candidate", "symlink", "outside")
    assert line.startswith("nearmiss: error: ")


def test_a_spec_symlink_leaving_the_tree_is_refused(tree):
    link = tree / "spec.py"
    link.symlink_to(tree.parent / "elsewhere" / "secret.py")
    _refused(run_cli("check", link, GOLDEN), "spec", "symlink")


@pytest.mark.skipif(not Path("/etc/shadow").exists(), reason="no /etc/shadow here")
def test_a_symlink_to_etc_shadow_is_refused(tree):
    link = tree / "kernel.py"
    link.symlink_to("/etc/shadow")
    _refused(run_cli("check", SOFTMAX_SPEC, link), "/etc/shadow", "outside")


def test_a_symlink_to_dev_zero_is_refused(tree):
    link = tree / "kernel.py"
    link.symlink_to("/dev/zero")
    _refused(run_cli("check", SOFTMAX_SPEC, link, timeout=60), "candidate")


def test_a_fifo_is_refused_without_blocking(tree):
    fifo = tree / "kernel.py"
    os.mkfifo(fifo)
    _refused(run_cli("check", SOFTMAX_SPEC, fifo, timeout=60), "FIFO")


def test_a_directory_is_refused(tree):
    folder = tree / "kernel.py"
    folder.mkdir()
    _refused(run_cli("check", SOFTMAX_SPEC, folder), "directory")


def test_a_file_not_named_py_is_refused(tree):
    text = tree / "kernel.txt"
    text.write_text(GOLDEN.read_text())
    line = _refused(run_cli("check", SOFTMAX_SPEC, text), "not a .py file")
    assert "NoneType" not in line


def test_non_utf8_bytes_are_refused(tree):
    latin = tree / "kernel.py"
    latin.write_bytes(GOLDEN.read_bytes() + "# caf\u00e9\n".encode("latin-1"))
    _refused(run_cli("check", SOFTMAX_SPEC, latin), "not UTF-8")


def test_an_oversized_file_is_refused(tree):
    big = tree / "kernel.py"
    big.write_text(GOLDEN.read_text() + "#" * MAX_SOURCE_BYTES + "\n")
    _refused(run_cli("check", SOFTMAX_SPEC, big), "bytes", str(MAX_SOURCE_BYTES))


@pytest.mark.end_to_end
def test_a_symlink_inside_the_tree_is_followed(tree):
    (tree / "versions").mkdir()
    real = tree / "versions" / "v2.py"
    real.write_text("import os\n" + GOLDEN.read_text())  # refused by the gate: nothing runs
    link = tree / "kernel.py"
    link.symlink_to(Path("versions") / "v2.py")
    source, static, execute = admit(SOFTMAX_SPEC, link, "enforce")
    assert source == real.read_text() and not execute
    assert static[0].detail == "import of `os` at kernel.py:1"
    result = run_cli("check", SOFTMAX_SPEC, link, "--json", "--suite", "compact")
    assert result.returncode == 1 and "not executed" in result.stdout, result.stderr


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"def kernel(x):\n    return x\n\0", "NUL"),
        (b"# -*- coding: latin-1 -*-\ndef kernel(x):\n    return x\n", "encoding"),
        (b"# -*- coding: utf-7 -*-\ndef kernel(x):\n    return x\n", "encoding"),
    ],
)
def test_text_the_interpreter_would_read_differently_is_refused(tree, content, reason):
    path = tree / "kernel.py"
    path.write_bytes(content)
    with pytest.raises(UsageError, match=reason):
        read_source("candidate", path)


def test_a_utf8_byte_order_mark_is_accepted_and_stripped(tree):
    path = tree / "kernel.py"
    path.write_bytes(b"\xef\xbb\xbfdef kernel(x):\n    return x\n")
    assert read_source("candidate", path) == "def kernel(x):\n    return x\n"


def test_a_link_loop_and_a_missing_file_are_one_line_usage_errors(tree):
    loop = tree / "kernel.py"
    loop.symlink_to("kernel.py")
    with pytest.raises(UsageError, match="cannot read candidate"):
        read_source("candidate", loop)
    with pytest.raises(UsageError, match="candidate file not found"):
        read_source("candidate", tree / "absent.py")


def test_pseudo_and_device_trees_are_refused(tree, monkeypatch):
    # A link into /proc is refused even from a working directory that contains it...
    link = tree / "kernel.py"
    link.symlink_to(f"/proc/{os.getpid()}/environ")
    monkeypatch.chdir("/proc")
    with pytest.raises(UsageError):
        read_source("candidate", link)
    # ...and a .py file under /dev is refused though it is a regular file (tmpfs).
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        planted = shm / f"nearmiss-test-{os.getpid()}.py"
        planted.write_text("def kernel(x):\n    return x\n")
        try:
            with pytest.raises(UsageError, match="special file"):
                read_source("candidate", planted)
        finally:
            planted.unlink()


def ast_threads(mode: str, seconds: float) -> dict:
    """Run ``tests/races/ast_threads.py`` (threads building ASTs at once, provoked)."""
    script = ROOT / "tests" / "races" / "ast_threads.py"
    done = subprocess.run(
        [sys.executable, str(script), mode, str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 60,
        check=True,
    )
    return json.loads(done.stdout)


def test_parsing_and_reading_arrays_from_many_threads_share_one_lock():
    # The control: bare ast.parse and np.load in three threads fail within a second here
    # (CPython 3.11; seen for real in a check whose executor thread read an array file while
    # the main thread read another). Only asserted on 3.11, where it was measured: the GPU
    # machine's 3.12 was not tried.
    bare = ast_threads("bare", 20)
    if sys.version_info < (3, 12):
        assert bare["errors"], bare
    # The engine's parse_source and load_arrays, three times as long as the control needs: no error.
    engine = ast_threads("engine", 3)
    assert engine["errors"] == [] and engine["parses"] > 0 and engine["loads"] > 0, engine


def test_a_caller_may_widen_the_tree_to_a_fleet_root(tree):
    (tree / "shared").mkdir()
    (tree / "shared" / "kernel.py").write_text("def kernel(x):\n    return x\n")
    (tree / "member").mkdir()
    link = tree / "member" / "kernel.py"
    link.symlink_to(Path("..") / "shared" / "kernel.py")
    with pytest.raises(UsageError, match="outside"):
        read_source("candidate", link)
    assert read_source("candidate", link, tree=tree).startswith("def kernel")
