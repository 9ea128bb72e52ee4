"""What a compiled computation does, measured on its StableHLO: the facts the dynamic rules need.

The audit reads the *artifact* — the StableHLO module that the executor child compiles and runs
to produce the compared outputs — never anything the candidate's Python reports about itself. It
runs in trusted children only: on the candidate's exported artifact in the executor child, and on
the reference's lowering in the reference child (the yardstick). It returns plain JSON-able
dicts and decides nothing: the engine validates what comes back and applies the rules
(``integrity.dynamic``).

Kernels. Where JAX lowers a pallas_call to a device kernel it is a ``custom_call`` with a kernel
target (Mosaic TPU, Triton, Mosaic GPU). In CPU interpret mode the kernel becomes ordinary HLO, so
the candidate child puts every pallas_call in a function labelled with the check's label
(``check_label``: ``KERNEL_LABEL`` and a suffix drawn per check; ``runner.traced_program``); a
labelled function counts as a kernel only if it has the shape interpret mode gives one — a grid
loop at its top — or holds a kernel custom_call. The work inside kernels
is the kernel's own and is not counted.

Work is counted in element operations, a FLOP-like unit: a matmul costs 2·M·N·K, a
transcendental one per element, elementwise arithmetic one per output element, layout glue
nothing, a library call (LAPACK, cuSOLVER, FFT) the flops it does on its operands' shapes, and an
op that applies a region per element (reduce, scatter, sort, reduce_window, map...) the region's
cost times the number of times it runs (``integrity.pricing`` holds the formulas). Every region
and called function is walked: calls and composites (whose ``decomposition`` function XLA
inlines and runs) are entered, ``case``/``if`` count their costliest branch, and a ``while``
counts its body times its trip count when the loop has the counted form that ``scan`` and
``fori_loop`` lower to.

Two kinds of work cannot be bounded, and are reported as ``unbounded`` rather than counted: a
loop outside a kernel of unknown trip count (with its work per iteration: it can do as much work
as the data asks of it), and an op the audit cannot price (kind ``unpriced``: an unknown op, a
custom call with no formula, a dynamic shape). Default deny: what cannot be priced counts
against the candidate, never for it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from nearmiss.engine.integrity import pricing
from nearmiss.engine.integrity.pricing import attr as _attr
from nearmiss.engine.integrity.pricing import kind_of as _kind
from nearmiss.engine.integrity.pricing import shape as _shape

# The name the candidate child gives each pallas_call's function (runner.traced_program); a
# check draws its own suffix (``check_label``).
KERNEL_LABEL = "nearmiss_pallas_kernel"
ALIAS_MARK = "__alias_"  # KERNEL_LABEL__alias_0_0: operand 0 written in place as output 0

KERNEL_TARGETS = ("tpu_custom_call", "__gpu$xla.gpu.triton", "mosaic_gpu", "triton_kernel_call")
CALLBACK_TARGETS = (
    "xla_python_cpu_callback",
    "xla_ffi_python_cpu_callback",
    "xla_ffi_partitioned_python_cpu_callback",
    "xla_python_gpu_callback",
    "xla_ffi_python_gpu_callback",
    "xla_ffi_partitioned_python_gpu_callback",
)
# The traced primitives behind those calls (JAX refuses to export them; the tracing child names
# them so the engine can say why there is no artifact).
CALLBACK_PRIMITIVES = frozenset(
    {"pure_callback", "io_callback", "debug_callback", "callback", "outside_call"}
)
GLUE_TARGETS = ("Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape")
# Custom calls an executor may run: kernels, sharding marks, and XLA's own numerical libraries
# (heavy work, counted as such). Anything else is refused: its meaning is unknown.
RUNNABLE_TARGET_PREFIXES = (*KERNEL_TARGETS, *GLUE_TARGETS, "lapack_", "ducc_", "cu_", "hip")

# Limits on a hostile artifact: how deep calls and regions may nest, how many ops are walked.
MAX_DEPTH = 64
MAX_OPS = 500_000
TOP_LISTED = 8

_WHERE = re.compile(r'"([^"]+?\.py)":(\d+)')
_INT = re.compile(r"dense<(-?\d+)>")
# Ops whose one region runs once, where they stand (Shardy's per-device body).
WALKED_ONCE = frozenset({"sdy.manual_computation", "sdy.named_computation"})
ORDER = {"unpriced": 0, "heavy": 1, "light": 2}  # how found work is listed: unbounded first


def check_label() -> str:
    """A kernel label for one check: ``KERNEL_LABEL`` and a suffix drawn now, after nothing of
    the candidate's has run. The name was a constant, and a candidate that named its own jitted
    XLA like that, with a loop at its top, passed it off as a kernel (found 2026-12-05 by an
    attack review): its trace cannot name what is drawn after it, and the name reaches the
    candidate's child only in the request, never where its code runs."""
    import secrets

    return f"{KERNEL_LABEL}_{secrets.token_hex(8)}"


