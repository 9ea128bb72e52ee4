"""Reading and editing a kernel's source for the recipes: ast positions, pallas_calls, refs,
grid axes, and what the evidence says failed."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

from nearmiss.engine.inputs import parse_source
from nearmiss.engine.models import Evidence

# ----------------------------------------------------------------------------------------------
# Source editing: recipes describe edits by ast positions; text outside them is left untouched.


@dataclass(frozen=True)
class _Edit:
    start: tuple[int, int]  # (line, utf-8 column) as ast reports positions
    end: tuple[int, int]
    text: str


def _replace(node: ast.AST, text: str) -> _Edit:
    return _Edit((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset), text)


@functools.lru_cache(maxsize=8)
def _layout(source: str) -> tuple[list[str], list[int]]:
    """The source's lines and each line's start offset: positions are read many times per
    source (a search makes thousands of edits of one module)."""
    lines = re.findall(r"[^\n]*\n|[^\n]+$", source)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    return lines, starts


def _offset(source: str, pos: tuple[int, int]) -> int:
    """The string offset of an ast position (a line, a utf-8 column)."""
    lines, starts = _layout(source)
    row, col = pos
    if row > len(lines):
        return len(source)
    return starts[row - 1] + len(lines[row - 1].encode()[:col].decode(errors="ignore"))


def _apply(source: str, edits: list[_Edit]) -> str | None:
    """The source with ``edits`` applied; None when there are none, they overlap or change
    nothing."""
    if not edits:
        return None
    out, previous = source, len(source) + 1
    for begin, end, text in sorted(
        {(_offset(source, e.start), _offset(source, e.end), e.text) for e in edits}, reverse=True
    ):
        if end > previous:
            return None
        out, previous = out[:begin] + text + out[end:], begin
    return out if out != source else None


def _span(source: str, start: tuple[int, int], end: tuple[int, int]) -> str:
    return source[_offset(source, start) : _offset(source, end)]


def _text(source: str, node: ast.AST) -> str:
    if getattr(node, "end_lineno", None) is None or "\r" in source:
        return ast.get_source_segment(source, node) or ast.unparse(node)
    start, end = (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)
    return _span(source, start, end) or ast.unparse(node)


def _bare(source: str, node: ast.AST, text: str) -> str:
    """``text`` to stand in for ``node``: bare where the node already sits alone (a statement's
    whole right-hand side, or inside its own parentheses), parenthesised elsewhere."""
    lines = source.splitlines()
    before = lines[node.lineno - 1].encode()[: node.col_offset].decode(errors="ignore").rstrip()
    after = lines[node.end_lineno - 1].encode()[node.end_col_offset :].decode(errors="ignore")
    after = after.strip()
    enclosed = before.endswith("(") and after.startswith(")")
    assigned = re.search(r"(?<![=<>!])=$", before) is not None and after in ("", ")")
    return text if enclosed or (assigned and not after) else f"({text})"


def _uncast(node):
    """``x`` for ``x.astype(a).astype(b)``: the value a chain of casts starts from (a cast
    keeps what a recipe looks for: a shift, a load, a reduction's operand)."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "astype"
    ):
        node = node.func.value
    return node


def _rounds_up(source: str, node: ast.BinOp) -> bool:
    """``(a + B - 1) // B``: a floor division that already rounds up."""
    numerator, denominator = _text(source, node.left), _text(source, node.right)
    return bool(re.search(r"-\s*1\s*\)?\s*$", numerator)) and denominator in numerator


def _atom(source: str, node: ast.AST) -> str:
    """The node's text, parenthesised unless it already binds tighter than any operator."""
    text = _text(source, node)
    simple = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant)
    return text if isinstance(node, simple) else f"({text})"


# ----------------------------------------------------------------------------------------------
# Reading a kernel module: import aliases, pallas_calls and their bodies, refs, grid axes.

LOW_FLOATS = ("bfloat16", "float16")


@dataclass(eq=False)  # by identity: read-only, shared by every recipe that reads its source
class _Module:
    source: str
    tree: ast.Module
    np: str | None  # alias of jax.numpy to write new code with
    pl: str | None  # alias of jax.experimental.pallas
    np_names: frozenset[str]
    pl_names: frozenset[str]
    lax: str | None = None  # how the module can name jax.lax


