"""Shared paths and helpers for the engine tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
