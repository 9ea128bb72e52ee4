"""Recipes for accumulators, carries and grid axes: init, reset, order, index maps."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from activities.fixers.playbook.registry import (
    _recipe,
)
from activities.fixers.playbook.source import (
    _accesses,
    _accumulators,
    _axes_cond,
    _bodies,
    _call_of,
    _combined_by,
    _dimension_semantics,
    _dotted,
    _Edit,
    _first_line,
    _fori_loops,
    _grid_params,
    _identity,
    _ignored_axes,
    _indent,
    _index_map,
    _inits,
    _is_call,
    _kernel_functions,
    _kwarg,
    _Module,
    _pallas_calls,
    _program_id_axis,
    _program_ids,
    _reads,
    _reduction_axes,
    _refs,
    _replace,
    _stores,
    _text,
    _when_cond,
    walk,
)
from nearmiss.engine.models import Evidence


@_recipe(
    "accumulator_init",
    ("nan_inf", "wrong_values"),
    "a ref carried across grid steps with no first-step init gets a @pl.when(... == 0) init",
)
def accumulator_init(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a body reads a ref before writing it (``o_ref[...] += ...``, a scratch carry)
    and no ``@pl.when(<program id> == 0)`` block initialises it. Fix: insert one at the top of the
    body, on the first step of the axes the ref accumulates over (those its output index_map
    ignores, else the innermost axis); the init is the identity of how the ref is combined
    (-inf for a running max, +inf for a min, else zeros)."""
    edits = []
    for body in _bodies(mod):
        call, inits = _call_of(mod, body), _inits(mod, body)
        initialised = {r for i in inits for r in i.refs}
        missing = [r for r in _accumulators(mod, body, inits) if r not in initialised]
        axes = {_reduction_axes(call, body, r) for r in missing}
        if not missing or None in axes or len(axes) != 1:
            continue
        refs = set(_refs(body))
        first = next(s for s in body.body if _reads(s, refs) or any(_stores(s, refs)))
        indent = _indent(mod.source, first)
        cond = _axes_cond(mod, axes.pop(), _program_ids(mod, body), first.lineno)
        lines = [f"@{mod.pl}.when({cond})", "def _init_accumulators():"]
        for ref in missing:
            lines.append(f"    {ref}[...] = {_identity(mod, ref, _combined_by(mod, body, ref))}")
        block = "".join(f"{indent}{line}\n" for line in lines) + "\n"
        edits.append(_Edit((_first_line(first), 0), (_first_line(first), 0), block))
    return edits


