"""Grid semantics read from the exported artifact (nearmiss.engine.integrity.grid).

Kernels are exported for TPU on this CPU host (Mosaic lowering needs no TPU); the analysis reads
the Mosaic module inside the artifact's tpu_custom_call, never the Python that built it.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from nearmiss.engine.integrity import grid
from nearmiss.engine.integrity.grid import grid_findings
from nearmiss.engine.targets import lowering_for

ROOT = Path(__file__).resolve().parents[1]
F32 = jnp.float32


def _export(fn, *shapes, platform="tpu"):
    """The kernel as the candidate's child exports it for a TPU target: lowered for v5e's chip,
    with interpret mode off (another test in this process may have forced it on)."""
    structs = [
        s if isinstance(s, jax.ShapeDtypeStruct) else jax.ShapeDtypeStruct(s, F32) for s in shapes
    ]
    with lowering_for("tpu-v5e"):
        return jax.export.export(jax.jit(fn), platforms=[platform])(*structs)


def _kinds(report):
    return [(f.kind, f.output, f.axes) for f in report.findings]


# --- kernels -------------------------------------------------------------------------------------


def _mm_body(a_ref, b_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(a_ref[...], b_ref[...])


def _matmul(semantics):
    def kernel(a, b):
        (m, k), (_, n) = a.shape, b.shape
        return pl.pallas_call(
            _mm_body,
            grid=(m // 128, n // 128, k // 128),
            in_specs=[
                pl.BlockSpec((128, 128), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j)),
            ],
            out_specs=pl.BlockSpec((128, 128), lambda i, j, kk: (i, j)),
            out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        )(a, b)

    return kernel


def _copy_body(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _copy(out_map, grid_shape, semantics, in_map=lambda i, j: (i, j), out_rows=64, mode=None):
    def kernel(x):
        spec = pl.BlockSpec((8, 128), out_map, pipeline_mode=mode)
        return pl.pallas_call(
            _copy_body,
            grid=grid_shape,
            in_specs=[pl.BlockSpec((8, 128), in_map)],
            out_specs=spec,
            out_shape=jax.ShapeDtypeStruct((out_rows, 512), x.dtype),
            compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        )(x)

    return kernel


def _acc_body(x_ref, o_ref):
    @pl.when(pl.program_id(0) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += x_ref[...]


def _k_first(x):
    """Sums row blocks with the reduction axis *first*: grid (k, i), output block (i, 0)."""
    return pl.pallas_call(
        _acc_body,
        grid=(3, 2),
        in_specs=[pl.BlockSpec((8, 128), lambda k, i: (k * 2 + i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda k, i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary", "parallel")),
    )(x)


def _prefetch_body(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _prefetch(out_map, in_map):
    def kernel(s, x):
        return pl.pallas_call(
            _prefetch_body,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(4, 4),
                in_specs=[pl.BlockSpec((8, 128), in_map)],
                out_specs=pl.BlockSpec((8, 128), out_map),
            ),
            out_shape=jax.ShapeDtypeStruct((64, 512), x.dtype),
        )(s, x)

    return kernel


PREFETCH_SHAPES = (jax.ShapeDtypeStruct((4,), jnp.int32), (64, 512))


@functools.cache
def artifact(name):
    """Each test kernel exported once for TPU."""
    mm_shapes = ((256, 512), (512, 384))
    table = {
        "mm_arbitrary": (_matmul(("parallel", "parallel", "arbitrary")), mm_shapes),
        "mm_parallel_k": (_matmul(("parallel", "parallel", "parallel")), mm_shapes),
        "elementwise": (_copy(lambda i, j: (i, j), (8, 4), ("parallel", "parallel")), [(64, 512)]),
        "mod2": (_copy(lambda i, j: (i, j % 2), (8, 4), ("parallel", "arbitrary")), [(64, 512)]),
        "mod2_any": (
            _copy(
                lambda i, j: (i, j % 2),
                (8, 4),
                ("parallel", "arbitrary"),
                mode=pl.Buffered(1, revisit=pl.RevisitMode.ANY),
            ),
            [(64, 512)],
        ),
        "k_first": (_k_first, [(48, 128)]),
        "prefetch_out": (
            _prefetch(lambda i, j, s: (s[i], j), lambda i, j, s: (i, j)),
            PREFETCH_SHAPES,
        ),
        "prefetch_in": (
            _prefetch(lambda i, j, s: (i, j), lambda i, j, s: (s[i], j)),
            PREFETCH_SHAPES,
        ),
    }
    fn, shapes = table[name]
    return _export(fn, *shapes)


# --- the cases of issue 14 -----------------------------------------------------------------------


def test_matmul_accumulating_over_k_races_on_gpu_and_is_fine_on_tpu():
    exported = artifact("mm_arbitrary")
    gpu = grid_findings(exported, "gpu")
    assert _kinds(gpu) == [("grid_race", 0, [2])]
    (race,) = gpu.findings
    first, second = race.points
    assert first[:2] == second[:2] and first[2] != second[2]  # same (i, j), another k
    assert race.kernel == 0 and race.kernel_name == "_mm_body"
    assert not gpu.undetermined and not gpu.ok

    tpu = grid_findings(exported, "tpu")
    assert tpu.findings == [] and tpu.undetermined == [] and tpu.ok
    (kernel,) = tpu.kernels
    assert kernel.grid == [2, 3, 4]
    assert kernel.dimension_semantics == ["parallel", "parallel", "arbitrary"]
    assert (kernel.scalar_prefetch, kernel.inputs) == (0, 2)
    (out,) = kernel.outputs
    assert out.block_shape == [128, 128]
    assert out.depends_on == [[0], [1]]
    assert out.varies_along == [0, 1] and out.revisit_axes == [2]
    assert out.analysis == "exhaustive" and out.points == 2 * 3 * 2  # k shrunk to 2: unread


def test_reduction_axis_declared_parallel_is_a_tpu_finding():
    tpu = grid_findings(artifact("mm_parallel_k"), "tpu")
    assert _kinds(tpu) == [("parallel_revisit", 0, [2])]
    assert "parallel" in tpu.findings[0].detail and "arbitrary" in tpu.findings[0].detail
    assert _kinds(grid_findings(artifact("mm_parallel_k"), "gpu")) == [("grid_race", 0, [2])]


def test_elementwise_kernel_has_no_findings():
    for semantics in ("gpu", "tpu"):
        report = grid_findings(artifact("elementwise"), semantics)
        assert report.ok, report.as_dict()
        assert report.kernels[0].outputs[0].revisit_axes == []
        assert report.kernels[0].outputs[0].varies_along == [0, 1]


def test_non_monotonic_index_map_revisits_non_consecutively():
    # out block (i, j % 2) over j in 0..3: blocks 0, 1, 0, 1 along the arbitrary axis 1
    tpu = grid_findings(artifact("mod2"), "tpu")
    assert _kinds(tpu) == [("nonconsecutive_revisit", 0, [1])]
    assert tpu.findings[0].points == [[0, 0], [0, 1], [0, 2]]  # visit, left, re-entered
    assert _kinds(grid_findings(artifact("mod2"), "gpu")) == [("grid_race", 0, [1])]
    out = tpu.kernels[0].outputs[0]
    assert out.depends_on == [[0], [1]] and out.revisit_axes == [1]


def test_revisit_mode_any_allows_non_consecutive_revisits_on_tpu():
    tpu = grid_findings(artifact("mod2_any"), "tpu")
    assert tpu.kernels[0].outputs[0].revisit_mode == "any"
    assert tpu.ok, tpu.as_dict()
    assert _kinds(grid_findings(artifact("mod2_any"), "gpu")) == [("grid_race", 0, [1])]


def test_reduction_axis_first_is_non_consecutive_on_tpu():
    tpu = grid_findings(artifact("k_first"), "tpu")
    # axis 0 (k) is arbitrary, so no parallel finding; block i is left for i + 1 and re-entered
    assert _kinds(tpu) == [("nonconsecutive_revisit", 0, [0])]
    assert tpu.findings[0].points == [[0, 0], [0, 1], [1, 0]]
    assert _kinds(grid_findings(artifact("k_first"), "gpu")) == [("grid_race", 0, [0])]


def test_output_index_from_scalar_prefetch_is_undetermined():
    for semantics in ("gpu", "tpu"):
        report = grid_findings(artifact("prefetch_out"), semantics)
        assert report.findings == [] and not report.ok
        (entry,) = report.undetermined
        assert (entry["kernel"], entry["output"]) == (0, 0)
        assert "scalar-prefetch" in entry["reason"]
        (out,) = report.kernels[0].outputs
        assert out.depends_on == [[-1, 0], [1]] and out.analysis == "none"
        assert report.kernels[0].scalar_prefetch == 1


def test_scalar_prefetch_in_an_input_map_only_does_not_matter():
    report = grid_findings(artifact("prefetch_in"), "tpu")
    assert report.ok, report.as_dict()
    assert report.kernels[0].inputs == 1


def test_beyond_the_bound_only_per_axis_facts_are_claimed():
    exported = artifact("mm_arbitrary")
    gpu = grid_findings(exported, "gpu", max_points=2)
    assert _kinds(gpu) == [("grid_race", 0, [2])]
    assert gpu.findings[0].points == [[0, 0, 0], [0, 0, 1]]
    (entry,) = gpu.undetermined
    assert "limit 2" in entry["reason"] and entry["output"] == 0
    out = gpu.kernels[0].outputs[0]
    assert out.analysis == "per_axis" and out.revisit_axes == [2] and out.varies_along is None

    tpu = grid_findings(artifact("mm_parallel_k"), "tpu", max_points=2)
    assert _kinds(tpu) == [("parallel_revisit", 0, [2])]

    # a re-entry is shown by a witness: block (0, 0) at (k=0, i=0), another at i=1, again at k=1
    k_first = grid_findings(artifact("k_first"), "tpu", max_points=1)
    assert _kinds(k_first) == [("nonconsecutive_revisit", 0, [0])]
    assert k_first.findings[0].points == [[0, 0], [0, 1], [1, 0]]


def test_a_huge_grid_read_on_every_axis_is_bounded_and_undetermined():
    kernel = _copy(lambda i, j: (i, j), (2048, 1024), ("parallel", "parallel"), out_rows=16384)
    report = grid_findings(_export(kernel, (16384, 131072)), "tpu")
    assert report.findings == []
    (entry,) = report.undetermined
    assert "2097152 grid points" in entry["reason"]
    assert report.kernels[0].outputs[0].analysis == "per_axis"


def test_text_serialized_and_exported_forms_agree_and_are_json():
    exported = artifact("mm_arbitrary")
    round_trip = jax.export.deserialize(exported.serialize())
    for semantics in ("gpu", "tpu"):
        expected = grid_findings(exported, semantics).as_dict()
        assert grid_findings(exported.mlir_module(), semantics).as_dict() == expected
        assert grid_findings(round_trip, semantics).as_dict() == expected
        assert json.loads(json.dumps(expected)) == expected


def test_an_unreadable_kernel_body_is_undetermined_not_an_error():
    text = artifact("mm_arbitrary").mlir_module()
    body = re.compile(r"(\\22body\\22: \\22)([A-Za-z0-9+/=]+)")
    assert body.search(text)
    not_mlir = body.sub(lambda m: m.group(1) + base64.b64encode(b"not mlir").decode(), text)
    report = grid_findings(not_mlir, "gpu")
    assert report.findings == [] and report.undetermined[0]["kernel"] == 0
    assert "does not parse" in report.undetermined[0]["reason"]
    not_base64 = body.sub(lambda m: m.group(1) + "@@@", text)
    assert "does not decode" in grid_findings(not_base64, "gpu").undetermined[0]["reason"]
    assert "does not parse" in grid_findings("not stablehlo", "tpu").undetermined[0]["reason"]
    with pytest.raises(ValueError):
        grid_findings(text, "cuda")


def test_an_interpret_mode_artifact_has_no_kernel_to_read():
    def kernel(x):
        return pl.pallas_call(
            _copy_body,
            grid=(2,),
            in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
            out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((16, 128), x.dtype),
            interpret=True,
        )(x)

    report = grid_findings(_export(kernel, (16, 128), platform="cpu"), "gpu")
    assert report.kernels == [] and not report.ok
    assert "no Mosaic TPU kernel" in report.undetermined[0]["reason"]


def _two_outputs_body(x_ref, o_ref, p_ref):
    o_ref[...] = x_ref[...]
    p_ref[...] = x_ref[...]


def test_outputs_are_counted_after_the_inputs():
    def kernel(x):
        return pl.pallas_call(
            _two_outputs_body,
            grid=(2, 4),
            in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
            out_specs=[
                pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                pl.BlockSpec((8, 128), lambda i, j: (i, 0)),
            ],
            out_shape=[
                jax.ShapeDtypeStruct((16, 512), x.dtype),
                jax.ShapeDtypeStruct((16, 128), x.dtype),
            ],
        )(x)

    exported = _export(kernel, (16, 512))
    assert _kinds(grid_findings(exported, "gpu")) == [("grid_race", 1, [1])]
    tpu = grid_findings(exported, "tpu")
    assert tpu.ok and [o.revisit_axes for o in tpu.kernels[0].outputs] == [[], [1]]


def test_grid_free_kernel_is_one_program():
    def kernel(x):
        return pl.pallas_call(_copy_body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

    for semantics in ("gpu", "tpu"):
        report = grid_findings(_export(kernel, (16, 128)), semantics)
        assert report.ok and report.kernels[0].grid == []


def _dma_body(x_ref, o_ref):
    pltpu.sync_copy(x_ref, o_ref)


def test_output_written_by_dma_is_undetermined():
    def kernel(x):
        return pl.pallas_call(
            _dma_body,
            grid=(2,),
            in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
            out_specs=pl.BlockSpec(memory_space=pl.ANY),
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        )(x)

    report = grid_findings(_export(kernel, (16, 128)), "gpu")
    assert report.findings == [] and not report.ok
    assert report.undetermined[0]["output"] == 0
    assert "DMA" in report.undetermined[0]["reason"]
    assert report.kernels[0].outputs[0].analysis == "none"


# --- corpus goldens ------------------------------------------------------------------------------


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"grid_test_{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _golden(op: str):
    spec = _load(ROOT / "pallas_ops" / op / "spec.py").SPEC
    inputs = spec.make_inputs(spec.compact[0], jax.random.key(0))
    return _export(
        _load(ROOT / "pallas_ops" / op / "golden.py").kernel,
        *[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs],
    )


def test_corpus_matmul_golden_races_on_gpu_only():
    exported = _golden("matmul")
    assert _kinds(grid_findings(exported, "gpu")) == [("grid_race", 0, [2])]
    assert grid_findings(exported, "tpu").ok


def test_corpus_row_kernels_have_no_findings():
    for op in ("softmax_rows", "layer_norm"):
        exported = _golden(op)
        for semantics in ("gpu", "tpu"):
            assert grid_findings(exported, semantics).ok, (op, semantics)


def test_corpus_col_sum_golden_accumulates_along_its_last_axis():
    exported = _golden("col_sum")
    assert _kinds(grid_findings(exported, "gpu")) == [("grid_race", 0, [1])]
    tpu = grid_findings(exported, "tpu")
    assert tpu.ok, tpu.as_dict()
    # The output's block index follows the column-block axis 0 alone, whatever its rank.
    depends_on = tpu.kernels[0].outputs[0].depends_on
    assert sorted({axis for dims in depends_on for axis in dims}) == [0], depends_on


# --- the interpreter -----------------------------------------------------------------------------

I32_VALUES = [-(2**31), -(2**31) + 1, -9, -7, -3, -2, -1, 0, 1, 2, 3, 7, 9, 2**31 - 2, 2**31 - 1]


def _program(body: str, result_type: str = "i32"):
    text = (
        f"func.func @f(%a: i32, %b: i32) -> {result_type} {{\n{body}\n"
        f"  return %r : {result_type}\n}}"
    )
    context = grid._context()
    with context:
        module = grid._ir().Module.parse(text)
        program = grid._compile(module.body.operations[0], 2)
    return program, (module, context)


def _run(program, pairs):
    a = np.array([p[0] for p in pairs], dtype=np.int64)
    b = np.array([p[1] for p in pairs], dtype=np.int64)
    return [int(v) for v in grid._evaluate(program, [a, b])[0]]


def _s32(x):
    return (x + 2**31) % 2**32 - 2**31


def _u32(x):
    return x % 2**32


def _trunc_div(a, b):
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


REFERENCES = {
    "divsi": lambda a, b: _trunc_div(a, b),
    "remsi": lambda a, b: a - b * _trunc_div(a, b),
    "floordivsi": lambda a, b: a // b,
    "ceildivsi": lambda a, b: -((-a) // b),
    "divui": lambda a, b: _s32(_u32(a) // _u32(b)),
    "remui": lambda a, b: _s32(_u32(a) % _u32(b)),
    "ceildivui": lambda a, b: _s32(-((-_u32(a)) // _u32(b))),
    "minsi": min,
    "maxsi": max,
    "minui": lambda a, b: _s32(min(_u32(a), _u32(b))),
    "maxui": lambda a, b: _s32(max(_u32(a), _u32(b))),
    "andi": lambda a, b: a & b,
    "ori": lambda a, b: a | b,
    "xori": lambda a, b: a ^ b,
}


@pytest.mark.parametrize("op", sorted(REFERENCES))
def test_interpreter_binary_ops_match_python_integers(op):
    program, _keep = _program(f"  %r = arith.{op} %a, %b : i32")
    pairs = [(a, b) for a in I32_VALUES for b in I32_VALUES]
    if op.startswith(("div", "rem", "floordiv", "ceildiv")):
        pairs = [
            (a, b)
            for a, b in pairs
            if b != 0 and not (op.endswith("si") and a == -(2**31) and b == -1)
        ]
    assert _run(program, pairs) == [REFERENCES[op](a, b) for a, b in pairs]


@pytest.mark.parametrize(
    ("predicate", "reference"),
    [
        ("eq", lambda a, b: a == b),
        ("ne", lambda a, b: a != b),
        ("slt", lambda a, b: a < b),
        ("sle", lambda a, b: a <= b),
        ("sgt", lambda a, b: a > b),
        ("sge", lambda a, b: a >= b),
        ("ult", lambda a, b: _u32(a) < _u32(b)),
        ("ule", lambda a, b: _u32(a) <= _u32(b)),
        ("ugt", lambda a, b: _u32(a) > _u32(b)),
        ("uge", lambda a, b: _u32(a) >= _u32(b)),
    ],
)
def test_interpreter_compare_select_and_casts(predicate, reference):
    body = (
        f"  %c = arith.cmpi {predicate}, %a, %b : i32\n"
        "  %one = arith.extui %c : i1 to i32\n"
        "  %sel = arith.select %c, %a, %b : i32\n"
        "  %sx = arith.extsi %c : i1 to i64\n"
        "  %idx = arith.index_cast %sx : i64 to index\n"
        "  %back = arith.index_cast %idx : index to i32\n"
        "  %t = arith.addi %one, %back : i32\n"  # 1 + (-1) when true: 0
        "  %sum = arith.addi %t, %one : i32\n"
        "  %r = arith.select %c, %sum, %sel : i32"
    )
    program, _keep = _program(body)
    pairs = [(a, b) for a in I32_VALUES for b in I32_VALUES]
    assert _run(program, pairs) == [1 if reference(a, b) else b for a, b in pairs]


def test_interpreter_mod_as_jax_lowers_it():
    # what `j % 2` lowers to (remsi with a sign fix-up through xori/andi on i1)
    body = (
        "  %c2 = arith.constant 2 : i32\n  %c0 = arith.constant 0 : i32\n"
        "  %rem = arith.remsi %a, %c2 : i32\n"
        "  %nz = arith.cmpi ne, %rem, %c0 : i32\n  %neg = arith.cmpi slt, %rem, %c0 : i32\n"
        "  %dneg = arith.cmpi slt, %c2, %c0 : i32\n  %x = arith.xori %neg, %dneg : i1\n"
        "  %fix = arith.andi %x, %nz : i1\n  %sum = arith.addi %rem, %c2 : i32\n"
        "  %r = arith.select %fix, %sum, %rem : i32"
    )
    program, _keep = _program(body)
    pairs = [(a, 0) for a in range(-9, 10)]
    assert _run(program, pairs) == [a % 2 for a, _ in pairs]


@pytest.mark.parametrize(
    ("body", "pairs", "reason"),
    [
        ("  %r = arith.divsi %a, %b : i32", [(1, 0)], "division by zero"),
        ("  %r = arith.remui %a, %b : i32", [(1, 0)], "division by zero"),
        ("  %r = arith.divsi %a, %b : i32", [(-(2**31), -1)], "overflows"),
        ("  %r = arith.addi %a, %b : i32", [(2**31 - 1, 1)], "overflows"),
        ("  %r = arith.muli %a, %b : i32", [(2**16, 2**16)], "overflows"),
        ("  %r = arith.shli %a, %b : i32", [(1, 32)], "bits or more"),
    ],
)
def test_interpreter_undefined_behaviour_is_undetermined(body, pairs, reason):
    program, _keep = _program(body)
    with pytest.raises(grid.Undetermined, match=reason):
        _run(program, pairs)


def test_interpreter_refuses_unknown_ops_it_depends_on_only():
    program, _keep = _program("  %r = math.absi %a : i32")
    assert "math.absi" in program.problem and program.deps == [{0}]
    with pytest.raises(grid.Undetermined, match="math.absi"):
        _run(program, [(1, 2)])
    dead, _keep2 = _program("  %unused = math.absi %a : i32\n  %r = arith.subi %b, %a : i32")
    assert dead.problem is None and dead.deps == [{0, 1}]
    assert _run(dead, [(1, 5), (-3, 4)]) == [4, 7]
