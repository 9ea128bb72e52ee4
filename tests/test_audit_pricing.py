"""The audit prices every op by the work it does, and denies what it cannot price.

Each route here once hid work from the audit: a matmul inside a ``lax.composite``, a matmul done
by a LAPACK triangular solve, column sums by one ``scatter_add``, an FFT, a sliding window, an
op whose region runs per element. Each test computes work outside a (tiny) kernel through the
route and asserts the effect: the audit prices it near its flop count, and the engine's rule
flags it against the honest reference's work. Glue around a kernel that does the work stays
clean, and an op the audit cannot price is flagged rather than waved through.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from pydantic import ValidationError

from conftest import MATMUL_SPEC
from nearmiss.engine import check as check_module
from nearmiss.engine.check import check
from nearmiss.engine.integrity.audit import audit_module, parse_module, total_work
from nearmiss.engine.integrity.dynamic import ArtifactAudit, audit_violations
from nearmiss.engine.runner.artifact import export_traced
from nearmiss.engine.runner.interpret import force_interpret_on_cpu
from nearmiss.engine.runner.traced_program import TracedProgram

force_interpret_on_cpu()  # for the functions exported as they are, kernels in interpret mode

FORGERIES = Path(__file__).resolve().parent / "forgeries"
N = 64
SPD = jnp.eye(N) * N + jnp.ones((N, N))  # symmetric positive definite, well conditioned
TALL = jnp.linspace(-1.0, 1.0, 96 * N).reshape(96, N)
X = jnp.linspace(-2.0, 2.0, 64 * 256).reshape(64, 256)


def _copy(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def copy_kernel(x):
    return pl.pallas_call(_copy, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


def lowered(fn, *args):
    return jax.jit(fn).lower(*args).compiler_ir("stablehlo")


def audit(fn, *args):
    """The audit of ``fn``'s artifact, exported as the candidate child does (traced once, each
    kernel labelled and in interpret mode) and parsed back as the executor does."""
    program = TracedProgram.trace(fn, list(args))
    artifact = export_traced(jax.jit(program.function(interpret=True)), list(args))
    exported = jax.export.deserialize(bytearray(artifact))
    module, _context = parse_module(exported.mlir_module())
    return audit_module(module, kept=tuple(sorted(exported.module_kept_var_idx)))


def audit_text(text):
    module, _context = parse_module(text)
    return audit_module(module)


def rules(found, reference_work):
    return [v.rule for v in audit_violations(ArtifactAudit(**found), reference_work)]


def outside(fn):
    """``fn``'s outputs, flattened to one real vector and copied by a pallas_call: all of
    ``fn``'s work is XLA's, outside the kernel."""

    def wrapped(*args):
        leaves = jax.tree_util.tree_leaves(fn(*args))
        flat = [jnp.real(leaf).astype(jnp.float32).reshape(-1) for leaf in leaves]
        return copy_kernel(jnp.concatenate(flat))

    return wrapped


# -- each route, priced by its work and flagged --------------------------------------------------


def test_a_matmul_inside_a_composite_is_the_matmul():
    a, b = X[:, :128], X.reshape(128, 128)[:, :96]
    found = audit(outside(lambda a, b: jax.lax.composite(jnp.dot, name="my.mm")(a, b)), a, b)
    assert found["pallas_calls"] == 1
    assert found["outside_heavy"] == 2 * 64 * 96 * 128
    assert found["costliest"][0]["primitive"] == "dot_general"
    assert rules(found, total_work(lowered(jnp.dot, a, b))) == ["wrapper_compute"]


def test_a_kernel_inside_a_composite_is_still_a_kernel():
    def body(x_ref, o_ref):
        o_ref[...] = jnp.exp(x_ref[...])

    def kernel(x):
        return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    found = audit(lambda x: jax.lax.composite(kernel, name="my.kernel")(x), X)
    assert found["pallas_calls"] == 1
    assert found["outside_heavy"] == found["outside_light"] == 0
    assert rules(found, total_work(lowered(jnp.exp, X))) == []


def test_a_matmul_through_a_triangular_solve_costs_its_multiply_adds():
    # Solving with a (lower triangular) matrix does the same multiply-adds as multiplying by one
    a, b = jnp.tril(SPD), TALL.T[:, :48]
    solve = outside(lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=True, lower=True))
    found = audit(solve, a, b)
    assert found["costliest"][0]["primitive"] == "custom_call @lapack_strsm_ffi"
    assert found["outside_heavy"] == N * N * 48  # half the matmul's 2·N·N·48: the triangle
    assert rules(found, total_work(lowered(jnp.dot, a, b))) == ["wrapper_compute"]


def _flat(fn):
    return lambda *args: jax.tree_util.tree_leaves(fn(*args))


# (route, its input, the flop count's leading terms)
FACTORIZATIONS = [
    ("cholesky", jnp.linalg.cholesky, SPD, N**3 / 3),
    ("lu", jax.scipy.linalg.lu_factor, SPD, 2 * N**3 / 3),
    # geqrf 2mn² − 2n³/3, then orgqr 4mnk − 2(m+n)k² + 4k³/3 with k = n
    ("qr", jnp.linalg.qr, TALL, 2 * 96 * N**2 - 2 * N**3 / 3 + 4 * 96 * N * N - 2 * 160 * N**2),
    ("eigh", jnp.linalg.eigh, SPD, 9 * N**3),
    ("svd", jnp.linalg.svd, TALL, 4 * 96**2 * N + 8 * 96 * N**2 + 9 * N**3),
    ("eig", jnp.linalg.eig, SPD, 25 * N**3),
    ("fft", jnp.fft.fft, TALL, 96 * 5 * N * 6),  # 96 transforms of 5·N·log2(N)
    ("rfft2", jnp.fft.rfft2, TALL, 5 * 96 * N * 13),  # one transform of 96·64 points
]


@pytest.mark.parametrize(
    ("name", "route", "x", "flops"), FACTORIZATIONS, ids=[f[0] for f in FACTORIZATIONS]
)
def test_library_calls_cost_their_flops_not_their_output(name, route, x, flops):
    found = audit(outside(route), x)
    assert found["pallas_calls"] == 1
    assert int(flops) <= found["outside_heavy"] <= 2 * flops, found["costliest"]
    # Against a matmul of the same order (2·N³ flops) each is a real share of the work.
    assert "wrapper_compute" in rules(found, total_work(lowered(jnp.dot, SPD, SPD)))


def test_an_fft_outside_the_kernel_is_a_share_of_the_dft_it_replaces():
    dft = jnp.exp(-2j * jnp.pi * jnp.outer(jnp.arange(N), jnp.arange(N)) / N).astype(jnp.complex64)
    reference = total_work(lowered(lambda x: jnp.dot(x.astype(jnp.complex64), dft), TALL))
    assert reference == 2 * 96 * N * N
    found = audit(outside(jnp.fft.fft), TALL)
    assert found["outside_heavy"] / reference >= 0.2  # 5·log2(N) against 2·N per point
    assert rules(found, reference) == ["wrapper_compute"]


def test_column_sums_by_one_scatter_add_cost_every_update():
    rows, cols = X.shape
    colsum = outside(lambda x: jnp.zeros((1, cols)).at[jnp.zeros(rows, jnp.int32)].add(x))
    found = audit(colsum, X)
    (scatter,) = [w for w in found["costliest"] if w["primitive"] == "scatter"]
    assert scatter["work"] == rows * cols  # one add per update, not one per output
    assert rules(found, total_work(lowered(lambda x: x.sum(axis=0), X))) == ["wrapper_compute"]


def test_a_sliding_window_costs_output_times_window():
    width = 32
    windowed = X[:8]
    out = 8 * (256 - width + 1)

    def moving_sum(x):
        return jax.lax.reduce_window(x, 0.0, jax.lax.add, (1, width), (1, 1), "VALID")

    found = audit(outside(moving_sum), windowed)
    assert found["outside_heavy"] == out * width

    def by_convolution(x):  # the same sums as a convolution: 2 flops per window element
        return jax.lax.conv_general_dilated(x[:, None, :], jnp.ones((1, 1, width)), (1,), "VALID")

    reference = total_work(lowered(by_convolution, windowed))
    assert reference == 2 * out * width
    assert rules(found, reference) == ["wrapper_compute"]


def test_a_prefix_scan_window_costs_its_input_as_a_reduction_would():
    # cumsum lowers to a window as wide as the row: XLA scans it, it does not sum n windows of n
    assert total_work(lowered(lambda x: jnp.cumsum(x, axis=1), X)) == X.size
    assert total_work(lowered(lambda x: jax.lax.cummax(x, axis=0, reverse=True), X)) == X.size


def test_regions_run_per_element_are_priced_with_their_body():
    def reducer(a, b):
        return a * b + jnp.sin(a)  # three ops per element, one of them heavy

    found = audit(outside(lambda x: jax.lax.reduce(x, 0.0, reducer, (1,))), X)
    assert found["outside_heavy"] == X.size * 3

    # A sort compares n·log2(n) times per row, each comparison the comparator's ops (>= 2 here)
    sort_work = total_work(lowered(lambda x: jax.lax.sort(x, dimension=1), X))
    assert sort_work >= 2 * X.size * 8

    # max-pool's gradient: select_and_scatter, a select over each 2×2 window per source element
    def pool(x):
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (2, 2), (2, 2), "VALID").sum()

    # (its select is one compare, its scatter one add; the forward pass is dead code)
    assert total_work(lowered(jax.grad(pool), X)) == (X.size // 4) * (4 * 1 + 1)


MAPPED = """
func.func public @main(%arg0: tensor<64xf32>) -> tensor<64xf32> {
  %0 = "stablehlo.map"(%arg0) ({
  ^bb0(%a: tensor<f32>):
    %1 = stablehlo.sine %a : tensor<f32>
    %2 = stablehlo.multiply %1, %a : tensor<f32>
    stablehlo.return %2 : tensor<f32>
  }) {dimensions = array<i64: 0>} : (tensor<64xf32>) -> tensor<64xf32>
  return %0 : tensor<64xf32>
}
"""

SOLVES = """
func.func public @main(
    %a: tensor<2x16x16xf32>, %b: tensor<2x16x8xf32>, %c: tensor<4x32xcomplex<f32>>
  ) -> (tensor<2x16x8xf32>, tensor<2x16x16xf32>, tensor<4x32xcomplex<f32>>) {
  %0 = "stablehlo.triangular_solve"(%a, %b) {left_side = true, lower = true,
      unit_diagonal = false, transpose_a = #stablehlo<transpose NO_TRANSPOSE>}
      : (tensor<2x16x16xf32>, tensor<2x16x8xf32>) -> tensor<2x16x8xf32>
  %1 = "stablehlo.cholesky"(%a) {lower = true} : (tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
  %2 = stablehlo.fft %c, type = FFT, length = [32]
      : (tensor<4x32xcomplex<f32>>) -> tensor<4x32xcomplex<f32>>
  return %0, %1, %2 : tensor<2x16x8xf32>, tensor<2x16x16xf32>, tensor<4x32xcomplex<f32>>
}
"""


def test_stablehlo_map_and_solver_ops_are_priced_by_their_work():
    assert audit_text(MAPPED)["outside_heavy"] == 64 * 2
    found = audit_text(SOLVES)
    trsm, cholesky, fft = 2 * 16 * 8 * 16, 2 * (16**3 // 3), 4 * 5 * 32 * 5
    assert found["outside_heavy"] == trsm + cholesky + fft
    assert found["unbounded"] == []


# -- default deny ------------------------------------------------------------------------------

UNKNOWN_OP = """
func.func public @main(%arg0: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %0 = "stablehlo.einsum"(%arg0, %arg0) {einsum_config = "ab,bc->ac"}
      : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %0 : tensor<64x64xf32>
}
"""
UNKNOWN_REGION = """
func.func public @main(%arg0: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %0 = scf.execute_region -> tensor<64x64xf32> {
    %1 = stablehlo.dot_general %arg0, %arg0, contracting_dims = [1] x [0]
        : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
    scf.yield %1 : tensor<64x64xf32>
  }
  return %0 : tensor<64x64xf32>
}
"""
UNKNOWN_TARGET = """
func.func public @main(%arg0: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %0 = stablehlo.custom_call @lapack_sgemm_ffi(%arg0, %arg0)
      : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  return %0 : tensor<64x64xf32>
}
"""
DYNAMIC = """
func.func public @main(%arg0: tensor<?x64xf32>) -> tensor<?x64xf32> {
  %0 = stablehlo.exponential %arg0 : tensor<?x64xf32>
  return %0 : tensor<?x64xf32>
}
"""
UNPRICED_BODY = """
func.func public @main(%arg0: tensor<64x64xf32>) -> tensor<64xf32> {
  %init = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %init) across dimensions = [1]
      : (tensor<64x64xf32>, tensor<f32>) -> tensor<64xf32>
   reducer(%a: tensor<f32>, %b: tensor<f32>) {
    %1 = stablehlo.custom_call @some_library_call(%a, %b)
        : (tensor<f32>, tensor<f32>) -> tensor<f32>
    stablehlo.return %1 : tensor<f32>
  }
  return %0 : tensor<64xf32>
}
"""


@pytest.mark.parametrize(
    ("text", "primitive"),
    [
        (UNKNOWN_OP, "einsum"),
        (UNKNOWN_REGION, "execute_region"),
        (UNKNOWN_TARGET, "custom_call @lapack_sgemm_ffi"),
        (DYNAMIC, "exponential"),
        (UNPRICED_BODY, "reduce"),
    ],
    ids=["unknown_op", "unknown_region", "unknown_target", "dynamic_shape", "unpriced_body"],
)
def test_what_the_audit_cannot_price_is_flagged(text, primitive):
    found = audit_text(text)
    assert [(w["primitive"], w["kind"]) for w in found["unbounded"]] == [(primitive, "unpriced")]
    violations = audit_violations(ArtifactAudit(**found), 10**9)  # however large the reference
    (unpriced,) = [v for v in violations if v.rule == "wrapper_compute"]
    assert "cannot price" in unpriced.detail and primitive in unpriced.detail


def test_the_report_takes_unpriced_work_and_nothing_else():
    entry = {"primitive": "einsum", "operand": "f32[4]", "where": "", "work": 4}
    base = {
        "pallas_calls": 1,
        "outside_heavy": 0,
        "outside_light": 0,
        "costliest": [],
        "callbacks": [],
        "aliased_inputs": [],
    }
    ArtifactAudit(**base, unbounded=[{**entry, "kind": "unpriced"}])
    with pytest.raises(ValidationError):
        ArtifactAudit(**base, unbounded=[{**entry, "kind": "free"}])


# -- honest kernels stay clean -----------------------------------------------------------------


def _matmul_body(a_ref, b_ref, o_ref):
    o_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def test_glue_around_a_kernel_that_does_the_work_is_clean():
    a, b = X[:, :100], X.reshape(128, 128)[:100, :64]

    def padded_matmul(a, b):
        a16 = jnp.pad(a, ((0, 0), (0, 28))).astype(jnp.bfloat16).astype(jnp.float32)
        b16 = jnp.pad(b, ((0, 28), (0, 0))).T.reshape(64, 128).T
        out = pl.pallas_call(_matmul_body, out_shape=jax.ShapeDtypeStruct((64, 64), jnp.float32))(
            a16, b16
        )
        return out[:, :64].reshape(-1).reshape(64, 64)

    found = audit(padded_matmul, a, b)
    assert found["pallas_calls"] == 1
    assert found["outside_heavy"] == found["outside_light"] == 0
    assert found["unbounded"] == []
    assert rules(found, total_work(lowered(jnp.dot, a, b))) == []


def test_a_reference_is_priced_by_the_same_walker():
    # A reference that scatters or factors is priced by its work, so doing that same work outside
    # a kernel is all of the reference's work, and not a multiple of it.
    ids = jnp.arange(X.shape[0]) % 8

    def segment(x):
        return jax.ops.segment_sum(x, ids, 8)

    reference = total_work(lowered(segment, X))
    assert reference >= X.size
    found = audit(outside(segment), X)
    assert found["outside_heavy"] + found["outside_light"] <= reference
    assert rules(found, reference) == ["wrapper_compute"]
    assert total_work(lowered(jnp.linalg.cholesky, SPD)) >= N**3 / 3


# -- forgeries: right numbers, most work hidden outside the kernel -----------------------------


@pytest.fixture
def no_static_gate(monkeypatch):
    monkeypatch.setattr(check_module, "static_violations", lambda source, name: [])


@pytest.mark.parametrize(
    "candidate",
    ["priced_composite_matmul.py", "priced_trsm_matmul.py", "priced_scatter_matmul.py"],
)
def test_a_forgery_that_hides_work_from_the_pricing_is_refused(no_static_gate, candidate):
    report = check(MATMUL_SPEC, FORGERIES / candidate, "compact", 5)
    assert report.cases and all(c.passed for c in report.cases)  # the numbers are right...
    assert not report.certified  # ...and still no certificate
    assert "wrapper_compute" in {v.rule for v in report.integrity.violations}
