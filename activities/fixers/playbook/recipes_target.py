"""Recipes for kernels right in interpret mode that a target refuses or races on: TPU block
tiling, scratch memory spaces, dimension semantics. Each reads the target's own words in the
evidence (the compiler's error, the grid finding) before it looks for its pattern."""

from __future__ import annotations

import ast
import math
import re

from activities.fixers.playbook.registry import (
    _recipe,
)
from activities.fixers.playbook.source import (
    _accumulators,
    _bindings,
    _bodies,
    _call_of,
    _dimension_semantics,
    _dotted,
    _Edit,
    _ignored_axes,
    _index_map,
    _inits,
    _listed,
    _Module,
    _pallas_calls,
    _PallasCall,
    _reduction_axes,
    _replace,
    _resolve,
    _text,
    walk,
)
from nearmiss.engine.models import Evidence
from nearmiss.engine.targets.tpu import vmem_figures

TPU_MODULE = "jax.experimental.pallas.tpu"

# JAX's TPU lowering: "... the last two dimensions of your block shape are divisible by 8 and
# 128 respectively, or be equal to the respective dimensions of the overall array. Block spec
# for args[0] in pallas_call _body at k.py:14 has block shape (64, 64), array shape (128, 256)".
_TILING = re.compile(
    r"last two dimensions of your block shape are divisible by (\d+) and (\d+).*?"
    r"Block spec for (args|outputs)(?:\[(\d+)\])? in pallas_call (\S+)"
    r".*? has block shape \((.*?)\), array shape \(([^)]*)\)",
    re.S,
)
# Mosaic on a pl.ANY ref read or written with plain indexing.
_ANY_ACCESS = re.compile(
    r"Loads and stores are only allowed on VMEM and SMEM references"
    r"|ANY memory space can only be accessed using async_copy"
)
_KERNEL_OF = re.compile(r"pallas_call of (\w+)")
# The TPU grid findings: a revisit along a parallel axis, the race detector, a random order.
_PARALLEL = re.compile(r"declared parallel|'parallel'")
_PARALLEL_AXES = re.compile(r"grid axis ([\d, ]+) declared parallel")


def _tpu_alias(mod: _Module) -> str | None:
    """The name the module gives jax.experimental.pallas.tpu, if it imports it."""
    for node in walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == TPU_MODULE and alias.asname:
                    return alias.asname
        elif isinstance(node, ast.ImportFrom) and node.module == "jax.experimental.pallas":
            for alias in node.names:
                if alias.name == "tpu":
                    return alias.asname or alias.name
    return None


def _import_tpu(mod: _Module, name: str) -> _Edit | None:
    """An import of the TPU module as ``name``, on the line after the pallas import."""
    for node in mod.tree.body:
        names = {a.name for a in getattr(node, "names", [])}
        if (isinstance(node, ast.Import) and "jax.experimental.pallas" in names) or (
            isinstance(node, ast.ImportFrom)
            and node.module == "jax.experimental"
            and "pallas" in names
        ):
            line = (node.end_lineno + 1, 0)
            return _Edit(line, line, f"from jax.experimental.pallas import tpu as {name}\n")
    return None


# ----------------------------------------------------------------------------------------------
# TPU block tiling.


def _module_constant(mod: _Module, name: str) -> ast.Constant | None:
    """The int literal a module-level ``NAME = 64`` (or ``A, NAME = 8, 64``) binds."""
    found = None
    for node in mod.tree.body:
        for t, v in _bindings(node):
            if isinstance(t, ast.Name) and t.id == name:
                found = v if isinstance(v, ast.Constant) and type(v.value) is int else None
    return found


def _local_value(scope: ast.AST, name: str) -> ast.expr | None:
    """The value ``name`` is bound to in ``scope`` by ``name = v`` or ``a, name = u, v``."""
    found = None
    for node in walk(scope):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if isinstance(target, ast.Name) and target.id == name:
            found = value
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for t, v in zip(target.elts, value.elts, strict=False):
                if isinstance(t, ast.Name) and t.id == name:
                    found = v
    return found