def requested_label(value: object) -> str:
    """The label a child was told to use (a request's ``label``), or ``KERNEL_LABEL`` where it
    names none that ``check_label`` could have drawn."""
    if isinstance(value, str) and value.startswith(KERNEL_LABEL) and value.isidentifier():
        return value
    return KERNEL_LABEL


class AuditError(Exception):
    """The artifact could not be audited (malformed, too big, too deep)."""


def _ir():
    from jax._src.lib.mlir import ir

    return ir


def _pretty(value_type: Any) -> str:
    """'f32[64,256]' for 'tensor<64x256xf32>', as JAX prints avals; other types as they are."""
    text = str(value_type)
    shape = _shape(value_type)
    if shape is None:
        return text[:200]
    element = text[len("tensor<") : text.rindex(">")].split("x", len(shape))[-1]
    return f"{element}[{','.join(map(str, shape))}]"


def _where(op: Any) -> str:
    """'file.py:12' of the user code that emitted an op (its MLIR location), '' when unknown."""
    for path, line in _WHERE.findall(str(op.location)):
        if "/site-packages/" in path or "/nearmiss/" in path:
            continue
        return f"{path.rsplit('/', 1)[-1]}:{line}"
    return ""


def _int_constant(value: Any) -> int | None:
    owner = value.owner
    if _kind(owner) != "stablehlo.constant":
        return None
    match = _INT.match(_attr(owner, "value"))
    return int(match.group(1)) if match else None


def _block_arg(value: Any, block: Any) -> int | None:
    """The argument number when ``value`` is an argument of ``block``."""
    ir = _ir()
    if isinstance(value.owner, ir.Block) and value.owner == block:
        return ir.BlockArgument(value).arg_number
    return None


def _trip_count(loop: Any) -> int | None:
    """Iterations of a counted while loop (i = c0; i < c1; i += 1), None when not that form."""
    cond, body = (region.blocks[0] for region in loop.regions)
    ops = list(cond.operations)
    if not ops or _kind(ops[-1]) != "stablehlo.return":
        return None
    compare = ops[-1].operands[0].owner
    if _kind(compare) != "stablehlo.compare" or "LT" not in _attr(compare, "comparison_direction"):
        return None
    counter = _block_arg(compare.operands[0], cond)
    bound = _int_constant(compare.operands[1])
    if counter is None or bound is None:
        return None
    start = _int_constant(loop.operands[counter])
    body_ops = list(body.operations)
    step = body_ops[-1].operands[counter].owner if body_ops else None
    if start is None or step is None or _kind(step) != "stablehlo.add":
        return None
    operands = list(step.operands)
    steps = [_int_constant(v) for v in operands]
    args = [_block_arg(v, body) for v in operands]
    if counter not in args or 1 not in steps:
        return None
    return max(bound - start, 0)


