"""TPU targets without a TPU: the real Pallas TPU (Mosaic) lowering, and libtpu's compiler.

Two halves, for the two sides of the sandbox:

- the candidate child (``export_for_tpu``) lowers the kernel with Pallas' TPU lowering *for the
  target's chip* and serializes it with ``jax.export`` (``platforms=["tpu"]``). That needs only
  JAX, never libtpu: the lowering is Python and MLIR, the chip's facts come from the registry.
- the executor child (``compile_tpu_artifact``), engine code that never imports the candidate,
  deserializes those bytes and compiles them with libtpu for a device of the target's
  compile-only topology: the whole XLA TPU pipeline including the Mosaic compiler, which
  refuses what the hardware cannot do (misaligned blocks, unprovable alignment, VMEM overflow),
  and reports the compiled program's memory. A candidate that bypasses the lowering's checks in
  its own process is refused here all the same (Mosaic checks the block tiling again).

Lowering refuses: block shapes not divisible by (8, 128) nor equal to the array's, rank-1
blocks, plain loads from ``pl.ANY`` memory, primitives without a TPU lowering (``cummax``).
Compiling refuses: ``E2002 CompileTimeMosaicMisalignedBlockAndTiling`` (the same tiling rule,
when lowering was bypassed), ``E2003 CompileTimeMosaicUnprovenMemoryAccessAlignment`` (bf16
slices), ``Invalid relayout``, ``E1001 CompileTimeScopedVmemOom`` (blocks over scoped VMEM).

Call ``libtpu_env.prepare_environment()`` before JAX is imported in a process that compiles.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import nearmiss
from nearmiss.engine.integrity.audit import PLATFORM_BRANCH_REFUSAL, parse_module, platform_branches
from nearmiss.engine.targets.errors import exception_text, kernel_sites, trim_error
from nearmiss.engine.targets.registry import TPU, Target, get_target
from nearmiss.engine.targets.vmem import vmem_use

COMPILE_ERROR = "compile_error"
ENGINE = str(Path(nearmiss.__file__).resolve().parent)  # the nearmiss package, wherever mounted
MOSAIC_TARGET = "tpu_custom_call"


def tpu_target(target: str | Target) -> Target:
    found = target if isinstance(target, Target) else get_target(target)
    if found.kind != TPU:
        raise ValueError(f"{found.name} is not a TPU target")
    return found


# -- the candidate child's side (no libtpu) -------------------------------------------------------


@contextlib.contextmanager
def lowering_for(target: str | Target) -> Iterator[None]:
    """Lower Pallas kernels for ``target``'s chip on any host, for the duration of the block.

    Pallas' TPU lowering asks ``tpu_info.get_tpu_info()`` for the chip's facts (sublanes, lanes,
    generation: ``_check_block_mappings`` for rank-1 and small blocks, some primitives). It
    reads the device kind of the *current abstract mesh's* device, else of the default backend's
    device — ``cpu`` here, hence ``ValueError: Unsupported TPU device kind: cpu`` (7 of the 31
    goldens: col_sum, matvec, row_variance, logsumexp_rows, embedding_gather, batch_norm,
    causal_flash_attention in bf16). JAX's public ``use_abstract_mesh`` with an
    ``AbstractDevice`` of the target's kind answers that question, scoped to this thread and
    this block, without patching JAX; the mesh has no axes, so nothing is sharded (the export
    still takes one device). ``tpu_info`` caches per trace context, which includes the abstract
    mesh, so targets do not leak into one another.

    Inside, TPU interpret mode is also switched off: a child that serves the CPU target sets it
    globally, and a kernel built under it would lower to plain HLO with no Mosaic kernel in it.
    """
    import jax
    from jax.experimental.pallas import tpu as pltpu

    chip = tpu_target(target)
    device = jax.sharding.AbstractDevice(
        device_kind=cast(str, chip.device_kind), num_cores=chip.num_cores, platform="tpu"
    )
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=device)
    # None switches interpret mode off (its docstring says so); its annotation omits None.
    with pltpu.force_tpu_interpret_mode(None), jax.sharding.use_abstract_mesh(mesh):  # type: ignore[arg-type]
        yield


@contextlib.contextmanager
def without_tiling_rules() -> Iterator[None]:
    """Pallas' TPU lowering without its BlockSpec tiling rules (last two block dimensions
    divisible by 8 and 128, rank-1 sizes), for the duration of the block.

    Only for a lowering that is read, never compiled: the ``gpu`` target's grid
    (``runner.target_plan.GPU_GRID``), where a GPU kernel's (1, 64) block is no fault. Every
    other check of the lowering stays; this thread's lowering is the only one the child runs."""
    from jax._src.pallas.mosaic import lowering

    original = getattr(lowering, "_check_block_mappings", None)
    if original is None:  # another JAX: its rules stay, and a refusal reads as unverified
        yield
        return
    lowering._check_block_mappings = lambda *args, **kwargs: None
    try:
        yield
    finally:
        lowering._check_block_mappings = original


