"""Single-site mutants of a kernel: the small edits a near-miss bug is usually one of.

A recipe knows a bug's pattern; a mutant knows only that near-miss bugs are small: a comparison
off by one, two conditions joined by ``|`` for ``&``, an operand swapped, an axis or a
broadcast the wrong way round, a stray transpose or a missing one, a matrix product contracted
over the wrong axis, max for min, exp for exp2, ones for zeros, a masked element given 0 for
minus infinity, an index map reading the wrong grid parameter, a reciprocal dropped, a slice
started at a block's index instead of its first element, a helper's two (index, size) pairs
swapped, a difference reversed, a value set where it was to be folded in, a flag pinned to a
literal, a loop started at 1, a term of a sum not squared. Enumerating every such edit of the
code the kernel runs, and letting the engine judge each, repairs bugs no recipe was written
for — the zero-token counterpart of generate-and-validate program repair. Pure: source in,
mutants out; nothing here runs code.

Only the code the entry point can reach is mutated (``reachable``): the functions named,
transitively, from ``kernel``'s body, so a module's unused backward pass or another op's kernel
is not searched. Mutants come in the order of ``OPERATORS``: the families with few sites per
kernel first, so a bounded search reaches them all before the many name substitutions.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from activities.fixers.playbook.source import (
    _apply,
    _Edit,
    _kernel_functions,
    _module,
    _pallas_calls,
    _replace,
    _span,
    _text,
    walk,
)
from nearmiss.engine.inputs import parse_source

ENTRY = "kernel"


@dataclass(frozen=True)
class Mutant:
    operator: str
    line: int
    description: str  # e.g. "line 41: `j == grid_width` -> `j == grid_width - 1`"
    source: str


# ----------------------------------------------------------------------------------------------
# Where to mutate: the functions the entry point reaches.

_Def = ast.FunctionDef | ast.AsyncFunctionDef


def reachable(tree: ast.Module, entry: str = ENTRY) -> list[ast.FunctionDef]:
    """Module-level functions the entry point names, transitively (calls, ``functools.partial``,
    a kernel body handed to ``pallas_call``, an index map, a module-level alias such as
    ``make_mha = partial(_make, ...)``, a class's methods), entry first. Nested functions are
    inside their parent's body and so reached with it."""
    named: dict[str, list[ast.AST]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            named[node.name] = [node]
        elif isinstance(node, ast.ClassDef):  # a kernel object built and called
            named[node.name] = [n for n in node.body if isinstance(n, _Def)]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    named.setdefault(target.id, []).append(node.value)
    if entry not in named:
        return []
    found = list(named[entry])
    for item in found:  # grows while it is walked
        for node in walk(item):
            more = named.get(node.id, []) if isinstance(node, ast.Name) else []
            found.extend(n for n in more if n not in found)
    functions = [n for n in found if isinstance(n, _Def)]
    return functions[1:] + functions[:1]  # the entry (the user's glue) last


def constants_read(tree: ast.Module, functions: list[ast.FunctionDef]) -> list[ast.Assign]:
    """Module-level assignments of names those functions read (``TRANS_B_DIM_NUMBERS = (((1,),
    (1,)), ((), ()))``, ``NUM_LANES = 128``): a constant the kernel uses is part of the kernel,
    and its value can be the bug. Not the ones that bind a function (``reachable`` has those)."""
    read = {
        n.id
        for fn in functions
        for n in walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    }
    found = []
    for node in tree.body:
        if not isinstance(node, ast.Assign) or not all(
            isinstance(t, ast.Name) for t in node.targets
        ):
            continue
        if any(t.id in read for t in node.targets if isinstance(t, ast.Name)):
            found.append(node)
    return found


# ----------------------------------------------------------------------------------------------
# The operators: each yields (node, replacement text) pairs for one family of edits.

Site = tuple[ast.AST, str]
_FLIP = {ast.Lt: ">", ast.Gt: "<", ast.LtE: ">=", ast.GtE: "<="}
_LOOSEN = {ast.Lt: "<=", ast.LtE: "<", ast.Gt: ">=", ast.GtE: ">", ast.Eq: "!=", ast.NotEq: "=="}
_OPPOSITE = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum"}
_OPPOSITE |= {"argmax": "argmin", "argmin": "argmax", "sum": "mean", "mean": "sum"}
_ARITH = {ast.Add: "-", ast.Sub: "+", ast.Mult: "/", ast.Div: "*"}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//"}


def _transposes(source: str, fn: ast.AST) -> Iterator[Site]:
    """``x.T`` -> ``x``: a stray transpose (the q k^T habit applied to the wrong operand)."""
    for node in walk(fn):
        if isinstance(node, ast.Attribute) and node.attr == "T":
            yield node, _text(source, node.value)


def _extrema(source: str, fn: ast.AST) -> Iterator[Site]:
    """``max`` <-> ``min``, ``sum`` <-> ``mean`` (a function, a method, or a ``jnp.`` call): the
    wrong reduction (a mean taken, then divided by the count again)."""
    return _renamed_calls(fn, _OPPOSITE)


def _renamed_calls(fn: ast.AST, table: dict[str, str]) -> Iterator[Site]:
    """Each call of a function named in ``table`` (a function, a method, or a ``jnp.`` call)
    calling the name ``table`` gives it instead."""
    for node in walk(fn):
        if isinstance(node, ast.Call):
            name = node.func
            if isinstance(name, ast.Attribute) and name.attr in table:
                yield _attribute_name(name), f".{table[name.attr]}"
            elif isinstance(name, ast.Name) and name.id in table:
                yield name, table[name.id]


def _selects(source: str, fn: ast.AST) -> Iterator[Site]:
    """``where(c, a, b)`` -> ``where(c, b, a)``, and ``a if c else b`` -> ``b if c else a``."""
    for node in walk(fn):
        if isinstance(node, ast.Call) and _called(node) == "where" and len(node.args) == 3:
            c, a, b = (_text(source, arg) for arg in node.args)
            yield node, f"{_text(source, node.func)}({c}, {b}, {a})"
        elif isinstance(node, ast.IfExp):
            c, a, b = (_text(source, n) for n in (node.test, node.body, node.orelse))
            yield node, f"({b} if {c} else {a})"


def _narrow_dtypes(source: str, fn: ast.AST) -> Iterator[Site]:
    """An accumulation asked in a narrow float: ``dtype=jnp.bfloat16`` (or ``float16``, or a
    ``preferred_element_type``) -> ``float32``. Only in those keywords: an ``astype`` to the
    output's narrow type is usually right."""
    for node in walk(fn):
        if isinstance(node, ast.keyword) and node.arg in ("dtype", "preferred_element_type"):
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr in ("bfloat16", "float16"):
                yield _attribute_name(value), ".float32"


def _kept_axes(source: str, fn: ast.AST) -> Iterator[Site]:
    """A reduction over an axis that drops it where the code goes on as if it were kept:
    ``jnp.max(s, axis=1)`` -> ``jnp.max(s, axis=1, keepdims=True)`` (a row statistic, its
    ``[:, None]`` forgotten, then broadcast along the lanes instead of the rows); and one over
    everything where a row's was meant: ``jnp.sum(p)`` -> ``jnp.sum(p, axis=-1,
    keepdims=True)`` (every row divided by the tile's total). Only for a call not yet indexed
    (``[:, None]``) or told ``keepdims``, naming its ``axis=`` or given nothing but its
    operand."""
    indexed = {id(n.value) for n in walk(fn) if isinstance(n, ast.Subscript)}
    for node in walk(fn):
        if (
            not isinstance(node, ast.Call)
            or _called(node) not in _REDUCTIONS
            or id(node) in indexed
        ):
            continue
        keywords = {k.arg for k in node.keywords}
        text = _text(source, node)
        if "axis" in keywords and "keepdims" not in keywords:
            yield node, f"{text[:-1].rstrip().rstrip(',')}, keepdims=True)"
        elif not keywords and len(node.args) == 1:  # jnp.sum(p); not p.sum(1), axis positional
            yield node, f"{text[:-1].rstrip().rstrip(',')}, axis=-1, keepdims=True)"
        elif not keywords and not node.args and isinstance(node.func, ast.Attribute):  # p.sum()
            yield node, f"{text[:-1].rstrip()}axis=-1, keepdims=True)"


_REDUCTIONS = ("max", "min", "sum", "mean", "var", "std", "prod", "logsumexp")


def _unused_parameters(source: str, fn: ast.AST) -> Iterator[Site]:
    """A literal 0 in a returned tuple where one of the function's own parameters, never read,
    belongs: an index map ``(b, h, i, _) -> (b, 0, i, 0)`` that ignores the grid's head axis,
    so every head writes one block and the others are never written. Each such 0 -> each
    unread parameter (not an ``_``-named one, which is unread on purpose)."""
    for scope in walk(fn):
        if isinstance(scope, ast.Lambda):
            returned = [scope.body]
        elif isinstance(scope, ast.FunctionDef):
            returned = [n.value for n in _own_nodes(scope) if isinstance(n, ast.Return)]
        else:
            continue
        read = {n.id for n in walk(scope) if isinstance(n, ast.Name)}
        params = [a.arg for a in [*scope.args.posonlyargs, *scope.args.args]]
        unread = [p for p in params if p not in read and not p.startswith("_")]
        for value in returned:
            if not unread or not isinstance(value, ast.Tuple):
                continue
            for entry in value.elts:
                if _is_literal(entry, 0):
                    for param in unread:
                        yield entry, param


def _pinned_keywords(source: str, fn: ast.AST) -> Iterator[Site]:
    """A keyword argument pinned to a literal where the function has a variable of that very
    name to pass on: ``partial(_fwd, causal=False)`` -> ``causal=causal`` inside a function
    that takes ``causal`` (a flag hard-coded while the caller's is ignored)."""
    for scope in walk(fn):
        if not isinstance(scope, ast.FunctionDef):
            continue
        local = _local_names(scope)
        for node in _own_nodes(scope):
            pinned = isinstance(node, ast.keyword) and isinstance(node.value, ast.Constant)
            if pinned and node.arg in local:
                yield node.value, node.arg


def _multiplied_masks(source: str, fn: ast.AST) -> Iterator[Site]:
    """A boolean mask multiplied into logits where it should send them far below the rest:
    ``s *= mask`` (or ``s = s * mask``) -> ``s = where(mask, s, 0.7 * finfo(s.dtype).min)``.
    A masked logit of 0 keeps its weight in the softmax (the padding attended). Only for a
    mask the function builds from a comparison, and a module that names jax.numpy."""
    numpy = _numpy_alias(source)
    if numpy is None:
        return
    for scope in walk(fn):
        if not isinstance(scope, ast.FunctionDef):
            continue
        own = list(_own_nodes(scope))
        masks = {
            n.targets[0].id
            for n in own
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and isinstance(n.targets[0], ast.Name)
            and _is_boolean(n.value)
        }
        for node in own:
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
                target, factor = node.target, node.value
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                value = node.value
                if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)):
                    continue
                target = node.targets[0]
                pair = (value.left, value.right)
                factor = next((f for f, t in (pair, pair[::-1]) if _same_name(t, target)), None)
            else:
                continue
            if isinstance(target, ast.Name) and isinstance(factor, ast.Name) and factor.id in masks:
                s, mask = target.id, factor.id
                yield node, f"{s} = {numpy}.where({mask}, {s}, 0.7 * {numpy}.finfo({s}.dtype).min)"


