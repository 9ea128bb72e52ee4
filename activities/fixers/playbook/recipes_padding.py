"""Recipes for the padded lanes of a ragged block: what a masked load fills them with, whether
they stay neutral through later arithmetic, and whether a loop's trip count reaches them.

A ragged extent (200 columns in blocks of 256) leaves lanes past the extent in every block that
crosses it. A masked load fills them with ``other``; that value must be the identity of the
reduction that consumes it (0 for a sum, -inf for a max or a sum of exponentials), and must stay
so after the body shifts the values (``a - mean`` turns the padded zeros into ``-mean``).
"""

from __future__ import annotations

import ast
import re

from activities.fixers.playbook.registry import _recipe
from activities.fixers.playbook.source import (
    _dotted,
    _Edit,
    _is_call,
    _kernel_functions,
    _kwarg,
    _Module,
    _replace,
    _resolve,
    _rounds_up,
    _text,
    _uncast,
    _values_of,
    walk,
)
from nearmiss.engine.models import Evidence

_LOADS = ("load",)  # pl.load, plgpu.load, pltpu.load: any ``<module>.load(..., mask=, other=)``
_SUM_LIKE = ("sum", "mean")
_MAX_LIKE = ("max", "exp", "exp2", "logsumexp")


def _loads(fn: ast.FunctionDef) -> list[tuple[str, ast.Call]]:
    """``name = <module>.load(...)`` (a trailing ``.astype(...)`` allowed) in ``fn``: (name,
    the load call)."""
    found = []
    for node in walk(fn):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], _uncast(node.value)
        called = (_dotted(value.func) or "") if isinstance(value, ast.Call) else ""
        if isinstance(target, ast.Name) and called.split(".")[-1] in _LOADS:
            found.append((target.id, value))
    return found


def _masked_loads(fn: ast.FunctionDef) -> list[tuple[str, ast.Call]]:
    """The loads that pass ``mask=`` and ``other=``: their padded lanes hold ``other``."""
    return [
        (name, call)
        for name, call in _loads(fn)
        if _kwarg(call, "mask") is not None and _kwarg(call, "other") is not None
    ]


def _consumers(mod: _Module, fn: ast.FunctionDef, name: str) -> set[str]:
    """The reductions and exponentials ``name``'s value reaches directly: ``jnp.max(name)``,
    ``jnp.exp(name - m)``, ``jnp.sum(name)`` (by their jnp function name)."""
    found = set()
    for node in walk(fn):
        if not _is_call(node, mod.np_names, *_SUM_LIKE, *_MAX_LIKE):
            continue
        first = _uncast(node.args[0]) if node.args else None
        operands = [first]
        if isinstance(first, ast.BinOp) and isinstance(first.op, ast.Sub):
            operands = [first.left]  # exp(x - max): x's padding must make the term vanish
        if any(isinstance(o, ast.Name) and o.id == name for o in operands):
            found.add(node.func.attr)
    return found


_NEG_INF = r"-(float\(['\"]inf['\"]\)|\w+\.inf|\w+\.finfo\(.*\)\.max)"


def _is_neg_inf(node: ast.AST) -> bool:
    text = ast.unparse(node).replace(" ", "")
    return bool(re.fullmatch(_NEG_INF, text))


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


