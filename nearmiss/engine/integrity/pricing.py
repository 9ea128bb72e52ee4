"""What one StableHLO op costs, in element operations, read from its operand shapes and attributes.

The audit (``integrity.audit``) walks a module and asks this module what each op does; the op
classes and formulas live here so that the walk stays readable. The unit is FLOP-like: a matmul
costs 2·M·N·K, elementwise arithmetic one per output element, a transcendental one per element
(marked heavy), layout glue nothing.

Default deny. An op is priced only when it is named here: every other op — an unknown op name,
a custom call target with no formula, a tensor of dynamic shape — is *unpriced*, which the audit
reports as work it cannot bound (``integrity.dynamic`` flags it as heavy). A hostile artifact
that hides work in an op the audit cannot price gains nothing by it.

Library calls are priced by the flops the library does on those shapes, not by the size of what
they return: a triangular solve that returns an M×N matrix does M·N·K multiply-adds. The counts
are the standard leading terms (LAPACK Working Note 41; Golub & Van Loan, *Matrix
Computations*, 4th ed., §5.5 and §7.7 tables), one count per multiply or add, with real and
complex types counted alike as the matmul is. Ops that apply a region per element (reduce,
scatter, sort, reduce_window, ...) are priced by how many times the region runs, times what one
run of the region costs (at least 1); the walker measures the region and passes its cost in.
"""

from __future__ import annotations

import math
import re
from typing import Any

GLUE = frozenset(
    f"stablehlo.{name}"
    for name in (
        "constant",
        "broadcast_in_dim",
        "broadcast",
        "dynamic_broadcast_in_dim",
        "reshape",
        "dynamic_reshape",
        "transpose",
        "slice",
        "dynamic_slice",
        "real_dynamic_slice",
        "dynamic_update_slice",
        "pad",
        "dynamic_pad",
        "concatenate",
        "convert",
        "bitcast_convert",
        "iota",
        "dynamic_iota",
        "select",
        "reverse",
        "tuple",
        "get_tuple_element",
        "optimization_barrier",
        "reduce_precision",
        "get_dimension_size",
        "return",
        "rng_bit_generator",
        "after_all",
        "create_token",
    )
) | {
    "func.return",
    "func.func",
    "builtin.module",
    "chlo.constant",
    "chlo.constant_like",
    # Shardy's marks: where data lives, not what is computed.
    "sdy.sharding_constraint",
    "sdy.reshard",
    "sdy.propagation_barrier",
    "sdy.sharding_group",
    "sdy.return",
}
# Transcendentals and data-dependent addressing: one per output element, heavy.
HEAVY = frozenset(
    f"stablehlo.{name}"
    for name in (
        "exponential",
        "exponential_minus_one",
        "log",
        "log_plus_one",
        "tanh",
        "logistic",
        "sine",
        "cosine",
        "tan",
        "atan2",
        "sqrt",
        "rsqrt",
        "cbrt",
        "power",
        "gather",
        "dynamic_gather",
        "rng",
    )
) | {
    f"chlo.{name}"
    for name in (
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "tan",
        "asin",
        "acos",
        "atan",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "bessel_i1e",
        "polygamma",
        "zeta",
        "igamma",
        "igammac",
    )
}
# Elementwise arithmetic and data movement: one per output element, light.
LIGHT = frozenset(
    f"stablehlo.{name}"
    for name in (
        "abs",
        "add",
        "and",
        "ceil",
        "clamp",
        "compare",
        "complex",
        "count_leading_zeros",
        "divide",
        "floor",
        "imag",
        "is_finite",
        "maximum",
        "minimum",
        "multiply",
        "negate",
        "not",
        "or",
        "popcnt",
        "real",
        "remainder",
        "round_nearest_afz",
        "round_nearest_even",
        "shift_left",
        "shift_right_arithmetic",
        "shift_right_logical",
        "sign",
        "subtract",
        "xor",
        "uniform_quantize",
        "uniform_dequantize",
        "all_gather",
        "all_to_all",
        "collective_permute",
        "collective_broadcast",
        "partition_id",
        "replica_id",
    )
) | {
    f"chlo.{name}"
    for name in ("conj", "is_inf", "is_neg_inf", "is_pos_inf", "square", "next_after")
}
# Ops whose regions run once per element (or per comparison, per update): priced by
# ``region_op_work`` from the cost of one run of each region.
PER_ELEMENT = frozenset(
    f"stablehlo.{name}"
    for name in (
        "reduce",
        "reduce_window",
        "select_and_scatter",
        "scatter",
        "sort",
        "map",
        "all_reduce",
        "reduce_scatter",
    )
)