def _is_boolean(value: ast.expr) -> bool:
    """A comparison, or comparisons combined with ``&``, ``|``, ``~`` (indexed or not)."""
    while isinstance(value, ast.Subscript):
        value = value.value
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.Invert | ast.Not):
        return _is_boolean(value.operand)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitAnd | ast.BitOr):
        return _is_boolean(value.left) and _is_boolean(value.right)
    return isinstance(value, ast.Compare | ast.BoolOp)


def _same_name(node: ast.AST, other: ast.AST) -> bool:
    return isinstance(node, ast.Name) and isinstance(other, ast.Name) and node.id == other.id


def _broadcasts(source: str, fn: ast.AST) -> Iterator[Site]:
    """``a[:, None]`` <-> ``a[None, :]``: a broadcast along the wrong axis."""
    for node in walk(fn):
        if not isinstance(node, ast.Subscript) or not isinstance(node.slice, ast.Tuple):
            continue
        parts = node.slice.elts
        if len(parts) == 2 and any(_is_none(p) for p in parts) and any(_is_colon(p) for p in parts):
            swapped = ", ".join(_text(source, p) if not _is_colon(p) else ":" for p in parts[::-1])
            yield node, f"{_text(source, node.value)}[{swapped}]"


def _comparisons(source: str, fn: ast.AST) -> Iterator[Site]:
    """A comparison off by one (``<`` <-> ``<=``, ``==`` <-> ``!=`` last), or facing the wrong
    way (``<`` -> ``>``)."""
    for node in walk(fn):
        if not isinstance(node, ast.Compare) or len(node.ops) != 1:
            continue
        left, right = _text(source, node.left), _text(source, node.comparators[0])
        op = type(node.ops[0])
        for table in (_LOOSEN, _FLIP):
            if op in table:
                yield node, f"{left} {table[op]} {right}"