# Every recipe reads the same source, and a playbook round tries them all: one module (tree
# and what is read from it) per source. No recipe changes a tree: they return text edits.
# Measured on JAX's flash attention module: reading it again per recipe and walking it again per
# name looked up took 89 of a repair test's 123 s.
@functools.lru_cache(maxsize=8)
def _module(source: str) -> _Module | None:
    try:
        tree = parse_source(source)
    except SyntaxError:
        return None
    np_names, pl_names = {"jax.numpy"}, {"jax.experimental.pallas"}
    lax = None
    for node in walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "jax" and not alias.asname:
                    lax = "jax.lax"
                if alias.name == "jax.numpy" and alias.asname:
                    np_names.add(alias.asname)
                if alias.name == "jax.experimental.pallas" and alias.asname:
                    pl_names.add(alias.asname)
        elif isinstance(node, ast.ImportFrom) and node.module in ("jax", "jax.experimental"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full == "jax.numpy":
                    np_names.add(alias.asname or alias.name)
                if full == "jax.experimental.pallas":
                    pl_names.add(alias.asname or alias.name)
                if full == "jax.lax":
                    lax = lax or alias.asname or alias.name

    def short(names: set[str]) -> str | None:
        return min((n for n in names if "." not in n), default=None)

    np_, pl = short(np_names), short(pl_names)
    return _Module(source, tree, np_, pl, frozenset(np_names), frozenset(pl_names), lax)


def walk(node: ast.AST) -> tuple[ast.AST, ...]:
    """``ast.walk``'s nodes, in its order, listed once per node. No recipe or mutant changes a
    tree (they return text edits), and a round walks the same cached module (``_module``) and
    its functions thousands of times: measured on a planted set, the walks were 7 of a round's
    8.5 s."""
    nodes = node.__dict__.get("_nearmiss_walked")
    if nodes is None:
        nodes = tuple(ast.walk(node))
        node.__dict__["_nearmiss_walked"] = nodes
    return nodes


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _is_call(node: ast.AST, bases: frozenset[str] | set[str], *attrs: str) -> bool:
    """A call of ``<base>.<attr>`` for a base in ``bases`` (e.g. jnp.exp with bases = numpy)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in attrs
        and _dotted(node.func.value) in bases
    )


def _kwarg(call: ast.Call, name: str, position: int | None = None) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    if position is not None and len(call.args) > position:
        return call.args[position]
    return None


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) pairs a single-target assignment binds: ``a = x`` and ``a, b = x, y``;
    none for anything else."""
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return []
    target, value = node.targets[0], node.value
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
        return list(zip(target.elts, value.elts, strict=False))
    return [(target, value)]


def _assigned(scope: ast.AST, name: str) -> ast.expr | None:
    """The value last bound to ``name`` by a plain assignment inside ``scope``."""
    return _last_assignments(scope).get(name)


@functools.lru_cache(maxsize=256)  # by the node's identity; trees are shared and read-only
def _last_assignments(scope: ast.AST) -> dict[str, ast.expr]:
    found: dict[str, ast.expr] = {}
    for node in walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = node.value
    return found


@functools.lru_cache(maxsize=256)
def _name_bindings(scope: ast.AST) -> tuple[tuple[str, ast.expr], ...]:
    """(name, value) of every single-target binding of a name in ``scope``, in walk order."""
    return tuple(
        (target.id, value)
        for stmt in walk(scope)
        for target, value in _bindings(stmt)
        if isinstance(target, ast.Name)
    )


def _functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in walk(tree) if isinstance(n, ast.FunctionDef)}


@dataclass
class _PallasCall:
    node: ast.Call
    scope: ast.AST  # the function (or module) that builds the call
    body: ast.FunctionDef | None
    grid: ast.expr | None
    in_specs: list[ast.expr]
    out_specs: list[ast.expr]
    out_shapes: list[ast.expr]
    scratch: ast.expr | None = None  # the scratch_shapes expression, as written
    # Leading operands passed as scalar prefetch (``PrefetchScalarGridSpec(num_scalar_prefetch=
    # N)``): the body's first N refs, and every index_map's last N parameters.
    scalar_prefetch: int = 0

    @property
    def body_inputs(self) -> int:
        """How many body refs come before the outputs' (scalar prefetch, then inputs)."""
        return self.scalar_prefetch + len(self.in_specs)


