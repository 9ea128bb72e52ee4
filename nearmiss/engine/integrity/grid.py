"""Which grid points write which output block: grid races (GPU) and TPU grid semantics.

Read from the *artifact*, never from the candidate: for a TPU target the exported StableHLO holds
one ``tpu_custom_call`` per Pallas kernel, whose ``backend_config`` carries the Mosaic kernel module
(JSON ``custom_call_config.body``: base64 of MLIR bytecode written by the ``mosaic-serde`` pass).
That module's kernel function carries the grid (``iteration_bounds``), ``dimension_semantics``, and
per operand a ``window_params`` entry: the block shape (``window_bounds``) and the index map
lowered to a small function (``transform_indices``) from the grid indices (and scalar-prefetch
refs) to block indices. This module decodes it, evaluates the outputs' index maps over the grid
with a small strict interpreter, and says where one output block is written by several grid points:

- ``gpu``: grid programs run concurrently, so two grid points writing one block of an output are a
  race (``grid_race``) — the classic accumulation over K across the grid. Where the block is
  shared but each program stores its own elements through a mask (a Triton-style kernel with
  whole-array blocks), the executor withdraws the race on the case's footprint
  (``runner.footprint``): this module reads blocks, not elements.
- ``tpu``: the grid runs in order (last axis fastest), so revisiting a block is fine only along
  axes declared ``arbitrary`` (``parallel_revisit`` otherwise: a parallel axis may be split across
  cores or reordered) and only while the revisits are consecutive (``nonconsecutive_revisit``: the
  block is written back when left and not read again when re-entered, unless its BlockSpec asks
  for ``RevisitMode.ANY``).

An output the artifact never uses (no use of the custom call's result: not returned, not read by
any op, not aliased to an input) cannot change the program's result. JAX's own kernels keep
running statistics in such outputs (splash attention's m/l/o, index map ``(0, 0)``, discarded
by the wrapper). Under ``tpu`` its revisits along a parallel axis are therefore not a finding,
only a note: each TensorCore holds its own VMEM copy of an output block, so what the kernel
reads back from it is core-local state, exactly as scratch is (a carry across a parallel axis
through either is the TPU-semantics run's to catch, not the index maps'). Its re-entries
(``nonconsecutive_revisit``) stay findings: a re-entered block is a stale buffer, and the kernel
may read it into a live output. Under ``gpu`` nothing is skipped: an output block is global
memory that concurrent programs can read back.

Strict: the interpreter knows integer ``arith`` ops and nothing else. An unknown op, a value read
from scalar-prefetch memory, undefined behaviour (division by zero, overflow of the index
arithmetic), an element (``pl.Element``) window, an output left in ``ANY``/HBM (written by DMA),
or a dynamic grid makes the answer for that output *undetermined*, with the reason — never a guess.

Cost is bounded: axes the index map does not read (found on its data flow) change nothing but the
repetition count, so they are shrunk to two points; the remaining grid is enumerated when it has at
most ``max_points`` points (numpy, vectorised). Beyond that only per-axis facts are reported: an
axis the map does not read is revisited for certain, a re-entry is shown by a witness, and the rest
is undetermined.

Parsing runs the MLIR parser on bytes the candidate produced; like the StableHLO audit it belongs
in a trusted child (the executor), not in the engine's own process.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

Semantics = Literal["gpu", "tpu"]

MAX_POINTS = 1 << 16  # grid points enumerated per output, after shrinking unread axes
MAX_TRANSFORM_OPS = 4096  # ops in one index-map function
MAX_KERNELS = 256  # tpu_custom_calls analysed in one artifact
MAX_ALIAS_POINTS = 1 << 12  # grid points whose aliased reads are compared with every write
MAX_BODY_BYTES = 64 << 20  # a Mosaic module's bytecode
_DYNAMIC = -(1 << 63)  # MLIR's ShapedType::kDynamic in iteration_bounds

MOSAIC_TARGET = "tpu_custom_call"
GPU_TARGETS = ("__gpu$xla.gpu.triton", "mosaic_gpu", "triton_kernel_call")
PARALLEL_KINDS = ("parallel", "core_parallel", "subcore_parallel")
KNOWN_SEMANTICS = (*PARALLEL_KINDS, "arbitrary")

_SEMANTIC = re.compile(r"#tpu\.dimension_semantics<([a-z_]+)>")
_REVISIT = re.compile(r"#tpu\.revisit_mode<([a-z_]+)>")
_ALIAS = re.compile(
    r"output_operand_alias<output_tuple_indices = \[(?P<output>\d*)\], "
    r"operand_index = (?P<operand>\d+)"
)


# ------------------------------------------------------------------------------------------------
# Report


@dataclass
class Finding:
    """One output block written by more than one grid point, in a way the semantics forbid.

    ``axes``: the grid axes along which the block is revisited (for ``nonconsecutive_revisit``, the
    axes in which the re-entry differs from the earlier visit). ``points``: grid points that show
    it — two points writing the same block, or for a re-entry [a visit, a later point writing
    another block, a still later point writing the first block again].
    """

    kind: Literal["grid_race", "aliased_read_race", "parallel_revisit", "nonconsecutive_revisit"]
    kernel: int
    kernel_name: str
    output: int
    axes: list[int]
    points: list[list[int]]
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class OutputSummary:
    """What the index map of one output does on the grid.

    ``depends_on``: per block dimension, the grid axes its index reads (data flow; ``-1`` marks a
    scalar-prefetch read). ``varies_along``: axes along which the block index changes (None when
    not evaluated). ``revisit_axes``: axes along which some block is written more than once
    (None when not determined; with ``analysis="per_axis"`` only the certain ones).
    """

    output: int
    block_shape: list[int]
    depends_on: list[list[int]]
    varies_along: list[int] | None
    revisit_axes: list[int] | None
    revisit_mode: str
    analysis: Literal["exhaustive", "per_axis", "none"]
    points: int  # grid points evaluated
    unused: bool = False  # the artifact never uses this output's result (see the module doc)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class KernelSummary:
    kernel: int
    name: str
    grid: list[int]
    dimension_semantics: list[str] | None
    scalar_prefetch: int
    inputs: int
    outputs: list[OutputSummary] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GridReport:
    semantics: Semantics
    findings: list[Finding] = field(default_factory=list)
    kernels: list[KernelSummary] = field(default_factory=list)
    # {"kernel": int | None, "output": int | None, "reason": str}
    undetermined: list[dict[str, Any]] = field(default_factory=list)
    # what was judged and let through, in words (an unused output's revisits)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No finding and nothing undetermined: the artifact keeps the grid semantics."""
        return not self.findings and not self.undetermined

    def as_dict(self) -> dict[str, Any]:
        return {
            "semantics": self.semantics,
            "ok": self.ok,
            "findings": [f.as_dict() for f in self.findings],
            "kernels": [k.as_dict() for k in self.kernels],
            "undetermined": [dict(u) for u in self.undetermined],
            "notes": list(self.notes),
        }