_INTS = re.compile(r"-?\d+")
# 'tensor<16x256xcomplex<f32>>': the dimensions, then the element type (which may hold an x).
_TENSOR = re.compile(r"^tensor<((?:(?:\d+|\?)x)*)[^?*\d]")
_CONTRACTING = re.compile(r"lhs_contracting_dimensions = \[([0-9, ]*)\]")
_CONV_KERNEL = re.compile(r"x\[([^\]]*)\]->")
# A numerical library's routine from its custom call target: lapack_sgetrf_ffi → getrf,
# cusolver_potrf_ffi → potrf, hipsolver_gesvdj_ffi → gesvdj, cu_threefry2x32_ffi → threefry2x32.
_ROUTINE = re.compile(
    r"^(?:lapack_[sdcz]|blas_[sdcz]|cusolver_|hipsolver_|cublas_|hipblas_|cusparse_|hipsparse_|"
    r"cu_|hip_)([a-z0-9_]+?)(?:_batched)?(?:_ffi)?$"
)
_FFT_TARGETS = ("ducc_fft", "dynamic_ducc_fft")


def kind_of(op: Any) -> str:
    """An op's name ('stablehlo.add'); OpViews such as func.func use ``.name`` for the symbol."""
    operation = getattr(op, "operation", op)
    return getattr(operation, "name", "")


def attr(op: Any, name: str) -> str:
    attributes = op.attributes
    return str(attributes[name]) if name in attributes else ""


def shape(value_type: Any) -> list[int] | None:
    """Dimensions of a ranked static tensor type; [] for a scalar; None for anything else."""
    match = _TENSOR.match(str(value_type))
    if match is None:
        return None  # not a tensor, or unranked: not produced by the exports the engine makes
    dims = match.group(1).split("x")[:-1]
    if "?" in dims:
        return None  # dynamic dimensions: likewise
    return [int(d) for d in dims]


def size(value: Any) -> int:
    dims = shape(value.type)
    return math.prod(dims) if dims else 1


def is_dynamic(op: Any) -> bool:
    """A tensor operand or result whose shape is not static (``?`` or unranked): its work
    depends on sizes the audit cannot read."""
    for value in (*op.operands, *op.results):
        text = str(value.type)
        if text.startswith("tensor<") and shape(value.type) is None:
            return True
    return False


def _ints(op: Any, name: str) -> list[int]:
    """An integer or integer array attribute (``3 : i64``, ``array<i64: 4, 4>``,
    ``dense<[4, 4]> : tensor<2xi64>``) as a list, [] when absent."""
    text = attr(op, name)
    values = text.partition(":")[2] if text.startswith("array<") else text.partition(":")[0]
    return [int(i) for i in _INTS.findall(values)]


def _dims(value: Any) -> list[int]:
    return shape(value.type) or [1]


def _matrix(value: Any) -> tuple[int, int, int]:
    """(batch, rows, columns) of a [..., m, n] operand."""
    dims = _dims(value)
    dims = [1] * (2 - len(dims)) + dims
    return math.prod(dims[:-2]), dims[-2], dims[-1]


def _log2(n: int) -> int:
    return max(math.ceil(math.log2(max(n, 2))), 1)


def _fft(length: int) -> int:
    """A complex FFT of ``length`` points: 5·N·log2(N) flops (the count FFT benchmarks use)."""
    return 5 * length * _log2(length)


# Slices whose position is read from an array: a gather (or scatter) of one window. At a position
# made of constants and scalars (a scan's step counter) they walk a layout; at one read out of
# an array, a loop of them does a whole gather outside the kernel (an embedding lookup was
# certified that way as 0 work, found 2026-12-05 by an attack review).
DATA_ADDRESSED = {"stablehlo.dynamic_slice": 1, "stablehlo.dynamic_update_slice": 2}
_PROVENANCE_DEPTH = 16


