"""The dynamic integrity rules: the artifact audit's work model and the engine's judgement of it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from pydantic import ValidationError

from nearmiss.engine.integrity.audit import KERNEL_LABEL, audit_module, parse_module, total_work
from nearmiss.engine.integrity.dynamic import (
    ArtifactAudit,
    Probe,
    audit_violations,
    merge,
    probe_violations,
)
from nearmiss.engine.models import Violation
from nearmiss.engine.runner.artifact import ArtifactRejected, export_traced, refuse_unrunnable
from nearmiss.engine.runner.candidate_child import traced_callbacks
from nearmiss.engine.runner.interpret import force_interpret_on_cpu
from nearmiss.engine.runner.traced_program import TracedProgram

force_interpret_on_cpu()  # for the functions exported as they are, kernels in interpret mode

A = jnp.ones((32, 64), jnp.float32)
B = jnp.ones((64, 16), jnp.float32)


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy_kernel(x, **aliases):
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), **aliases)(x)


def lowered(fn, *args):
    return jax.jit(fn).lower(*args).compiler_ir("stablehlo")


def audit(fn, *args, compiled_only=False):
    """The audit of ``fn``'s artifact, exported as the candidate child does (traced once, each
    kernel labelled and in interpret mode) and parsed back as the executor does."""
    program = TracedProgram.trace(fn, list(args))
    artifact = export_traced(jax.jit(program.function(interpret=True)), list(args))
    exported = jax.export.deserialize(bytearray(artifact))
    module, _context = parse_module(exported.mlir_module())
    kept = tuple(sorted(exported.module_kept_var_idx))
    return audit_module(module, kept=kept, compiled_only=compiled_only)


def test_a_matmul_costs_two_m_n_k_and_glue_costs_nothing():
    assert total_work(lowered(jnp.dot, A, B)) == 2 * 32 * 16 * 64
    glue = lowered(
        lambda x: jnp.pad(x, ((0, 8), (0, 0))).T.reshape(-1)[:100].astype(jnp.bfloat16), A
    )
    assert total_work(glue) == 0


def test_counted_loops_count_each_step_and_cond_its_costliest_branch():
    def scanned(x):
        return jax.lax.scan(lambda c, row: (c + jnp.exp(row).sum(), None), 0.0, x)[0]

    # 32 steps × (exp over 64 + sum over 64 + one scalar add), plus the loop's own counter
    work = total_work(lowered(scanned, A))
    assert 32 * (64 + 64 + 1) <= work <= 32 * (64 + 64 + 8)

    def branchy(x):
        return jax.lax.cond(x[0, 0] > 0, lambda: jnp.tanh(x).sum(), lambda: x[0, 0])

    assert 2 * 32 * 64 <= total_work(lowered(branchy, A)) <= 2 * 32 * 64 + 4


def softmax_row_by_row(x, rows):
    """A softmax computed one row per iteration by XLA, then copied by a pallas_call."""

    def body(state):
        i, out = state
        row = jax.lax.dynamic_slice_in_dim(x, i, 1)
        e = jnp.exp(row - row.max())
        return i + 1, jax.lax.dynamic_update_slice_in_dim(out, e / e.sum(), i, 0)

    _, out = jax.lax.while_loop(lambda s: s[0] < rows, body, (0, jnp.zeros_like(x)))
    return copy_kernel(out)


def test_a_loop_of_known_trip_count_counts_every_iteration():
    found = audit(lambda x: softmax_row_by_row(x, x.shape[0]), A)
    assert found["unbounded"] == []
    assert found["outside_heavy"] >= 32 * 3 * 64  # exp, max and sum over every row


def test_a_loop_of_unknown_trip_count_outside_the_kernel_is_unbounded():
    # The trip count comes from the data: the audit cannot bound it, the loop can do anything.
    found = audit(lambda x: softmax_row_by_row(x, jnp.int32(x.shape[0]) * (x[0, 0] == x[0, 0])), A)
    assert found["pallas_calls"] == 1
    assert {w["primitive"] for w in found["unbounded"]} >= {"exponential", "reduce"}
    violations = audit_violations(ArtifactAudit.model_validate(found), 32 * 64 * 5)
    assert [v.rule for v in violations] == ["wrapper_compute"]
    assert "unknown trip count" in violations[0].detail


def test_work_outside_a_kernel_is_found_through_nested_jit_and_custom_jvp():
    @jax.custom_jvp
    def hidden(x):
        return jnp.exp(x)

    hidden.defjvp(lambda p, t: (hidden(p[0]), t[0]))

    found = audit(lambda x: copy_kernel(jax.jit(hidden)(x)), A)
    assert found["pallas_calls"] == 1
    assert found["outside_heavy"] == 32 * 64
    assert found["costliest"][0]["primitive"] == "exponential"
    assert found["costliest"][0]["where"].startswith("test_integrity_dynamic.py:")


def test_on_a_device_a_kernel_left_in_interpret_mode_is_no_kernel():
    """A candidate that convinces its own process it is on a CPU exports interpret mode's plain
    XLA: on a device the executor counts no kernel in it, and the rule says why."""

    def body(x_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...])

    def kernel(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    on_cpu = audit(kernel, A)
    assert (on_cpu["pallas_calls"], on_cpu["interpreted"]) == (1, 0)
    on_device = audit(kernel, A, compiled_only=True)
    assert (on_device["pallas_calls"], on_device["interpreted"]) == (0, 1)
    assert on_device["outside_heavy"] >= 32 * 64  # its exp is XLA's work now
    (violation,) = [
        v
        for v in audit_violations(ArtifactAudit(**on_device), 32 * 64)
        if v.rule == "no_pallas_call"
    ]
    assert "interpret mode" in violation.detail


def test_kernel_bodies_are_the_kernels_own_work():
    def body(x_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...]) / jnp.sum(jnp.exp(x_ref[...]))

    found = audit(
        lambda x: pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x), A
    )
    assert found["pallas_calls"] == 1
    assert found["outside_heavy"] == found["outside_light"] == 0
    assert found["callbacks"] == [] and found["aliased_inputs"] == []


def test_a_function_merely_named_like_a_kernel_is_not_one():
    def softmax(x):
        return jax.nn.softmax(x, axis=-1)

    softmax.__name__ = softmax.__qualname__ = KERNEL_LABEL  # a forged label, no grid loop
    found = audit(jax.jit(softmax), A)
    assert found["pallas_calls"] == 0 and found["outside_heavy"] > 0


def test_aliasing_a_callers_input_is_found_but_aliasing_a_temporary_is_not():
    direct = audit(lambda x: copy_kernel(x, input_output_aliases={0: 0}), A)
    assert [a["input"] for a in direct["aliased_inputs"]] == [0]
    nested = audit(
        lambda a, b: jax.jit(lambda y: copy_kernel(y, input_output_aliases={0: 0}))(b), A, B
    )
    assert [a["input"] for a in nested["aliased_inputs"]] == [1]
    temporary = audit(lambda x: copy_kernel(x * 2.0, input_output_aliases={0: 0}), A)
    assert temporary["aliased_inputs"] == []


def test_callbacks_are_named_by_the_tracer_even_inside_kernel_bodies():
    def body(x_ref, o_ref):
        jax.debug.callback(lambda v: None, x_ref[0, 0])
        o_ref[...] = x_ref[...]

    def kernel(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    assert traced_callbacks(jax.jit(kernel).trace(A).jaxpr.jaxpr) == ["debug_callback"]
    with pytest.raises(NotImplementedError):  # JAX cannot export it: there is no artifact
        export_traced(jax.jit(kernel), [A])


FORGED_CALLBACK = """
func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.custom_call @xla_ffi_python_cpu_callback(%arg0) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