class _Walker:
    """Walks a module from ``main``, entering calls and regions, tallying work by place."""

    def __init__(
        self,
        module: Any,
        count_kernels: bool,
        compiled_only: bool = False,
        label: str = KERNEL_LABEL,
    ) -> None:
        self.compiled_only = compiled_only
        self.label = label
        self.interpreted = 0  # labelled functions in interpret mode's form, where not kernels
        self.functions = {}
        for op in module.body.operations:
            if _kind(op) == "func.func":
                self.functions[_attr(op, "sym_name").strip('"')] = op
        if "main" not in self.functions:
            raise AuditError("the module has no main function")
        self.count_kernels = count_kernels
        self.ops = 0
        self.kernels = 0
        self.heavy = self.light = 0
        self.costly: dict[tuple[str, str, str, str], int] = {}
        self.unbounded: dict[tuple[str, str, str, str], int] = {}
        self.callbacks: list[dict[str, Any]] = []
        self.custom_targets: set[str] = set()
        self.aliased: list[dict[str, Any]] = []
        self.main = self.functions["main"]
        self._block: Any = None  # the entry block of the function being walked

    # -- kernels -------------------------------------------------------------------------------
    def _is_kernel_function(self, name: str) -> bool:
        if not name.startswith(self.label) or name not in self.functions:
            return False
        top = list(self.functions[name].regions[0].blocks[0].operations)
        interpreted = any(_kind(op) == "stablehlo.while" for op in top)
        if interpreted and not self.compiled_only:
            return True
        compiled = any(
            _kind(op) == "stablehlo.custom_call"
            and _attr(op, "call_target_name").strip('"').startswith(KERNEL_TARGETS)
            for op in self._all_ops(self.functions[name], 0)
        )
        if interpreted and not compiled:
            self.interpreted += 1  # on a device: plain XLA, whatever the label says
        return compiled

    def _all_ops(self, op: Any, depth: int):
        if depth > MAX_DEPTH:
            raise AuditError("regions nest too deeply")
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    self.ops += 1
                    if self.ops > MAX_OPS:
                        raise AuditError(f"more than {MAX_OPS} operations")
                    yield inner
                    yield from self._all_ops(inner, depth + 1)

    def _enter_kernel(self, call: Any, name: str, inputs: dict[int, int]) -> None:
        """A kernel: its work is its own; callbacks inside it and in-place writes still count."""
        self.kernels += 1
        for op in self._all_ops(self.functions[name], 0):
            if _kind(op) == "stablehlo.custom_call":
                self._custom_call(op, times=0)
        # KERNEL_LABEL__alias_I_O: the kernel writes its operand I in place. That is a finding
        # when operand I is one of the caller's own inputs.
        for pair in name.split(ALIAS_MARK)[1:]:
            operand = pair.split("_")[0]
            if not operand.isdigit() or int(operand) >= len(call.operands):
                continue
            arg = self._arg_of(call.operands[int(operand)])
            if arg is not None and arg in inputs:
                self.aliased.append({"where": _where(call), "input": inputs[arg]})

    # -- the walk ------------------------------------------------------------------------------
    def _arg_of(self, value: Any) -> int | None:
        """The argument number when ``value`` is an argument of the function being walked."""
        return _block_arg(value, self._block)

    def walk_function(self, name: str, times: int | None, inputs: dict[int, int], depth: int):
        function = self.functions[name]
        block = function.regions[0].blocks[0]
        saved, self._block = self._block, block
        try:
            self._walk_block(block, times, inputs, depth)
        finally:
            self._block = saved

    def _walk_block(self, block: Any, times: int | None, inputs: dict[int, int], depth: int):
        if depth > MAX_DEPTH:
            raise AuditError("calls or regions nest too deeply")
        for op in block.operations:
            self.ops += 1
            if self.ops > MAX_OPS:
                raise AuditError(f"more than {MAX_OPS} operations")
            self._op(op, times, inputs, depth)

    def _op(self, op: Any, times: int | None, inputs: dict[int, int], depth: int) -> None:
        name = _kind(op)
        if name in ("func.call", "stablehlo.composite"):
            # A composite runs its decomposition function, which XLA inlines: it is a call.
            symbol = "callee" if name == "func.call" else "decomposition"
            self._call(op, _attr(op, symbol).lstrip("@").strip('"'), times, inputs, depth)
        elif name == "stablehlo.while":
            trips = _trip_count(op) if times is not None else None
            inner = None if trips is None or times is None else times * trips
            for region in op.regions:
                self._walk_block(region.blocks[0], inner, {}, depth + 1)
        elif name in ("stablehlo.case", "stablehlo.if"):
            self._costliest_branch(op, times, depth)
        elif name == "stablehlo.custom_call":
            self._custom_call(op, times)
        elif name in WALKED_ONCE:
            for region in op.regions:
                for block in region.blocks:
                    self._walk_block(block, times, {}, depth + 1)
        elif name in pricing.GLUE and not pricing.data_addressed(op):
            return
        elif pricing.is_dynamic(op):
            self._tally(op, "unpriced", 1, times)  # its sizes, and so its work, are unknown
        elif name in pricing.PER_ELEMENT:
            regions = self._region_costs(op, depth)
            if regions is None:  # a region that cannot be priced, run per element
                self._tally(op, "unpriced", 1, times)
            else:
                self._tally(op, *pricing.region_op_work(op, regions), times)
        elif len(op.regions):
            self._tally(op, "unpriced", 1, times)  # regions the audit does not know how to run
        else:
            self._tally(op, *pricing.op_work(op), times)

    def _call(self, op: Any, callee: str, times: int | None, inputs: dict[int, int], depth: int):
        """Enter a called function; one labelled as a kernel (and shaped like one) is not
        counted, unless the walk counts kernels."""
        if callee not in self.functions:
            raise AuditError(f"call of an unknown function {callee!r}")
        mapped = {}
        for index, operand in enumerate(op.operands):
            arg = self._arg_of(operand)
            if arg is not None and arg in inputs:
                mapped[index] = inputs[arg]
        if self._is_kernel_function(callee):
            self._enter_kernel(op, callee, inputs)
            if not self.count_kernels:
                return
        self.walk_function(callee, times, mapped, depth + 1)

    def _region_costs(self, op: Any, depth: int) -> list[tuple[int, int]] | None:
        """(heavy, light) work of one run of each of the op's regions; None when a region holds
        work that cannot be priced. A region runs per element, so everything in it is XLA's
        work, a kernel called from it included; host callbacks in it are still reported."""
        costs = []
        for region in op.regions:
            scratch = self.scratch()
            scratch.count_kernels = True
            for block in region.blocks:
                scratch._walk_block(block, 1, {}, depth + 1)
            self.ops = scratch.ops
            self.callbacks += scratch.callbacks
            self.custom_targets |= scratch.custom_targets
            if scratch.unbounded:
                return None
            costs.append((scratch.heavy, scratch.light))
        return costs

    def _costliest_branch(self, op: Any, times: int | None, depth: int) -> None:
        """Only one branch runs: count the costliest, each measured first on a scratch walker."""
        best, best_region = -1, None
        for region in op.regions:
            scratch = self.scratch()
            scratch._walk_block(region.blocks[0], 1, {}, depth + 1)
            self.ops = scratch.ops
            cost = scratch.heavy + scratch.light + (10**18 if scratch.unbounded else 0)
            if cost > best:
                best, best_region = cost, region
        if best_region is not None:
            self._walk_block(best_region.blocks[0], times, {}, depth + 1)

    def scratch(self) -> _Walker:
        """A walker over the same module with empty tallies (to price a branch)."""
        other = _Walker.__new__(_Walker)
        other.__dict__.update(self.__dict__)
        other.heavy = other.light = other.kernels = 0
        other.costly, other.unbounded = {}, {}
        other.callbacks, other.aliased, other.custom_targets = [], [], set()
        return other

    def _custom_call(self, op: Any, times: int | None) -> None:
        target = _attr(op, "call_target_name").strip('"')
        self.custom_targets.add(target)
        if target.startswith(KERNEL_TARGETS):
            self.kernels += 1
            if not self.count_kernels:
                return
        if target in CALLBACK_TARGETS:
            self.callbacks.append({"primitive": target, "where": _where(op)})
            return
        if times == 0 or target in GLUE_TARGETS:
            return
        if target.startswith(KERNEL_TARGETS):  # a kernel counted as work: its output, at least
            self._tally(op, "heavy", sum(pricing.size(r) for r in op.results), times)
        elif pricing.is_dynamic(op):
            self._tally(op, "unpriced", 1, times)
        else:
            self._tally(op, *pricing.custom_call_work(op, target), times)

    def _tally(self, op: Any, kind: str, work: int, times: int | None) -> None:
        """Count ``work`` ``times`` over; work that cannot be bounded (``unpriced``, or a loop's
        ``times`` unknown) is listed as unbounded instead, by its work per run."""
        if kind == "glue" or work == 0 or times == 0:
            return
        operand = _pretty(op.operands[0].type) if len(op.operands) else ""
        primitive = _kind(op).split(".", 1)[-1]
        if primitive == "custom_call":
            target = _attr(op, "call_target_name").strip('"')
            primitive = f"custom_call @{target}"
        key = (primitive[:80], kind, operand, _where(op))
        if times is None or kind == "unpriced":
            self.unbounded[key] = self.unbounded.get(key, 0) + work
            return
        work *= times
        if kind == "heavy":
            self.heavy += work
        else:
            self.light += work
        self.costly[key] = self.costly.get(key, 0) + work