@_recipe(
    "padding_identity",
    ("wrong_values", "boundary", "nan_inf"),
    "a masked load whose padding is not the identity of what consumes it → -inf under a max or "
    "exp, 0 under a sum",
)
def padding_identity(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``row = load(ref, mask=mask, other=0.0)`` then ``jnp.max(row)`` /
    ``jnp.exp(row - m)``: every padded lane adds ``exp(0 - m)`` to the softmax's denominator.
    Fix: ``other`` becomes the consumer's identity: ``-inf`` under a max or an exponential, 0
    under a sum or mean. Left alone when the same value feeds both kinds (no single identity)."""
    edits = []
    for fn in _kernel_functions(mod):
        for name, load in _masked_loads(fn):
            consumers = _consumers(mod, fn, name)
            other = _kwarg(load, "other")
            if not consumers or other is None:
                continue
            if consumers <= set(_MAX_LIKE) and not _is_neg_inf(other):
                edits.append(_replace(other, '-float("inf")'))
            elif consumers <= set(_SUM_LIKE) and not _is_zero(other):
                edits.append(_replace(other, "0.0"))
    return edits


def _accumulated(fn: ast.FunctionDef, name: str) -> bool:
    """``name`` ends in a sum: ``acc + name * name`` (a loop carry), ``jnp.sum(... name ...)``
    or ``total += ...name...``."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            sides = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            sides = (node.value,)
        elif isinstance(node, ast.Call) and (_dotted(node.func) or "").endswith(".sum"):
            sides = tuple(node.args[:1])
        else:
            continue
        if any(isinstance(n, ast.Name) and n.id == name for s in sides for n in walk(s)):
            return True
    return False


@_recipe(
    "masked_shift",
    ("wrong_values", "boundary"),
    "zero-padded lanes shifted (a - mean) before a sum → jnp.where(mask, a - mean, 0.)",
)
def masked_shift(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``a = load(x, mask=mask, other=0.)`` then ``a = a - mean`` and a sum of ``a * a``:
    the shift turns each padded zero into ``-mean``, so every padded lane adds ``mean**2`` to the
    variance. Fix: the shift keeps the padding at zero, ``jnp.where(mask, a - mean, 0.)``."""
    edits = []
    for fn in _kernel_functions(mod):
        for name, load in _masked_loads(fn):
            mask, other = _kwarg(load, "mask"), _kwarg(load, "other")
            if not (_is_zero(other) and isinstance(mask, ast.Name)):
                continue
            for node in walk(fn):
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                    continue
                target, value = node.targets[0], node.value
                if not (isinstance(target, ast.Name) and isinstance(value, ast.BinOp)):
                    continue
                if not (
                    isinstance(value.op, ast.Sub)
                    and isinstance(value.left, ast.Name)
                    and value.left.id == name
                    and not _is_zero(value.right)
                ):
                    continue
                if _accumulated(fn, target.id):
                    text = _text(mod.source, value)
                    edits.append(_replace(value, f"{mod.np}.where({mask.id}, {text}, 0.0)"))
    return edits


def _trip_counts(mod: _Module, fn: ast.FunctionDef) -> list[ast.expr]:
    """Upper bounds of the loops in ``fn``: ``lax.fori_loop(lower, upper, ...)`` and
    ``pl.loop(lower, upper)``, followed through a local name."""
    found = []
    for node in walk(fn):
        if not isinstance(node, ast.Call):
            continue
        called = (_dotted(node.func) or "").split(".")[-1]
        if called in ("fori_loop", "loop") and len(node.args) >= 2:
            found.append(_resolve(fn, node.args[1]) or node.args[1])
    return found


def _static_size(node: ast.expr) -> bool:
    """A size known when the kernel is traced — a name, a constant, ``x.shape[0]`` or
    ``ref.shape[0]`` — whose ratio to a block is the block count the kernel was built for; a
    remaining length (``length - start``) or a value read from a ref is what can end
    mid-block."""
    if isinstance(node, ast.Name | ast.Constant):
        return True
    return isinstance(node, ast.Subscript) and (_dotted(node.value) or "").endswith(".shape")


@_recipe(
    "ceil_div_loop",
    ("wrong_values", "boundary", "nan_inf"),
    "a loop's trip count a // B (skips the partial last block) → pl.cdiv(a, B)",
)
def ceil_div_loop(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``max_it = ... (length - start) // block_k ...`` then ``fori_loop(0, max_it,
    ...)``: when the valid length ends mid-block, the loop stops before the block holding the
    tail, and those elements are never visited. Fix: the floor divisions of a remaining or
    runtime length in the trip count round up (``pl.cdiv``); ratios of static sizes are left
    alone, and the body's own masks (which the engine checks) must then neutralise the tail."""
    edits = []
    for fn in _kernel_functions(mod):
        for bound in _trip_counts(mod, fn):
            for node in walk(bound):
                if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)):
                    continue
                if _rounds_up(mod.source, node) or _static_size(node.left):
                    continue
                numerator, denominator = (_text(mod.source, s) for s in (node.left, node.right))
                numerator = " ".join(numerator.split())  # a bound split over lines
                edits.append(_replace(node, f"{mod.pl}.cdiv({numerator}, {denominator})"))
    return edits


def _keep_mask_names(fn: ast.FunctionDef) -> set[str]:
    """Names bound to a position-against-extent comparison in ``fn`` (``mask = col_idx <
    n_col``): the keep-masks a load in the same function can take."""
    return {
        node.targets[0].id
        for node in walk(fn)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Compare)
        and len(node.value.ops) == 1
        and isinstance(node.value.ops[0], ast.Lt | ast.LtE | ast.Gt | ast.GtE)
    }


@_recipe(
    "mask_load",
    ("boundary", "wrong_values", "nan_inf"),
    "a load with no mask beside a keep-mask the function builds → mask=keep, other=identity",
)
def mask_load(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``mask = col_idx < n_col`` is built, but ``a = plgpu.load(x_ref.at[col_idx])``
    loads without it, so the lanes past the extent (garbage, or the next row) are summed in.
    Fix: ``mask=mask, other=<the consumer's identity>`` (0 under a sum, -inf under a max or an
    exponential). Only where the function has exactly one such mask and the load indexes with
    the positions it compares (``x_ref.at[col_idx]``)."""
    edits = []
    for fn in _kernel_functions(mod):
        masks = _keep_mask_names(fn)
        if len(masks) != 1:
            continue
        mask = next(iter(masks))
        # The positions the mask compares, and what they are built from (``col =
        # jnp.arange(block)``: a load of ``pl.ds(0, block)`` reads those positions too).
        compared = {
            n.id
            for node in walk(fn)
            if isinstance(node, ast.Assign) and _bound_to(node, mask)
            for value in _values_of(fn, node.value.left, depth=1)
            for n in walk(value)
            if isinstance(n, ast.Name) and n.id not in mod.np_names
        }
        for name, value in _loads(fn):
            if _kwarg(value, "mask") is not None:
                continue
            index = {n.id for a in value.args[:1] for n in walk(a) if isinstance(n, ast.Name)}
            if not index & compared:
                continue
            consumers = _consumers(mod, fn, name)
            other = '-float("inf")' if consumers and consumers <= set(_MAX_LIKE) else "0.0"
            first = value.args[0]
            end = (first.end_lineno, first.end_col_offset)
            edits.append(_Edit(end, end, f", mask={mask}, other={other}"))
    return edits


def _bound_to(node: ast.Assign, name: str) -> bool:
    return (
        len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and (node.targets[0].id == name and isinstance(node.value, ast.Compare))
    )
