"""Indistinguishable: a candidate sees what a plain import of its file shows.

Each ``tests/forgeries/harness_*.py`` computes right only where it can tell it is being checked
(its docstring says by what). Imported plainly, in a fresh Python in its own folder, it decides
to be wrong; under the engine it must decide the same, so it is not certified. The static gate
is off: these hold by the harness alone (the gate refuses ``os``, ``sys`` and frames besides).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SOFTMAX_SPEC
from nearmiss.engine import check as check_module
from nearmiss.engine.check import check

FORGERIES = Path(__file__).resolve().parent / "forgeries"
CHAMELEONS = sorted(p.name for p in FORGERIES.glob("harness_*.py"))
# Traced as a user would (on a CPU, where a kernel must be interpreted to run, tracing is
# enough to make every chameleon decide).
PLAIN_USE = (
    "import jax, jax.numpy as jnp; import {module} as m; "
    "jax.make_jaxpr(m.kernel)(jnp.zeros((64, 256), jnp.float32)); print(m.RIGHT)"
)


@pytest.fixture
def no_static_gate(monkeypatch):
    monkeypatch.setattr(check_module, "static_violations", lambda source, name: [])


def decides_when_imported_plainly(name: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_USE.format(module=name.removesuffix(".py"))],
        cwd=FORGERIES,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("name", CHAMELEONS)
def test_a_kernel_right_only_under_the_harness_is_not_certified(no_static_gate, name):
    assert decides_when_imported_plainly(name) == "False"  # wrong where a user imports it
    report = check(SOFTMAX_SPEC, FORGERIES / name, "compact", 5)
    assert report.cases and not report.cases[0].passed, report.diagnosis
    assert not report.certified


def test_inside_the_window_the_engine_is_gone_and_its_copies_do_not_outlive_it():
    import importlib

    import nearmiss.engine.runner.arrays as engine_arrays
    from nearmiss.engine.runner.plain_import import as_plain_import

    argv, path = list(sys.argv), list(sys.path)
    with as_plain_import():
        assert not [name for name in sys.modules if name.split(".")[0] == "nearmiss"]
        assert sys.argv == ["-c"] and sys.path[0] == ""
        assert not hasattr(sys.modules["__main__"], "__file__")
        # A candidate's own copy of an engine module (its code runs again, fresh)...
        copy = importlib.import_module("nearmiss.engine.runner.arrays")
        assert copy is not engine_arrays
    # ...is never what the engine finds afterwards.
    assert sys.modules["nearmiss.engine.runner.arrays"] is engine_arrays
    assert (sys.argv, sys.path) == (argv, path)


def test_asking_which_arrays_are_alive_is_refused_by_the_gate():
    """The one tell the harness cannot hide: a user's call has the input alive, the engine's
    trace of shapes has none (``tests/forgeries/gated_live_arrays.py``)."""
    report = check(SOFTMAX_SPEC, FORGERIES / "gated_live_arrays.py", "compact", 5)
    assert not report.certified
    assert "config_tamper" in {v.rule for v in report.integrity.violations}