class Undetermined(Exception):
    """The index map cannot be evaluated exactly; the message says why."""


# ------------------------------------------------------------------------------------------------
# Reading the artifact


def _ir():
    from jax._src.lib.mlir import ir

    return ir


def _context() -> Any:
    from jax._src.interpreters import mlir
    from jax._src.lib import tpu

    context = mlir.make_ir_context()
    tpu.register_dialect(context)
    return context


def _name(op: Any) -> str:
    return getattr(getattr(op, "operation", op), "name", "")


def _walk(op: Any):
    """Every operation under ``op`` in order, without recursion (a deep module is no stack risk)."""
    stack = [iter([op])]
    while stack:
        try:
            current = next(stack[-1])
        except StopIteration:
            stack.pop()
            continue
        yield current
        operation = getattr(current, "operation", current)
        for region in reversed(list(operation.regions)):
            for block in reversed(list(region.blocks)):
                stack.append(iter(list(block.operations)))


def _stablehlo_text(artifact: Any) -> str:
    if isinstance(artifact, str):
        return artifact
    if hasattr(artifact, "mlir_module"):  # jax.export.Exported
        return artifact.mlir_module()
    raise TypeError(f"expected a jax.export.Exported or StableHLO text, not {type(artifact)}")


def _mosaic_body(call: Any) -> bytes:
    ir = _ir()
    attributes = call.attributes
    if "backend_config" not in attributes:
        raise Undetermined("tpu_custom_call without backend_config")
    config_attr = attributes["backend_config"]
    if not isinstance(config_attr, ir.StringAttr):
        raise Undetermined("tpu_custom_call backend_config is not a string")
    try:
        config = json.loads(config_attr.value_bytes)
        body = config["custom_call_config"]["body"]
        if not isinstance(body, str) or len(body) > MAX_BODY_BYTES * 4 // 3 + 4:
            raise Undetermined("Mosaic body missing or too large")
        return base64.b64decode(body, validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as error:
        raise Undetermined(f"backend_config does not decode: {error}") from None


def _parse_mosaic(body: bytes, context: Any) -> Any:
    """The kernel's Mosaic module, upgraded from its serialized (versioned) form."""
    ir = _ir()
    from jaxlib.mlir.passmanager import PassManager

    with context, ir.Location.unknown():
        context.allow_unregistered_dialects = True
        try:
            module = ir.Module.parse(body)
            PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(module.operation)
            if not module.operation.verify():
                raise Undetermined("Mosaic module does not verify")
        except Undetermined:
            raise
        except Exception as error:  # MLIRError and friends: a body we cannot read
            raise Undetermined(f"Mosaic module does not parse: {str(error)[:300]}") from None
        finally:
            context.allow_unregistered_dialects = False
    return module


def _kernel_function(call: Any, context: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The call's Mosaic module, its kernel function (the one with a grid or windows, or the
    only one) and every function of the module by symbol (index maps are functions too). The
    caller keeps the module while it reads the functions: they die with it."""
    ir = _ir()
    module = _parse_mosaic(_mosaic_body(call), context)
    functions = {}
    kernels = []
    for op in module.body.operations:
        if _name(op) != "func.func":
            continue
        symbol = ir.StringAttr(op.attributes["sym_name"]).value
        functions[symbol] = op
        if "window_params" in op.attributes or "iteration_bounds" in op.attributes:
            kernels.append(op)
    if not kernels and len(functions) == 1:
        kernels = list(functions.values())  # a grid-free kernel: one program
    if len(kernels) != 1:
        raise Undetermined(f"Mosaic module has {len(kernels)} kernel functions")
    return module, kernels[0], functions


def _result_count(call: Any) -> int:
    ir = _ir()
    results = list(call.results)
    if len(results) == 1 and isinstance(results[0].type, ir.TupleType):
        return ir.TupleType(results[0].type).num_types
    return len(results)


def _aliases(call: Any) -> list[tuple[int, int]]:
    """(operand, output) pairs of a custom call's ``output_operand_aliases``."""
    found = (
        call.attributes.get("output_operand_aliases")
        if "output_operand_aliases" in call.attributes
        else None
    )
    if found is None:
        return []
    return [(int(m["operand"]), int(m["output"] or 0)) for m in _ALIAS.finditer(str(found))]


def _unused_outputs(call: Any, n_out: int) -> set[int]:
    """Outputs of a custom call whose results nothing in the artifact uses. Conservative: a
    use of any kind (an op, ``func.return`` of a called function, a tuple read as a whole)
    counts, and an output aliased to an input is used (its buffer is the input's)."""
    ir = _ir()
    results = list(call.results)
    if len(results) == 1 and isinstance(results[0].type, ir.TupleType):
        used: set[int] = set()
        for use in results[0].uses:
            owner = use.owner
            index = _int_attr(owner.attributes, "index") if hasattr(owner, "attributes") else None
            if _name(owner) != "stablehlo.get_tuple_element" or index is None:
                return set()  # the tuple read as a whole: every output is used
            used.add(index)
        unused = set(range(n_out)) - used
    elif len(results) == n_out:
        unused = {number for number, result in enumerate(results) if not list(result.uses)}
    else:
        return set()
    return unused - {output for _, output in _aliases(call)}


def _int_attr(attributes: Any, name: str) -> int | None:
    ir = _ir()
    if name not in attributes:
        return None
    attr = attributes[name]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def _i64_array(attr: Any) -> list[int]:
    ir = _ir()
    if not isinstance(attr, ir.DenseI64ArrayAttr):
        raise Undetermined(f"expected an i64 array attribute, got {str(attr)[:80]}")
    return [int(v) for v in attr]


# ------------------------------------------------------------------------------------------------
# The interpreter of index maps


@dataclass
class _Step:
    op: str
    result: int  # slot
    operands: tuple[int, ...]
    widths: tuple[int, ...]  # result width, then operand widths
    predicate: int = -1
    value: int = 0


@dataclass
class _Program:
    """An index-map function compiled to slots: ``inputs[a]`` is grid axis a's slot."""

    inputs: list[int]
    input_widths: list[int]
    steps: list[_Step]
    outputs: list[int]
    deps: list[set[int]]  # per returned value: grid axes read; -1 = scalar prefetch
    problem: str | None  # why it cannot be evaluated (None when it can)


_BINARY = {
    "arith.addi",
    "arith.subi",
    "arith.muli",
    "arith.divsi",
    "arith.divui",
    "arith.remsi",
    "arith.remui",
    "arith.floordivsi",
    "arith.ceildivsi",
    "arith.ceildivui",
    "arith.minsi",
    "arith.maxsi",
    "arith.minui",
    "arith.maxui",
    "arith.andi",
    "arith.ori",
    "arith.xori",
    "arith.shli",
    "arith.shrsi",
    "arith.shrui",
    "arith.cmpi",
}
_CASTS = {
    "arith.index_cast",
    "arith.index_castui",
    "arith.extui",
    "arith.extsi",
    "arith.trunci",
}
SUPPORTED_OPS = frozenset({"arith.constant", "arith.select", "func.return", *_BINARY, *_CASTS})


def _width(value_type: Any) -> int:
    ir = _ir()
    if isinstance(value_type, ir.IndexType):
        return 64
    if isinstance(value_type, ir.IntegerType):
        return ir.IntegerType(value_type).width
    raise Undetermined(f"non-integer value of type {value_type}")


def _signed(value: int, width: int) -> int:
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value


def _compile(func: Any, n_grid: int) -> _Program:
    """Slots for the function's values, its ops as steps, and the data flow of its results.

    Only the ops the returned values depend on matter: an op the interpreter does not know makes
    the map undetermined only when a returned value depends on it."""
    blocks = [block for region in func.regions for block in region.blocks]
    if len(blocks) != 1:
        raise Undetermined("index map is not a single block")
    block = blocks[0]
    slots: dict[Any, int] = {}
    widths: list[int] = []
    deps: list[set[int]] = []
    producer: list[int] = []  # slot -> index of the op that defines it (-1: an argument)
    arguments = list(block.arguments)
    if len(arguments) < n_grid:
        raise Undetermined("index map takes fewer arguments than the grid has axes")
    inputs: list[int] = []
    for number, argument in enumerate(arguments):
        slots[argument] = len(widths)
        producer.append(-1)
        if number < n_grid:
            widths.append(_width(argument.type))
            deps.append({number})
            inputs.append(slots[argument])
        else:  # scalar-prefetch refs
            widths.append(0)
            deps.append({-1})
    operations = list(block.operations)
    if len(operations) > MAX_TRANSFORM_OPS:
        raise Undetermined(f"index map has {len(operations)} ops (limit {MAX_TRANSFORM_OPS})")
    # per op: (its operand slots, its step or why it cannot be evaluated)
    compiled: list[tuple[list[int], _Step | str]] = []
    outputs: list[int] | None = None
    for number, op in enumerate(operations):
        name = _name(op)
        operands = []
        for operand in op.operands:
            if operand not in slots:
                raise Undetermined(f"{name} reads a value defined outside the index map")
            operands.append(slots[operand])
        if name == "func.return":
            outputs = operands
            compiled.append((operands, "return"))
            continue
        operation = op.operation
        flow: set[int] = set().union(*(deps[o] for o in operands)) if operands else set()
        if any(len(region.blocks) for region in operation.regions):
            flow = set(range(n_grid)) | {-1}  # values may flow in through its regions
        results = list(op.results)
        for result in results:
            slots[result] = len(widths)
            producer.append(number)
            deps.append(set(flow))
            try:
                widths.append(_width(result.type))
            except Undetermined:
                widths.append(0)
        compiled.append((operands, _step(name, operation, operands, results, widths, deps)))
    if outputs is None:
        raise Undetermined("index map does not return")
    # the ops the returned values depend on, and the first problem among them
    needed: set[int] = set()
    pending = [producer[s] for s in outputs if producer[s] >= 0]
    while pending:
        number = pending.pop()
        if number in needed:
            continue
        needed.add(number)
        pending.extend(producer[s] for s in compiled[number][0] if producer[s] >= 0)
    problem = next(
        (entry for n, (_, entry) in enumerate(compiled) if n in needed and isinstance(entry, str)),
        None,
    )
    if problem is None and any(widths[slot] == 0 for slot in outputs):
        problem = "returns a non-integer value"
    steps = [
        entry for n, (_, entry) in enumerate(compiled) if n in needed and not isinstance(entry, str)
    ]
    return _Program(
        inputs=inputs,
        input_widths=[widths[s] for s in inputs],
        steps=steps,
        outputs=outputs,
        deps=[deps[s] for s in outputs],
        problem=problem,
    )


def _step(
    name: str,
    operation: Any,
    operands: list[int],
    results: list[Any],
    widths: list[int],
    deps: list[set[int]],
) -> _Step | str:
    """The op as an interpreter step, or why it cannot be one."""
    ir = _ir()
    if name not in SUPPORTED_OPS:
        if any(-1 in deps[o] for o in operands):
            return f"reads scalar-prefetch data ({name})"
        return f"uses {name}, which the interpreter does not know"
    if len(results) != 1:
        return f"{name} with {len(results)} results"
    expected = {"arith.constant": 0, "arith.select": 3}.get(name, 1 if name in _CASTS else 2)
    if len(operands) != expected:
        return f"{name} with {len(operands)} operands"
    if any(widths[o] == 0 for o in operands):
        return f"{name} on a non-integer operand"
    try:
        result_width = _width(results[0].type)
    except Undetermined as error:
        return str(error)
    operand_widths = tuple(widths[o] for o in operands)
    # the op's only result is the latest slot
    step = _Step(name, len(widths) - 1, tuple(operands), (result_width, *operand_widths))
    if name == "arith.constant":
        attr = operation.attributes.get("value")
        if not isinstance(attr, ir.IntegerAttr):
            return f"non-integer constant {str(attr)[:60]}"
        step.value = _signed(int(ir.IntegerAttr(attr).value), result_width)
    elif name == "arith.cmpi":
        predicate = _int_attr(operation.attributes, "predicate")
        if predicate is None or not 0 <= predicate <= 9:
            return f"cmpi with predicate {predicate}"
        step.predicate = predicate
    return step


def _fits(x: np.ndarray, width: int) -> bool:
    if width >= 64:
        return True
    low, high = -(1 << (width - 1)), (1 << (width - 1)) - 1
    return bool(np.all((x >= low) & (x <= high)))


def _wrap(x: np.ndarray, width: int) -> np.ndarray:
    """The signed value of the low ``width`` bits (two's complement), for width < 64."""
    if width >= 64:
        return x
    mask = (1 << width) - 1
    x = x & mask
    return np.where(x >> (width - 1) != 0, x - (1 << width), x)


def _unsigned(x: np.ndarray, width: int) -> np.ndarray:
    if width >= 64:
        if np.any(x < 0):
            raise Undetermined("64-bit unsigned arithmetic beyond 2^63")
        return x
    return x & ((1 << width) - 1)


_SMALL = 1 << 31  # 64-bit operands are kept below this so sums and products are exact in int64


def _exact(op: str, a: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    """add/sub/mul without overflow at ``width`` bits; overflow is undetermined (it would be
    poison with nsw/nuw, a wrap otherwise, and an index map that overflows is no index map)."""
    if width >= 64 and (np.any(np.abs(a) >= _SMALL) or np.any(np.abs(b) >= _SMALL)):
        raise Undetermined("64-bit index arithmetic on values beyond 2^31")
    result = a + b if op == "arith.addi" else a - b if op == "arith.subi" else a * b
    if not _fits(result, width):
        raise Undetermined(f"{op} overflows i{width}")
    return result


def _nonzero_divisor(b: np.ndarray) -> None:
    if np.any(b == 0):
        raise Undetermined("division by zero in the index map")


def _evaluate(program: _Program, coords: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The returned block indices at every grid point (arrays broadcast to ``coords``' length)."""
    if program.problem is not None:
        raise Undetermined(program.problem)
    values: dict[int, np.ndarray] = {}
    for slot, width, column in zip(program.inputs, program.input_widths, coords, strict=True):
        if not _fits(column, width):
            raise Undetermined(f"grid index does not fit i{width}")
        values[slot] = column.astype(np.int64, copy=False)
    for step in program.steps:
        op, width = step.op, step.widths[0]
        args = [values[o] for o in step.operands]
        if op == "arith.constant":
            result: np.ndarray | np.int64 = np.int64(step.value)
        elif op == "arith.select":
            result = np.where(args[0] != 0, args[1], args[2])
        elif op in ("arith.addi", "arith.subi", "arith.muli"):
            result = _exact(op, args[0], args[1], width)
        elif op in _CASTS:
            result = _cast(op, args[0], step.widths[1], width)
        elif op == "arith.cmpi":
            result = _compare(step.predicate, args[0], args[1], step.widths[1])
        else:
            result = _binary(op, args[0], args[1], width)
        values[step.result] = np.asarray(result, dtype=np.int64)
    size = len(coords[0]) if coords else 1
    return [np.broadcast_to(values[slot], (size,)) for slot in program.outputs]


def _cast(op: str, x: np.ndarray, width_in: int, width_out: int) -> np.ndarray:
    if op in ("arith.extui", "arith.index_castui") and width_out > width_in:
        return _unsigned(x, width_in)
    if width_out >= width_in:
        return x  # sign extension keeps the signed value
    return _wrap(x, width_out)  # truncation


def _compare(predicate: int, a: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    if predicate >= 6:  # ult ule ugt uge
        a, b = _unsigned(a, width), _unsigned(b, width)
    test = (
        a == b,
        a != b,
        a < b,
        a <= b,
        a > b,
        a >= b,
        a < b,
        a <= b,
        a > b,
        a >= b,
    )[predicate]
    return np.where(test, -1, 0)  # i1 true is -1 as a signed value


def _binary(op: str, a: np.ndarray, b: np.ndarray, width: int) -> np.ndarray:
    minimum = -(1 << (width - 1)) if width < 64 else -(1 << 63)
    if op in ("arith.divsi", "arith.remsi", "arith.floordivsi", "arith.ceildivsi"):
        _nonzero_divisor(b)
        if op != "arith.remsi" and np.any((a == minimum) & (b == -1)):
            raise Undetermined(f"{op} overflows i{width}")
        if op == "arith.remsi":
            return np.fmod(a, b)
        if op == "arith.divsi":
            return (a - np.fmod(a, b)) // b  # exact division: truncation toward zero
        floor = a // b
        if op == "arith.floordivsi":
            return floor
        return floor + (a - floor * b != 0)  # ceildivsi
    if op in ("arith.divui", "arith.remui", "arith.ceildivui"):
        ua, ub = _unsigned(a, width), _unsigned(b, width)
        _nonzero_divisor(ub)
        if op == "arith.remui":
            return _wrap(ua % ub, width)
        quotient = ua // ub
        if op == "arith.ceildivui":
            quotient = quotient + (ua % ub != 0)
        return _wrap(quotient, width)
    if op == "arith.minsi":
        return np.minimum(a, b)
    if op == "arith.maxsi":
        return np.maximum(a, b)
    if op in ("arith.minui", "arith.maxui"):
        ua, ub = _unsigned(a, width), _unsigned(b, width)
        pick = np.minimum(ua, ub) if op == "arith.minui" else np.maximum(ua, ub)
        return _wrap(pick, width)
    if op == "arith.andi":
        return a & b
    if op == "arith.ori":
        return a | b
    if op == "arith.xori":
        return a ^ b
    # shifts: an amount of ``width`` or more is poison
    amount = _unsigned(b, width)
    if np.any(amount >= width):
        raise Undetermined(f"{op} by {width} bits or more")
    if op == "arith.shrsi":
        return a >> amount
    if op == "arith.shrui":
        return _wrap(_unsigned(a, width) >> amount, width)
    if width >= 64 and (np.any(np.abs(a) >= _SMALL) or np.any(amount >= 31)):
        raise Undetermined("64-bit shift beyond 2^62")
    return _wrap(a << amount, width)  # shli wraps


# ------------------------------------------------------------------------------------------------
# Revisits on the grid


@dataclass
class _Revisits:
    varies_along: list[int]
    revisit_axes: list[int]
    examples: dict[int, list[list[int]]]  # axis -> two points writing one block
    reentry: list[list[int]] | None  # [visit, other block, re-entry]


def _points(coords: np.ndarray, *indices: int) -> list[list[int]]:
    return [[int(v) for v in coords[:, i]] for i in indices]


def _revisits(keys: list[np.ndarray], coords: np.ndarray, shape: Sequence[int]) -> _Revisits:
    """Exact revisit facts of a block-index function tabulated over a (shrunk) grid in order."""
    n_axes, size = coords.shape
    if keys:
        table = np.stack(keys)
        order = np.lexsort(table[::-1])  # stable: a group's members stay in iteration order
        ordered = table[:, order]
        new = np.ones(size, dtype=bool)
        new[1:] = np.any(ordered[:, 1:] != ordered[:, :-1], axis=0)
    else:  # a rank-0 block: one block for every grid point
        order = np.arange(size)
        new = np.zeros(size, dtype=bool)
        new[0] = True
    block = np.empty(size, dtype=np.int64)
    block[order] = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], size)

    varies = [
        axis
        for axis in range(n_axes)
        if shape[axis] > 1 and any(np.any(np.diff(k.reshape(shape), axis=axis) != 0) for k in keys)
    ]
    revisit_axes: list[int] = []
    examples: dict[int, list[list[int]]] = {}
    for axis in range(n_axes):
        if shape[axis] < 2:
            continue
        column = coords[axis, order]
        spread = np.maximum.reduceat(column, starts) != np.minimum.reduceat(column, starts)
        if not np.any(spread):
            continue
        revisit_axes.append(axis)
        group = int(np.argmax(spread))
        members = order[starts[group] : ends[group]]
        first = int(members[0])
        other = int(members[int(np.argmax(coords[axis, members] != coords[axis, first]))])
        examples[axis] = _points(coords, first, other)

    reentry = None
    run_starts = np.concatenate(([0], np.flatnonzero(block[1:] != block[:-1]) + 1))
    if len(run_starts) > len(starts):
        run_blocks = block[run_starts]
        _, first_run = np.unique(run_blocks, return_index=True)
        again = first_run[run_blocks] < np.arange(len(run_blocks))
        run = int(np.argmax(again))
        earlier = int(np.flatnonzero(run_blocks[:run] == run_blocks[run])[-1])
        left = int(run_starts[earlier + 1]) - 1
        reentry = _points(coords, left, left + 1, int(run_starts[run]))
    return _Revisits(varies, revisit_axes, examples, reentry)


# ------------------------------------------------------------------------------------------------
# Kernels


@dataclass
class _Window:
    operand: int
    block_shape: list[int]
    transform: str | None  # symbol of the index map; None: not blocked (ANY/HBM/semaphore)
    element: bool
    revisit_mode: str


def _windows(kernel: Any) -> list[_Window]:
    ir = _ir()
    attributes = kernel.attributes
    if "window_params" not in attributes:
        return []
    windows = []
    for number, entry in enumerate(ir.ArrayAttr(attributes["window_params"])):
        params = ir.DictAttr(entry)
        transform = None
        if "transform_indices" in params:
            transform = ir.FlatSymbolRefAttr(params["transform_indices"]).value
        shape = _i64_array(params["window_bounds"]) if "window_bounds" in params else []
        mode = "immediate"
        if "revisit_mode" in params:
            match = _REVISIT.fullmatch(str(params["revisit_mode"]))
            if match is None:
                raise Undetermined(f"revisit mode {str(params['revisit_mode'])[:60]}")
            mode = match.group(1)
        windows.append(_Window(number, shape, transform, "window_kind" in params, mode))
    return windows


def _semantics(kernel: Any, n_axes: int) -> list[str] | None:
    if "dimension_semantics" not in kernel.attributes:
        return None
    ir = _ir()
    attr = kernel.attributes["dimension_semantics"]
    if not isinstance(attr, ir.ArrayAttr):
        return None
    matches = [_SEMANTIC.fullmatch(str(element)) for element in ir.ArrayAttr(attr)]
    if len(matches) != n_axes or not all(matches):
        return None
    return [match.group(1) for match in matches if match]  # all matched (checked above)


def _function_arg_count(func: Any) -> int:
    blocks = [block for region in func.regions for block in region.blocks]
    return len(list(blocks[0].arguments)) if blocks else -1


class _Analysis:
    def __init__(self, semantics: Semantics, max_points: int) -> None:
        self.semantics = semantics
        self.max_points = max_points
        self.report = GridReport(semantics=semantics)

    def undetermined(self, kernel: int | None, output: int | None, reason: str) -> None:
        self.report.undetermined.append({"kernel": kernel, "output": output, "reason": reason})

    def kernel(self, index: int, call: Any, context: Any) -> None:
        ir = _ir()
        label = call.attributes.get("kernel_name")
        name = ir.StringAttr(label).value if isinstance(label, ir.StringAttr) else ""
        _module, kernel, functions = _kernel_function(call, context)  # _module: keeps them alive
        name = name or ir.StringAttr(kernel.attributes["sym_name"]).value
        grid = (
            _i64_array(kernel.attributes["iteration_bounds"])
            if ("iteration_bounds" in kernel.attributes)
            else []
        )
        if any(b == _DYNAMIC or b < 0 for b in grid):
            # A grid bound computed at run time (megablox gmm's tile count, from its group
            # sizes): which grid points exist, and so which blocks are written, depends on
            # values the artifact does not hold. Undetermined, never certified: a certificate
            # for a target says every grid point keeps the target's rules.
            shown = ", ".join("?" if b == _DYNAMIC or b < 0 else str(b) for b in grid)
            raise Undetermined(
                f"dynamic grid [{shown}]: the grid's size is computed at run time from "
                "scalar-prefetch values; the engine cannot enumerate which blocks each grid "
                "point writes"
            )
        if any(b >= 1 << 31 for b in grid):
            raise Undetermined(f"grid {grid} beyond i32 indices")
        semantics = _semantics(kernel, len(grid))
        prefetch = _int_attr(kernel.attributes, "scalar_prefetch") or 0
        scratch = _int_attr(kernel.attributes, "scratch_operands") or 0
        windows = _windows(kernel)
        operands = len(list(call.operands))
        n_out = _result_count(call)
        n_in = operands - prefetch
        summary = KernelSummary(index, name, grid, semantics, prefetch, n_in)
        self.report.kernels.append(summary)
        if math.prod(grid) <= 1:
            return  # one program (or none): nothing is revisited
        if (
            len(windows) != n_in + n_out
            or _function_arg_count(kernel) != len(grid) + prefetch + len(windows) + scratch
        ):
            raise Undetermined(
                f"{len(windows)} windows for {n_in} inputs and {n_out} outputs: cannot tell "
                "which are outputs"
            )
        if self.semantics == "tpu" and semantics is None:
            raise Undetermined("no dimension_semantics matching the grid")
        if semantics is not None:
            unknown = sorted(set(semantics) - set(KNOWN_SEMANTICS))
            if unknown and self.semantics == "tpu":
                raise Undetermined(f"unknown dimension semantics {unknown}")
        unused = _unused_outputs(call, n_out)
        for output, window in enumerate(windows[n_in:]):
            try:
                self.output(summary, output, window, functions, output in unused)
            except Undetermined as error:
                self.undetermined(index, output, str(error))
        if self.semantics == "gpu":
            for operand, output in _aliases(call):
                try:
                    self.aliased_read(summary, operand - prefetch, output, windows, functions)
                except Undetermined as error:
                    self.undetermined(index, output, str(error))
        if self.semantics == "gpu" and scratch:
            # TPU keeps scratch across grid steps, so kernels carry state in it; GPU programs
            # each get their own, and run concurrently: whether this one carries cannot be read
            # from the index maps (tests/forgeries/target_gpu_scratch_carry.py).
            self.undetermined(
                index,
                None,
                f"{scratch} scratch operand(s) on a grid of {math.prod(grid)} programs: state "
                "carried in scratch between grid points is lost on a GPU",
            )

    def aliased_read(
        self,
        kernel: KernelSummary,
        source: int,
        output: int,
        windows: list[_Window],
        functions: dict[str, Any],
    ) -> None:
        """Under ``gpu``: does a grid point read a block of an input aliased to an output that
        *another* grid point writes? The output's index map alone cannot say: each block may be
        written once and still be read, concurrently, by its neighbour
        (``tests/forgeries/target_alias_neighbour.py``)."""
        n_in = kernel.inputs
        if not 0 <= source < n_in or output >= len(windows) - n_in:
            raise Undetermined(f"aliased operand {source + kernel.scalar_prefetch} is not a block")
        read, written = windows[source], windows[n_in + output]
        if read.transform is None or written.transform is None:
            raise Undetermined(f"input {source}, aliased to output {output}, is not blocked")
        if read.element or written.element:
            raise Undetermined(f"input {source}, aliased to output {output}, is an element window")
        if len(read.block_shape) != len(written.block_shape):
            raise Undetermined(f"input {source} and its aliased output {output} differ in rank")
        grid = kernel.grid
        points = math.prod(grid)
        if points > MAX_ALIAS_POINTS:
            raise Undetermined(
                f"{points} grid points to compare the reads of input {source} with the writes of "
                f"its aliased output {output} (limit {MAX_ALIAS_POINTS})"
            )
        coords = np.indices(grid, dtype=np.int64).reshape(len(grid), -1)
        regions = []
        for window in (read, written):
            if window.transform not in functions:
                raise Undetermined(f"index map @{window.transform} not in the module")
            blocks = _evaluate(_compile(functions[window.transform], len(grid)), list(coords))
            starts = (
                np.stack(
                    [
                        np.broadcast_to(b, (points,)) * size
                        for b, size in zip(blocks, window.block_shape, strict=True)
                    ]
                )
                if blocks
                else np.zeros((0, points), dtype=np.int64)
            )
            sizes = np.array(window.block_shape, dtype=np.int64).reshape(-1, 1)
            regions.append((starts, starts + sizes))
        (read_lo, read_hi), (write_lo, write_hi) = regions
        for p in range(points):  # the point that reads, against every point that writes
            overlap = np.all(
                (read_lo[:, p : p + 1] < write_hi) & (write_lo < read_hi[:, p : p + 1]), axis=0
            )
            overlap[p] = False  # a program may read the block it writes
            writers = np.flatnonzero(overlap)
            if writers.size == 0:
                continue
            reader, writer = _points(coords, p, int(writers[0]))
            axes = [a for a, (x, y) in enumerate(zip(reader, writer, strict=True)) if x != y]
            self.report.findings.append(
                Finding(
                    "aliased_read_race",
                    kernel.kernel,
                    kernel.name,
                    output,
                    axes,
                    [reader, writer],
                    f"input {source} of kernel {kernel.name!r} is aliased to output {output}: "
                    f"grid point {reader} reads the block that grid point {writer} writes; GPU "
                    "grid programs run concurrently, so this is a race. Read only the block a "
                    "program writes, or write into a fresh output.",
                )
            )
            return

    def output(
        self,
        kernel: KernelSummary,
        output: int,
        window: _Window,
        functions: dict[str, Any],
        unused: bool = False,
    ) -> None:
        summary = OutputSummary(
            output, window.block_shape, [], None, None, window.revisit_mode, "none", 0, unused
        )
        kernel.outputs.append(summary)
        if window.transform is None:
            raise Undetermined(
                "not blocked (memory space ANY/HBM): the kernel writes it by DMA, which the "
                "index maps do not say"
            )
        if window.transform not in functions:
            raise Undetermined(f"index map @{window.transform} not in the module")
        grid = kernel.grid
        program = _compile(functions[window.transform], len(grid))
        summary.depends_on = [sorted(d) for d in program.deps]
        if window.element:
            raise Undetermined("element window (pl.Element): offsets, not block indices")
        if program.problem is not None:
            raise Undetermined(f"index map {program.problem}")
        read = set().union(*program.deps) if program.deps else set()
        shrunk = [size if axis in read else min(size, 2) for axis, size in enumerate(grid)]
        points = math.prod(shrunk)
        if points <= self.max_points:
            coords = np.indices(shrunk, dtype=np.int64).reshape(len(grid), -1)
            facts = _revisits(_evaluate(program, list(coords)), coords, shrunk)
            summary.analysis, summary.points = "exhaustive", points
            summary.varies_along, summary.revisit_axes = facts.varies_along, facts.revisit_axes
            self.judge(kernel, output, window, facts, unused)
            return
        # Too many points: per-axis facts only. An unread axis is revisited for certain.
        unread = [axis for axis, size in enumerate(grid) if size > 1 and axis not in read]
        examples = {}
        for axis in unread:
            other = [0] * len(grid)
            other[axis] = 1
            examples[axis] = [[0] * len(grid), other]
        reentry, evaluated = self.witness(program, grid, unread, read)
        summary.analysis, summary.points = "per_axis", evaluated
        summary.revisit_axes = unread
        self.judge(kernel, output, window, _Revisits([], unread, examples, reentry), unused)
        self.undetermined(
            kernel.kernel,
            output,
            f"{points} grid points to enumerate (limit {self.max_points}): only revisits along "
            f"axes the index map does not read ({unread}) are known",
        )

    def witness(
        self, program: _Program, grid: list[int], unread: list[int], read: set[int]
    ) -> tuple[list[list[int]] | None, int]:
        """A re-entry shown by three points: the block at the origin changes along a read axis d
        that comes after an unread axis u, so it is left within u = 0 and re-entered at u = 1."""
        evaluated = 0
        if self.semantics != "tpu" or not unread:
            return None, evaluated
        for axis in sorted(read):
            if grid[axis] < 2 or axis < min(unread):
                continue
            origin = [0] * len(grid)
            step = list(origin)
            step[axis] = 1
            columns = [np.array([o, s], dtype=np.int64) for o, s in zip(origin, step, strict=True)]
            evaluated += 2
            try:
                first, second = zip(*(v.tolist() for v in _evaluate(program, columns)), strict=True)
            except Undetermined:
                continue
            if first != second:
                again = list(origin)
                again[max(u for u in unread if u < axis)] = 1
                return [origin, step, again], evaluated
        return None, evaluated

    def judge(
        self,
        kernel: KernelSummary,
        output: int,
        window: _Window,
        facts: _Revisits,
        unused: bool = False,
    ) -> None:
        name, index = kernel.name, kernel.kernel
        axes = facts.revisit_axes
        if self.semantics == "gpu":
            if axes:
                self.report.findings.append(
                    Finding(
                        "grid_race",
                        index,
                        name,
                        output,
                        axes,
                        facts.examples[axes[0]],
                        f"output {output} of kernel {name!r}: one block is written by several "
                        f"grid points along axis {_list(axes)}; GPU grid programs run "
                        "concurrently, so this is a race. Reduce inside one program with a loop "
                        "(e.g. lax.fori_loop over K) instead of across the grid.",
                    )
                )
            return
        semantics = kernel.dimension_semantics or []
        parallel = [a for a in axes if semantics[a] in PARALLEL_KINDS]
        if parallel and unused:
            self.report.notes.append(
                f"output {output} of kernel {name!r} revisits one block along grid axis "
                f"{_list(parallel)} declared parallel, but nothing uses that output (the "
                "program discards it), so its revisits are no race on the result"
            )
        elif parallel:
            declared = ", ".join(f"{a}: {semantics[a]}" for a in parallel)
            self.report.findings.append(
                Finding(
                    "parallel_revisit",
                    index,
                    name,
                    output,
                    parallel,
                    facts.examples[parallel[0]],
                    f"output {output} of kernel {name!r} revisits one block along grid axis "
                    f"{_list(parallel)} declared parallel ({declared}); TPU may split a parallel "
                    "axis across cores or reorder it. Declare it 'arbitrary' in "
                    "dimension_semantics.",
                )
            )
        if facts.reentry is not None and window.revisit_mode != "any":
            visit, _, again = facts.reentry
            moved = [a for a, (x, y) in enumerate(zip(visit, again, strict=True)) if x != y]
            self.report.findings.append(
                Finding(
                    "nonconsecutive_revisit",
                    index,
                    name,
                    output,
                    moved,
                    facts.reentry,
                    f"output {output} of kernel {name!r}: a block is left at grid point {visit} "
                    f"and written again at {again} (axis {_list(moved)}); TPU writes a block "
                    "back when it is left and does not read it again. Put the revisiting "
                    "(reduction) axis last in the grid.",
                )
            )


def _list(axes: Sequence[int]) -> str:
    return ", ".join(map(str, axes))


def grid_findings(
    artifact: Any, semantics: Semantics, *, max_points: int = MAX_POINTS
) -> GridReport:
    """Grid findings for every kernel in an exported artifact (``jax.export.Exported``) or its
    StableHLO text, under ``gpu`` or ``tpu`` grid semantics. Never raises on what the artifact
    holds: what cannot be read or evaluated is listed in ``undetermined``."""
    if semantics not in ("gpu", "tpu"):
        raise ValueError(f"semantics must be 'gpu' or 'tpu', not {semantics!r}")
    analysis = _Analysis(semantics, max_points)
    ir = _ir()
    context = _context()
    text = _stablehlo_text(artifact)
    try:
        with context:
            module = ir.Module.parse(text)
    except Exception as error:
        analysis.undetermined(None, None, f"artifact does not parse: {str(error)[:300]}")
        return analysis.report
    calls = 0
    for op in _walk(module.operation):
        if _name(op) != "stablehlo.custom_call":
            continue
        target_attr = op.attributes.get("call_target_name")
        target = ir.StringAttr(target_attr).value if isinstance(target_attr, ir.StringAttr) else ""
        if target in GPU_TARGETS:
            analysis.undetermined(
                calls, None, f"{target}: only Mosaic TPU kernels carry their grid and index maps"
            )
            calls += 1
            continue
        if target != MOSAIC_TARGET:
            continue
        if calls >= MAX_KERNELS:
            analysis.undetermined(None, None, f"more than {MAX_KERNELS} kernels")
            break
        try:
            analysis.kernel(calls, op, context)
        except Undetermined as error:
            analysis.undetermined(calls, None, str(error))
        except Exception as error:  # a malformed module the checks above did not foresee
            reason = f"cannot read the kernel: {type(error).__name__}: {str(error)[:300]}"
            analysis.undetermined(calls, None, reason)
        calls += 1
    if calls == 0:
        analysis.undetermined(None, None, "no Mosaic TPU kernel (tpu_custom_call) in the artifact")
    return analysis.report


# ------------------------------------------------------------------------------------------------
# What each kernel keeps in memory (read by ``nearmiss.engine.targets.vmem``)


@dataclass
class KernelBuffers:
    """One Mosaic kernel's buffers as its kernel function declares them: MLIR memref types
    (``memref<128x256xbf16, #tpu.memory_space<vmem>>``)."""

    name: str
    grid: list[int]
    windows: list[tuple[str, bool]]  # (memref type, blocked: has an index map, so pipelined)
    scratch: list[str]
    scoped_limit: int | None  # the kernel's ``vmem_limit_bytes``, where it set one


def kernel_buffers(artifact: Any) -> list[KernelBuffers]:
    """Every Mosaic kernel's buffers in an exported artifact (or its StableHLO text). Raises
    ``Undetermined`` on what it cannot read: an estimate is never made of a guess."""
    ir = _ir()
    context = _context()
    with context:
        module = ir.Module.parse(_stablehlo_text(artifact))
    kernels: list[KernelBuffers] = []
    for call in _walk(module.operation):
        if _name(call) != "stablehlo.custom_call":
            continue
        target = call.attributes.get("call_target_name")
        if not isinstance(target, ir.StringAttr) or target.value != MOSAIC_TARGET:
            continue
        if len(kernels) >= MAX_KERNELS:
            raise Undetermined(f"more than {MAX_KERNELS} kernels")
        _module, kernel, _ = _kernel_function(call, context)  # _module: keeps kernel alive
        grid = (
            _i64_array(kernel.attributes["iteration_bounds"])
            if "iteration_bounds" in kernel.attributes
            else []
        )
        prefetch = _int_attr(kernel.attributes, "scalar_prefetch") or 0
        scratch = _int_attr(kernel.attributes, "scratch_operands") or 0
        windows = _windows(kernel)
        blocks = [block for region in kernel.regions for block in region.blocks]
        types = [str(argument.type) for argument in blocks[0].arguments] if blocks else []
        start = len(grid) + prefetch
        if len(types) != start + len(windows) + scratch:
            raise Undetermined(
                f"{len(types)} kernel arguments for a grid of {len(grid)} axes, {prefetch} "
                f"scalar-prefetch, {len(windows)} windows and {scratch} scratch operands"
            )
        kernels.append(
            KernelBuffers(
                name=ir.StringAttr(kernel.attributes["sym_name"]).value,
                grid=grid,
                windows=[
                    (types[start + i], window.transform is not None)
                    for i, window in enumerate(windows)
                ],
                scratch=types[start + len(windows) :],
                scoped_limit=_scoped_vmem_limit(call),
            )
        )
    return kernels


def _scoped_vmem_limit(call: Any) -> int | None:
    """``vmem_limit_bytes`` as Pallas passes it to Mosaic: the backend config's scoped memory
    configuration for memory space 1 (VMEM)."""
    ir = _ir()
    config_attr = call.attributes.get("backend_config")
    if not isinstance(config_attr, ir.StringAttr):
        return None
    try:
        config = json.loads(config_attr.value_bytes)
    except ValueError:
        return None
    for entry in config.get("scoped_memory_configs") or []:
        if isinstance(entry, dict) and entry.get("memory_space") == 1:
            size = entry.get("size")
            return size if isinstance(size, int) and size > 0 else None
    return None
