"""Recipes for numeric conventions a kernel must keep consistent: one exponential base for the
logits of one softmax, and no narrowing cast feeding a dot that the spec computes wide."""

from __future__ import annotations

import ast

from activities.fixers.playbook.registry import _recipe
from activities.fixers.playbook.source import (
    LOW_FLOATS,
    _dotted,
    _Edit,
    _is_call,
    _kernel_functions,
    _Module,
    _replace,
    _text,
)
from workflows.models import Evidence

LOG2_E = 1.4426950408889634


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _scales_by_log2e(fn: ast.AST) -> bool:
    """The function (or what it encloses) rescales logits into base 2: ``log2(e)``,
    ``math.log2(math.e)`` or the constant 1.4427 (a softmax computed with ``exp2``)."""
    for node in ast.walk(fn):
        log2 = isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith("log2")
        if log2 and any((_dotted(a) or "").split(".")[-1] == "e" for a in node.args):
            return True
        number = isinstance(node, ast.Constant) and isinstance(node.value, float)
        if number and abs(node.value - LOG2_E) < 1e-4:
            return True
    return False


@_recipe(
    "exp_base",
    ("wrong_values", "nan_inf"),
    "exp and exp2 mixed over the same running max (base-2 logits) → one base throughout",
)
def exp_base(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: an online softmax whose logits are scaled by ``log2(e)`` and exponentiated with
    ``exp2``, but whose rescale factor ``exp(m_prev - m_next)`` is taken in base e (or the
    other way round): the running sum and accumulator are rescaled by the wrong factor whenever
    the max moves. Fix: an exponential sharing a name with the others but in the minority base
    takes theirs (base 2 when the kernel scales by ``log2(e)``, else base e)."""
    edits = []
    for fn in _kernel_functions(mod):
        exps = [n for n in ast.walk(fn) if _is_call(n, mod.np_names, "exp")]
        exp2s = [n for n in ast.walk(fn) if _is_call(n, mod.np_names, "exp2")]
        if not exps or not exp2s:
            continue
        wrong, right = (exps, exp2s) if _scales_by_log2e(fn) else (exp2s, exps)
        shared = set().union(*(_names(n) for n in right))
        for call in wrong:
            if _names(call) & shared:
                base = "exp2" if wrong is exps else "exp"
                edits.append(_replace(call.func, f"{_dotted(call.func.value)}.{base}"))
    return edits


_DOTS = ("dot", "dot_general", "matmul", "einsum")


def _narrowing_cast(mod: _Module, node: ast.AST) -> bool:
    """``x.astype(jnp.bfloat16)`` / ``x.astype("float16")``: a cast to a 16-bit float by name."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "astype"
        and node.args
    ):
        return False
    dtype = node.args[0]
    name = dtype.value if isinstance(dtype, ast.Constant) else (_dotted(dtype) or "")
    return isinstance(name, str) and name.split(".")[-1] in LOW_FLOATS


@_recipe(
    "narrowing_cast",
    ("precision",),
    "an operand cast to bf16/f16 by name before a dot → the other operand's dtype",
)
def narrowing_cast(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``jax.lax.dot(p.astype(jnp.bfloat16), v, ...)``, a "faster" MXU feed whatever
    the inputs' dtype: with float32 inputs the probabilities lose 16 bits before the dot, which
    the evidence reads as precision loss. Fix: the cast follows the other operand
    (``p.astype(v.dtype)``), which keeps bf16 inputs on the bf16 path and f32 inputs exact; a
    dot of two narrowed operands gets float32."""
    edits = []
    for fn in _kernel_functions(mod):
        for node in ast.walk(fn):
            called = (_dotted(node.func) or "").split(".")[-1] if isinstance(node, ast.Call) else ""
            if called not in _DOTS:
                continue
            operands = [a for a in node.args[:3] if isinstance(a, ast.expr)]
            if called == "einsum":
                operands = operands[1:]
            for i, operand in enumerate(operands[:2]):
                if not _narrowing_cast(mod, operand):
                    continue
                others = [o for j, o in enumerate(operands[:2]) if j != i]
                other = others[0] if others else None
                if isinstance(other, ast.Name | ast.Attribute | ast.Subscript) and not (
                    _narrowing_cast(mod, other)
                ):
                    dtype = f"{_text(mod.source, other)}.dtype"
                else:
                    dtype = f"{mod.np}.float32"
                edits.append(_replace(operand.args[0], dtype))
    return edits