def _resolve(scope: ast.AST, node: ast.expr | None, depth: int = 3) -> ast.expr | None:
    """Follow a name to the value it was assigned in ``scope`` (a few steps at most)."""
    while depth and isinstance(node, ast.Name):
        value = _assigned(scope, node.id)
        if value is None:
            break
        node, depth = value, depth - 1
    return node


def _listed(scope: ast.AST, node: ast.expr | None) -> list[ast.expr]:
    node = _resolve(scope, node)
    if node is None:
        return []
    if isinstance(node, ast.List | ast.Tuple):
        return [_resolve(scope, e) or e for e in node.elts]
    return [node]


def _scalar_prefetch(scope: ast.AST, grid_spec: ast.expr | None) -> int:
    """``num_scalar_prefetch`` of a grid_spec call, when it is a literal (or a name bound to
    one); 0 without a grid_spec."""
    if not isinstance(grid_spec, ast.Call):
        return 0
    value = _resolve(scope, _kwarg(grid_spec, "num_scalar_prefetch"))
    if isinstance(value, ast.Constant) and isinstance(value.value, int):
        return value.value
    return 0


def _pallas_calls(mod: _Module) -> list[_PallasCall]:
    return list(_read_pallas_calls(mod))


@functools.lru_cache(maxsize=8)
def _read_pallas_calls(mod: _Module) -> tuple[_PallasCall, ...]:
    functions = _functions(mod.tree)
    parents = {child: node for node in walk(mod.tree) for child in ast.iter_child_nodes(node)}
    calls = []
    for node in walk(mod.tree):
        if not _is_call(node, mod.pl_names, "pallas_call"):
            continue
        scope = parents.get(node)
        while scope is not None and not isinstance(scope, ast.FunctionDef):
            scope = parents.get(scope)
        scope = scope or mod.tree
        body_expr = _resolve(scope, node.args[0] if node.args else _kwarg(node, "kernel"))
        while isinstance(body_expr, ast.Call) and body_expr.args:  # functools.partial(f, ...)
            body_expr = _resolve(scope, body_expr.args[0])
        body = functions.get(body_expr.id) if isinstance(body_expr, ast.Name) else None
        # JAX's own kernels pass grid, block specs and scratch in a grid_spec object
        # (``pltpu.PrefetchScalarGridSpec(...)``, ``pl.GridSpec(...)``) instead.
        grid_spec = _resolve(scope, _kwarg(node, "grid_spec"))

        def option(name: str, node=node, grid_spec=grid_spec) -> ast.expr | None:
            found = _kwarg(node, name)
            if found is None and isinstance(grid_spec, ast.Call):
                found = _kwarg(grid_spec, name)
            return found

        calls.append(
            _PallasCall(
                node,
                scope,
                body,
                _resolve(scope, option("grid")),
                _listed(scope, option("in_specs")),
                _listed(scope, option("out_specs")),
                _listed(scope, _kwarg(node, "out_shape", 1)),
                option("scratch_shapes"),
                _scalar_prefetch(scope, grid_spec),
            )
        )
    return tuple(calls)


def _dimension_semantics(call: _PallasCall) -> ast.Tuple | ast.List | None:
    """The ``dimension_semantics`` tuple a pallas_call's ``compiler_params`` declares, in any
    spelling: ``pltpu.CompilerParams(dimension_semantics=...)``, ``dict(mosaic=dict(...))`` or a
    ``{"mosaic": {...}}`` literal; None when it declares none."""
    params = _resolve(call.scope, _kwarg(call.node, "compiler_params"))
    for _ in range(3):
        if isinstance(params, ast.Call):
            found = _kwarg(params, "dimension_semantics") or _kwarg(params, "mosaic")
        elif isinstance(params, ast.Dict):
            keys = [k.value if isinstance(k, ast.Constant) else None for k in params.keys]
            wanted = [v for k, v in zip(keys, params.values, strict=True) if k in _SEMANTICS_KEYS]
            found = wanted[0] if wanted else None
        else:
            return None
        found = _resolve(call.scope, found)
        if isinstance(found, ast.Tuple | ast.List):
            return found
        params = found
    return None


_SEMANTICS_KEYS = ("dimension_semantics", "mosaic")