def _logic(source: str, fn: ast.AST) -> Iterator[Site]:
    """Two conditions joined the wrong way: ``a | b`` <-> ``a & b`` for masks built from
    comparisons (a window's two bounds: every key passes one of them), ``logical_or`` <->
    ``logical_and``, ``or`` <-> ``and``."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and type(node.op) in _JOIN and _is_boolean(node):
            left, right = _text(source, node.left), _text(source, node.right)
            joined = f"{_paren(node.left, left)} {_JOIN[type(node.op)]} {_paren(node.right, right)}"
            yield node, joined
        elif isinstance(node, ast.Call) and _called(node) in _LOGICAL:
            name = node.func
            if isinstance(name, ast.Attribute):
                yield _attribute_name(name), f".{_LOGICAL[name.attr]}"
            elif isinstance(name, ast.Name):
                yield name, _LOGICAL[name.id]
        elif isinstance(node, ast.BoolOp) and len(node.values) == 2:
            word = "or" if isinstance(node.op, ast.And) else "and"
            a, b = (_paren(v, _text(source, v)) for v in node.values)
            yield node, f"{a} {word} {b}"


_JOIN = {ast.BitOr: "&", ast.BitAnd: "|"}
_LOGICAL = {"logical_and": "logical_or", "logical_or": "logical_and"}


def _off_by_one(source: str, fn: ast.AST) -> Iterator[Site]:
    """An operand of a comparison, a ``range``/``fori_loop`` bound or a slice bound one off:
    ``n`` -> ``n - 1``/``n + 1``, ``n - 1`` -> ``n``; and a loop, a slice or a ``pl.ds`` that
    starts at a literal 1 started at 0 (the first element skipped)."""
    for node in walk(fn):
        operands: list[ast.expr] = []
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.Call) and _called(node) in ("range", "fori_loop"):
            operands = node.args[:2]
        elif isinstance(node, ast.Slice):
            operands = [n for n in (node.lower, node.upper) if n is not None]
        elif _called_with(node, ("ds", "dslice")) and _is_literal(node.args[0], 1):
            yield node.args[0], "0"  # a block loaded from lane 1
        for operand in operands:
            if _is_literal(operand, 1) and operand is _start(node):
                yield operand, "0"  # a loop or a slice started at 1: the first element skipped
            if _is_literal(operand, 0) or isinstance(operand, ast.Constant | ast.Compare):
                continue
            one_off = isinstance(operand, ast.BinOp) and _is_literal(operand.right, 1)
            if one_off and isinstance(operand.op, ast.Add | ast.Sub):
                yield operand, _text(source, operand.left)
                continue
            text = _text(source, operand)
            atom = text if isinstance(operand, ast.Name | ast.Attribute | ast.Call) else f"({text})"
            yield operand, f"{atom} - 1"
            yield operand, f"{atom} + 1"


def _start(node: ast.AST) -> ast.expr | None:
    """Where a loop or a slice starts: ``range(a, b)``'s and ``fori_loop(a, ...)``'s ``a``, a
    slice's lower bound (``pl.ds``'s start is read where its call is, in ``_off_by_one``)."""
    if isinstance(node, ast.Slice):
        return node.lower
    if isinstance(node, ast.Call) and (len(node.args) > 1 or _called(node) != "range"):
        return node.args[0] if node.args else None
    return None


def _axes(source: str, fn: ast.AST) -> Iterator[Site]:
    """A reduction's or a concatenation's ``axis=`` the wrong one (0, 1, -1, -2), an iota's
    (key positions counted along the rows: ``broadcasted_iota(int32, shape, 0)``), a
    ``program_id``'s (a block index read from the batch's grid axis), a size read
    from the wrong dimension (``row_len = x.shape[0]`` for ``x.shape[-1]``), and the same
    for each entry of a dimension tuple: a ``broadcast_in_dim``'s broadcast dimensions (a row
    statistic spread along the lanes instead of the rows), a ``transpose``'s permutation, a
    ``vmap``'s ``in_axes``/``out_axes`` (the sequence axis mapped instead of the batch)."""
    for node in walk(fn):
        if isinstance(node, ast.keyword) and node.arg in _MAPPED_AXES:  # vmap's: one or a tuple
            yield from (_tuple_axes if isinstance(node.value, ast.Tuple) else _other_axes)(
                node.value
            )
        elif isinstance(node, ast.keyword) and node.arg in ("axis", "dimension"):
            yield from _other_axes(node.value)
        elif isinstance(node, ast.keyword) and node.arg in _DIMENSION_KEYWORDS:
            yield from _tuple_axes(node.value)
        elif isinstance(node, ast.Call) and _called(node) in _DIMENSION_ARGUMENT:
            index = _DIMENSION_ARGUMENT[_called(node)]
            if len(node.args) > index:
                yield from _tuple_axes(node.args[index])
        elif isinstance(node, ast.Call) and _called(node) in _AXIS_ARGUMENT:
            index = _AXIS_ARGUMENT[_called(node)]
            if len(node.args) > index:
                grid = _called(node) in ("program_id", "num_programs")
                yield from _other_axes(node.args[index], (0, 1, 2, 3) if grid else _AXES)
        elif isinstance(node, ast.Subscript) and _is_shape(node.value):
            yield from _other_axes(node.slice)