def _block_literal(mod: _Module, call: _PallasCall, expr: ast.expr, size: int):
    """The module constant's int literal that sets a block dim of ``size``, named by the dim
    directly or through a local ``b = min(B, n)``; None when the dim is computed some other way
    or written as a literal (the grid is then likely written for that literal too)."""
    for _ in range(4):
        if isinstance(expr, ast.Call) and _dotted(expr.func) == "min":
            found = [_block_literal(mod, call, arg, size) for arg in expr.args]
            return next((f for f in found if f is not None), None)
        if not isinstance(expr, ast.Name):
            return None
        local = _local_value(call.scope, expr.id) if call.scope is not mod.tree else None
        if local is not None:
            expr = local
            continue
        constant = _module_constant(mod, expr.id)
        return constant if constant is not None and constant.value == size else None
    return None


def _tile_literal(mod: _Module, call: _PallasCall, expr: ast.expr) -> ast.Constant | None:
    """The module constant of a block dim written ``min(B, n)`` (directly or through a local):
    a tile size that yields to a smaller array, so it must fit the tiling on its own."""
    if isinstance(expr, ast.Name) and call.scope is not mod.tree:
        expr = _local_value(call.scope, expr.id) or expr
    if not (isinstance(expr, ast.Call) and _dotted(expr.func) == "min" and len(expr.args) == 2):
        return None
    for arg in expr.args:
        if isinstance(arg, ast.Name) and (constant := _module_constant(mod, arg.id)) is not None:
            return constant
    return None