def test_an_artifact_that_calls_the_host_is_reported_and_never_run():
    module, _context = parse_module(FORGED_CALLBACK)
    assert [c["primitive"] for c in audit_module(module)["callbacks"]] == [
        "xla_ffi_python_cpu_callback"
    ]
    with pytest.raises(ArtifactRejected, match="calls back into the host"):
        refuse_unrunnable(module)


def _audit(heavy=0, light=0, calls=1, **extra) -> ArtifactAudit:
    return ArtifactAudit(
        pallas_calls=calls,
        outside_heavy=heavy,
        outside_light=light,
        costliest=[
            {
                "primitive": "exp",
                "kind": "heavy",
                "operand": "f32[8]",
                "where": "k.py:3",
                "work": heavy,
            }
        ],
        unbounded=extra.get("unbounded", []),
        callbacks=extra.get("callbacks", []),
        aliased_inputs=extra.get("aliased_inputs", []),
    )


@pytest.mark.parametrize(
    ("heavy", "light", "flagged"),
    [
        (0, 0, False),
        (40, 0, False),  # below the absolute floor: a scalar epilogue
        (400, 0, False),  # 4 % of the reference: under the heavy share
        (600, 0, True),  # 6 %: a reduction or transcendental over the data
        (0, 4000, False),  # elementwise arithmetic worth 40 %
        (0, 6000, True),  # ... and worth 60 %
    ],
)
def test_wrapper_compute_thresholds(heavy, light, flagged):
    rules = [v.rule for v in audit_violations(_audit(heavy, light), 10_000)]
    assert ("wrapper_compute" in rules) is flagged