_DIMENSION_KEYWORDS = ("broadcast_dimensions", "axes", "permutation")
_MAPPED_AXES = ("in_axes", "out_axes")
_DIMENSION_ARGUMENT = {"broadcast_in_dim": 2, "transpose": 1}  # call -> its dimensions' position
# call -> its one axis's position: row vs column ids; the grid axis a block index is read from
_AXIS_ARGUMENT = {"broadcasted_iota": 2, "program_id": 0, "num_programs": 0}


_AXES = (-1, 0, 1, -2)


def _other_axes(value: ast.expr, axes: tuple[int, ...] = _AXES) -> Iterator[Site]:
    current = _int_value(value)
    if current is None:
        return
    for other in axes:
        if other != current:
            yield value, str(other)


def _tuple_axes(value: ast.expr) -> Iterator[Site]:
    if isinstance(value, ast.Tuple | ast.List):
        for entry in value.elts:
            yield from _other_axes(entry)


def _swaps(source: str, fn: ast.AST) -> Iterator[Site]:
    """Two neighbours swapped: a kernel's ``*_ref`` parameters, the entries of a tuple (an
    index map's block indices, a grid)."""
    for node in walk(fn):
        if isinstance(node, ast.FunctionDef):
            params = node.args.args
            for a, b in zip(params, params[1:], strict=False):
                if a.arg.endswith("_ref") and b.arg.endswith("_ref"):
                    yield _pair(a, b), f"{b.arg}, {a.arg}"
        elif isinstance(node, ast.Tuple) and 2 <= len(node.elts) <= 4:
            yield from _neighbours(source, node.elts)


def _argument_swaps(source: str, fn: ast.AST) -> Iterator[Site]:
    """Two neighbouring positional arguments of a call swapped (``dot(b, a)``)."""
    for node in walk(fn):
        if isinstance(node, ast.Call) and 2 <= len(node.args) <= 4:
            yield from _neighbours(source, node.args)


def _pair_swaps(source: str, fn: ast.AST) -> Iterator[Site]:
    """A call's two argument pairs swapped, ``f(a, b, c, d)`` -> ``f(c, d, a, b)``: a helper
    taking (index, size) of one operand then of the other, called in the other order."""
    for node in walk(fn):
        if isinstance(node, ast.Call) and len(node.args) == 4:
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue
            a, b, c, d = (_text(source, arg) for arg in node.args)
            if (a, b) != (c, d):
                yield _pair(node.args[0], node.args[3]), f"{c}, {d}, {a}, {b}"


