"""The executor's and the screen's CPU compile (``runner.cpu_compile``): the same outputs, bit for
bit, as XLA's defaults; an XLA without the option still compiles; a program's own failure is
raised as it was."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import export  # noqa: E402

from nearmiss.engine.runner import cpu_compile  # noqa: E402
from nearmiss.engine.runner.candidate_child import import_candidate  # noqa: E402
from nearmiss.engine.runner.interpret import force_interpret_on_cpu  # noqa: E402
from nearmiss.engine.spec import load_spec  # noqa: E402

OPS = Path(__file__).resolve().parents[1] / "pallas_ops"


def _bytes(output) -> bytes:
    return b"".join(np.asarray(leaf).tobytes() for leaf in jax.tree_util.tree_leaves(output))


@pytest.fixture
def interpret_mode():
    """Pallas calls in interpret mode, as in the candidate's child; put back after the test."""
    from jax._src import config as jax_config

    flag = jax_config.pallas_tpu_interpret_mode_context_manager
    before = flag.value
    force_interpret_on_cpu()
    yield
    flag.set_global(before)


@pytest.mark.parametrize("op", ["softmax_rows", "ema_scan", "layer_norm"])
def test_an_artifact_gives_the_defaults_outputs_bit_for_bit(op, interpret_mode):
    spec = load_spec(OPS / op / "spec.py")
    kernel = import_candidate(str(OPS / op / "golden.py"), f"cpu_compile_{op}").kernel
    for index, case in enumerate([*spec.compact, *spec.extended][:2]):
        args = list(spec.make_inputs(case, jax.random.key(index)))
        exported = export.export(jax.jit(kernel))(*args)
        lowered = jax.jit(exported.call).lower(*args)
        ours = cpu_compile.compile_lowered(lowered)
        assert _bytes(ours(*args)) == _bytes(lowered.compile()(*args)), (op, case.name)


def test_an_xla_without_the_option_compiles_with_its_defaults(monkeypatch):
    monkeypatch.setattr(cpu_compile, "CPU_OPTIONS", {"xla_cpu_option_nobody_has": False})
    monkeypatch.setattr(cpu_compile, "_refused", set())
    lowered = jax.jit(lambda x: x * 2.0).lower(np.ones(4, np.float32))
    assert np.array_equal(cpu_compile.compile_lowered(lowered)(np.ones(4, np.float32)), [2.0] * 4)
    assert cpu_compile._refused == {"xla_cpu_option_nobody_has"}  # asked once, not again


def test_an_option_the_xla_refuses_leaves_the_others_asked_for(monkeypatch):
    known = {"xla_cpu_use_fusion_emitters": False}
    monkeypatch.setattr(cpu_compile, "CPU_OPTIONS", {**known, "xla_cpu_option_nobody_has": 2})
    monkeypatch.setattr(cpu_compile, "_refused", set())
    lowered = jax.jit(lambda x: x * 2.0).lower(np.ones(4, np.float32))
    assert np.array_equal(cpu_compile.compile_lowered(lowered)(np.ones(4, np.float32)), [2.0] * 4)
    asked = []

    class Recording:
        def compile(self, compiler_options=None):
            asked.append(compiler_options)
            return "compiled"

    assert cpu_compile.compile_lowered(Recording()) == "compiled"
    assert asked == [known]


def test_a_program_that_fails_to_compile_raises_its_own_error(monkeypatch):
    monkeypatch.setattr(cpu_compile, "_refused", set())

    class Failing:
        def compile(self, compiler_options=None):
            raise RuntimeError("the program's own failure")

    with pytest.raises(RuntimeError, match="own failure"):
        cpu_compile.compile_lowered(Failing())
    assert cpu_compile._refused == set()


def test_the_spec_childs_flags_come_first_and_only_from_a_jaxlib_known_to_take_them():
    ours = "--xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=2"
    assert cpu_compile.spec_child_xla_flags("", "0.10.2") == ours
    # The user's flags follow, so theirs win where both name the same flag.
    mine = "--xla_cpu_use_fusion_emitters=true --xla_dump_to=/x"
    assert cpu_compile.spec_child_xla_flags(mine, "0.10.2") == f"{ours} {mine}"
    # An XLA that might not know the flag would stop the process: nothing is added.
    assert cpu_compile.spec_child_xla_flags(mine, "0.99.0") == mine
    assert cpu_compile.spec_child_xla_flags("", "0.99.0") == ""


def test_the_spec_child_is_started_with_them(tmp_path, monkeypatch):
    from nearmiss.engine.runner.sandbox import Limits
    from nearmiss.engine.runner.spec_sandbox import start_spec_child

    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    started = {}
    monkeypatch.setattr(
        "nearmiss.engine.runner.spec_sandbox.SandboxChild",
        lambda *args, **kwargs: started.update(kwargs),
    )
    start_spec_child(tmp_path, Limits(), "cpu")
    expected = cpu_compile.spec_child_xla_flags("--xla_dump_to=/nowhere")
    assert started["extra_env"] == {"XLA_FLAGS": expected}
    assert expected.endswith("--xla_dump_to=/nowhere")