def test_violations_say_what_was_found_and_where():
    found = audit_violations(
        _audit(
            5000,
            calls=0,
            callbacks=[{"primitive": "pure_callback", "where": "k.py:9"}],
            aliased_inputs=[{"input": 1, "where": "k.py:12"}],
        ),
        10_000,
    )
    details = {v.rule: v.detail for v in found}
    assert set(details) == {"no_pallas_call", "wrapper_compute", "host_callback", "input_mutation"}
    assert "exp over f32[8] at k.py:3 (50%)" in details["wrapper_compute"]
    assert "k.py:9" in details["host_callback"] and "input #1" in details["input_mutation"]


@pytest.mark.parametrize(
    "forged",
    [
        {"pallas_calls": -1},
        {"outside_heavy": "0"},
        {"costliest": [{"primitive": "x", "kind": "free", "operand": "", "where": "", "work": 1}]},
        {"extra": 1},
    ],
)
def test_a_forged_audit_is_rejected(forged):
    good = _audit().model_dump()
    with pytest.raises(ValidationError):
        ArtifactAudit.model_validate({**good, **forged})


def test_outputs_that_ignore_a_redrawn_input_are_input_independent():
    ref, ref_new = np.zeros((4, 4)), np.ones((4, 4))
    honest = Probe(0, [ref_new], [ref_new.copy()])
    stuck = Probe(1, [ref_new], [ref.copy()])
    missing = Probe(2, [ref_new], None)
    found = probe_violations([honest, stuck, missing], [ref], [ref.copy()])
    assert [(v.rule, "#1" in v.detail or "#2" in v.detail) for v in found] == [
        ("input_independent", True),
        ("input_independent", True),
    ]
    nan = np.full((2,), np.nan)
    assert probe_violations([Probe(0, [nan], [nan])], [nan], [nan]) == []  # nothing moved


def test_findings_are_merged_across_cases():
    shared = Violation(rule="host_callback", detail="`pure_callback` at k.py:3")
    merged = merge(
        [
            ("compact-base", [shared, Violation(rule="wrapper_compute", detail="60%")]),
            ("extended-ragged", [shared, Violation(rule="wrapper_compute", detail="70%")]),
        ]
    )
    assert [v.detail for v in merged] == [
        "`pure_callback` at k.py:3 (case compact-base, extended-ragged)",
        "60% (case compact-base, extended-ragged)",
    ]
