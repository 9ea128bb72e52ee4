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
    _values_of,
    walk,
)
from nearmiss.engine.models import Evidence

LOG2_E = 1.4426950408889634


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in walk(node) if isinstance(n, ast.Name)}


def _scales_by_log2e(fn: ast.AST) -> bool:
    """The function (or what it encloses) rescales logits into base 2: ``log2(e)``,
    ``math.log2(math.e)`` or the constant 1.4427 (a softmax computed with ``exp2``)."""
    for node in walk(fn):
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
        exps = [n for n in walk(fn) if _is_call(n, mod.np_names, "exp")]
        exp2s = [n for n in walk(fn) if _is_call(n, mod.np_names, "exp2")]
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
        for node in walk(fn):
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


def _reduction(
    mod: _Module, node: ast.AST, kinds: tuple[str, ...]
) -> tuple[ast.expr, ast.expr] | None:
    """(operand, axis node) of ``jnp.max(x, axis=a)`` or ``x.max(axis=a)`` for ``kinds``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr not in kinds:
        return None
    axis = next((k.value for k in node.keywords if k.arg == "axis"), None)
    if _dotted(node.func.value) in mod.np_names:  # the function form: the operand is args[0]
        operand = node.args[0] if node.args else None
        axis = axis if axis is not None or len(node.args) < 2 else node.args[1]
    else:
        operand = node.func.value
    if operand is None or not (isinstance(axis, ast.Constant) and isinstance(axis.value, int)):
        return None
    return operand, axis


@_recipe(
    "softmax_axes",
    ("wrong_values", "nan_inf"),
    "a softmax's sum of exponentials over another axis than its max → the max's axis",
)
def softmax_axes(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``m = jnp.max(s, axis=1)``, ``p = jnp.exp(s - m)``, then ``jnp.sum(p, axis=0)``:
    the normaliser sums down the queries instead of along the keys the max was taken over.
    Fix: the sum reduces the axis of the max of the same logits (compared only when both axes
    count from the same end, so ``1`` and ``-1`` of an unknown rank are left alone)."""
    edits = []
    for fn in _kernel_functions(mod):
        max_axes: dict[str, set[int]] = {}
        for node in walk(fn):
            found = _reduction(mod, node, ("max",))
            if found and isinstance(found[0], ast.Name):
                max_axes.setdefault(found[0].id, set()).add(found[1].value)
        for node in walk(fn):
            found = _reduction(mod, node, ("sum",))
            if found is None:
                continue
            operand, axis = found
            logits = {
                sub.left.id
                for value in _values_of(fn, operand, depth=2)
                if _is_call(value, mod.np_names, "exp", "exp2")
                for sub in walk(value)
                if isinstance(sub, ast.BinOp)
                and isinstance(sub.op, ast.Sub)
                and isinstance(sub.left, ast.Name)
            }
            axes = set().union(*(max_axes.get(name, set()) for name in logits))
            if len(axes) != 1:
                continue
            wanted = axes.pop()
            if wanted != axis.value and (wanted < 0) == (axis.value < 0):
                edits.append(_replace(axis, str(wanted)))
    return edits


_HEAD_DIM = ("d", "D", "head_dim", "d_head", "head_size", "dim", "d_k", "dk")


def _head_dim(node: ast.expr) -> bool:
    """``q.shape[-1]`` or a name that says head dimension."""
    if isinstance(node, ast.Name):
        return node.id in _HEAD_DIM
    return (
        isinstance(node, ast.Subscript)
        and (_dotted(node.value) or "").endswith(".shape")
        and isinstance(node.slice, ast.UnaryOp)
        and isinstance(node.slice.operand, ast.Constant)
        and node.slice.operand.value == 1
    )