def _ranked(groups: dict[tuple[str, str, str, str], int]) -> list[dict[str, Any]]:
    ranked = sorted(groups.items(), key=lambda item: (ORDER[item[0][1]], -item[1]))
    return [
        {"primitive": p, "kind": k, "operand": o, "where": w, "work": work}
        for (p, k, o, w), work in ranked[:TOP_LISTED]
    ]


def _walk(
    module: Any,
    count_kernels: bool,
    kept: tuple[int, ...] | None = None,
    compiled_only: bool = False,
    label: str = KERNEL_LABEL,
) -> _Walker:
    """Walk from ``main``; its argument i is the function's input ``kept[i]`` (JAX drops unused
    inputs from the module), input i when ``kept`` is None."""
    walker = _Walker(module, count_kernels, compiled_only, label)
    main_args = len(walker.main.regions[0].blocks[0].arguments)
    kept = tuple(range(main_args)) if kept is None else tuple(kept)
    if len(kept) != main_args:
        raise AuditError("the module's arguments do not match the function's inputs")
    walker.walk_function("main", 1, dict(enumerate(kept)), 0)
    return walker


def total_work(module: Any) -> int:
    """All the work a lowered function does, kernels included (the reference's yardstick)."""
    walker = _walk(module, count_kernels=True)
    return walker.heavy + walker.light