def _operand_swaps(source: str, fn: ast.AST) -> Iterator[Site]:
    """A difference taken the wrong way round, ``a - b`` -> ``b - a``: a rescale exponent
    ``exp(m_next - m_prev)`` that should shrink and grows (an overflow, NaN downstream)."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            left, right = _text(source, node.left), _text(source, node.right)
            yield node, f"{_paren(node.right, right)} - {_paren(node.left, left)}"


def _rebindings(source: str, fn: ast.AST) -> Iterator[Site]:
    """A value set where it should have been folded in, or the converse: ``x = y`` -> ``x *= y``
    or ``x += y`` for a name already bound (a parameter, or set on an earlier line) and not read
    by ``y`` (``qk_scale = sm_scale`` for ``qk_scale *= sm_scale``: the log2(e) factor lost);
    ``x *= y``/``x += y`` -> ``x = y``."""
    for scope in walk(fn):
        if not isinstance(scope, ast.FunctionDef):
            continue
        own = list(_own_nodes(scope))
        args = scope.args
        bound = {a.arg: 0 for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
        for node in own:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound[node.id] = min(bound.get(node.id, node.lineno), node.lineno)
        for node in own:
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Mult):
                yield node, f"{_text(source, node.target)} = {_text(source, node.value)}"
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            if not isinstance(target, ast.Name) or bound.get(target.id, node.lineno) >= node.lineno:
                continue
            if any(_same_name(n, target) for n in walk(value)):
                continue  # `acc = acc + x` folds already
            for op in ("*", "+"):
                yield node, f"{target.id} {op}= {_text(source, value)}"


def _strides(source: str, fn: ast.AST) -> Iterator[Site]:
    """A dynamic slice started at a block's index instead of its first element:
    ``pl.ds(i, n)`` -> ``pl.ds(i * n, n)`` (the converse is a dropped factor)."""
    for node in walk(fn):
        if isinstance(node, ast.Call) and _called(node) in ("ds", "dslice") and len(node.args) == 2:
            start, size = node.args
            if isinstance(start, ast.Constant) or _is_literal(size, 1):
                continue
            yield (
                start,
                f"{_paren(start, _text(source, start))} * {_paren(size, _text(source, size))}",
            )


def _squares(source: str, fn: ast.AST) -> Iterator[Site]:
    """A term of a sum not squared: ``acc + a`` -> ``acc + a * a`` (a variance or a norm's
    loop copied from the mean's)."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            term = node.right
            if isinstance(term, ast.Name | ast.Subscript | ast.Attribute):
                text = _text(source, term)
                yield term, f"{text} * {text}"


def _neighbours(source: str, nodes: list[ast.expr]) -> Iterator[Site]:
    for a, b in zip(nodes, nodes[1:], strict=False):
        if isinstance(a, ast.Starred) or isinstance(b, ast.Starred):
            continue
        if _text(source, a) != _text(source, b):
            yield _pair(a, b), f"{_text(source, b)}, {_text(source, a)}"


def _arithmetic(source: str, fn: ast.AST) -> Iterator[Site]:
    """``+`` <-> ``-``, ``*`` <-> ``/``: a sign or a scale inverted, in an expression or an
    augmented assignment (``s /= scale``)."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            left, right = _text(source, node.left), _text(source, node.right)
            yield node, f"{left} {_ARITH[type(node.op)]} {_paren(node.right, right)}"
        elif isinstance(node, ast.AugAssign) and type(node.op) in _ARITH:
            target, value = _text(source, node.target), _text(source, node.value)
            yield node, f"{target} {_ARITH[type(node.op)]}= {value}"


def _dropped_terms(source: str, fn: ast.AST) -> Iterator[Site]:
    """A factor or a term the right operand of which is the bug: ``a * c`` -> ``a``,
    ``a - c`` -> ``a``, and a missing factor's converse is out of reach (it needs a name)."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOL:
            yield node, _text(source, node.left)
            if isinstance(node.op, ast.Mult | ast.Add):
                yield node, _text(source, node.right)


def _names(source: str, fn: ast.AST) -> Iterator[Site]:
    """One name read where a sibling was meant: within a function, a loaded name replaced by
    another local of the same naming family (``q_seq_index`` for ``kv_seq_index``,
    ``block_row`` for ``row_len``). Families: names sharing a suffix or a prefix."""
    for scope in walk(fn):
        if not isinstance(scope, ast.FunctionDef | ast.Lambda):
            continue
        local = _local_names(scope)
        for node in _own_nodes(scope):
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)):
                continue
            for other in sorted(local):
                if other != node.id and _related(node.id, other):
                    yield node, other


def _siblings(source: str, fn: ast.AST) -> Iterator[Site]:
    """A function for its sibling, a name apart: ``exp`` <-> ``exp2`` and ``log`` <-> ``log2``
    (a running rescale kept in base 2 read in base e), ``sqrt`` <-> ``rsqrt``, ``ones`` <->
    ``zeros`` (and ``_like``: an accumulator started at one), ``floor`` <-> ``ceil``."""
    return _renamed_calls(fn, _SIBLING)


_SIBLING = {"exp": "exp2", "exp2": "exp", "log": "log2", "log2": "log", "sqrt": "rsqrt"}
_SIBLING |= {"rsqrt": "sqrt", "ones": "zeros", "zeros": "ones", "ones_like": "zeros_like"}
_SIBLING |= {"zeros_like": "ones_like", "floor": "ceil", "ceil": "floor"}
# Where a masked-out or padded element's value is given: a call's keyword of these names.
_FILL_KEYWORDS = ("other", "mask_value", "fill_value", "pad_value", "initial")