def _read_from_array(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is computed from an array's elements (any operand of more than one
    element on the way back), rather than from constants and scalars alone. Past the depth
    it looks, it is taken to be (default deny)."""
    owner = value.owner
    if not hasattr(owner, "operands"):  # a block's argument: a scalar one is a loop's counter
        return size(value) > 1
    if depth > _PROVENANCE_DEPTH:
        return True
    operands = list(owner.operands)
    if any(size(operand) > 1 for operand in operands):
        return True
    return any(_read_from_array(operand, depth + 1) for operand in operands)


def data_addressed(op: Any) -> bool:
    """A slice (or an update of one) whose position is read from an array."""
    first = DATA_ADDRESSED.get(kind_of(op))
    return first is not None and any(_read_from_array(value) for value in list(op.operands)[first:])


def op_work(op: Any) -> tuple[str, int]:
    """(kind, work) of an op without regions: kind is glue, light, heavy or unpriced."""
    name = kind_of(op)
    out = sum(size(r) for r in op.results)
    if data_addressed(op):
        moved = op.operands[1] if name == "stablehlo.dynamic_update_slice" else op.results[0]
        return "heavy", size(moved)
    if name in GLUE:
        return "glue", 0
    if name in ("stablehlo.dot_general", "stablehlo.dot"):
        lhs = shape(op.operands[0].type) or []
        match = _CONTRACTING.search(attr(op, "dot_dimension_numbers"))
        dims = [int(d) for d in match.group(1).split(",") if d.strip()] if match else [-1]
        depth = math.prod(lhs[d] for d in dims if -len(lhs) <= d < len(lhs)) if lhs else 1
        return "heavy", 2 * out * depth
    if name == "chlo.ragged_dot":  # lhs [m, k] against group g's [k, n]: 2·m·k·n
        return "heavy", 2 * size(op.operands[0]) * _dims(op.results[0])[-1]
    if name == "stablehlo.convolution":
        rhs = shape(op.operands[1].type) or [1]
        match = _CONV_KERNEL.search(attr(op, "dimension_numbers"))
        letters = [s.strip() for s in match.group(1).split(",")] if match else []
        features = rhs[letters.index("o")] if "o" in letters else max(rhs)
        return "heavy", 2 * out * (math.prod(rhs) // max(features, 1))
    if name == "stablehlo.triangular_solve":
        return "heavy", _trsm(op)
    if name == "stablehlo.cholesky":
        batch, n, _ = _matrix(op.operands[0])
        return "heavy", batch * max(n**3 // 3, n * n)
    if name == "stablehlo.fft":
        lengths = _ints(op, "fft_length") or [1]
        points = math.prod(lengths)
        operand = _dims(op.operands[0])
        batch = math.prod(operand[: len(operand) - len(lengths)])
        return "heavy", batch * _fft(points)
    if name == "chlo.top_k":  # one pass over each row keeping k: n·log2(k) comparisons
        k = _ints(op, "k") or [1]
        return "heavy", size(op.operands[0]) * _log2(k[0])
    if name in HEAVY:
        return "heavy", out
    if name in LIGHT:
        return "light", out
    return "unpriced", max(out, 1)


def _trsm(op: Any) -> int:
    """A triangular solve of B [..., m, n] by A [..., k, k] (k = m on the left, n on the right):
    each of B's elements costs k multiply-adds over the triangle, m·n·k flops in all."""
    return size(op.operands[1]) * _dims(op.operands[0])[-1]


def _factorization(routine: str, op: Any) -> int | None:
    """Flops of one LAPACK/cuSOLVER routine on this call's operands; None: no formula."""
    if routine == "trsm":
        return _trsm(op)
    if routine in ("gtsv", "gtsv2"):  # the Thomas algorithm: ~8 flops per right-hand side entry
        return 8 * size(op.operands[-1])
    if routine == "lu_pivots_to_permutation":
        return sum(size(r) for r in op.results)
    batch, m, n = _matrix(op.operands[0])
    big, small = max(m, n), min(m, n)
    if routine == "potrf":  # Cholesky: n³/3
        per = n**3 // 3
    elif routine == "getrf":  # LU with partial pivoting: m·n² − n³/3 (2n³/3 when square)
        per = big * small**2 - small**3 // 3
    elif routine in ("geqrf", "geqp3"):  # Householder QR: 2·m·n² − 2n³/3
        per = 2 * big * small**2 - 2 * small**3 // 3
    elif routine in ("orgqr", "ungqr"):  # Q from k reflectors: 4mnk − 2(m+n)k² + 4k³/3
        k = _dims(op.operands[1])[-1] if len(op.operands) > 1 else small
        per = 4 * m * n * k - 2 * (m + n) * k * k + 4 * k**3 // 3
    elif routine in ("syevd", "heevd", "syevj", "heevj"):
        per = 9 * n**3  # symmetric eigensolver with vectors (GVL: 9n³)
    elif routine in ("gesdd", "gesvd", "gesvdj"):  # SVD with U, V: 4m²n + 8mn² + 9n³
        per = 4 * big**2 * small + 8 * big * small**2 + 9 * small**3
    elif routine in ("geev", "gees"):  # real Schur form with its vectors (GVL: 25n³)
        per = 25 * n**3
    elif routine == "gehrd":  # Hessenberg reduction: 10n³/3
        per = 10 * n**3 // 3
    elif routine in ("sytrd", "hetrd"):  # tridiagonal reduction: 4n³/3
        per = 4 * n**3 // 3
    else:
        return None
    return batch * max(per, m * n)