def _bodies(mod: _Module) -> list[ast.FunctionDef]:
    """Kernel bodies: functions handed to pallas_call, else functions taking ``*_ref`` args."""
    found = [c.body for c in _pallas_calls(mod) if c.body is not None]
    if not found:
        found = [
            f
            for f in _functions(mod.tree).values()
            if any(a.arg.endswith("_ref") for a in f.args.args)
        ]
    unique: list[ast.FunctionDef] = []
    for f in found:
        if f not in unique:
            unique.append(f)
    return unique


def _refs(body: ast.FunctionDef) -> list[str]:
    return [a.arg for a in body.args.posonlyargs + body.args.args]


def _index_map(spec: ast.expr | None) -> ast.Lambda | None:
    if not isinstance(spec, ast.Call):
        return None
    for value in [*spec.args, *(k.value for k in spec.keywords)]:
        if isinstance(value, ast.Lambda):
            return value
    return None


def _grid_params(index_map: ast.Lambda, prefetch: int = 0) -> list[ast.arg]:
    """An index_map's grid-index parameters (the scalar-prefetch refs after them left out)."""
    params = index_map.args.args
    return params[: len(params) - prefetch] if prefetch else params


def _ignored_axes(index_map: ast.Lambda, prefetch: int = 0) -> tuple[int, ...]:
    """Grid axes an index_map ignores: the block stays put while they advance (a reduction)."""
    used = {n.id for n in walk(index_map.body) if isinstance(n, ast.Name)}
    return tuple(i for i, a in enumerate(_grid_params(index_map, prefetch)) if a.arg not in used)


def _grid_rank(call: _PallasCall) -> int | None:
    if isinstance(call.grid, ast.Tuple | ast.List):
        return len(call.grid.elts)
    if call.grid is not None:
        return 1
    for spec in call.out_specs + call.in_specs:
        if (index_map := _index_map(spec)) is not None:
            return len(_grid_params(index_map, call.scalar_prefetch))
    return None


def _call_of(mod: _Module, body: ast.FunctionDef) -> _PallasCall | None:
    return next((c for c in _pallas_calls(mod) if c.body is body), None)


def _reduction_axes(call: _PallasCall | None, body: ast.FunctionDef, ref: str):
    """The grid axes a body ref accumulates over: those its output's index_map ignores (for a
    scratch ref, the first output's), else the innermost grid axis (a scan's carry)."""
    if call is None:
        return None
    refs, n_in, outputs = _refs(body), call.body_inputs, call.out_specs
    if ref not in refs or refs.index(ref) < n_in:
        return None  # an input
    position = refs.index(ref) - n_in
    spec = outputs[position] if position < len(outputs) else (outputs or [None])[0]
    index_map = _index_map(spec)
    if index_map and (axes := _ignored_axes(index_map, call.scalar_prefetch)):
        return axes
    rank = _grid_rank(call)
    return (rank - 1,) if rank else None


def _program_ids(mod: _Module, body: ast.FunctionDef) -> dict[str, tuple[int, int]]:
    """Names bound to ``pl.program_id(axis)`` in the body: name → (axis, line of binding)."""
    found: dict[str, tuple[int, int]] = {}
    for node in walk(body):
        for name, expr in _bindings(node):
            if isinstance(name, ast.Name) and (axis := _program_id_axis(mod, expr)) is not None:
                found[name.id] = (axis, node.lineno)
    return found


def _program_id_axis(mod: _Module, node: ast.AST) -> int | None:
    if _is_call(node, mod.pl_names, "program_id") and node.args:
        arg = node.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
            return arg.value
    return None


def _cond_axes(mod: _Module, cond: ast.expr, pids: dict[str, tuple[int, int]]):
    """The axes of a condition made only of ``<program id> == 0`` terms joined by and; else
    None."""
    if isinstance(cond, ast.BinOp) and isinstance(cond.op, ast.BitAnd):
        parts = [cond.left, cond.right]
    elif isinstance(cond, ast.BoolOp) and isinstance(cond.op, ast.And):
        parts = cond.values
    elif _is_call(cond, mod.np_names, "logical_and"):
        parts = cond.args
    elif (
        isinstance(cond, ast.Compare)
        and len(cond.ops) == 1
        and isinstance(cond.ops[0], ast.Eq)
        and isinstance(cond.comparators[0], ast.Constant)
        and cond.comparators[0].value == 0
    ):
        left = cond.left
        if isinstance(left, ast.Name) and left.id in pids:
            return frozenset({pids[left.id][0]})
        axis = _program_id_axis(mod, left)
        return None if axis is None else frozenset({axis})
    else:
        return None
    axes: frozenset[int] = frozenset()
    for part in parts:
        sub = _cond_axes(mod, part, pids)
        if sub is None:
            return None
        axes |= sub
    return axes