@_recipe(
    "reset_axis",
    ("wrong_values", "nan_inf"),
    "an accumulator's first-step init on the wrong grid axes → the axes it accumulates over",
)
def reset_axis(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``@pl.when(<program ids> == 0)`` initialises a carried ref, but its axes are not
    the ones the ref accumulates over (those its output index_map ignores, else the innermost
    axis), so it resets too often or too rarely. In a function the body hands its work to
    (JAX's flash attention dispatches to ``_flash_attention_kernel_single_batch``), where no
    index_map says which axes, they are the axes of the last-step block that writes the carry
    out (``@pl.when(kv_seq_idx == n_kv - 1)``): a carry is reset and written out along one
    axis. Fix: the condition names those axes."""
    edits = []
    for body in _kernel_functions(mod):
        call, inits = _call_of(mod, body), _inits(mod, body)
        carried = set(_accumulators(mod, body, inits))
        pids = _program_ids(mod, body)
        for init in inits:
            wanted = {_reduction_axes(call, body, r) for r in init.refs if r in carried}
            if call is None:
                wanted = _written_out_along(mod, body, carried & set(init.refs), pids)
            if len(wanted) != 1 or None in wanted:
                continue
            axes = frozenset(wanted.pop())
            if axes != init.axes:
                edits.append(_replace(init.cond, _axes_cond(mod, axes, pids, init.fn.lineno)))
    return edits


def _written_out_along(mod: _Module, body: ast.FunctionDef, carried: set[str], pids) -> set:
    """The grid axes of the ``@pl.when(<program id> == <its last step>)`` blocks that read the
    carried refs (to write them out): one frozenset of axes per such block."""
    found = set()
    for fn in walk(body):
        cond = _when_cond(mod, fn) if isinstance(fn, ast.FunctionDef) else None
        if not (isinstance(cond, ast.Compare) and len(cond.ops) == 1):
            continue
        last = cond.comparators[0]
        if not isinstance(cond.ops[0], ast.Eq) or isinstance(last, ast.Constant):
            continue  # a first step (== 0) is an init, not a write-out
        left = cond.left
        axis = pids[left.id][0] if isinstance(left, ast.Name) and left.id in pids else None
        if axis is None:
            axis = _program_id_axis(mod, left)
        if axis is not None and any(_reads(stmt, carried) for stmt in fn.body):
            found.add(frozenset({axis}))
    return found


@_recipe(
    "identity_init",
    ("wrong_values",),
    "a running max/min carry initialised to zeros → initialised to -inf/+inf",
)
def identity_init(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: an init block sets a ref to zeros, but the ref is combined with ``jnp.maximum``
    (``jnp.minimum``), so 0 clips the running extreme. Fix: initialise it to -inf (+inf)."""
    edits = []
    for body in _bodies(mod):
        for init in _inits(mod, body):
            for ref, stmt in _stores(init.fn, set(init.refs)):
                zeros = _is_call(stmt.value, mod.np_names, "zeros", "zeros_like")
                combine = _combined_by(mod, body, ref)
                if zeros and combine:
                    edits.append(_replace(stmt.value, _identity(mod, ref, combine)))
    return edits


@_recipe(
    "accumulate",
    ("wrong_values",),
    "an output zeroed on the first reduction step but overwritten every step → +=",
)
def accumulate(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: an output block revisited along a reduction axis (its index_map ignores that
    axis) — or a scratch accumulator beside such an output — is zeroed by a first-step init,
    yet every step stores ``acc[...] = partial`` without reading it. Fix: ``acc[...] +=
    partial``."""
    edits = []
    for body in _bodies(mod):
        call, inits = _call_of(mod, body), _inits(mod, body)
        if call is None or not call.out_specs:
            continue
        carried = set(_accumulators(mod, body, inits))
        n_in = call.body_inputs
        for init in inits:
            for ref in init.refs:
                position = _refs(body).index(ref) - n_in
                if ref in carried or position < 0:
                    continue
                # A scratch ref (after the outputs) is revisited with the first output's block.
                outputs = call.out_specs
                index_map = _index_map(outputs[position if position < len(outputs) else 0])
                if index_map is None or not _ignored_axes(index_map, call.scalar_prefetch):
                    continue
                for stmt in body.body:  # top level: runs on every step
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                        target = stmt.targets[0]
                        if isinstance(target, ast.Subscript) and _dotted(target.value) == ref:
                            value = _text(mod.source, stmt.value)
                            edits.append(_replace(stmt, f"{_text(mod.source, target)} += {value}"))
    return edits


@_recipe(
    "out_index_map_axis",
    ("nan_inf", "wrong_values"),
    "an output stored at every step of a grid axis its index_map ignores → the map uses the axis",
)
def out_index_map_axis(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: an output ref that is only ever stored (never read, never initialised), outside
    any ``pl.when``, while its index_map ignores one grid axis and returns a constant 0 in one
    position: every step of that axis overwrites the same block and the rest of the output is
    never written. Fix: the index_map returns that axis in the constant's place."""
    edits = []
    for call in _pallas_calls(mod):
        body = call.body
        if body is None:
            continue
        inits, refs, n_in = _inits(mod, body), _refs(body), call.body_inputs
        initialised = {r for i in inits for r in i.refs}
        whens = {f for f in walk(body) if isinstance(f, ast.FunctionDef) and _when_cond(mod, f)}
        for position, spec in enumerate(call.out_specs):
            index_map = _index_map(spec)
            if index_map is None or n_in + position >= len(refs):
                continue
            ref = refs[n_in + position]
            accesses = list(_accesses(body.body, {ref}, whens))
            if ref in initialised or not accesses or any(k == "read" for _, k in accesses):
                continue
            ignored = _ignored_axes(index_map, call.scalar_prefetch)
            returned = index_map.body.elts if isinstance(index_map.body, ast.Tuple) else []
            zeros = [e for e in returned if isinstance(e, ast.Constant) and e.value == 0]
            if len(ignored) == 1 and len(zeros) == 1:
                edits.append(_replace(zeros[0], index_map.args.args[ignored[0]].arg))
    return edits


@_recipe(
    "reduction_axis_last",
    ("wrong_values", "nan_inf", "grid_race"),
    "a reduction grid axis placed before parallel axes → moved innermost (grid, index maps, ids)",
)
def reduction_axis_last(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the output's index_map ignores a grid axis (a reduction) that comes before axes
    it uses, so output blocks — and scratch carried along the reduction — are revisited after
    other blocks clobbered them (on TPU, a block left and re-entered is not read again: a grid
    race). Fix: permute the grid so reduction axes are innermost: the grid entries, every
    index_map's parameters, the declared ``dimension_semantics`` and the body's
    ``pl.program_id(k)`` / ``pl.num_programs(k)`` axis numbers."""
    edits = []
    for call in _pallas_calls(mod):
        grid, body = call.grid, call.body
        index_map = _index_map(call.out_specs[0]) if call.out_specs else None
        if index_map is None or body is None or not isinstance(grid, ast.Tuple | ast.List):
            continue
        rank, reduction = len(grid.elts), _ignored_axes(index_map, call.scalar_prefetch)
        if not reduction or reduction == tuple(range(rank - len(reduction), rank)):
            continue
        order = [a for a in range(rank) if a not in reduction] + list(reduction)
        for new, old in enumerate(order):
            if new != old:
                edits.append(_replace(grid.elts[new], _text(mod.source, grid.elts[old])))
        semantics = _dimension_semantics(call)
        if semantics is not None and len(semantics.elts) == rank:
            edits += [
                _replace(semantics.elts[n], _text(mod.source, semantics.elts[o]))
                for n, o in enumerate(order)
                if n != o
            ]
        for spec in call.in_specs + call.out_specs:
            index_map = _index_map(spec)
            params = _grid_params(index_map, call.scalar_prefetch) if index_map else []
            if len(params) == rank:
                edits += [_replace(params[n], params[o].arg) for n, o in enumerate(order) if n != o]
        for node in walk(body):
            if _is_call(node, mod.pl_names, "program_id", "num_programs") and node.args:
                axis = node.args[0]
                known = isinstance(axis, ast.Constant) and axis.value in order
                if known and (moved := order.index(axis.value)) != axis.value:
                    edits.append(_replace(axis, str(moved)))
    return edits


_REDUCTIONS = ("sum", "max", "min", "mean", "var", "std", "prod", "argmax", "argmin")


@_recipe(
    "untiled_reduction_axis",
    ("wrong_values", "nan_inf"),
    "a reduction over a grid-tiled axis with no carry across steps → the block's untiled axis",
)
def untiled_reduction_axis(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a body with no state carried across grid steps reduces (sum, max, mean, ...) over
    an axis its input block tiles along the grid: the result sees one tile, never the whole
    extent. Fix: reduce over the block's single untiled axis (the one its index_map pins to 0)."""
    edits = []
    for call in _pallas_calls(mod):
        body = call.body
        spec = call.in_specs[0] if call.in_specs else None
        index_map = _index_map(spec)
        if body is None or index_map is None or _accumulators(mod, body, _inits(mod, body)):
            continue
        block = spec.args[0] if spec.args else None
        returned = index_map.body.elts if isinstance(index_map.body, ast.Tuple) else []
        if not isinstance(block, ast.Tuple) or len(returned) != len(block.elts):
            continue
        params = {a.arg for a in index_map.args.args}
        kept = [
            e
            for e, b in zip(returned, block.elts, strict=True)
            if not (isinstance(b, ast.Constant) and b.value is None)
        ]
        tiled = {d for d, e in enumerate(kept) if isinstance(e, ast.Name) and e.id in params}
        untiled = [d for d, e in enumerate(kept) if isinstance(e, ast.Constant) and e.value == 0]
        if len(untiled) != 1 or not tiled:
            continue
        rank, target = len(kept), untiled[0]
        text = "-1" if target == rank - 1 else str(target)
        for node in walk(body):
            if not _is_call(node, mod.np_names, *_REDUCTIONS):
                continue
            axis = _kwarg(node, "axis", 1)
            if isinstance(axis, ast.UnaryOp) and isinstance(axis.operand, ast.Constant):
                value = -axis.operand.value
            elif isinstance(axis, ast.Constant):
                value = axis.value
            else:
                continue
            if isinstance(value, int) and value % rank in tiled:
                edits.append(_replace(axis, text))
    return edits


def _tile_divisor(source: str, extent: ast.expr) -> str | None:
    """The block size a grid extent counts in: ``B`` of ``a // B`` or ``pl.cdiv(a, B)``."""
    if isinstance(extent, ast.BinOp) and isinstance(extent.op, ast.FloorDiv):
        return _text(source, extent.right)
    if isinstance(extent, ast.Call) and (_dotted(extent.func) or "").endswith("cdiv"):
        return _text(source, extent.args[1]) if len(extent.args) == 2 else None
    return None


def _block_shape(spec: ast.expr) -> list[ast.expr] | None:
    if not isinstance(spec, ast.Call):
        return None
    shape = _kwarg(spec, "block_shape", 0)
    return list(shape.elts) if isinstance(shape, ast.Tuple | ast.List) else None


@dataclass
class _Tiling:
    """One BlockSpec against its call's grid: what each block dim walks, and what it should."""

    returned: list[ast.expr]  # the index map's returned entries
    params: list[str]  # its grid-axis parameters
    block: list[str]  # the block shape's entries, as written
    divisors: list[str | None]  # per grid axis, the block size its extent counts in


def _tilings(mod: _Module) -> list[_Tiling]:
    found = []
    for call in _pallas_calls(mod):
        if not isinstance(call.grid, ast.Tuple | ast.List):
            continue
        divisors = [_tile_divisor(mod.source, e) for e in call.grid.elts]
        for spec in call.in_specs + call.out_specs:
            index_map, shape = _index_map(spec), _block_shape(spec)
            if index_map is None or shape is None or not isinstance(index_map.body, ast.Tuple):
                continue
            params = [a.arg for a in _grid_params(index_map, call.scalar_prefetch)]
            returned = index_map.body.elts
            if len(params) == len(divisors) and len(returned) == len(shape):
                block = [_text(mod.source, b) for b in shape]
                found.append(_Tiling(returned, params, block, divisors))
    return found


@_recipe(
    "index_map_order",
    ("wrong_values", "nan_inf"),
    "an index_map whose block indices walk grid axes tiled by another block size → reordered",
)
def index_map_order(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``grid=(m // bm, n // bn, k // bk)`` and y's ``BlockSpec((bk, bn), lambda i, j,
    k: (j, k))``: the block's first dim (``bk`` wide) walks axis ``j``, which counts ``bn``-wide
    tiles — the index map's entries are swapped. Each block dim should walk the grid axis whose
    extent is counted in that dim's block size. Fix: when the entries that disagree are a
    permutation of each other that makes them all agree, that permutation."""
    edits = []
    for t in _tilings(mod):
        axis_of = {
            i: t.params.index(e.id)
            for i, e in enumerate(t.returned)
            if isinstance(e, ast.Name) and e.id in t.params and t.divisors[t.params.index(e.id)]
        }
        wrong = [i for i, axis in axis_of.items() if t.divisors[axis] != t.block[i]]
        if len(wrong) < 2:
            continue
        # Each wrong position takes the one wrong entry whose axis counts its block size.
        fits = {i: [j for j in wrong if t.divisors[axis_of[j]] == t.block[i]] for i in wrong}
        chosen = {i: f[0] for i, f in fits.items() if len(f) == 1}
        if len(chosen) == len(wrong) and sorted(chosen.values()) == sorted(wrong):
            edits += [_replace(t.returned[i], t.returned[j].id) for i, j in chosen.items()]
    return edits


@_recipe(
    "index_map_missing_axis",
    ("wrong_values", "nan_inf"),
    "an index_map pinning to 0 a block dim that an unused grid axis tiles → that axis",
)
def index_map_missing_axis(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``grid=(pl.cdiv(cols, BC), pl.cdiv(rows, BR))`` and ``BlockSpec((BR, BC),
    lambda j, i: (i, 0))``: the map ignores grid axis ``j``, which counts ``BC``-wide tiles, and
    returns 0 for the block dim ``BC`` wide — every step of ``j`` reads column block 0. Fix:
    that dim walks ``j``. Only where exactly one unused axis counts in that block size."""
    edits = []
    for t in _tilings(mod):
        used = {n.id for e in t.returned for n in walk(e) if isinstance(n, ast.Name)}
        unused = [a for a, name in enumerate(t.params) if name not in used and t.divisors[a]]
        for i, entry in enumerate(t.returned):
            if not (isinstance(entry, ast.Constant) and entry.value == 0):
                continue
            axes = [a for a in unused if t.divisors[a] == t.block[i]]
            if len(axes) == 1 and t.params[axes[0]] != "_":
                edits.append(_replace(entry, t.params[axes[0]]))
    return edits


def _carry_combine(mod: _Module, loop) -> str | None:
    """How a ``fori_loop`` step combines its (single) carry: "sum" for ``return acc + x``,
    "maximum"/"minimum" for ``return jnp.maximum(acc, x)``; None otherwise."""
    params = loop.step.args.args if loop.step else []
    if len(params) != 2 or len(loop.returned) != 1:
        return None
    acc, value = params[1].arg, loop.returned[0]

    def is_acc(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == acc

    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return "sum" if is_acc(value.left) or is_acc(value.right) else None
    if _is_call(value, mod.np_names, "maximum", "minimum") and any(map(is_acc, value.args)):
        return value.func.attr
    return None


@_recipe(
    "loop_carry_identity",
    ("wrong_values", "nan_inf"),
    "a fori_loop carry started at ones (a sum) or zeros (a max) → the combine's identity",
)
def loop_carry_identity(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``lax.fori_loop(0, n, body, init_val=jnp.ones(block))`` whose step returns
    ``acc + x``: every lane starts one too high, so the sum is off by the block's width (a
    running max started at zeros clips negative values the same way). Fix: the carry starts at
    the identity of how the step combines it (zeros for a sum, -inf/+inf for a max/min)."""
    edits = []
    for fn in _kernel_functions(mod):
        for loop in _fori_loops(fn):
            init = loop.init
            combine = _carry_combine(mod, loop)
            if combine is None or not _is_call(init, mod.np_names, "ones", "zeros", "full"):
                continue
            shape = _text(mod.source, init.args[0]) if init.args else None
            kind = init.func.attr
            if shape is None:
                continue
            fill = init.args[1] if kind == "full" and len(init.args) > 1 else None
            if isinstance(fill, ast.Constant) and fill.value == 0:
                kind = "zeros"
            if combine == "sum" and kind in ("ones", "full"):
                edits.append(_replace(init, f"{mod.np}.zeros({shape})"))
            elif combine in ("maximum", "minimum") and kind in ("zeros", "ones"):
                sign = "-" if combine == "maximum" else ""
                edits.append(_replace(init, f"{mod.np}.full({shape}, {sign}{mod.np}.inf)"))
    return edits