def custom_call_work(op: Any, target: str) -> tuple[str, int]:
    """(kind, work) of a custom call to a numerical library; ``unpriced`` without a formula
    (kernels, glue and callbacks are the walker's to handle before this)."""
    out = sum(size(r) for r in op.results)
    if target in _FFT_TARGETS:
        # The old CPU FFT names its axes in an opaque descriptor: price the whole array as one
        # transform, an upper bound on any batch of transforms over some of its axes.
        points = max(size(v) for v in (*op.operands, *op.results))
        return "heavy", _fft(points)
    match = _ROUTINE.match(target)
    if match is None or not op.operands:
        return "unpriced", max(out, 1)
    routine = match.group(1)
    if routine == "threefry2x32":  # 20 rounds of add, rotate (2 shifts, or), xor per word
        return "light", 100 * out
    work = _factorization(routine, op)
    if work is None:
        return "unpriced", max(out, 1)
    kind = "light" if routine == "lu_pivots_to_permutation" else "heavy"
    return kind, max(work, 1)


def _prefix_scans(op: Any) -> int:
    """How many dimensions a reduce_window scans when it is a prefix scan (what ``cumsum``,
    ``cummax`` and friends lower to): same output shape as input, unit strides and dilations,
    each window 1 or the whole dimension. 0 for any other window.

    Such a window is n wide at every one of n outputs, n² combines read literally, but its
    output is a prefix (or suffix) scan, which needs one combine per element, and XLA does not
    run it as n² (a cumsum of 64 rows of 16384 takes about 17 ms on a CPU core). Pricing it by its
    output, as a reduction of the same input is priced, keeps the yardstick of a cumsum
    reference where it was; a window of any other form is priced by output × window."""
    dims = _dims(op.operands[0])
    window = _ints(op, "window_dimensions")
    if len(window) != len(dims) or _dims(op.results[0]) != dims:
        return 0
    for name in ("window_strides", "base_dilations", "window_dilations"):
        if any(v != 1 for v in _ints(op, name)):
            return 0
    padding = _ints(op, "padding") or [0] * (2 * len(dims))
    if len(padding) != 2 * len(dims):
        return 0
    for w, n, low, high in zip(window, dims, padding[::2], padding[1::2], strict=True):
        if (low, high) not in ((0, 0), (w - 1, 0), (0, w - 1)) or w not in (1, n):
            return 0  # a window centred anywhere else is a sliding window, priced as such
    return sum(1 for w in window if w > 1)


def region_op_work(op: Any, regions: list[tuple[int, int]]) -> tuple[str, int]:
    """(kind, work) of an op of ``PER_ELEMENT``, given (heavy, light) work of one run of each of
    its regions. Each run counts at least 1: combining two values is an operation."""
    name = kind_of(op)
    runs = [max(heavy + light, 1) for heavy, light in regions] or [1]
    operands = list(op.operands)
    out = sum(size(r) for r in op.results)
    if name == "stablehlo.map":  # the body on every element
        kind = "heavy" if any(heavy for heavy, _ in regions) else "light"
        return kind, out * runs[0]
    if name in ("stablehlo.reduce", "stablehlo.all_reduce", "stablehlo.reduce_scatter"):
        # variadic: N inputs then N initial values; the body combines one element of each
        inputs = operands[: max(len(operands) // 2, 1)] if name == "stablehlo.reduce" else operands
        return "heavy", max(size(inputs[0]) * runs[0], sum(size(v) for v in inputs), out)
    if name == "stablehlo.reduce_window":  # every output reduces a whole window
        inputs = operands[: max(len(operands) // 2, 1)]
        scans = _prefix_scans(op)
        if scans:  # cumsum's form: XLA runs it as a scan, one combine per element and pass
            return "heavy", size(inputs[0]) * scans * runs[0]
        window = math.prod(_ints(op, "window_dimensions"))
        per_output = size(op.results[0]) * window * runs[0]
        return "heavy", max(per_output, sum(size(v) for v in inputs), out)
    if name == "stablehlo.select_and_scatter":  # operand, source, init: select over each window
        window = math.prod(_ints(op, "window_dimensions"))
        source = size(operands[1]) if len(operands) > 1 else out
        scatter = runs[1] if len(runs) > 1 else 1
        return "heavy", max(source * (window * runs[0] + scatter), out)
    if name == "stablehlo.scatter":  # N inputs, the indices, N updates: the body per update
        updates = operands[(len(operands) + 1) // 2 :] or operands[-1:]
        return "heavy", size(updates[0]) * runs[0]
    if name == "stablehlo.sort":  # n·log2(n) comparisons along the sorted dimension
        dims = _dims(operands[0]) if operands else [1]
        dimension = (_ints(op, "dimension") or [-1])[0]
        length = dims[dimension] if -len(dims) <= dimension < len(dims) else max(dims)
        return "heavy", size(operands[0]) * _log2(length) * runs[0] if operands else out
    return "unpriced", max(out, 1)