@_recipe(
    "tpu_block_tiling",
    ("compile_error",),
    "a block dim off the TPU's (8, 128) tiling (per the error) → its constant rounded up to fit",
)
def tpu_block_tiling(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the TPU lowering refused a BlockSpec because its last two dims are neither
    multiples of (8, 128) nor the array's dims, naming the operand (``args[k]``/``outputs``),
    the kernel, the block and the array shape. Fix: the int literal that sets each offending
    dim — the module constant the BlockSpec names (directly or through ``min(B, n)``) — becomes
    the next multiple of what the error asks (128 when one constant sets both dims). Tile
    constants of the same pallas_call's other BlockSpecs written ``min(B, n)`` (tiles that yield
    only to a smaller array) are held to the same rule, so one round fixes the whole tiling."""
    match = _TILING.search(evidence.diagnosis)
    if not match:
        return []
    sublane, lane, origin, index, body_name, block_text, array_text = match.groups()
    block = [int(d) for d in re.findall(r"\d+", block_text)]
    array = [int(d) for d in re.findall(r"\d+", array_text)]
    if len(block) < 2 or len(array) < 2:
        return []
    calls = _pallas_calls(mod)
    named = [c for c in calls if c.body is not None and c.body.name == body_name]
    call = named[0] if named else (calls[0] if len(calls) == 1 else None)
    if call is None:
        return []
    specs = call.in_specs if origin == "args" else call.out_specs
    position = int(index or 0)
    if position >= len(specs) or not isinstance(specs[position], ast.Call):
        return []
    shape = _resolve(call.scope, specs[position].args[0] if specs[position].args else None)
    if not isinstance(shape, ast.Tuple) or len(shape.elts) < 2:
        return []
    wanted: dict[int, tuple[ast.Constant, int]] = {}
    for offset, multiple in ((-1, int(lane)), (-2, int(sublane))):
        size, extent = block[offset], array[offset]
        if size % multiple == 0 or size == extent:
            continue
        literal = _block_literal(mod, call, shape.elts[offset], size)
        if literal is None:
            return []
        _, before = wanted.get(id(literal), (literal, 1))
        wanted[id(literal)] = (literal, math.lcm(before, multiple))
    multiples = {-1: int(lane), -2: int(sublane)}
    for spec in call.in_specs + call.out_specs:
        first = spec.args[0] if isinstance(spec, ast.Call) and spec.args else None
        dims = _resolve(call.scope, first)
        if not isinstance(dims, ast.Tuple) or len(dims.elts) < 2:
            continue
        for offset, multiple in multiples.items():
            literal = _tile_literal(mod, call, dims.elts[offset])
            if literal is None or literal.value % multiple == 0:
                continue
            _, before = wanted.get(id(literal), (literal, 1))
            wanted[id(literal)] = (literal, math.lcm(before, multiple))
    edits = []
    for literal, multiple in wanted.values():
        rounded = -(-literal.value // multiple) * multiple
        edits.append(_replace(literal, str(rounded)))
    return edits


def _dim_constant(mod: _Module, call: _PallasCall, expr: ast.expr) -> ast.Constant | None:
    """The module constant's int literal a block dim is written as: ``B``, ``min(B, n)``, or
    a local bound to either."""
    if isinstance(expr, ast.Name) and call.scope is not mod.tree:
        expr = _local_value(call.scope, expr.id) or expr
    if isinstance(expr, ast.Name):
        return _module_constant(mod, expr.id)
    return _tile_literal(mod, call, expr)


@_recipe(
    "tpu_vmem_budget",
    ("compile_error",),
    "blocks over the TPU's scoped VMEM (per the compiler) → the largest block constants halved",
)
def tpu_vmem_budget(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the TPU compiler ran out of scoped VMEM (``Scoped allocation with size S and
    limit L``, or v4's ``Used S of L vmem``) in a pallas_call whose blocks are set by module
    constants. Fix: halve the largest of those constants — never below the tiling its dim needs
    (128 lanes last, 8 sublanes before) — until the blocks shrink by S / L rounded up to a
    power of two, and once more for room: blocks at exactly the limit compile (S is the blocks'
    bytes, tests/test_vmem.py), but the check warns and the next larger block overflows. More,
    smaller grid steps: the grid is written over the same constants (``pl.cdiv(n, B)``)."""
    # libtpu's "E1001: CompileTimeScopedVmemOom: ... Scoped allocation with size 32.00M and
    # limit 16.00M ... (pallas_call of _body)"; v4's "Used 32.00M of 16.00M vmem".
    figures = vmem_figures(evidence.diagnosis)
    if not figures:
        return []
    size, limit = figures["vmem_bytes"], figures["vmem_limit_bytes"]
    if size <= limit or limit <= 0:
        return []
    halvings = math.ceil(math.log2(size / limit)) + 1
    body = _KERNEL_OF.search(evidence.diagnosis)
    calls = _pallas_calls(mod)
    named = [c for c in calls if body and c.body is not None and c.body.name == body[1]]
    call = named[0] if named else (calls[0] if len(calls) == 1 else None)
    if call is None:
        return []
    literals: dict[int, tuple[ast.Constant, int]] = {}
    for spec in call.in_specs + call.out_specs:
        first = spec.args[0] if isinstance(spec, ast.Call) and spec.args else None
        dims = _resolve(call.scope, first)
        if not isinstance(dims, ast.Tuple):
            continue
        rank = len(dims.elts)
        for position, dim in enumerate(dims.elts):
            literal = _dim_constant(mod, call, dim)
            if literal is None:
                continue
            multiple = {rank - 1: 128, rank - 2: 8}.get(position, 1)
            _, before = literals.get(id(literal), (literal, 1))
            literals[id(literal)] = (literal, math.lcm(before, multiple))
    values = {key: literal.value for key, (literal, _) in literals.items()}
    for _ in range(halvings):
        halvable = [(values[k], k) for k, (_, m) in literals.items() if values[k] % (2 * m) == 0]
        if not halvable:
            return []
        _, key = max(halvable)
        values[key] //= 2
    return [
        _replace(literal, str(values[key]))
        for key, (literal, _) in literals.items()
        if values[key] != literal.value
    ]