def _fills(source: str, fn: ast.AST) -> Iterator[Site]:
    """The value a masked or padded element takes, zero for minus infinity or the converse:
    ``where(mask, s, 0.0)`` -> ``where(mask, s, -inf)`` and a load's ``other=``, a mask's
    ``mask_value=`` (padded lanes that must lose a max, or a softmax's dropped columns that
    must weigh nothing)."""
    inf = f"-{_numpy_alias(source) or 'jnp'}.inf"
    for node in walk(fn):
        values: list[ast.expr] = []
        if isinstance(node, ast.Call) and _called(node) == "where" and len(node.args) == 3:
            values = node.args[1:]
        elif isinstance(node, ast.Call):
            values = [k.value for k in node.keywords if k.arg in _FILL_KEYWORDS]
        for value in values:
            if _is_zero(value):
                yield value, inf
            elif _is_minus_infinity(source, value):
                yield value, "0.0"


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 0


def _is_minus_infinity(source: str, node: ast.AST) -> bool:
    """``-jnp.inf``, ``-float("inf")``, a large negative literal, a ``*MASK_VALUE`` name (the
    large negative a masked logit is given, by convention)."""
    text = _text(source, node).replace(" ", "").replace("'", '"')
    if not text.startswith("-"):
        named = isinstance(node, ast.Name | ast.Attribute)
        return named and text.split(".")[-1].upper().endswith("MASK_VALUE")
    if text[1:].endswith(".inf") or text[1:] in ("inf", 'float("inf")'):
        return True
    value = node.operand if isinstance(node, ast.UnaryOp) else None
    return (
        isinstance(value, ast.Constant)
        and isinstance(value.value, int | float)
        and not isinstance(value.value, bool)
        and value.value >= 1e9
    )


def _index_map_names(source: str, fn: ast.AST) -> Iterator[Site]:
    """A grid index read from the wrong parameter of an index map: in a ``lambda`` of plain
    parameters (a BlockSpec's index map), a parameter read where a sibling was meant
    (``lambda b, o, i: (0, b)`` -> ``(0, o)``); in a ``def`` of plain parameters that returns
    a tuple (an index map written out: ``def o_map(b, h, q, k): return (b, h, q, 0)``), a
    parameter the tuple names where a sibling was meant."""
    for node in walk(fn):
        if not isinstance(node, ast.Lambda | ast.FunctionDef) or node.args.vararg:
            continue
        params = [a.arg for a in node.args.args]
        if node.args.kwarg or not 2 <= len(params) <= 5:
            continue
        if isinstance(node, ast.Lambda):
            read = [n for n in walk(node.body) if isinstance(n, ast.Name)]
        else:
            returned = [r.value for r in walk(node) if isinstance(r, ast.Return)]
            tuples = [t for t in returned if isinstance(t, ast.Tuple)]
            read = [n for t in tuples for n in t.elts if isinstance(n, ast.Name)]
        for name in read:
            if name.id in params:
                for other in params:
                    if other != name.id:
                        yield name, other


def _dot_dimensions(source: str, fn: ast.AST) -> Iterator[Site]:
    """A matrix product contracted over the wrong axis: a ``dot_general``'s contracting
    dimensions (written out as a literal, or bound to a name: ``NT_DIMS = (((1,), (1,)), ((),
    ()))``) each moved to the operand's other matrix axis, and an operand of a
    ``dot``/``matmul``/``@`` transposed (``q @ k`` for ``q @ k.T``)."""
    for node in walk(fn):
        if isinstance(node, ast.Call) and _called(node) == "dot_general" and len(node.args) >= 3:
            yield from _contracting_alternatives(node.args[2])
        elif isinstance(node, ast.Assign) and _dimension_numbers(node.value):
            yield from _contracting_alternatives(node.value)
        operands: list[ast.expr] = []
        if isinstance(node, ast.Call) and _called(node) in ("dot", "matmul") and node.args:
            operands = node.args[:2]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            operands = [node.left, node.right]
        for operand in operands:
            if isinstance(operand, ast.Attribute) and operand.attr == "T":
                continue  # the stray transpose is ``transpose``'s
            text = _text(source, operand)
            atom = isinstance(operand, ast.Name | ast.Attribute | ast.Subscript | ast.Call)
            yield operand, f"{text if atom else f'({text})'}.T"


def _dimension_numbers(value: ast.expr) -> bool:
    """Whether ``value`` is written as a ``dot_general``'s dimension numbers: ``((contracting,
    contracting), (batch, batch))``, each a tuple of ints."""
    if not (isinstance(value, ast.Tuple) and len(value.elts) == 2):
        return False
    pairs = [p for p in value.elts if isinstance(p, ast.Tuple) and len(p.elts) == 2]
    sides = [side for pair in pairs for side in pair.elts if isinstance(side, ast.Tuple)]
    return (
        len(pairs) == 2
        and len(sides) == 4
        and all(_int_value(axis) is not None for side in sides for axis in side.elts)
    )


