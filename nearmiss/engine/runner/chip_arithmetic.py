"""A traced program computed as a TPU computes it: matmul precision and undefined integer results.

Every run a check makes on a CPU computes a float32 matmul in float32. A TPU does not: its MXU
multiplies bfloat16, so a float32 ``dot`` at DEFAULT precision is one pass over operands rounded
to bfloat16 (read from libtpu's own output for v5e: one ``vmatmul`` in round mode; HIGHEST gives
six), HIGH is three (bf16_3x: each float32 operand split into a high and a low bfloat16 part, the
low×low product left out; XLA only, Mosaic refuses HIGH) and HIGHEST is float32 to within
rounding. Read from libtpu's LLO for v4, v5e, v5p and v6e alike (compile-only): one ``vdwg``
weight load per pass, in kernels and in XLA code. Inside a Pallas kernel,
Mosaic reads only the dot's own ``precision``; outside, XLA also reads the
``jax_default_matmul_precision`` setting. A kernel right only in float32 is wrong on the chip
(``tests/forgeries/chip_default_precision_dot.py``: 8e-2 off at atol 2e-4).

``on_the_chip`` rewrites the traced program so each such matmul (``dot_general``, and outside
kernels ``conv_general_dilated``) computes on operands rounded as the chip rounds them, with
float32 accumulation, and lists the ones it changed (their lines, for the diagnosis). It also
watches, inside kernel bodies, the integer operations whose result the TPU compiler leaves
undefined (MLIR's poison: a shift by the bit width or more, a division by zero, the most negative
value divided by -1, a float converted to an integer it does not fit): XLA on a CPU gives each a
fixed answer a kernel can come to rely on; the chip gives whatever it gives. Each such operation
reports, through a host callback, when it meets an operand that makes it undefined.

The rewrite works on the jaxpr the candidate traced once (``runner.traced_program``): no
candidate code runs again, and each replaced equation keeps its source location, so a kernel
that misbehaves here is named by its own line.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nearmiss.engine.jaxpr_walk import rewrite_eqns
from nearmiss.engine.runner.traced_program import as_jit_equation

# bfloat16 passes of a float32 matmul on a TPU's MXU, by precision. The same MXU (bfloat16
# multipliers, float32 accumulation) in v4, v5e, v5p and v6e.
DEFAULT_PASSES, HIGH_PASSES, EXACT = 1, 3, None
# ``jax_default_matmul_precision`` values (XLA, outside kernels) -> passes.
_CONFIG_PASSES = {
    "bfloat16": DEFAULT_PASSES,
    "default": DEFAULT_PASSES,
    "fastest": DEFAULT_PASSES,
    "bfloat16_3x": HIGH_PASSES,
    "high": HIGH_PASSES,
    "tensorfloat32": HIGH_PASSES,
    "float32": EXACT,
    "highest": EXACT,
}
_PRESET_PASSES = {
    "BF16_BF16_F32": DEFAULT_PASSES,
    "BF16_BF16_F32_X3": HIGH_PASSES,
    "DEFAULT": DEFAULT_PASSES,
}
# A GPU's tensor cores take float32 operands as TF32 (a 10-bit mantissa): Pallas' Triton
# lowering gives a float32 dot at DEFAULT or HIGH precision (either operand's) ``inputPrecision
# = tf32``, HIGHEST ``ieee``; XLA on a GPU computes DEFAULT and HIGH float32 dots in TF32 too
# unless ``jax_default_matmul_precision`` says otherwise.
TF32 = "tf32"
_GPU_CONFIG = _CONFIG_PASSES | {
    "default": TF32,
    "fastest": TF32,
    "high": TF32,
    "tensorfloat32": TF32,
}
_GPU_PRESETS: dict[str, int | str | None] = {
    "TF32_TF32_F32": TF32,
    "BF16_BF16_F32": DEFAULT_PASSES,
    "DEFAULT": TF32,
}


@dataclass
class ChipArithmetic:
    """What ``on_the_chip`` changed, and what the run met: ``reduced`` lists each matmul it
    rounded ({"line", "precision", "passes", "in_kernel"}); ``undefined`` collects, while the
    program runs, each operation that met an operand the chip leaves undefined ({"line",
    "what"})."""

    reduced: list[dict[str, Any]] = field(default_factory=list)
    undefined: list[dict[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, line: str, what: str) -> Callable[[Any], None]:
        def seen(bad: Any) -> None:
            if bool(bad):
                with self._lock:
                    if (
                        len(self.undefined) < 8
                        and {"line": line, "what": what} not in self.undefined
                    ):
                        self.undefined.append({"line": line, "what": what})

        return seen


Passes = int | str | None  # bfloat16 passes (TPU), TF32 (GPU) or EXACT


def on_the_chip(
    closed: Any, every_dot: Passes = None, gpu: bool = False
) -> tuple[Any, ChipArithmetic]:
    """``closed`` (a ClosedJaxpr, pallas_calls already set to run under the TPU interpreter)
    with the chip's matmul rounding and undefined-integer watches; what it changed.
    ``every_dot``: that rounding for every float32 dot whatever its precision (what a kernel
    computing a spec's reference at DEFAULT precision would get: ``spec check``). ``gpu``: a
    GPU's arithmetic (TF32) instead of a TPU's."""
    from jax._src import config

    found = ChipArithmetic()
    table = _GPU_CONFIG if gpu else _CONFIG_PASSES
    value = config.default_matmul_precision.value
    default = table.get(str(value or "default").lower(), table["default"])
    rewrite = _computed_on_the_chip(found, _Rules(default, gpu, every_dot))
    jaxpr, _ = rewrite_eqns(closed.jaxpr, rewrite)
    return (closed if jaxpr is closed.jaxpr else closed.replace(jaxpr=jaxpr)), found


@dataclass(frozen=True)
class _Rules:
    default: Passes  # outside kernels, a DEFAULT dot (the configured precision)
    gpu: bool
    every_dot: Passes = None


def _precision_passes(precision: Any, rules: _Rules, in_kernel: bool) -> Passes:
    """How a dot whose ``precision`` parameter is this computes. None and DEFAULT are the
    configured default outside a kernel; in one, one bfloat16 pass on a TPU (Mosaic reads no
    setting) and TF32 on a GPU (Triton's lowering)."""
    from jax import lax

    if rules.every_dot is not None:
        return rules.every_dot
    in_kernel_default = TF32 if rules.gpu else DEFAULT_PASSES
    if precision is None:
        return in_kernel_default if in_kernel else rules.default
    if isinstance(precision, lax.DotAlgorithmPreset):
        presets: dict[str, Passes] = {**(_GPU_PRESETS if rules.gpu else _PRESET_PASSES)}
        return presets.get(precision.name, EXACT)
    levels = precision if isinstance(precision, tuple | list) else (precision,)
    passes: list[Passes] = []
    for level in levels:
        if level is None or level == lax.Precision.DEFAULT:
            passes.append(in_kernel_default if in_kernel else rules.default)
        elif level == lax.Precision.HIGH:
            passes.append(TF32 if rules.gpu else HIGH_PASSES)
        else:
            passes.append(EXACT)
    if rules.gpu and in_kernel:  # Triton: TF32 if either operand allows it
        return TF32 if TF32 in passes else EXACT
    # Per-operand precisions: XLA and Mosaic compute at the finer of the two.
    if any(p is EXACT for p in passes):
        return EXACT
    if TF32 in passes:
        return TF32
    return max(p for p in passes if isinstance(p, int))


def _line(eqn: Any) -> str:
    from jax._src import source_info_util

    try:
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # a location is for the diagnosis only
        return "?"


def _rounded(x: Any, passes: int | str) -> tuple[Any, ...]:
    """A float32 operand as the MXU sees it. One pass: rounded to bfloat16 (the MXU's ``round``
    mode). Three: split into a high and a low bfloat16 part by truncation, as libtpu's code does
    (``vand`` with 0xFFFF0000, then a subtraction). Other dtypes pass through whole."""
    import jax.numpy as jnp
    from jax import lax

    if x.dtype != jnp.float32:
        return (x,)
    if passes == TF32:  # the tensor core reads the top 19 bits: 10 of mantissa
        bits = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0xFFFFE000)
        return (lax.bitcast_convert_type(bits, jnp.float32),)
    if passes == DEFAULT_PASSES:
        return (x.astype(jnp.bfloat16).astype(jnp.float32),)

    def truncated(v: Any) -> Any:
        bits = lax.bitcast_convert_type(v, jnp.uint32) & jnp.uint32(0xFFFF0000)
        return lax.bitcast_convert_type(bits, jnp.float32)

    high = truncated(x)
    return high, truncated(x - high)


def _emulated_product(eqn: Any, passes: int | str) -> Any:
    """A ``jit`` equation computing ``eqn`` (a dot or convolution) from rounded operands."""

    primitive, params = eqn.primitive, eqn.params

    def product(lhs: Any, rhs: Any) -> Any:
        lhs_parts, rhs_parts = _rounded(lhs, passes), _rounded(rhs, passes)
        total = None
        for i, a in enumerate(lhs_parts):
            for j, b in enumerate(rhs_parts):
                if i and j:
                    continue  # bf16_3x leaves out low x low
                term = primitive.bind(a, b, **params)
                total = term if total is None else total + term
        return total

    product.__name__ = product.__qualname__ = f"{primitive.name}_as_on_the_chip"
    return as_jit_equation(eqn, product)


def _undefined_when(eqn: Any) -> tuple[str, Callable[..., Any]] | None:
    """For an integer operation the TPU compiler may leave undefined: what it is and a function
    of its operands that is True, element by element, where it is."""
    import jax.numpy as jnp

    name = eqn.primitive.name
    dtypes = [getattr(v.aval, "dtype", None) for v in eqn.invars]
    if not dtypes or dtypes[0] is None:
        return None
    if name in ("shift_left", "shift_right_logical", "shift_right_arithmetic"):
        if not jnp.issubdtype(dtypes[0], jnp.integer):
            return None
        bits = jnp.iinfo(dtypes[0]).bits
        return (
            f"a shift by {bits} or more (or by a negative amount) of a {bits}-bit integer",
            lambda x, y: (y < 0) | (y >= bits),
        )
    if name in ("div", "rem"):
        if not jnp.issubdtype(dtypes[0], jnp.integer):
            return None
        signed = jnp.issubdtype(dtypes[0], jnp.signedinteger)
        smallest = jnp.iinfo(dtypes[0]).min

        def bad(x: Any, y: Any) -> Any:
            wrong = y == 0
            if signed:
                wrong = wrong | ((x == smallest) & (y == -1))
            return wrong

        what = "an integer division by zero" + (
            " (or of the most negative value by -1)" if signed else ""
        )
        return what, bad
    if name == "convert_element_type":
        new = eqn.params.get("new_dtype")
        if new is None or not jnp.issubdtype(new, jnp.integer):
            return None
        if not jnp.issubdtype(dtypes[0], jnp.floating):
            return None
        info = jnp.iinfo(new)
        low, high = float(info.min), float(info.max) + 1.0
        return (
            f"a float converted to {jnp.dtype(new).name} that it does not fit (or NaN)",
            lambda x: ~((x >= low) & (x < high)),
        )
    return None


def _watched(eqn: Any, found: ChipArithmetic) -> Any:
    """``eqn`` as one ``jit`` equation that also reports, through a host callback, when its
    operands make its result undefined on the chip. Its result is XLA's where defined; where
    not, the operation runs on operands that are (a divisor of 1: XLA on a CPU traps on some
    integer divisions by zero), for the result is the chip's to choose anyway."""
    import jax
    import jax.numpy as jnp

    watch = _undefined_when(eqn)
    if watch is None:
        return eqn
    what, bad = watch
    seen = found.report(_line(eqn), what)
    primitive, params = eqn.primitive, eqn.params

    def checked(*operands: Any) -> Any:
        undefined = bad(*operands)
        jax.debug.callback(seen, jnp.any(undefined))
        if primitive.name in ("div", "rem"):
            x, y = operands
            operands = (x, jnp.where(undefined, jnp.ones_like(y), y))
        return primitive.bind(*operands, **params)

    checked.__name__ = checked.__qualname__ = f"{primitive.name}_watched"
    return as_jit_equation(eqn, checked)


def _computed_on_the_chip(found: ChipArithmetic, rules: _Rules) -> Callable[[Any, bool], Any]:
    """The rewrite of one equation (``jaxpr_walk.rewrite_eqns``): a float32 matmul rounded as
    the target rounds it (in kernels and, for dots and convolutions, outside), an integer
    operation the chip leaves undefined watched (in kernel bodies); None for the others."""

    def rewrite(eqn: Any, in_kernel: bool) -> Any:
        name = eqn.primitive.name
        if name == "dot_general" or (name == "conv_general_dilated" and not in_kernel):
            passes = _precision_passes(eqn.params.get("precision"), rules, in_kernel)
            float32 = any(str(getattr(v.aval, "dtype", "")) == "float32" for v in eqn.invars)
            if passes is EXACT or not float32:
                return eqn
            found.reduced.append(
                {
                    "line": _line(eqn),
                    "precision": _precision_name(eqn.params.get("precision")),
                    "passes": passes,
                    "in_kernel": in_kernel,
                }
            )
            return _emulated_product(eqn, passes)
        if in_kernel and _undefined_when(eqn) is not None:
            return _watched(eqn, found)
        return None

    return rewrite


def _precision_name(precision: Any) -> str:
    if precision is None:
        return "DEFAULT"
    if isinstance(precision, tuple | list):
        names = {getattr(p, "name", str(p)) if p is not None else "DEFAULT" for p in precision}
        return "/".join(sorted(names))
    return getattr(precision, "name", str(precision))