def _axes_cond(mod: _Module, axes, pids: dict[str, tuple[int, int]], before_line: int) -> str:
    """``kk == 0`` (or ``(i == 0) & (j == 0)``), naming program ids bound before the line."""
    names = {axis: name for name, (axis, line) in pids.items() if line < before_line}
    terms = [f"{names.get(a, f'{mod.pl}.program_id({a})')} == 0" for a in sorted(axes)]
    return terms[0] if len(terms) == 1 else " & ".join(f"({t})" for t in terms)


def _when_cond(mod: _Module, fn: ast.FunctionDef) -> ast.expr | None:
    for decorator in fn.decorator_list:
        if _is_call(decorator, mod.pl_names, "when") and decorator.args:
            return decorator.args[0]
    return None


def _stores(fn: ast.AST, refs) -> Iterator[tuple[str, ast.stmt]]:
    for node in walk(fn):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if (
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Name)
                and target.value.id in refs
            ):
                yield target.value.id, node


def _reads(node: ast.AST, refs) -> list[str]:
    return [
        n.value.id
        for n in walk(node)
        if isinstance(n, ast.Subscript)
        and isinstance(n.ctx, ast.Load)
        and isinstance(n.value, ast.Name)
        and n.value.id in refs
    ]


@dataclass
class _Init:
    fn: ast.FunctionDef  # the ``@pl.when(...)`` block
    cond: ast.expr
    axes: frozenset[int] | None
    refs: list[str]


def _inits(mod: _Module, body: ast.FunctionDef) -> list[_Init]:
    """``@pl.when(<first step>)`` blocks that set refs without reading any: initialisers."""
    refs, pids, found = set(_refs(body)), _program_ids(mod, body), []
    for fn in walk(body):
        if fn is body or not isinstance(fn, ast.FunctionDef):
            continue
        cond = _when_cond(mod, fn)
        axes = _cond_axes(mod, cond, pids) if cond is not None else None
        stored = [name for name, stmt in _stores(fn, refs) if not _reads(stmt.value, refs)]
        if cond is not None and axes is not None and stored:
            found.append(_Init(fn, cond, axes, stored))
    return found


def _accesses(stmts: list[ast.stmt], refs, skip) -> Iterator[tuple[str, str]]:
    """(ref, "read" | "write") in evaluation order, skipping the functions in ``skip``."""
    for stmt in stmts:
        if isinstance(stmt, ast.FunctionDef):
            if stmt not in skip:
                yield from _accesses(stmt.body, refs, skip)
        elif isinstance(stmt, ast.Assign | ast.AugAssign):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            stored = [
                t.value.id
                for t in targets
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
            ]
            if isinstance(stmt, ast.AugAssign):
                yield from ((r, "read") for r in stored if r in refs)
            yield from ((r, "read") for r in _reads(stmt.value, refs))
            yield from ((r, "write") for r in stored if r in refs)
        else:
            nested = [
                s for field in ("body", "orelse", "finalbody") for s in getattr(stmt, field, [])
            ]
            heads = [
                getattr(stmt, f) for f in ("test", "iter", "value") if hasattr(stmt, f)
            ] + list(getattr(stmt, "items", []))
            for head in heads:
                if head is not None:
                    yield from ((r, "read") for r in _reads(head, refs))
            yield from _accesses(nested, refs, skip)


def _accumulators(mod: _Module, body: ast.FunctionDef, inits: list[_Init]) -> list[str]:
    """Refs carried across grid steps: read before they are written (initialisers aside)."""
    first: dict[str, str] = {}
    written = set()
    for ref, kind in _accesses(body.body, set(_refs(body)), {i.fn for i in inits}):
        first.setdefault(ref, kind)
        if kind == "write":
            written.add(ref)
    return [r for r in _refs(body) if first.get(r) == "read" and r in written]


