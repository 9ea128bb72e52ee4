"""Recipes for kernels that do not compile or return the wrong structure."""

from __future__ import annotations

import ast
import re

from activities.fixers.playbook.registry import (
    _recipe,
)
from activities.fixers.playbook.source import (
    _BLOCK_RANK,
    _BOOL_OF_TRACER,
    _STORE_DTYPE,
    _STRUCTURE,
    LOW_FLOATS,
    _atom,
    _bodies,
    _dotted,
    _Edit,
    _failed_statements,
    _indent,
    _kwarg,
    _Module,
    _pallas_calls,
    _program_id_axis,
    _program_ids,
    _refs,
    _replace,
    _text,
    walk,
)
from nearmiss.engine.models import Evidence


@_recipe(
    "store_cast",
    ("compile_error",),
    "a store whose value dtype differs from the ref's (per the error) gets .astype(ref.dtype)",
)
def store_cast(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the compile error says a store's value dtype differs from the ref's, at a plain
    ``x_ref[...] = value`` line or a ``<pallas module>.store(x_ref.at[...], value, ...)`` call.
    Fix: the value is cast to ``x_ref.dtype`` — by replacing the dtype of a cast it already
    ends in (``value.astype(jnp.bfloat16)``: a second cast would keep the first's rounding),
    else by appending one."""
    if not _STORE_DTYPE.search(evidence.diagnosis):
        return []
    edits = []
    for stmt in _failed_statements(mod, evidence):
        stored = _stored(stmt)
        if stored is None:
            continue
        ref, value = stored
        if _is_cast(value):
            edits.append(_replace(value.args[0], f"{ref}.dtype"))
        else:
            edits.append(_replace(value, f"{_atom(mod.source, value)}.astype({ref}.dtype)"))
    return edits


def _stored(stmt: ast.stmt) -> tuple[str, ast.expr] | None:
    """(ref name, stored value) of ``ref[...] = value`` or ``<m>.store(ref[.at[...]], value)``."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            return target.value.id, stmt.value
        return None
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not (isinstance(call, ast.Call) and (_dotted(call.func) or "").endswith(".store")):
        return None
    if len(call.args) < 2:
        return None
    ref = call.args[0]
    while isinstance(ref, ast.Subscript | ast.Attribute):  # x_ref.at[...] → x_ref
        ref = ref.value
    return (ref.id, call.args[1]) if isinstance(ref, ast.Name) else None


def _is_cast(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "astype"
        and len(node.args) == 1
    )


@_recipe(
    "out_shape_dtype",
    ("shape_mismatch", "compile_error"),
    "out_shape's ShapeDtypeStruct dtype → the dtype the evidence says the output needs",
)
def out_shape_dtype(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a ``jax.ShapeDtypeStruct(shape, dtype)`` with the wrong dtype. For a structure
    mismatch ("out is float32[..], the reference's is bfloat16[..]") the dtype becomes the wanted
    one — the input's dtype when the compact suite passed (so it varies with the inputs); for a
    compile error where a ``+=`` accumulates a wider value into the output ref, the output takes
    the value's dtype (an accumulator cannot be rounded at every step)."""
    want = follow_input = None
    if evidence.structure_problem and (m := _STRUCTURE.search(evidence.structure_problem)):
        got, got_shape, want, want_shape = m.groups()
        if got == want or got_shape != want_shape:
            return []
        follow_input = want in LOW_FLOATS and bool(evidence.compact_passed)
    elif m := _STORE_DTYPE.search(evidence.diagnosis):
        accumulates = [s for s in _failed_statements(mod, evidence) if isinstance(s, ast.AugAssign)]
        if not accumulates:
            return []
        want = m.group(2)
    else:
        return []
    for call in _pallas_calls(mod):
        structs = [s for s in call.out_shapes if isinstance(s, ast.Call)]
        if len(structs) != 1 or (dtype := _kwarg(structs[0], "dtype", 1)) is None:
            continue
        params = getattr(call.scope, "args", None)
        if follow_input and params and params.args:
            new = f"{params.args[0].arg}.dtype"
        else:
            new = f"{mod.np}.{want}"
        if _text(mod.source, dtype) != new:
            return [_replace(dtype, new)]
    return []


@_recipe(
    "block_rank_reshape",
    ("compile_error",),
    "an operand one rank short of its BlockSpec (leading unit dims) is reshaped at the call",
)
def block_rank_reshape(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the error says ``args[k]``'s block shape has more dimensions than the array and
    the extra leading block dims are 1 (a 1-D weight under a ``(1, C)`` BlockSpec). Fix: pass
    ``operand.reshape(1, *operand.shape)`` to the kernel call (layout glue only)."""
    m = _BLOCK_RANK.search(evidence.diagnosis)
    if not m:
        return []
    index, block, shape = int(m.group(1)), m.group(2), m.group(3)
    sizes = re.findall(r"block_size=(\d+)", block) or re.findall(r"\d+|None", block)
    extra = len(sizes) - len([d for d in shape.split(",") if d.strip()])
    if extra <= 0 or any(s not in ("1", "None") for s in sizes[:extra]):
        return []
    for call in _pallas_calls(mod):
        for node in walk(call.scope):
            if isinstance(node, ast.Call) and node.func is call.node and len(node.args) > index:
                operand = _atom(mod.source, node.args[index])
                ones = "1, " * extra
                return [_replace(node.args[index], f"{operand}.reshape({ones}*{operand}.shape)")]
    return []


@_recipe(
    "python_if_to_when",
    ("compile_error",),
    "a Python `if` on a program id (a tracer) → a @pl.when block",
)
def python_if_to_when(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: tracing failed converting a tracer to bool, and a kernel body has an ``if`` (no
    ``else``) on ``pl.program_id`` whose branch only writes refs. Fix: the branch becomes a
    ``@pl.when(cond)`` function."""
    if not _BOOL_OF_TRACER.search(evidence.diagnosis):
        return []
    edits = []
    for body in _bodies(mod):
        pids, refs = _program_ids(mod, body), set(_refs(body))
        for node in walk(body):
            if not isinstance(node, ast.If) or node.orelse:
                continue
            names = {n.id for n in walk(node.test) if isinstance(n, ast.Name)}
            on_pid = names & set(pids) or any(
                _program_id_axis(mod, n) is not None for n in walk(node.test)
            )
            only_refs = all(
                isinstance(s, ast.Expr)
                or (
                    isinstance(s, ast.Assign | ast.AugAssign)
                    and all(
                        isinstance(t, ast.Subscript) and _dotted(t.value) in refs
                        for t in (s.targets if isinstance(s, ast.Assign) else [s.target])
                    )
                )
                for s in node.body
            )
            if not (on_pid and only_refs) or node.body[0].lineno <= node.test.end_lineno:
                continue
            indent = _indent(mod.source, node)
            header = (
                f"@{mod.pl}.when({_text(mod.source, node.test)})\n"
                f"{indent}def _when_{node.lineno}():"
            )
            line = mod.source.splitlines()[node.test.end_lineno - 1]
            end = (node.test.end_lineno, len(line.encode()))
            edits.append(_Edit((node.lineno, node.col_offset), end, header))
    return edits


@_recipe(
    "ifexp_to_where",
    ("compile_error",),
    "a Python conditional expression on traced values → jnp.where",
)
def ifexp_to_where(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: tracing failed converting an array to bool, and a kernel body holds ``a if cond
    else b`` on array values. Fix: ``jnp.where(cond, a, b)``."""
    if not _BOOL_OF_TRACER.search(evidence.diagnosis):
        return []
    static = ("shape", "ndim", "dtype", "size")
    edits = []
    for body in _bodies(mod):
        for node in walk(body):
            if not isinstance(node, ast.IfExp):
                continue
            if any(isinstance(n, ast.Attribute) and n.attr in static for n in walk(node.test)):
                continue  # decided at trace time: legitimate Python
            parts = [_text(mod.source, p) for p in (node.test, node.body, node.orelse)]
            edits.append(_replace(node, f"{mod.np}.where({', '.join(parts)})"))
    return edits