def _contracting_alternatives(numbers: ast.expr) -> Iterator[Site]:
    """``(((1,), (1,)), batch)`` -> the other axis of one side: ``(0,)`` for ``(1,)`` (the
    matrix axes of 2-D operands, or the last two of batched ones)."""
    if not (isinstance(numbers, ast.Tuple) and len(numbers.elts) == 2):
        return
    contracting = numbers.elts[0]
    if not (isinstance(contracting, ast.Tuple) and len(contracting.elts) == 2):
        return
    for side in contracting.elts:
        if isinstance(side, ast.Tuple) and len(side.elts) == 1:
            axis = _int_value(side.elts[0])
            for other in {0: (1,), 1: (0, 2), 2: (1,)}.get(axis if axis is not None else -9, ()):
                yield side, f"({other},)"


def _reciprocals(source: str, fn: ast.AST) -> Iterator[Site]:
    """A value for its reciprocal: ``1 / x`` -> ``x``, and a scale bound from a plain value
    (``scale = sm_scale``) -> ``1 / sm_scale``: a reciprocal dropped or one too many."""
    for node in walk(fn):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _is_one(node.left):
            yield node, _text(source, node.right)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = node.value
            if isinstance(value, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
                yield value, f"1 / {_paren(value, _text(source, value))}"


def _is_one(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value == 1


Operator = Callable[[str, ast.AST], Iterator[Site]]
OPERATORS: dict[str, Operator] = {
    "transpose": _transposes,
    "extremum": _extrema,
    "sibling": _siblings,
    "select": _selects,
    "fill": _fills,
    "unused_parameter": _unused_parameters,
    "pinned_keyword": _pinned_keywords,
    "multiplied_mask": _multiplied_masks,
    "narrow_dtype": _narrow_dtypes,
    "kept_axis": _kept_axes,
    "broadcast": _broadcasts,
    "comparison": _comparisons,
    "logic": _logic,
    "swap": _swaps,
    "index_map_name": _index_map_names,
    "axis": _axes,
    "off_by_one": _off_by_one,
    "stride": _strides,
    "argument_swap": _argument_swaps,
    "operand_swap": _operand_swaps,
    "pair_swap": _pair_swaps,
    "rebinding": _rebindings,
    "name": _names,
    "arithmetic": _arithmetic,
    "dot_dimensions": _dot_dimensions,
    "reciprocal": _reciprocals,
    "dropped_term": _dropped_terms,
    "square": _squares,
}


def mutants(
    source: str, entry: str = ENTRY, suspicion: Callable[[int], int] | None = None
) -> Iterator[Mutant]:
    """Every single-site mutant of the code ``entry`` reaches, each distinct source once; none
    when the source does not parse. Ordered by where, then by what: the kernel bodies (and the
    functions they call) first, then the functions that build the pallas_calls (grids, block
    specs, index maps, output shapes), then the rest, then the module-level constants they read
    (``constants_read``); within each, operator by operator in the
    order of ``OPERATORS``. Edits of a guard's test (an ``if`` that only raises, an ``assert``)
    come after all others: turning a check off makes a failing call pass on the suite while
    breaking the calls the check let through (a plausible patch, not a fix).

    ``suspicion``, given a line number, says how many of the evidence's leads point at that
    line (a NaN is born where an ``exp``, a division or an infinity is; an input the kernel
    ignores is read there): edits of lines more leads point at come first, in the same order
    among themselves. Where the edits are is planned for the whole module first (cheap); each
    edit is made, parsed and yielded lazily, as it is asked for."""
    mod = _module(source)
    if mod is None:
        return
    functions = reachable(mod.tree, entry)
    bodies = [f for f in _kernel_functions(mod) if f in functions] if mod.pl else []
    builders = [c.scope for c in _pallas_calls(mod)] if mod.pl else []
    builders = [f for f in functions if f in builders and f not in bodies]
    rest = [f for f in functions if f not in bodies + builders]
    tiers: list[list] = [bodies, builders, rest, constants_read(mod.tree, functions)]
    guarded = {id(n) for fn in functions for test in _guard_tests(fn) for n in walk(test)}
    planned: list[tuple[int, str, ast.AST | _Span, str]] = []  # (rank, operator, site, text)
    for tier in tiers:
        for operator, sites in OPERATORS.items():
            for node, text in (site for fn in tier for site in sites(source, fn)):
                span = isinstance(node, _Span)
                if id(node.site if span else node) in guarded:
                    rank = 1
                else:
                    rank = -suspicion(node.lineno) if suspicion else 0
                planned.append((rank, operator, node, text))
    planned.sort(key=lambda plan: plan[0])  # stable: the order above within each rank
    lines = source.split("\n")  # as ast numbers them (splitlines also splits at \f)
    seen, statements = {source}, _Statements(mod.tree, lines)
    for _, operator, node, text in planned:
        edit = _edit(node, text)
        edited = _apply(source, [edit])
        if edited is None or edited in seen or not statements.parses(edited, edit):
            continue
        seen.add(edited)
        before = node.text(source) if isinstance(node, _Span) else _text(source, node)
        line = node.lineno
        yield Mutant(operator, line, f"line {line}: `{before}` -> `{text}`", edited)


def _guard_tests(fn: ast.AST) -> Iterator[ast.expr]:
    """The tests of a function's guards: ``if`` statements whose body only raises, asserts."""
    for node in walk(fn):
        raises = isinstance(node, ast.If) and all(isinstance(s, ast.Raise) for s in node.body)
        if raises or isinstance(node, ast.Assert):
            yield node.test


# ----------------------------------------------------------------------------------------------
# Helpers.


@dataclass(frozen=True)
class _Span:
    """A site that is not one node's whole text: two neighbouring nodes edited as one (``a, b``
    -> ``b, a``, ``_pair``), or an attribute's name without its object (``.mean`` of a long
    call's ``x.mean``, ``_attribute_name``), so a description does not repeat the call."""

    site: ast.AST  # the node a guard's test may hold
    lineno: int
    start: tuple[int, int]  # (line, utf-8 column) as ast reports positions
    end: tuple[int, int]

    def text(self, source: str) -> str:
        return _span(source, self.start, self.end)


def _pair(first: ast.AST, second: ast.AST) -> _Span:
    start = (first.lineno, first.col_offset)
    return _Span(first, first.lineno, start, (second.end_lineno, second.end_col_offset))


def _attribute_name(node: ast.Attribute) -> _Span:
    value, line = node.value, node.end_lineno or node.lineno
    start = (value.end_lineno or value.lineno, value.end_col_offset or 0)
    return _Span(node, line, start, (line, node.end_col_offset or 0))


def _edit(node: ast.AST | _Span, text: str) -> _Edit:
    if isinstance(node, _Span):
        return _Edit(node.start, node.end, text)
    return _replace(node, text)


class _Statements:
    """Whether an edited module parses, judged by parsing the smallest statement that holds the
    edit: an edit changes nothing outside it, and a whole module of JAX's flash attention takes
    tens of milliseconds to parse (a search makes thousands of edits), a statement well under
    one. Where no statement holds the edit, the whole module is parsed."""

    def __init__(self, tree: ast.Module, lines: list[str]) -> None:
        """``lines``: the module's, split at "\n" as ast numbers them (splitlines also splits
        at \f)."""
        self.newlines = len(lines) - 1
        self.covering: dict[int, list[tuple[int, int]]] = {}  # line -> statements' line spans
        for node in walk(tree):
            if not isinstance(node, ast.stmt) or node.end_lineno is None:
                continue
            decorators = getattr(node, "decorator_list", [])
            first = min([node.lineno, *(d.lineno for d in decorators)])
            if lines[first - 1].lstrip().startswith("elif"):
                continue  # an `elif` clause parses only with its `if`
            for line in range(first, node.end_lineno + 1):
                self.covering.setdefault(line, []).append((first, node.end_lineno))
        for spans in self.covering.values():
            spans.sort(key=lambda span: span[1] - span[0])  # the innermost first

    def parses(self, edited: str, edit: _Edit) -> bool:
        (first, _), (last, _) = edit.start, edit.end
        held = [span for span in self.covering.get(first, []) if span[1] >= last]
        if not held:
            return _parses(edited)
        start, end = held[0]
        lines = edited.split("\n")
        text = "\n".join(lines[start - 1 : end + len(lines) - 1 - self.newlines])
        return _parses(f"if 1:\n{text}" if text[:1] in (" ", "\t") else text)


@functools.lru_cache(maxsize=8)
def _numpy_alias(source: str) -> str | None:
    """How the module names jax.numpy (``jnp``), to write new code with."""
    mod = _module(source)
    return mod.np if mod else None


def _parses(source: str) -> bool:
    try:
        parse_source(source, "<mutant>")
    except SyntaxError:
        return False
    return True


def _called(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _called_with(node: ast.AST, names: tuple[str, ...]) -> bool:
    """A call of one of ``names`` given at least one positional argument."""
    return isinstance(node, ast.Call) and _called(node) in names and bool(node.args)


def _is_shape(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "shape"


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_colon(node: ast.AST) -> bool:
    return isinstance(node, ast.Slice) and node.lower is node.upper is node.step is None


def _is_literal(node: ast.AST, value: int) -> bool:
    return (
        isinstance(node, ast.Constant) and node.value == value and type(value) is type(node.value)
    )


def _int_value(node: ast.AST) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and type(node.operand.value) is int
    ):
        return -node.operand.value
    return None


def _paren(node: ast.AST, text: str) -> str:
    return (
        text
        if isinstance(node, ast.Name | ast.Constant | ast.Attribute | ast.Call)
        else f"({text})"
    )


def _local_names(scope: ast.FunctionDef | ast.Lambda) -> set[str]:
    """Parameters, names assigned and functions defined in the function itself (not in nested
    functions): a loop body handed to ``fori_loop`` is a local like any other."""
    args = scope.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
    names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    for node in _own_nodes(scope):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):  # a helper defined here
            names.add(node.name)
    return names


def _own_nodes(scope: ast.FunctionDef | ast.Lambda) -> Iterator[ast.AST]:
    """The nodes of a function's body, not descending into nested functions."""
    todo = list(scope.body) if isinstance(scope.body, list) else [scope.body]
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def _related(a: str, b: str) -> bool:
    """Names of one family: the same last word (``q_seq_index``/``kv_seq_index``) or the same
    first word (``block_row``/``block_q``), of names made of words."""
    wa, wb = a.split("_"), b.split("_")
    if len(wa) < 2 and len(wb) < 2:
        return False
    return wa[-1] == wb[-1] or wa[0] == wb[0]