def export_for_tpu(
    jitted: Any, avals: Sequence[Any], target: str | Target, *, jaxpr: Any = None
) -> bytes:
    """The kernel lowered for ``target`` (Mosaic) and serialized (``jax.export``), to cross a
    process boundary. ``avals``: ``jax.ShapeDtypeStruct``s of the inputs; ``jaxpr``: the
    kernel's traced program where the caller has it (else it is traced again), for the sites
    of its pallas_calls in an error. Raises what the lowering raises (``ValueError`` for
    Pallas' TPU rules, ``NotImplementedError``...): the candidate's ``compile_error``;
    ``trim_exception`` makes it short."""
    import jax
    from jax import export

    if not hasattr(jitted, "trace"):
        jitted = jax.jit(jitted)
    with lowering_for(target):
        try:
            exported = export.export(jitted, platforms=["tpu"])(*avals)
        except Exception as exc:
            # Lowering runs after tracing, so the traceback holds no line of the candidate and
            # Pallas names only the kernel body's. Where each pallas_call was traced is in the
            # jaxpr: add it as notes (``pallas_call of BODY at FILE:LINE``) for trim_error.
            for site in pallas_call_sites(jitted, avals, jaxpr):
                exc.add_note(site)
            raise
    return bytes(exported.serialize())


def _jaxprs_in(value: Any) -> Iterator[Any]:
    for item in value if isinstance(value, (list, tuple)) else (value,):
        if hasattr(item, "eqns"):
            yield item
        elif hasattr(getattr(item, "jaxpr", None), "eqns"):  # a ClosedJaxpr
            yield item.jaxpr


def pallas_call_sites(jitted: Any, avals: Sequence[Any], traced: Any = None) -> list[str]:
    """``pallas_call of BODY at FILE:LINE`` for every pallas_call of ``traced`` (a ClosedJaxpr;
    else what ``jitted`` traces on ``avals``), the frames outside installed packages; [] when it
    does not trace."""
    try:
        jaxpr = (traced if traced is not None else jitted.trace(*avals).jaxpr).jaxpr
    except Exception:  # tracing fails: the exception being reported already says why
        return []
    sites, pending = [], [jaxpr]
    while pending:
        for eqn in pending.pop().eqns:
            for value in eqn.params.values():
                pending.extend(_jaxprs_in(value))
            if eqn.primitive.name != "pallas_call":
                continue
            debug = getattr(eqn.params.get("jaxpr"), "debug_info", None)
            body = (getattr(debug, "func_src_info", None) or "kernel").split(" at ")[0]
            for frame in getattr(eqn.source_info.traceback, "frames", ()):
                # Installed packages' frames and the engine's own (its pallas_call wrapper).
                if "-packages" not in frame.file_name and not frame.file_name.startswith(ENGINE):
                    sites.append(f"pallas_call of {body} at {frame.file_name}:{frame.line_num}")
    return list(dict.fromkeys(sites))


# -- the executor child's side (loads libtpu) -----------------------------------------------------


@functools.cache
def compile_only_device(target: str) -> Any:
    """Device 0 of the target's compile-only topology (loads libtpu on first use; ~0.1 s)."""
    from jax.experimental import topologies

    chip = tpu_target(target)
    topology = cast(str, chip.topology)  # every TPU target has one
    return topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]


MEMORY_FIELDS = {
    "argument_bytes": "argument_size_in_bytes",
    "output_bytes": "output_size_in_bytes",
    "temp_bytes": "temp_size_in_bytes",
    "alias_bytes": "alias_size_in_bytes",
    "code_bytes": "generated_code_size_in_bytes",
    "peak_bytes": "peak_memory_in_bytes",
    "host_temp_bytes": "host_temp_size_in_bytes",
}
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_SCOPED_VMEM = (
    re.compile(
        r"Scoped allocation with size (?P<size>[\d.]+)(?P<su>[KMG]?)B? and limit "
        r"(?P<limit>[\d.]+)(?P<lu>[KMG]?)B?"
    ),
    # v4, whose whole VMEM is the limit: "Ran out of memory in memory space vmem. Used 32.00M
    # of 16.00M vmem."
    re.compile(r"Used (?P<size>[\d.]+)(?P<su>[KMG]?)B? of (?P<limit>[\d.]+)(?P<lu>[KMG]?)B? vmem"),
)


