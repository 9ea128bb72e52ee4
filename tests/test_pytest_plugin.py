"""The pytest plugin, as a kernel team uses it: ``pytest`` in a folder holding only a kernel, a
spec and a test file (``examples/kernel_repo``) certifies the kernel in its own run, and fails
the test with the check's diagnosis when the kernel is a near-miss."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kernel_repo"


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture
def repo(tmp_path) -> Path:
    folder = tmp_path / "kernel_repo"
    shutil.copytree(EXAMPLE, folder)
    return folder


def test_pytest_in_a_kernel_repository_certifies_its_kernel(repo):
    done = run_pytest(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_a_near_miss_fails_its_test_with_the_diagnosis_and_the_seed(repo):
    kernel = repo / "kernels" / "scale_shift.py"
    kernel.write_text(kernel.read_text().replace("pl.cdiv(rows, BLOCK_R)", "rows // BLOCK_R"))
    done = run_pytest(repo, "-k", "is_certified", "--nearmiss-seed", "5")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "NotCertified: scale_shift.py is not certified against scale_shift_spec.py" in out
    assert "ragged" in out  # the diagnosis names the failing case
    assert "reproduce with: nearmiss check" in out and "--seed 5" in out