# ----------------------------------------------------------------------------------------------
# Scratch memory spaces.


@_recipe(
    "vmem_scratch",
    ("compile_error",),
    "scratch allocated in pl.ANY, which Mosaic cannot load or store (per the error) → pltpu.VMEM",
)
def vmem_scratch(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the TPU compiler says loads and stores need VMEM or SMEM refs, and a
    pallas_call's ``scratch_shapes`` allocates with ``pl.ANY(shape, dtype)`` (HBM on TPU).
    Fix: those scratch buffers become ``pltpu.VMEM(shape, dtype)``, importing the TPU module
    when the kernel does not."""
    if not _ANY_ACCESS.search(evidence.diagnosis):
        return []
    tpu = _tpu_alias(mod)
    edits = []
    for call in _pallas_calls(mod):
        for scratch in _listed(call.scope, call.scratch):
            if not isinstance(scratch, ast.Call):
                continue
            base = _dotted(scratch.func) or ""
            owner = base.rsplit(".", 1)[0].removesuffix(".MemorySpace")
            if base.endswith(".ANY") and (owner in mod.pl_names or owner == tpu):
                edits.append(_replace(scratch.func, f"{tpu or 'pltpu'}.VMEM"))
    if edits and tpu is None:
        if "pltpu" in {n.id for n in walk(mod.tree) if isinstance(n, ast.Name)}:
            return []  # the name is taken: no import to add safely
        if (imported := _import_tpu(mod, "pltpu")) is None:
            return []
        edits.append(imported)
    return edits


# ----------------------------------------------------------------------------------------------
# Dimension semantics.


def _carried_axes(mod: _Module, call: _PallasCall) -> set[int]:
    """Grid axes along which the kernel revisits an output block or carries state: the axes an
    output's index_map ignores, and those its carried refs accumulate over."""
    axes: set[int] = set()
    for spec in call.out_specs:
        if (index_map := _index_map(spec)) is not None:
            axes.update(_ignored_axes(index_map, call.scalar_prefetch))
    if call.body is not None:
        body = call.body
        for ref in _accumulators(mod, body, _inits(mod, body)):
            axes.update(_reduction_axes(call, body, ref) or ())
    return axes


@_recipe(
    "arbitrary_reduction_axis",
    ("grid_race",),
    "a reduction (revisited or carried) grid axis declared 'parallel' → 'arbitrary'",
)
def arbitrary_reduction_axis(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the target says a 'parallel' axis is revisited, raced on or order-dependent, and
    a pallas_call's ``dimension_semantics`` declares parallel an axis that an output's
    index_map ignores or that a carried ref accumulates over (or that the evidence names).
    Fix: those entries become ``"arbitrary"``; the other axes keep their semantics."""
    if not _PARALLEL.search(evidence.diagnosis):
        return []
    named = {
        int(axis)
        for match in _PARALLEL_AXES.finditer(evidence.diagnosis)
        for axis in re.findall(r"\d+", match.group(1))
    }
    edits = []
    for body in _bodies(mod):
        call = _call_of(mod, body)
        semantics = _dimension_semantics(call) if call is not None else None
        if semantics is None:
            continue
        for axis in sorted(_carried_axes(mod, call) | named):
            if axis >= len(semantics.elts):
                continue
            entry = semantics.elts[axis]
            text = _text(mod.source, entry)
            if isinstance(entry, ast.Constant) and entry.value == "parallel":
                edits.append(_replace(entry, text.replace("parallel", "arbitrary")))
            elif isinstance(entry, ast.Attribute) and entry.attr == "PARALLEL":
                edits.append(_replace(entry, text.removesuffix("PARALLEL") + "ARBITRARY"))
    return edits


# A target's precision finding (``targets.verdict``): "a float32 dot at DEFAULT precision (in the
# kernel, /home/user/k.py:36:12 (_body)) runs as one bfloat16 pass on tpu-v5e: ..." (or "runs as
# TF32 ... on gpu").
_CHIP_DOT = re.compile(r"a float32 dot at \S+ precision \((?:in|outside) the kernel, .*?:(\d+):\d+")
_DOT_NAMES = ("dot", "dot_general", "matmul", "einsum")


@_recipe(
    "dot_precision_highest",
    ("precision",),
    "a float32 dot the chip computes in bfloat16 passes (per the target) → precision=HIGHEST",
)
def dot_precision_highest(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: a target found a float32 dot at DEFAULT (or HIGH) precision too coarse for
    the spec's tolerance — one bfloat16 pass on a TPU's MXU, TF32 on a GPU — and named its
    line. Fix: that dot
    asks for ``precision=lax.Precision.HIGHEST`` (float32 on the chip, six passes), for float32
    operands only: Mosaic refuses HIGHEST for bfloat16 ones, which one pass computes exactly.
    An existing ``precision=`` keyword is replaced."""
    lines = {int(m) for m in _CHIP_DOT.findall(evidence.diagnosis)}
    if not lines or mod.lax is None:
        return []
    edits = []
    for node in walk(mod.tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        name = (_dotted(node.func) or "").rsplit(".", 1)[-1]
        if name not in _DOT_NAMES or not any(
            node.lineno <= line <= (node.end_lineno or node.lineno) for line in lines
        ):
            continue
        first = node.args[1] if name == "einsum" and len(node.args) > 1 else node.args[0]
        while isinstance(first, ast.Subscript):  # a slice has its array's dtype: read that
            first = first.value
        operand = _text(mod.source, first)
        highest = f"{mod.lax}.Precision.HIGHEST"
        value = f"{highest} if {operand}.dtype == {mod.np}.float32 else None"
        existing = next((k for k in node.keywords if k.arg == "precision"), None)
        if existing is not None:
            edits.append(_replace(existing.value, f"({value})"))
            continue
        last = max(
            [*node.args, *(k.value for k in node.keywords)],
            key=lambda n: (n.end_lineno or 0, n.end_col_offset or 0),
        )
        position = (last.end_lineno or node.lineno, last.end_col_offset or 0)
        edits.append(_Edit(position, position, f", precision=({value})"))
    return edits


# The gpu target's Triton refusal (``targets.triton``): "block (96, 256): Triton needs
# power-of-two block shapes; ...".
_TRITON_BLOCK = re.compile(r"block \(([\d, ]+)\): Triton needs power-of-two block shapes")


def _largest_power_of_two_dividing(value: int) -> int:
    return value & -value


@_recipe(
    "block_power_of_two",
    ("compile_error",),
    "a block size Triton refuses (not a power of two) → the largest power of two dividing it",
)
def block_power_of_two(mod: _Module, evidence: Evidence) -> list[_Edit]:
    """Pattern: the gpu target refused a block whose size is not a power of two, and a constant
    of the module (``BM = 96``, or one of ``BM, BN = 96, 128``) holds that block dimension.
    Fix: the constant becomes the largest power of two that divides it (96 → 32): it still
    divides every array the old one divided, so no block turns ragged, and a multiple of 8 or
    128 (a TPU's tiling) stays one. A dimension the kernel takes from its array's shape has no
    such constant: nothing to round."""
    wanted = {
        int(d)
        for match in _TRITON_BLOCK.findall(evidence.diagnosis)
        for d in re.findall(r"\d+", match)
        if int(d) & (int(d) - 1)
    }
    if not wanted:
        return []
    edits = []
    for node in mod.tree.body:  # module-level constants only: what a block size is named by
        if not isinstance(node, ast.Assign):
            continue
        values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
        for value in values:
            if (
                isinstance(value, ast.Constant)
                and type(value.value) is int
                and value.value in wanted
            ):
                edits.append(_replace(value, str(_largest_power_of_two_dividing(value.value))))
    return edits