def _combined_by(mod: _Module, body: ast.FunctionDef, ref: str) -> str | None:
    """How a ref is combined, "maximum" or "minimum", when its value (directly or through a
    name) feeds such a running extreme; None otherwise."""
    aliases = {
        t.id
        for n in walk(body)
        if isinstance(n, ast.Assign) and ref in _reads(n.value, {ref})
        for t in n.targets
        if isinstance(t, ast.Name) and isinstance(n.value, ast.Subscript | ast.Call)
    }
    for node in walk(body):
        if not _is_call(node, mod.np_names, "maximum", "minimum"):
            continue
        if any(isinstance(a, ast.Constant | ast.UnaryOp) for a in node.args):
            continue  # a clamp such as relu, not a running extreme
        for arg in node.args:
            if _reads(arg, {ref}) and isinstance(arg, ast.Subscript | ast.Call):
                return node.func.attr
            if isinstance(arg, ast.Name) and arg.id in aliases:
                return node.func.attr
    return None


def _identity(mod: _Module, ref: str, combine: str | None) -> str:
    if combine == "maximum":
        return f"{mod.np}.full({ref}.shape, -{mod.np}.inf, {ref}.dtype)"
    if combine == "minimum":
        return f"{mod.np}.full({ref}.shape, {mod.np}.inf, {ref}.dtype)"
    return f"{mod.np}.zeros({ref}.shape, {ref}.dtype)"


def _indent(source: str, node: ast.AST) -> str:
    line = source.splitlines()[node.lineno - 1]
    return line[: len(line) - len(line.lstrip())]


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decorators])


# ----------------------------------------------------------------------------------------------
# Evidence: compile errors and structure problems say what failed in the engine's words.

_FAILED_LINE = re.compile(r"\(`(.+?)`\): ")
_STORE_DTYPE = re.compile(r"Ref dtype: (\w+)\. Value dtype: (\w+)")
_STRUCTURE = re.compile(r"is (\w+)\[([^\]]*)\], the reference's is (\w+)\[([^\]]*)\]")
_BOOL_OF_TRACER = re.compile(
    r"TracerBoolConversionError|ConcretizationTypeError|truth value of an array"
)
_BLOCK_RANK = re.compile(
    r"Block shape for args\[(\d+)\] \(= \((.*?)\)\) must have the same number of dimensions "
    r"as the array shape \(([^)]*)\)"
)


def _failed_statements(mod: _Module, evidence: Evidence) -> list[ast.stmt]:
    """Statements of the source whose text is the line the evidence says failed."""
    match = _FAILED_LINE.search(evidence.diagnosis)
    if not match:
        return []
    wanted = match.group(1).strip()
    lines = mod.source.splitlines()
    return [
        node
        for node in walk(mod.tree)
        if isinstance(node, ast.stmt) and lines[node.lineno - 1].strip() == wanted
    ]


# ----------------------------------------------------------------------------------------------
# Reading kernels in other styles (JAX's own): values through local names, bodies behind a
# dispatcher, positions built from iota or arange.


def _parameter_defaults(scope: ast.AST) -> dict[str, ast.expr]:
    """A function's parameters that have a default, with it (``acc_dtype=jnp.float32``)."""
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return {}
    arguments = scope.args
    positional = arguments.posonlyargs + arguments.args
    found = dict(
        zip(
            [a.arg for a in positional[len(positional) - len(arguments.defaults) :]],
            arguments.defaults,
            strict=True,
        )
    )
    found.update(
        (a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True) if d
    )
    return found


def _values_of(scope: ast.AST, node: ast.AST, depth: int = 4) -> Iterator[ast.AST]:
    """``node`` and, for every name in it, every value that name is assigned in ``scope`` (all
    the assignments, not only the last: ``acc_dtype = jnp.float32`` then ``acc_dtype = ...`` in
    an ``if``) or given as the default of ``scope``'s parameter of that name (JAX's kernels take
    ``acc_dtype=jnp.float32`` as a keyword), followed a few steps; each value once."""
    defaults = _parameter_defaults(scope)
    seen: set[int] = set()
    todo = [(node, depth)]
    while todo:
        current, left = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if not left:
            continue
        names = {n.id for n in walk(current) if isinstance(n, ast.Name)}
        todo.extend((value, left - 1) for name, value in _name_bindings(scope) if name in names)
        todo.extend((defaults[name], left - 1) for name in names if name in defaults)


