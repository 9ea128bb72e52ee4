"""Recipes for values: masks and ragged tails, precision, normalisation, stable formulas."""

from __future__ import annotations

import ast
import re

from activities.fixers.playbook.registry import (
    _recipe,
)
from activities.fixers.playbook.source import (
    LOW_FLOATS,
    _atom,
    _bare,
    _bodies,
    _dotted,
    _Edit,
    _fori_loops,
    _indent,
    _index_map,
    _is_call,
    _is_position_call,
    _kernel_functions,
    _kwarg,
    _Module,
    _pallas_calls,
    _PallasCall,
    _position_dim,
    _positions,
    _reads,
    _refs,
    _replace,
    _resolve,
    _rounds_up,
    _stores,
    _text,
    _uncast,
    _values_of,
    walk,
)
from nearmiss.engine.models import Evidence


def _iota_dims(mod: _Module, body: ast.FunctionDef) -> dict[str, int]:
    """Names computed from ``broadcasted_iota(dtype, shape, dim)``: name → dim."""
    dims = {}
    for node in walk(body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            for sub in walk(node.value):
                is_iota = isinstance(sub, ast.Call) and _dotted(sub.func) in (
                    "jax.lax.broadcasted_iota",
                    "lax.broadcasted_iota",
                )
                if is_iota and isinstance(target, ast.Name) and len(sub.args) >= 3:
                    dim = sub.args[2]
                    if isinstance(dim, ast.Constant) and isinstance(dim.value, int):
                        dims[target.id] = dim.value
    return dims


def _is_mask_value(mod: _Module, node: ast.expr) -> bool:
    """-inf, a large negative constant, a constant or parameter named like a mask value
    (``DEFAULT_MASK_VALUE``, ``mask_value``), or a fraction of a dtype's lowest value
    (``0.7 * jnp.finfo(x.dtype).min``)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = node.operand
        return (isinstance(inner, ast.Attribute) and inner.attr == "inf") or (
            isinstance(inner, ast.Constant) and isinstance(inner.value, int | float)
        )
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value <= -1e9
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return any(_is_mask_value(mod, side) for side in (node.left, node.right))
    if isinstance(node, ast.Attribute) and node.attr == "min":
        return isinstance(node.value, ast.Call) and _dotted(node.value.func) in {
            f"{n}.finfo" for n in mod.np_names
        }
    return isinstance(node, ast.Name) and bool(
        re.search(r"MASK|NEG|INF", node.id) or re.search(r"mask_val", node.id, re.IGNORECASE)
    )


def _keep_masks(mod: _Module, fn: ast.AST) -> list[ast.expr]:
    """Conditions that keep elements where they hold: ``jnp.where(keep, s, mask_value)``, the
    additive ``s + jnp.where(keep, 0.0, mask_value)``, ``s += (~keep) * mask_value`` and the
    ``mask=`` of a masked load or store (``plgpu.load(ref.at[idx], mask=keep, other=0.)``)."""
    found = []
    for node in walk(fn):
        called = (_dotted(node.func) or "").split(".")[-1] if isinstance(node, ast.Call) else ""
        if called in ("load", "store") and (keep := _kwarg(node, "mask")) is not None:
            found.append(keep)
        elif _is_call(node, mod.np_names, "where") and len(node.args) == 3:
            if _is_mask_value(mod, node.args[2]):
                found.append(node.args[0])
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for dropped, value in ((node.left, node.right), (node.right, node.left)):
                inverted = isinstance(dropped, ast.UnaryOp) and isinstance(dropped.op, ast.Invert)
                if inverted and _is_mask_value(mod, value):
                    found.append(dropped.operand)
    return found


def _mask_comparisons(mod: _Module, fn: ast.AST) -> list[ast.Compare]:
    """Single comparisons a keep-mask is built from, directly or through the names it is
    assigned from (``causal_mask = col_ids <= row_ids``, ``mask = jnp.logical_and(mask,
    causal_mask)``, ``jnp.where(mask, ...)``)."""
    found: list[ast.Compare] = []
    for cond in _keep_masks(mod, fn):
        for value in _values_of(fn, cond):
            for cmp in walk(value):
                if isinstance(cmp, ast.Compare) and len(cmp.ops) == 1 and cmp not in found:
                    found.append(cmp)
    return found


@_recipe(
    "causal_diagonal",
    ("nan_inf", "wrong_values"),
    "a causal mask keeping col < row (dropping the diagonal) → col <= row",
)
def causal_diagonal(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a keep-mask ``col < row`` (or ``row > col``) applied with a mask value —
    ``jnp.where(col < row, s, -inf)``, or assigned first and applied later
    (``jnp.where(mask, s, mask_value)``, additively ``s + jnp.where(mask, 0.0, mask_value)``) —
    where ``col``/``row`` are positions along the last/first axis (``broadcasted_iota`` along
    that axis, or an ``arange`` broadcast as ``[None, :]``/``[:, None]``): each query loses its
    own key (the first query sees none). Fix: ``col <= row`` (``row > col`` → ``row >= col``)."""
    edits = []
    for fn in _kernel_functions(mod):
        positions = _positions(fn)
        for cmp in _mask_comparisons(mod, fn):
            left, right = cmp.left, cmp.comparators[0]
            dl = _position_dim(fn, left, positions)
            dr = _position_dim(fn, right, positions)
            lhs, rhs = _text(mod.source, left), _text(mod.source, right)
            if isinstance(cmp.ops[0], ast.Lt) and dl in (1, -1) and dr in (0, -2):
                edits.append(_replace(cmp, f"{lhs} <= {rhs}"))
            if isinstance(cmp.ops[0], ast.Gt) and dl in (0, -2) and dr in (1, -1):
                edits.append(_replace(cmp, f"{lhs} >= {rhs}"))
    return edits


_LENGTH = re.compile(r"(len|length|size|count|extent|limit)s?$|^(n|num)_", re.IGNORECASE)


def _is_position(node: ast.expr, positions: dict[str, ast.Call]) -> bool:
    return any(
        (isinstance(n, ast.Name) and n.id in positions) or _is_position_call(n) for n in walk(node)
    )


def _is_length(node: ast.expr, positions: dict[str, ast.Call]) -> bool:
    """A name like a length (``kv_seq_len``), or a read of a ref of lengths (``lengths_ref[b]``)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        node = ast.Name(node.value.id.removesuffix("_ref"))
    return (
        isinstance(node, ast.Name)
        and node.id not in positions
        and _LENGTH.search(node.id) is not None
    )


@_recipe(
    "mask_bound",
    ("wrong_values", "boundary"),
    "a keep-mask position <= length (lets the first padding element in) → position < length",
)
def mask_bound(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a keep-mask compares element positions (``arange``/``broadcasted_iota``, through
    names) with a length (a name like ``kv_seq_len``, ``n_valid``, ``num_rows``) as ``pos <=
    length`` (``length >= pos``): lengths count elements, so position ``length`` is the first
    one past the end and the mask lets it in. Fix: ``pos < length`` (``length > pos``)."""
    edits = []
    for fn in _kernel_functions(mod):
        positions = _positions(fn)

        for cmp in _mask_comparisons(mod, fn):
            left, right = cmp.left, cmp.comparators[0]
            lhs, rhs = _text(mod.source, left), _text(mod.source, right)
            if (
                isinstance(cmp.ops[0], ast.LtE)
                and _is_position(left, positions)
                and _is_length(right, positions)
            ):
                edits.append(_replace(cmp, f"{lhs} < {rhs}"))
            if (
                isinstance(cmp.ops[0], ast.GtE)
                and _is_length(left, positions)
                and _is_position(right, positions)
            ):
                edits.append(_replace(cmp, f"{lhs} > {rhs}"))
    return edits


def _is_low(mod: _Module, node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in LOW_FLOATS
        and (_dotted(node.value) in mod.np_names)
    )


@_recipe(
    "f32_accumulation",
    ("precision",),
    "low-precision accumulators (bf16/f16 scratch, casts of running sums, dots without "
    "preferred_element_type) → float32",
)
def f32_accumulation(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: state carried across steps or taps in bfloat16/float16 — a scratch declared in a
    low dtype (directly or through the local names it is built from, such as an ``acc_dtype``
    variable), ``.astype(jnp.bfloat16)`` on a running value, a local accumulator created in a
    ref's dtype and then ``+=``-ed — or a ``jnp.dot`` without ``preferred_element_type``. Fix:
    float32 for each (stores into output refs keep their own cast)."""
    f32, edits = f"{mod.np}.float32", []
    for call in _pallas_calls(mod):
        # The scratch as written, and the values of the names it is built from
        # (``scratch_shapes=scratch_shapes``, ``pltpu.VMEM((l, r), acc_dtype)``).
        scratch = call.scratch
        for value in _values_of(call.scope, scratch) if scratch is not None else []:
            for node in walk(value):
                if _is_low(mod, node):
                    edits.append(_replace(node, f32))
    for body in _bodies(mod):
        refs = set(_refs(body))
        stored = {id(s.value) for _, s in _stores(body, refs)}
        accumulated = {
            n.target.id
            for n in walk(body)
            if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)
        }
        for node in walk(body):
            if _is_call(node, mod.np_names, "dot", "matmul") or (
                isinstance(node, ast.Call) and _dotted(node.func) in ("jax.lax.dot_general",)
            ):
                arguments = [*node.args, *node.keywords]
                if _kwarg(node, "preferred_element_type") is None and arguments:
                    last = max(arguments, key=lambda a: (a.end_lineno, a.end_col_offset))
                    end = (last.end_lineno, last.end_col_offset)
                    edits.append(_Edit(end, end, f", preferred_element_type={f32}"))
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "astype"
                and node.args
                and _is_low(mod, node.args[0])
                and id(node) not in stored
            ):
                edits.append(_replace(node.args[0], f32))
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                if not (isinstance(target, ast.Name) and target.id in accumulated):
                    continue
                if _is_call(value, mod.np_names, "zeros", "full", "empty"):
                    position = 2 if value.func.attr == "full" else 1
                    dtype = _kwarg(value, "dtype", position)
                    if dtype is not None and (
                        _is_low(mod, dtype)
                        or (isinstance(dtype, ast.Attribute) and dtype.attr == "dtype")
                    ):
                        edits.append(_replace(dtype, f32))
    return edits


def _enclosing_parens(source: str, node: ast.AST) -> _Edit:
    """The node's span, widened to the parentheses right around it when there are some."""
    line = source.splitlines()[node.lineno - 1].encode()
    end_line = source.splitlines()[node.end_lineno - 1].encode()
    before = line[: node.col_offset].rstrip()
    after = end_line[node.end_col_offset :].lstrip()
    if before.endswith(b"(") and after.startswith(b")") and node.lineno == node.end_lineno:
        start = len(before) - 1
        end = node.end_col_offset + (len(end_line[node.end_col_offset :]) - len(after)) + 1
        return _Edit((node.lineno, start), (node.end_lineno, end), "")
    return _replace(node, "")


def _sum_of_squares(mod: _Module, node: ast.AST) -> bool:
    if not (_is_call(node, mod.np_names, "sum") and node.args):
        return False
    arg = node.args[0]
    return _squared(arg) or _is_call(arg, mod.np_names, "square")


@_recipe(
    "population_variance",
    ("wrong_values",),
    "a sum of squared deviations divided by (n - 1), outputs off by a constant factor → / n",
)
def population_variance(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the evidence reports outputs off by a constant factor, and a body divides a sum of
    squares by ``(n - 1)`` (Bessel's correction, the sample variance) where the population
    variance (``jnp.var``'s default) divides by ``n``. Fix: ``/ n``."""
    if "constant factor" not in evidence.diagnosis:
        return []
    edits = []
    for body in _kernel_functions(mod):
        for node in walk(body):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                divided, right = node.left, node.right
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
                divided, right = node.target, node.value  # var /= n - 1
            else:
                continue
            minus_one = (
                isinstance(right, ast.BinOp)
                and isinstance(right.op, ast.Sub)
                and _is_one(right.right)
            )
            if minus_one and _squares_summed(mod, body, divided):
                span = _enclosing_parens(mod.source, right)
                edits.append(_Edit(span.start, span.end, _text(mod.source, right.left)))
    return edits


def _squared(node: ast.AST) -> bool:
    """``a * a``, ``a ** 2``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return ast.dump(node.left) == ast.dump(node.right)
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Pow)
        and isinstance(node.right, ast.Constant)
        and node.right.value == 2
    )


def _squares_summed(mod: _Module, fn: ast.FunctionDef, node: ast.expr) -> bool:
    """A sum of squares: ``jnp.sum(d * d)``, or a name bound to one — also through a loop whose
    body returns ``acc + d * d`` (``var = lax.fori_loop(0, n, var_body, zeros).sum()``)."""
    if _sum_of_squares(mod, node):
        return True
    if not isinstance(node, ast.Name):
        return False
    for value in _values_of(fn, node):
        if _sum_of_squares(mod, value):
            return True
        for loop in _fori_loops(fn, value):
            if any(_squared(n) for r in loop.returned for n in walk(r)):
                return True
    return False


def _masks(mod: _Module, body: ast.FunctionDef) -> dict[str, tuple[int, str]]:
    """Validity masks ``valid = col < n`` (``col`` from broadcasted_iota along ``dim``, ``n`` a
    keyword the body receives): mask name → (dim, extent name)."""
    dims, extents = _iota_dims(mod, body), {a.arg for a in body.args.kwonlyargs}
    found = {}
    for node in walk(body):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, cmp = node.targets[0], node.value
            if not (isinstance(target, ast.Name) and isinstance(cmp, ast.Compare)):
                continue
            left, right = cmp.left, cmp.comparators[0]
            if (
                len(cmp.ops) == 1
                and isinstance(cmp.ops[0], ast.Lt)
                and isinstance(left, ast.Name)
                and left.id in dims
                and isinstance(right, ast.Name)
                and right.id in extents
            ):
                found[target.id] = (dims[left.id], right.id)
    return found


@_recipe(
    "masked_mean",
    ("wrong_values",),
    "jnp.mean over a zero-padded, masked axis, or a masked sum / the padded width → / the extent",
)
def masked_mean(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the body masks a padded axis (``valid = col < n``, ``x = jnp.where(valid, x,
    0)``) and then takes ``jnp.mean`` of the masked values along that axis, dividing by the
    padded width; or it builds positions from ``arange(width)``, keeps ``pos < n`` and divides a
    sum by ``width`` (``var /= block_size``). Fix: ``jnp.sum(..., same axis) / n``; ``/ n``."""
    edits = []
    for body in _bodies(mod):
        masks = _masks(mod, body)
        if not masks:
            continue
        padded: dict[str, list[tuple[int, int, str]]] = {}  # name → [(line, dim, extent)]
        for node in walk(body):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and _is_call(value, mod.np_names, "where"):
                used = [n.id for n in walk(value.args[0]) if isinstance(n, ast.Name)]
                for name in used:
                    if name in masks:
                        padded.setdefault(target.id, []).append((node.lineno, *masks[name]))
        for node in walk(body):
            if not _is_call(node, mod.np_names, "mean") or not node.args:
                continue
            axis = _kwarg(node, "axis", 1)
            names = [n.id for n in walk(node.args[0]) if isinstance(n, ast.Name)]
            bindings = [
                max((b for b in padded.get(n, []) if b[0] < node.lineno), default=None)
                for n in names
            ]
            if not names or None in bindings or len({(b[1], b[2]) for b in bindings}) != 1:
                continue
            dim, extent = bindings[0][1], bindings[0][2]
            axis_value = _text(mod.source, axis) if axis is not None else None
            if axis_value not in (str(dim), "-1" if dim > 0 else None):
                continue
            total = _text(mod.source, node).replace(f"{_text(mod.source, node.func)}(", "", 1)
            new = f"{mod.np}.sum({total} / {extent}"
            edits.append(_replace(node, _bare(mod.source, node, new)))
    return edits + _padded_divisors(mod)


def _padded_divisors(mod: _Module) -> list[_Edit]:
    """Divisions by a padded width where a mask says the true extent: the body builds positions
    from ``arange(width)`` (``col_idx = i * block_size + jnp.arange(block_size)``), keeps
    ``col_idx < n_col``, and then divides by ``width`` (``var /= block_size``): the mean of the
    masked values over the padded width. The divisor becomes the extent."""
    edits = []
    for fn in _kernel_functions(mod):
        positions = _positions(fn)
        extents: dict[str, set[str]] = {}  # padded width → the extents masks compare with
        for cmp in walk(fn):
            if not (isinstance(cmp, ast.Compare) and len(cmp.ops) == 1):
                continue
            left, right = cmp.left, cmp.comparators[0]
            if not (isinstance(cmp.ops[0], ast.Lt) and isinstance(left, ast.Name)):
                continue
            call = positions.get(left.id)
            if call is None or not isinstance(right, ast.Name) or right.id in positions:
                continue
            if _dotted(call.func).split(".")[-1] == "arange" and len(call.args) == 1:
                width = call.args[0]
                if isinstance(width, ast.Name) and width.id != right.id:
                    extents.setdefault(width.id, set()).add(right.id)
        for node in walk(fn):
            if isinstance(node, ast.AugAssign | ast.BinOp) and isinstance(node.op, ast.Div):
                divisor = node.value if isinstance(node, ast.AugAssign) else node.right
                if isinstance(divisor, ast.Name) and len(extents.get(divisor.id, ())) == 1:
                    edits.append(_replace(divisor, next(iter(extents[divisor.id]))))
    return edits


def _is_floor_div(node: ast.AST) -> bool:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv)


@_recipe(
    "ceil_div_grid",
    ("boundary", "nan_inf"),
    "a grid extent a // B (drops the partial tail block) → pl.cdiv(a, B)",
)
def ceil_div_grid(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a ``grid=`` entry ``a // B``: a ragged size leaves its last, partial block
    uncomputed. Fix: ``pl.cdiv(a, B)``. (Reads past the edge are not masked by this recipe: it
    cannot tell in general which padding a body must neutralise.)"""
    edits = []
    for call in _pallas_calls(mod):
        grid = call.grid
        entries = grid.elts if isinstance(grid, ast.Tuple | ast.List) else [grid]
        for entry in entries:
            if not _is_floor_div(entry):
                continue
            if _rounds_up(mod.source, entry):
                continue
            numerator, denominator = (_text(mod.source, s) for s in (entry.left, entry.right))
            edits.append(_replace(entry, f"{mod.pl}.cdiv({numerator}, {denominator})"))
    return edits


def _shape_of(node: ast.AST) -> str | None:
    """``x`` for ``x.shape``."""
    is_shape = isinstance(node, ast.Attribute) and node.attr == "shape"
    return node.value.id if is_shape and isinstance(node.value, ast.Name) else None


def _extents(scope: ast.AST) -> dict[str, tuple[str, int]]:
    """Names bound to an array's extent in ``scope``: ``rows, cols = x.shape`` or
    ``n = x.shape[0]`` → name → (array name, dim)."""
    found = {}
    for node in walk(scope):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Tuple) and (array := _shape_of(value)):
            for dim, name in enumerate(target.elts):
                if isinstance(name, ast.Name):
                    found[name.id] = (array, dim)
        elif isinstance(target, ast.Name) and isinstance(value, ast.Subscript):
            index = value.slice
            if (array := _shape_of(value.value)) and isinstance(index, ast.Constant):
                found[target.id] = (array, index.value)
    return found


def _bound_keywords(call: _PallasCall) -> dict[str, ast.expr]:
    """Keyword arguments bound to the body by ``functools.partial(body, name=value)``."""
    kernel = _resolve(call.scope, call.node.args[0] if call.node.args else None)
    return {k.arg: k.value for k in getattr(kernel, "keywords", []) if k.arg}


def _operands(call: _PallasCall) -> list[ast.expr]:
    for node in walk(call.scope):
        if isinstance(node, ast.Call) and node.func is call.node:
            return node.args
    return []


@_recipe(
    "mask_tail",
    ("boundary", "nan_inf"),
    "an input block read unmasked though the body gets the true extent → zero past the extent",
)
def mask_tail(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the body receives an input's true extent as a keyword (``partial(body,
    rows=rows)`` with ``rows, cols = x.shape``) but never compares anything with it, and reads
    the input's block whole (``x = x_ref[...]``): the padding of the last, partial block enters
    the computation. Fix: right after the read, zero the positions at or past the extent along
    each such dim (``jnp.where(index < extent, x, 0)``), the neutral value of a sum."""
    if mod.lax is None:
        return []
    edits = []
    for call in _pallas_calls(mod):
        body, operands = call.body, _operands(call)
        if body is None:
            continue
        extents, refs = _extents(call.scope), _refs(body)
        compared = {
            n.id
            for c in walk(body)
            if isinstance(c, ast.Compare)
            for n in walk(c)
            if isinstance(n, ast.Name)
        }
        by_input: dict[int, list[tuple[int, str]]] = {}
        for param, value in _bound_keywords(call).items():
            if param in compared or not isinstance(value, ast.Name) or value.id not in extents:
                continue
            array, dim = extents[value.id]
            for k, operand in enumerate(operands[call.scalar_prefetch : call.body_inputs]):
                if isinstance(operand, ast.Name) and operand.id == array:
                    by_input.setdefault(k, []).append((dim, param))
        for k, dims in by_input.items():
            at = call.scalar_prefetch + k
            spec, ref = call.in_specs[k], refs[at] if at < len(refs) else None
            index_map = _index_map(spec)
            block = spec.args[0] if isinstance(spec, ast.Call) and spec.args else None
            if index_map is None or not isinstance(block, ast.Tuple) or ref is None:
                continue
            returned = index_map.body.elts if isinstance(index_map.body, ast.Tuple) else []
            axes = {a.arg: i for i, a in enumerate(index_map.args.args)}
            read = next(
                (
                    s
                    for s in body.body
                    if isinstance(s, ast.Assign)
                    and len(s.targets) == 1
                    and isinstance(s.targets[0], ast.Name)
                    and ref in _reads(s.value, {ref})
                ),
                None,
            )
            if read is None or len(returned) != len(block.elts):
                continue
            name, indent, lines, terms = read.targets[0].id, _indent(mod.source, read), [], []
            for dim, param in sorted(dims):
                size, step = block.elts[dim], returned[dim]
                if not (isinstance(step, ast.Name) and step.id in axes):
                    continue
                squeezed = sum(
                    1 for e in block.elts[:dim] if isinstance(e, ast.Constant) and e.value is None
                )
                lines.append(
                    f"{param}_index = {mod.pl}.program_id({axes[step.id]}) * "
                    f"{_text(mod.source, size)} + {mod.lax}.broadcasted_iota({mod.np}.int32, "
                    f"{name}.shape, {dim - squeezed})"
                )
                terms.append(f"{param}_index < {param}")
            if not terms:
                continue
            cond = terms[0] if len(terms) == 1 else " & ".join(f"({t})" for t in terms)
            lines.append(f"{name} = {mod.np}.where({cond}, {name}, 0)")
            text = "".join(f"{indent}{line}\n" for line in lines)
            edits.append(_Edit((read.end_lineno + 1, 0), (read.end_lineno + 1, 0), text))
    return edits


def _statement_of(body: ast.FunctionDef, node: ast.AST) -> tuple[list[ast.stmt], int] | None:
    """The statement list holding ``node`` and the index of the statement in it."""
    for holder in walk(body):
        for field in ("body", "orelse"):
            stmts = getattr(holder, field, None)
            if not isinstance(stmts, list):
                continue
            for index, stmt in enumerate(stmts):
                simple = not isinstance(stmt, ast.FunctionDef | ast.If)
                if simple and any(sub is node for sub in walk(stmt)):
                    return stmts, index
    return None


def _assigns(stmt: ast.stmt, name: str) -> bool:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    return any(isinstance(n, ast.Name) and n.id == name for t in targets for n in walk(t))


def _sum_of(mod: _Module, body: ast.FunctionDef, exp: ast.Call):
    """The ``jnp.sum`` that adds up ``exp``'s values — directly, or through the name ``exp`` is
    assigned to — with the statements that follow; None when nothing sums them."""
    for node in walk(body):
        if _is_call(node, mod.np_names, "sum") and node.args and node.args[0] is exp:
            return node
    located = _statement_of(body, exp)
    if located is None:
        return None
    stmts, index = located
    stmt = stmts[index]
    if not (isinstance(stmt, ast.Assign) and stmt.value is exp and len(stmt.targets) == 1):
        return None
    if not isinstance(name := stmt.targets[0], ast.Name):
        return None
    for later in stmts[index + 1 :]:
        for node in walk(later):
            summed = _is_call(node, mod.np_names, "sum") and node.args
            if summed and any(
                isinstance(n, ast.Name) and n.id == name.id for n in walk(node.args[0])
            ):
                return node
        if _assigns(later, name.id):
            return None
    return None


def _log_of(mod: _Module, body: ast.FunctionDef, total: ast.Call, arg_name: str | None):
    """The ``jnp.log`` of a sum (directly or through its name) in a logsumexp-like formula."""
    for node in walk(body):
        if _is_call(node, mod.np_names, "log") and node.args and node.args[0] is total:
            return node
    located = _statement_of(body, total)
    if located is None or arg_name is None:
        return None
    stmts, index = located
    stmt = stmts[index]
    if not (isinstance(stmt, ast.Assign) and stmt.value is total and len(stmt.targets) == 1):
        return None
    if not isinstance(name := stmt.targets[0], ast.Name):
        return None
    for later in stmts[index + 1 :]:
        for node in walk(later):
            logged = _is_call(node, mod.np_names, "log") and node.args
            if logged and isinstance(node.args[0], ast.Name) and node.args[0].id == name.id:
                return node
        if _assigns(later, name.id) or _assigns(later, arg_name):
            return None
    return None


def _shifted(mod: _Module, body: ast.FunctionDef, arg: ast.expr, line: int) -> bool:
    """Whether an exp's argument already subtracts something (``s - m``), itself or through the
    name's last binding before the exp."""
    if isinstance(arg, ast.Name):
        bindings = [
            n.value
            for n in walk(body)
            if isinstance(n, ast.Assign) and n.lineno < line and _assigns(n, arg.id)
        ]
        arg = max(bindings, key=lambda v: v.lineno, default=arg)
    arg = _uncast(arg)  # a cast keeps the shift: (s - m).astype(jnp.float32)
    return isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Sub)


def _summed_then_logged(mod: _Module, body: ast.FunctionDef, total: ast.Call) -> bool:
    """Whether the name a sum is assigned to is logged later (a logsumexp)."""
    located = _statement_of(body, total)
    if located is None:
        return False
    stmts, index = located
    stmt = stmts[index]
    names = {t.id for t in getattr(stmt, "targets", []) if isinstance(t, ast.Name)}
    return any(
        _is_call(n, mod.np_names, "log")
        and any(isinstance(a, ast.Name) and a.id in names for a in n.args)
        for later in stmts[index + 1 :]
        for n in walk(later)
    )


@_recipe(
    "max_subtraction",
    ("unstable", "nan_inf"),
    "exp of raw logits in a softmax/logsumexp → exp(x - max(x)), adding the max back to a log",
)
def max_subtraction(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``jnp.exp(x)`` of an unshifted value whose result is summed (softmax, logsumexp):
    large inputs overflow to inf and inf/inf = NaN. Fix: ``jnp.exp(x - jnp.max(x, axis,
    keepdims=True))`` over the sum's axis; where the sum is then logged, the max is added back:
    ``m + jnp.log(s)``."""
    edits = []
    for body in _bodies(mod):
        for exp in walk(body):
            if not _is_call(exp, mod.np_names, "exp") or len(exp.args) != 1:
                continue
            arg = exp.args[0]
            if _shifted(mod, body, arg, exp.lineno):
                continue
            total = _sum_of(mod, body, exp)
            if total is None:
                continue
            axis = _kwarg(total, "axis", 1)
            axis_text = f", axis={_text(mod.source, axis)}" if axis is not None else ""
            log = _log_of(mod, body, total, arg.id if isinstance(arg, ast.Name) else None)
            if log is None and _summed_then_logged(mod, body, total):
                continue  # a logsumexp whose log cannot be adjusted: leave it alone
            x = _atom(mod.source, arg)
            edits.append(_replace(arg, f"{x} - {mod.np}.max({x}{axis_text}, keepdims=True)"))
            if log is not None:  # logsumexp: log(sum(exp(x - m))) + m
                keepdims = _kwarg(total, "keepdims")
                keep = f", keepdims={_text(mod.source, keepdims)}" if keepdims is not None else ""
                start = (log.lineno, log.col_offset)
                end = (log.end_lineno, log.end_col_offset)
                edits.append(_Edit(start, start, f"({mod.np}.max({x}{axis_text}{keep}) + "))
                edits.append(_Edit(end, end, ")"))
    return edits


def _exp_arg(mod: _Module, node: ast.AST) -> ast.expr | None:
    if _is_call(node, mod.np_names, "exp") and len(node.args) == 1:
        return node.args[0]
    return None


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == 1


@_recipe(
    "stable_softplus",
    ("unstable", "nan_inf"),
    "log(1 + exp(x)) / log1p(exp(x)) → max(x, 0) + log1p(exp(-|x|))",
)
def stable_softplus(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: softplus written ``jnp.log(1 + jnp.exp(x))`` or ``jnp.log1p(jnp.exp(x))``: exp
    overflows for large x. Fix: ``jnp.maximum(x, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(x)))``."""
    np_, edits = mod.np, []
    for node in walk(mod.tree):
        x = None
        if _is_call(node, mod.np_names, "log1p") and len(node.args) == 1:
            x = _exp_arg(mod, node.args[0])
        elif _is_call(node, mod.np_names, "log") and len(node.args) == 1:
            inner = node.args[0]
            if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Add):
                if _is_one(inner.left):
                    x = _exp_arg(mod, inner.right)
                elif _is_one(inner.right):
                    x = _exp_arg(mod, inner.left)
        negative = isinstance(x, ast.UnaryOp) and _is_call(x.operand, mod.np_names, "abs")
        if x is not None and not negative:  # exp(-|x|) is already the stable form
            t = _text(mod.source, x)
            stable = f"{np_}.maximum({t}, 0.0) + {np_}.log1p({np_}.exp(-{np_}.abs({t})))"
            edits.append(_replace(node, _bare(mod.source, node, stable)))
    return edits


def _doubled(mod: _Module, exp_arg: ast.expr) -> ast.expr | None:
    """z when the argument is ``2 * z`` (or ``z * 2``)."""
    if isinstance(exp_arg, ast.BinOp) and isinstance(exp_arg.op, ast.Mult):
        for two, z in ((exp_arg.left, exp_arg.right), (exp_arg.right, exp_arg.left)):
            if isinstance(two, ast.Constant) and two.value == 2:
                return z
    return None


@_recipe(
    "stable_tanh",
    ("unstable", "nan_inf"),
    "hand-written tanh (e - 1) / (e + 1) with e = exp(2z) → jnp.tanh(z)",
)
def stable_tanh(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``(e - 1) / (e + 1)`` (optionally ``c * (e - 1) / (e + 1)``) where ``e`` is
    ``jnp.exp(2 * z)``: inf / inf = NaN for large z. Fix: ``jnp.tanh(z)`` (``c * jnp.tanh(z)``)."""
    edits = []
    for scope in _bodies(mod) or [mod.tree]:
        exps = {}
        for node in walk(scope):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                arg = _exp_arg(mod, node.value)
                z = _doubled(mod, arg) if arg is not None else None
                if isinstance(target, ast.Name) and z is not None:
                    exps[target.id] = z
        for node in walk(scope):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
                continue
            numerator, factor = node.left, None
            if isinstance(numerator, ast.BinOp) and isinstance(numerator.op, ast.Mult):
                factor, numerator = numerator.left, numerator.right
            pair = [numerator, node.right]
            ops = (ast.Sub, ast.Add)
            if not all(
                isinstance(p, ast.BinOp) and isinstance(p.op, op) and _is_one(p.right)
                for p, op in zip(pair, ops, strict=True)
            ):
                continue
            names = {p.left.id for p in pair if isinstance(p.left, ast.Name)}
            if len(names) != 1 or (name := names.pop()) not in exps:
                continue
            tanh = f"{mod.np}.tanh({_text(mod.source, exps[name])})"
            if factor is not None:
                tanh = f"{_atom(mod.source, factor)} * {tanh}"
            edits.append(_replace(node, tanh))
    return edits


_EPS_NAME = re.compile(r"_?(EPS|EPSILON)\w*", re.IGNORECASE)


_RSQRT, _SQRT = ("jax.lax.rsqrt", "lax.rsqrt"), ("jax.lax.sqrt", "lax.sqrt")


def _inverse_sqrt_args(mod: _Module, fn: ast.AST) -> list[ast.expr]:
    """What a body normalises by: the argument of ``rsqrt(v)`` or of a ``jnp.sqrt(v)`` it divides
    by (``1 / jnp.sqrt(var)``, ``x / jnp.sqrt(var)``)."""
    found = []
    for node in walk(fn):
        rsqrt = isinstance(node, ast.Call) and _dotted(node.func) in _RSQRT
        if rsqrt and len(node.args) == 1:
            found.append(node.args[0])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            root = node.right
            sqrt = _is_call(root, mod.np_names, "sqrt") or (
                isinstance(root, ast.Call) and _dotted(root.func) in _SQRT
            )
            if sqrt and len(root.args) == 1:
                found.append(root.args[0])
    return found


@_recipe(
    "rsqrt_eps",
    ("unstable", "nan_inf"),
    "rsqrt(x) or 1 / sqrt(x) without the module's or the body's eps → rsqrt(x + eps)",
)
def rsqrt_eps(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the kernel has an epsilon — a module constant (``EPS = 1e-6``) or a parameter of
    the body (``*, eps: float``, bound by ``functools.partial(body, eps=eps)``) — but a body
    normalises by ``rsqrt(x)`` or ``1 / jnp.sqrt(x)`` without it: an all-zero row gives
    rsqrt(0) = inf and 0 * inf = NaN. Fix: ``rsqrt(x + eps)`` (``jnp.sqrt(x + eps)``). (No
    epsilon, no edit: the recipe does not invent one.)"""
    constants = [
        t.id
        for node in mod.tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for t in node.targets
        if isinstance(t, ast.Name) and _EPS_NAME.fullmatch(t.id)
    ]
    edits = []
    for fn in _kernel_functions(mod):
        arguments = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        params = [a.arg for a in arguments if _EPS_NAME.fullmatch(a.arg)]
        eps = params or constants
        if len(eps) != 1:
            continue
        for arg in _inverse_sqrt_args(mod, fn):
            names = {n.id for n in walk(arg) if isinstance(n, ast.Name)}
            if eps[0] not in names and not (names & set(constants)):
                edits.append(_replace(arg, f"{_text(mod.source, arg)} + {eps[0]}"))
    return edits


def _moment(mod: _Module, scope: ast.AST, node: ast.expr) -> tuple[ast.Call, str] | None:
    """A mean written ``jnp.mean(v, ..)`` or ``jnp.sum(v, ..) / n`` (through a name, too):
    (the reducing call, the text of v)."""
    node = _resolve(scope, node, 1)
    call = node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        call = node.left if _is_call(node.left, mod.np_names, "sum") else None
    elif not _is_call(node, mod.np_names, "mean"):
        call = None
    if call is None or not call.args:
        return None
    return call, _text(mod.source, call.args[0])


@_recipe(
    "two_pass_variance",
    ("unstable",),
    "one-pass variance E[x²] - E[x]² → the centred E[(x - E[x])²]",
)
def two_pass_variance(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: ``mean_sq - mean * mean`` where ``mean_sq`` is the mean of ``x * x`` and ``mean``
    the mean of ``x`` (kept dims): catastrophic cancellation for a large mean. Fix: the mean of
    ``(x - mean) * (x - mean)`` with ``mean_sq``'s own reduction."""
    edits = []
    for body in _bodies(mod):
        for node in walk(body):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)):
                continue
            right = node.right
            if not (isinstance(right, ast.BinOp) and isinstance(right.op, ast.Mult)):
                continue
            if ast.dump(right.left) != ast.dump(right.right):
                continue
            square, mean = _moment(mod, body, node.left), _moment(mod, body, right.left)
            if square is None or mean is None:
                continue
            x = mean[1]
            keepdims = _kwarg(mean[0], "keepdims")
            keeps = isinstance(keepdims, ast.Constant) and keepdims.value is True
            if square[1].replace(" ", "") != f"{x}*{x}".replace(" ", "") or not keeps:
                continue
            m = _atom(mod.source, right.left)
            centred = f"({x} - {m}) * ({x} - {m})"
            definition = _resolve(body, node.left, 1)
            text = _text(mod.source, definition).replace(square[1], centred, 1)
            if not isinstance(definition, ast.Call):
                text = _bare(mod.source, node, text)
            edits.append(_replace(node, text))
    return edits