@_recipe(
    "attention_scale",
    ("wrong_values", "unstable"),
    "an attention scale 1 / head_dim → 1 / sqrt(head_dim)",
)
def attention_scale(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a softmax scale assigned ``1 / q.shape[-1]`` (or ``1.0 / head_dim``): scaled
    dot-product attention divides the logits by the square root of the head dimension, so the
    softmax comes out far too flat. Fix: ``1 / head_dim ** 0.5``. Only in an assignment to a
    name that says scale, in a module that exponentiates (a softmax)."""
    if not any(_is_call(n, mod.np_names, "exp", "exp2") for n in walk(mod.tree)):
        return []
    edits = []
    for node in walk(mod.tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and "scale" in target.id.lower()):
            continue
        for div in walk(node.value):
            if not (isinstance(div, ast.BinOp) and isinstance(div.op, ast.Div)):
                continue
            one = isinstance(div.left, ast.Constant) and div.left.value == 1
            if one and _head_dim(div.right):
                edits.append(_replace(div.right, f"{_text(mod.source, div.right)} ** 0.5"))
    return edits


def _corrections(mod: _Module, fn: ast.AST) -> dict[str, ast.Assign]:
    """Names bound to an online softmax's correction ``exp(m_prev - m_next)`` (or exp2), and
    the names derived from one (``alpha_o = jnp.tile(alpha, ...)``): name → its assignment."""
    found: dict[str, ast.Assign] = {}
    for node in walk(fn):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        if not isinstance(target, ast.Name):
            continue
        exp = _is_call(value, mod.np_names, "exp", "exp2") and value.args
        arg = value.args[0] if exp else None
        if (
            isinstance(arg, ast.BinOp)
            and isinstance(arg.op, ast.Sub)
            and isinstance(arg.left, ast.Name)
            and isinstance(arg.right, ast.Name)
        ) or (found and _names(value) & set(found) and not isinstance(value, ast.BinOp)):
            found[target.id] = node
    return found


def _read(fn: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in walk(fn)
    )


@_recipe(
    "online_rescale",
    ("wrong_values",),
    "an online softmax's accumulator not rescaled when the running max moves → scaled",
)
def online_rescale(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``alpha = jnp.exp(m_prev - m_next)`` rescales the running sum (``alpha *
    l_prev``), but the output accumulator is updated ``acc[:] = acc[:] + o_curr``: the blocks
    folded in before the max moved keep their old scale. Fix: ``acc[:] = alpha * acc[:] +
    o_curr``, with the correction name the kernel derived for the accumulator's shape if it
    computed one and left it unused (``alpha_o``), else the correction itself."""
    edits = []
    for fn in _kernel_functions(mod):
        corrections = _corrections(mod, fn)
        if not corrections:
            continue
        unused = [n for n in corrections if not _read(fn, n)]
        factor = unused[0] if len(unused) == 1 else next(iter(corrections))
        for node in walk(fn):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            if not (isinstance(target, ast.Subscript) and isinstance(value, ast.BinOp)):
                continue
            if not isinstance(value.op, ast.Add) or _names(value) & set(corrections):
                continue
            same = ast.dump(target.value)
            for side, other in ((value.left, value.right), (value.right, value.left)):
                reads_acc = isinstance(side, ast.Subscript) and ast.dump(side.value) == same
                from_dot = any(
                    (_dotted(c.func) or "").split(".")[-1] in _DOTS
                    for v in _values_of(fn, other, depth=2)
                    for c in walk(v)
                    if isinstance(c, ast.Call)
                )
                if reads_acc and from_dot:
                    edits.append(_replace(side, f"{factor} * {_text(mod.source, side)}"))
                    break
    return edits


@_recipe(
    "correction_sign",
    ("nan_inf", "wrong_values", "unstable"),
    "an online softmax's correction exp(m_next - m_prev) → exp(m_prev - m_next)",
)
def correction_sign(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``m_next = jnp.maximum(m_prev, m_curr)`` then ``alpha = jnp.exp(m_next -
    m_prev)``: the rescale of what was summed under the old max must be at most 1; the flipped
    difference grows it instead (and overflows to inf on large logits). Fix: ``exp(m_prev -
    m_next)`` (exp2 alike)."""
    edits = []
    for fn in _kernel_functions(mod):
        for node in walk(fn):
            if not _is_call(node, mod.np_names, "exp", "exp2") or len(node.args) != 1:
                continue
            diff = node.args[0]
            if not (
                isinstance(diff, ast.BinOp)
                and isinstance(diff.op, ast.Sub)
                and isinstance(diff.left, ast.Name)
                and isinstance(diff.right, ast.Name)
            ):
                continue
            new, old = diff.left.id, diff.right.id
            for value in _values_of(fn, diff.left, depth=1):
                if _is_call(value, mod.np_names, "maximum") and old in _names(value):
                    edits.append(_replace(diff, f"{old} - {new}"))
                    break
    return edits