def _kernel_functions(mod: _Module) -> list[ast.FunctionDef]:
    """Kernel bodies and the module functions they hand work to (a dispatcher such as JAX's
    ``_flash_attention_kernel`` that picks ``kernel = _single_batch`` and calls it), a few
    steps deep."""
    return list(_read_kernel_functions(mod))


@functools.lru_cache(maxsize=8)
def _read_kernel_functions(mod: _Module) -> tuple[ast.FunctionDef, ...]:
    functions = {n.name: n for n in mod.tree.body if isinstance(n, ast.FunctionDef)}
    found = list(_bodies(mod))
    for fn in found:  # grows while it is walked
        if len(found) > 16:
            break
        for node in walk(fn):
            callee = functions.get(node.id) if isinstance(node, ast.Name) else None
            if callee is not None and callee not in found:
                found.append(callee)
    return tuple(found)


@dataclass
class _Loop:
    call: ast.Call  # lax.fori_loop(lower, upper, step, init_val)
    step: ast.FunctionDef | None  # the step function, where it is defined by name in reach
    init: ast.expr | None

    @property
    def returned(self) -> list[ast.expr]:
        if self.step is None:
            return []
        found = [r.value for r in walk(self.step) if isinstance(r, ast.Return)]
        return [r for r in found if r is not None]


def _fori_loops(fn: ast.AST, within: ast.AST | None = None) -> list[_Loop]:
    """The ``fori_loop`` calls inside ``within`` (default ``fn``), with their step function (a
    ``def`` inside ``fn``) and their initial carry (positional or ``init_val=``)."""
    local = {f.name: f for f in walk(fn) if isinstance(f, ast.FunctionDef)}
    loops = []
    for call in walk(within if within is not None else fn):
        if not (isinstance(call, ast.Call) and (_dotted(call.func) or "").endswith("fori_loop")):
            continue
        step = call.args[2] if len(call.args) > 2 else _kwarg(call, "body_fun")
        init = call.args[3] if len(call.args) > 3 else _kwarg(call, "init_val")
        step_fn = local.get(step.id) if isinstance(step, ast.Name) else None
        loops.append(_Loop(call, step_fn, init))
    return loops


_POSITION_CALLS = ("broadcasted_iota", "iota", "arange")


def _is_position_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and (_dotted(node.func) or "").split(".")[-1] in (
        _POSITION_CALLS
    )


def _positions(fn: ast.AST) -> dict[str, ast.Call]:
    """Names holding element positions in ``fn``: assigned (or ``+=``-ed) an expression built
    from ``broadcasted_iota``/``arange`` or from such names: name → the iota/arange call."""
    found: dict[str, ast.Call] = {}
    changed = True
    while changed:
        changed = False
        for node in walk(fn):
            for target, value in _bindings(node):
                if not isinstance(target, ast.Name) or target.id in found:
                    continue
                for sub in walk(value):
                    call = sub if _is_position_call(sub) else None
                    if isinstance(sub, ast.Name) and sub.id in found:
                        call = found[sub.id]
                    if call is not None:
                        found[target.id], changed = call, True
                        break
    return found


def _position_dim(fn: ast.AST, node: ast.expr, positions: dict[str, ast.Call]) -> int | None:
    """The axis along which a position expression varies: a ``broadcasted_iota``'s dimension
    (through names), or a 1-D ``arange`` broadcast as ``p[:, None]`` (0) or ``p[None, :]`` (1)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name):
        index = node.slice
        if node.value.id in positions and isinstance(index, ast.Tuple) and len(index.elts) == 2:
            kinds = [
                "new" if isinstance(e, ast.Constant) and e.value is None else type(e).__name__
                for e in index.elts
            ]
            if kinds == ["Slice", "new"]:
                return 0
            if kinds == ["new", "Slice"]:
                return 1
        return None
    if isinstance(node, ast.Name) and node.id in positions:
        call = positions[node.id]
        if (call.func.attr if isinstance(call.func, ast.Attribute) else "") == "broadcasted_iota":
            dim = call.args[2] if len(call.args) >= 3 else None
            if isinstance(dim, ast.Constant) and isinstance(dim.value, int):
                return dim.value
    return None