def audit_module(
    module: Any,
    kept: tuple[int, ...] | None = None,
    compiled_only: bool = False,
    label: str = KERNEL_LABEL,
) -> dict[str, Any]:
    """The facts about a candidate's artifact that the dynamic rules judge (``kept``: which
    inputs the module's arguments are, as ``Exported.module_kept_var_idx`` says; ``label``: the
    name the engine gave kernels' functions in this check, ``check_label``).

    ``compiled_only`` (an artifact run on a device): only a kernel custom_call is a kernel. The
    candidate's own process decides how it exports, so a candidate that makes itself believe it
    is on a CPU exports interpret mode's plain XLA, which would be "right on the GPU" without
    any GPU kernel in it; such functions are counted as ``interpreted`` and their work as XLA's.
    """
    walker = _walk(module, count_kernels=False, kept=kept, compiled_only=compiled_only, label=label)
    return {
        "pallas_calls": walker.kernels,
        "interpreted": walker.interpreted,
        "outside_heavy": walker.heavy,
        "outside_light": walker.light,
        "costliest": _ranked(walker.costly),
        "unbounded": _ranked(walker.unbounded),
        "callbacks": walker.callbacks[:TOP_LISTED],
        "aliased_inputs": walker.aliased[:TOP_LISTED],
    }


def _every_op(module: Any) -> Iterator[Any]:
    """Every op of every function in the module, nested regions included (bounded as the
    audit's walk is)."""
    walker = _Walker(module, count_kernels=True)
    for function in walker.functions.values():
        yield from walker._all_ops(function, 0)


def custom_call_targets(module: Any) -> set[str]:
    """Every custom_call target anywhere in the module (for the executor's refusal list)."""
    return {
        _attr(op, "call_target_name").strip('"')
        for op in _every_op(module)
        if _kind(op) == "stablehlo.custom_call"
    }


def platform_branches(module: Any) -> int:
    """How many ``case`` ops have a single branch: what ``lax.platform_dependent`` leaves once
    JAX has lowered it for one platform (the other platforms' branches are dropped there, and
    an honest ``cond`` or ``switch`` has two or more). Each is code the check ran that another
    platform would not: the chip's lowering of the same trace keeps another branch."""
    return sum(
        1 for op in _every_op(module) if _kind(op) == "stablehlo.case" and len(op.regions) == 1
    )


PLATFORM_BRANCH_REFUSAL = (
    "the artifact holds {count} branch(es) JAX chose by platform when it lowered the kernel "
    "(`lax.platform_dependent`): another platform is given other code than the one checked"
)


def parse_module(text: str) -> tuple[Any, Any]:
    """(module, context) from MLIR text; keep the context alive as long as the module is used."""
    from jax._src.interpreters import mlir

    context = mlir.make_ir_context()
    with context:
        return _ir().Module.parse(text), context