def memory_figures(stats: Any) -> dict[str, int]:
    """What ``Compiled.memory_analysis()`` reports, in plain names (bytes)."""
    figures = {}
    for name, field in MEMORY_FIELDS.items():
        value = getattr(stats, field, None)
        if isinstance(value, int):
            figures[name] = value
    return figures


def vmem_figures(message: str) -> dict[str, int]:
    """The scoped-VMEM size and limit an ``E1001 CompileTimeScopedVmemOom`` (v4: "Used S of L
    vmem") names (bytes): the compiler reports VMEM only when a kernel overflows it."""
    match = next(filter(None, (pattern.search(message) for pattern in _SCOPED_VMEM)), None)
    if not match:
        return {}
    return {
        "vmem_bytes": int(float(match["size"]) * _UNITS[match["su"]]),
        "vmem_limit_bytes": int(float(match["limit"]) * _UNITS[match["lu"]]),
    }


def _refused(result: dict[str, Any], error: str) -> dict[str, Any]:
    result.update(ok=False, failure_class=COMPILE_ERROR, error=error)
    return result


def compile_tpu_artifact(data: bytes, target: str, candidate: str | None = None) -> dict[str, Any]:
    """Compile a serialized TPU artifact for ``target``'s compile-only device.

    Returns ``{target, ok, failure_class (None or "compile_error"), error (None or trimmed, with
    the candidate's line where known), compile_s, kernels (Mosaic kernels in the artifact),
    memory {argument_bytes, output_bytes, temp_bytes, alias_bytes, code_bytes, peak_bytes,
    host_temp_bytes; vmem_blocks_bytes, vmem_scratch_bytes and vmem_limit_bytes estimated
    (``targets.vmem``); vmem_bytes and the compiler's vmem_limit_bytes when VMEM
    overflowed}}``. ``candidate`` (its path or file name) picks its lines out of the
    compiler's locations.

    An artifact that is not a one-device TPU module, or holds no Mosaic kernel (a pallas_call
    built in interpret mode lowers to plain HLO, which would compile without Mosaic ever
    seeing the kernel), is refused as well.
    """
    import jax
    from jax import export

    chip = tpu_target(target)
    generation = cast(str, chip.chip)  # every TPU target has one
    result: dict[str, Any] = {
        "target": chip.name,
        "ok": False,
        "failure_class": None,
        "error": None,
        "compile_s": None,
        "kernels": 0,
        "memory": {},
    }
    try:
        exported = export.deserialize(bytearray(data))
    except Exception as exc:  # a forged or corrupt file: whatever the parser says
        return _refused(result, f"the artifact does not deserialize: {type(exc).__name__}")
    if tuple(exported.platforms) != ("tpu",):
        return _refused(result, f"the artifact is for {list(exported.platforms)}, not ['tpu']")
    if exported.nr_devices != 1 or exported.ordered_effects or exported.unordered_effects:
        return _refused(result, "the artifact needs several devices or has side effects")
    module = exported.mlir_module()
    sites = kernel_sites(module, candidate)
    result["kernels"] = len(sites)
    if not sites:
        return _refused(result, f"the artifact holds no Mosaic kernel ({MOSAIC_TARGET})")
    try:
        parsed, _context = parse_module(module)
        branches = platform_branches(parsed)
    except Exception as exc:  # AuditError, or a module MLIR cannot parse
        return _refused(result, f"the artifact cannot be read: {type(exc).__name__}: {exc}"[:200])
    if branches:
        return _refused(result, PLATFORM_BRANCH_REFUSAL.format(count=branches))
    sharding = jax.sharding.SingleDeviceSharding(compile_only_device(result["target"]))
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in exported.in_avals]
    start = time.perf_counter()
    try:
        compiled = jax.jit(exported.call).trace(*structs).lower().compile()
    except Exception as exc:  # the compiler's verdict on the candidate's kernel
        result["compile_s"] = round(time.perf_counter() - start, 3)
        message = exception_text(exc)
        # The compiler's own VMEM figures, where it gave them, over the estimate's.
        result["memory"] = vmem_use(module, generation) | vmem_figures(message)
        return _refused(result, trim_error(message, candidate, sites=sites))
    result["compile_s"] = round(time.perf_counter() - start, 3)
    result["memory"] = memory_figures(compiled.memory_analysis()) | vmem_use(module, generation)
    result["ok"] = True
    return result
