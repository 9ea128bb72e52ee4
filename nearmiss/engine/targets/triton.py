"""The GPU target without a GPU: Pallas' real Triton lowering, and a reading of what it made.

Pallas lowers a kernel for an NVIDIA GPU in two steps: Python over jaxlib's Triton dialect turns
the kernel's jaxpr into a Triton module (``lower_jaxpr_to_triton_module``), then Triton compiles
that module to PTX on the GPU's host. The first step needs no GPU and is where Pallas refuses
what Triton cannot do: block shapes whose size is not a power of two, scratch memory, scalar
prefetch, TPU compiler parameters (a ``pltpu.CompilerParams`` kernel is lowered for TPU only),
operations without a Triton rule. Pallas only reaches that step through its GPU registration,
which imports the CUDA plugin, so the engine calls it itself, per pallas_call, with the checks
that registration makes first. A kernel that asks for Mosaic GPU (``plgpu.CompilerParams`` of
``pallas.mosaic_gpu``) goes through Mosaic GPU's lowering instead, which is Python over jaxlib's
Mosaic GPU dialect too (``lower_pipelined_jaxpr_to_module``) and refuses what its TMA copies,
layouts and warpgroup rules cannot do.

Two halves, for the two sides of the sandbox, as for TPU targets (``targets.tpu``):

- the candidate child (``lower_for_triton``) lowers every pallas_call of the traced program and
  writes each Triton module as text, with its source locations; a refusal, trimmed to the
  candidate's line, counts against the candidate;
- the executor child (``read_triton_modules``), engine code that never imports the candidate,
  parses those modules with the Triton dialect (a Mosaic GPU module, marked by its
  ``mosaic_gpu.arch_major`` attribute, with Mosaic GPU's), has MLIR verify them, and holds every
  Triton tensor to Triton's power-of-two rule itself, and counts the modules only when they
  are the artifact's kernels. A module the executor cannot read leaves the target
  undetermined. TF32 (a float32 dot at DEFAULT or HIGH precision: ``inputPrecision = tf32`` in
  Triton, a TF32 wgmma in Mosaic GPU) is emulated on the traced program, whichever lowering
  runs it (``runner.chip_arithmetic``).

Read from Pallas' Triton lowering: a BlockSpec block is loaded and stored whole, unmasked, so a
block that runs past its array's end (a ragged last block) reads and writes memory past it on
the GPU (``runner.tpu_semantics`` gives such reads values nobody wrote).
"""

from __future__ import annotations

import os
import re
from typing import Any

from nearmiss.engine.targets.errors import trim_error, trim_exception

# The compute capability the lowering is asked for: Hopper, the oldest Triton's Pallas lowering
# falls back to without a GPU (``pallas_call_registration``).
COMPUTE_CAPABILITY = 90
TRITON_FILE = "triton.mlir"
# How a refusal names the lowering that made it.
TRITON = "Pallas' Triton lowering"
MOSAIC_GPU = "Mosaic GPU's lowering"
# Between modules in ``TRITON_FILE``: a line no MLIR printer writes.
MODULE_SEPARATOR = "\n// ---- nearmiss: next kernel ----\n"


def _refusal_before_lowering(params: dict[str, Any]) -> str | None:
    """What Pallas' GPU registration refuses before it lowers (its own words where it has some)."""
    from jax._src.pallas.triton import core as triton_core

    compiler_params = params.get("compiler_params")
    if _asks_for_mosaic_gpu(params):
        return None  # Mosaic GPU's lowering judges it (``_lower_for_mosaic_gpu``)
    if compiler_params is not None and not isinstance(compiler_params, triton_core.CompilerParams):
        return (
            f"its compiler parameters ({type(compiler_params).__name__} of "
            f"{type(compiler_params).__module__.removeprefix('jax._src.pallas.')}) are not a "
            "GPU's: Pallas lowers such a kernel for that backend only (Cannot lower pallas_call "
            "on platform: gpu); pass none, or plgpu's Triton CompilerParams, for a GPU"
        )
    if params.get("mesh") is not None:
        return "a kernel with a mesh does not lower through Triton (mesh is not supported)"
    return None


def _asks_for_mosaic_gpu(params: dict[str, Any]) -> bool:
    """Whether a pallas_call asks for Mosaic GPU: its compiler parameters or its mesh are
    ``pallas.mosaic_gpu``'s (``plgpu.CompilerParams``, ``plgpu.Mesh``)."""
    return any(
        value is not None and ".mosaic_gpu." in f"{type(value).__module__}."
        for value in (params.get("compiler_params"), params.get("mesh"))
    )


# What Mosaic GPU's lowering is given, by name: the grid, the kernel's mesh, the JAX mesh it
# runs under (none: one device), the body, the compiler parameters, no cost estimate.
_MOSAIC_GPU_ARGUMENTS = ("grid_mapping", "gpu_mesh", "jax_mesh", "jaxpr", "params", "cost_estimate")


def _mosaic_gpu_lowering() -> Any:
    """Mosaic GPU's lowering function, once this JAX is known to take what the engine gives it;
    raises (the engine's own step failed, not the candidate) where it does not."""
    import inspect

    from jax._src.pallas.mosaic_gpu import lowering

    takes = inspect.signature(lowering.lower_pipelined_jaxpr_to_module).parameters
    missing = [name for name in _MOSAIC_GPU_ARGUMENTS if name not in takes]
    if missing:
        raise RuntimeError(f"Mosaic GPU's lowering takes no {', '.join(missing)} in this JAX")
    return lowering.lower_pipelined_jaxpr_to_module


def _lower_for_mosaic_gpu(lower: Any, params: dict[str, Any]) -> str:
    """One pallas_call through Mosaic GPU's lowering (``lower``), as its GPU registration calls
    it (``pallas_call_registration``), in an MLIR context of its own: the module's text."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir
    from jax._src.pallas.mosaic_gpu import core as gpu_core
    from jax.experimental.mosaic import gpu as mosaic_gpu

    with mlir.make_ir_context() as context, ir.Location.unknown():
        mosaic_gpu.dialect.register_dialect(context)
        result = lower(
            grid_mapping=params["grid_mapping"],
            gpu_mesh=params.get("mesh"),
            jax_mesh=None,
            jaxpr=params["jaxpr"],
            params=params.get("compiler_params") or gpu_core.CompilerParams(),
            cost_estimate=None,
        )
        return str(
            result.module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True)
        )


def _module_context() -> Any:
    """The lowering context Pallas' Triton lowering reads: its platform and nothing else."""
    import itertools

    from jax._src import sharding_impls
    from jax._src.interpreters import mlir

    return mlir.ModuleContext(
        platforms=("cuda",),
        backend=None,
        axis_context=sharding_impls.ShardingContext(1),
        keepalives=[],
        channel_iterator=itertools.count(1),
        host_callbacks=[],
        lowering_parameters=mlir.LoweringParameters(),
    )


def lower_for_triton(closed: Any, candidate: str | os.PathLike | None = None) -> dict[str, Any]:
    """Every pallas_call of ``closed`` (a ClosedJaxpr) through Pallas' Triton lowering, or
    Mosaic GPU's where the kernel asks for it: ``{"ok": True, "modules": [text, ...],
    "mosaic_gpu": n}`` (``mosaic_gpu``: how many of the modules are Mosaic GPU's), or
    ``{"ok": False, "error": one line}``. Raises where the engine's own step fails."""
    from jax._src.pallas.triton import lowering

    from nearmiss.engine.jaxpr_walk import iter_eqns

    modules: list[str] = []
    mosaic_gpu, lower_mosaic_gpu = 0, None
    for eqn in iter_eqns(closed.jaxpr):
        if eqn.primitive.name != "pallas_call":
            continue
        params = eqn.params
        refusal = _refusal_before_lowering(params)
        where = _kernel_line(eqn, candidate)
        if refusal:
            return {"ok": False, "error": f"{TRITON}: {refusal}{where}"}
        if _asks_for_mosaic_gpu(params):
            lower_mosaic_gpu = lower_mosaic_gpu or _mosaic_gpu_lowering()
            try:
                modules.append(_lower_for_mosaic_gpu(lower_mosaic_gpu, params))
            except Exception as exc:  # Mosaic GPU's refusal, whatever it raises
                return {"ok": False, "error": _refusal_words(MOSAIC_GPU, exc, candidate, where)}
            mosaic_gpu += 1
            continue
        try:
            result = lowering.lower_jaxpr_to_triton_module(
                params["jaxpr"],
                params["grid_mapping"],
                "cuda",
                COMPUTE_CAPABILITY,
                _module_context(),
            )
            modules.append(
                str(
                    result.module.operation.get_asm(
                        enable_debug_info=True, print_generic_op_form=True
                    )
                )
            )
            store = unmasked_store_past_the_end(params)
            if store:
                return {"ok": False, "error": f"{TRITON}: {store}{where}"}
        except Exception as exc:  # the lowering's refusal, whatever it raises
            return {"ok": False, "error": _refusal_words(TRITON, exc, candidate, where)}
    return {"ok": True, "modules": modules, "mosaic_gpu": mosaic_gpu}


def _refusal_words(
    lowering: str, exc: Exception, candidate: str | os.PathLike | None, where: str
) -> str:
    """A lowering's refusal in one line, named by its lowering, with the candidate's line
    where it has none."""
    text = _power_of_two_words(str(exc)) or trim_exception(exc, candidate)
    if candidate is not None and os.path.basename(str(candidate)) not in text:
        text += where
    return f"{lowering}: {text}"


def unmasked_store_past_the_end(params: dict[str, Any]) -> str | None:
    """What a GPU does that no CPU run shows: an output block that runs past its array's end
    (a ragged last block) stored whole. Pallas' Triton lowering stores a block without a mask
    unless the kernel gives one (``pl.store(..., mask=)``), so that program writes past the
    array, into memory that is not the output's. Interpret modes drop those elements."""
    from jax._src.pallas import core as pallas_core

    mapping, body = params["grid_mapping"], params["jaxpr"]
    blocks = body.invars[mapping.slice_block_ops]
    outputs = blocks[mapping.num_inputs :]
    for index, (ref, block) in enumerate(zip(outputs, mapping.block_mappings_output, strict=False)):
        shape = block.array_aval.shape
        dims = [
            None if isinstance(b, pallas_core.Squeezed) else pallas_core._get_block_dim_size(b)
            for b in block.block_shape
        ]
        if all(d is None or size % d == 0 for d, size in zip(dims, shape, strict=False)):
            continue
        line = _unmasked_store_line(body, {ref})
        if line is not None:
            shown = tuple(1 if d is None else d for d in dims)
            return (
                f"output {index}'s block {shown} runs past its array {tuple(shape)} in the last "
                f"program, and {line} stores it whole: on a GPU that writes past the array's "
                "end (Triton stores a block unmasked); store with a mask of the elements inside "
                "the array (pl.store(..., mask=)), or pick a block that divides the array"
            )
    return None


def _unmasked_store_line(jaxpr: Any, refs: set) -> str | None:
    """The source line of a store without a mask into one of ``refs`` (vars of ``jaxpr``),
    looking into nested jaxprs (loops, conditionals, scoped calls) where the ref is passed on."""
    from jax._src import core, source_info_util

    from nearmiss.engine.jaxpr_walk import operands_inside

    def held(v: Any) -> bool:
        return isinstance(v, core.Var) and v in refs

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in ("swap", "masked_swap") and eqn.invars and held(eqn.invars[0]):
            masked = False
            if name == "masked_swap":
                tree = eqn.params.get("args_tree")
                try:
                    *_, mask = tree.unflatten(eqn.invars)
                    masked = mask is not None
                except Exception:
                    masked = True  # a form this reading does not know: not held against it
            if not masked:
                return os.path.basename(source_info_util.summarize(eqn.source_info))
        passed = [i for i, v in enumerate(eqn.invars) if held(v)]
        if not passed:
            continue
        for inner, arriving in operands_inside(eqn):
            if arriving is not None:
                inner_refs = {arriving[i] for i in passed if i in arriving}
            else:  # a form not known: every ref the nested jaxpr gets is taken as the one
                known = (*inner.constvars, *inner.invars)
                inner_refs = {v for v in known if "Ref" in type(v.aval).__name__}
            found = _unmasked_store_line(inner, inner_refs) if inner_refs else None
            if found:
                return found
    return None


_NOT_POWER_OF_TWO = re.compile(r"size is a power of 2\. Encountered an array of shape (\([^)]*\))")


def _power_of_two_words(message: str) -> str | None:
    """Pallas' power-of-two refusal, said as the fix needs it (the line is added after)."""
    match = _NOT_POWER_OF_TWO.search(message)
    if match is None:
        return None
    return (
        f"block {match.group(1)}: Triton needs power-of-two block shapes; round the block up "
        "to a power of two and mask the tail (pl.load/pl.store with mask=), or pad the array"
    )


def _kernel_line(eqn: Any, candidate: str | os.PathLike | None) -> str:
    """`` (at kernel.py:12)``: where the pallas_call was made, for a refusal without a line."""
    from jax._src import source_info_util

    try:
        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except Exception:
        frame = None
    if frame is None:
        return ""
    name = os.path.basename(frame.file_name)
    if candidate is not None and name != os.path.basename(str(candidate)):
        return ""
    return f" (at {name}:{frame.start_line})"


# -- the executor's side: the modules read, never the candidate's word ----------------------------

_TENSOR = re.compile(r"tensor<((?:\d+x)+)[a-z]")


def read_triton_modules(text: str, candidate: str | None = None) -> dict[str, Any]:
    """The candidate child's GPU modules, read by the engine: ``{"ok", "error", "names"}``.
    ``ok`` False with an ``error`` where a module does not parse or verify with its dialect, or
    a Triton module holds a tensor whose size is not a power of two (Triton's rule: its
    lowering refuses such blocks); ``names``: each module's kernel (``unmatched_kernels``)."""
    modules = [m for m in text.split(MODULE_SEPARATOR) if m.strip()]
    names: list[str] = []
    for module_text in modules:
        is_mosaic_gpu = _MOSAIC_GPU_MODULE in module_text
        parsed = _parsed_and_verified(module_text, is_mosaic_gpu)
        if parsed is None:
            kind = "Mosaic GPU" if is_mosaic_gpu else "Triton"
            return {"ok": False, "error": f"a {kind} module does not verify"}
        generic, name = parsed
        names.append(name)
        if is_mosaic_gpu:
            continue
        for match in _TENSOR.finditer(generic):
            dims = [int(d) for d in match.group(1).rstrip("x").split("x")]
            size = 1
            for d in dims:
                size *= d
            if size & (size - 1):
                shape = tuple(dims)
                return {
                    "ok": False,
                    "error": trim_error(
                        f"a block of shape {shape} in the Triton module: Triton needs every "
                        "block's size to be a power of two",
                        candidate,
                    ),
                }
    return {"ok": True, "error": None, "names": names}


def unmatched_kernels(read: dict[str, Any], grid: dict[str, Any]) -> str | None:
    """Why the GPU modules the candidate child filed are not the artifact's kernels, or None.
    Both come from one traced program, kernel for kernel, under the pallas_call's name (the
    module's or its function's symbol; the custom call's ``kernel_name``): a module missing,
    added or renamed is a lowering of some other program, which says nothing of this one. A
    module filed under the right name with other contents is not caught here (the gate refuses
    a candidate that patches the lowering)."""
    artifact = sorted(str(k.get("name", "")) for k in grid.get("kernels", []))
    filed = sorted(str(n) for n in read.get("names", []))
    if artifact == filed:
        return None
    return (
        f"the GPU modules are of kernels {filed}, the artifact holds {artifact}: "
        "they are not this program's lowering"
    )[:300]


# The attribute Mosaic GPU's lowering puts on every module it makes (the GPU it is made for).
_MOSAIC_GPU_MODULE = "mosaic_gpu.arch_major"


def _parsed_and_verified(module_text: str, mosaic_gpu: bool) -> tuple[str, str] | None:
    """The module parsed in a context with its dialect (Triton's, or Mosaic GPU's) and
    verified by MLIR: its generic form with locations and its kernel's name, or None where it
    does not verify."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir import ir

    context = mlir.JaxIrContext()
    context.append_dialect_registry(mlir.upstream_dialects)
    if mosaic_gpu:
        from jax.experimental.mosaic import gpu as mosaic_gpu_dialects

        mosaic_gpu_dialects.dialect.register_dialect(context)
    else:
        from jax._src.lib.triton import dialect as tt_dialect

        tt_dialect.register_dialect(context)
    context.load_all_available_dialects()
    with context:
        module = ir.Module.parse(module_text)
        if not module.operation.verify():
            return None
        # Mosaic GPU names the module for the kernel; Triton, the kernel's function.
        named = [module.operation, *module.body.operations]
        names = [
            ir.StringAttr(op.attributes["sym_name"]).value
            for op in named
            if "sym_name" in op.attributes
        ]
        generic = module.operation.get_asm(enable_debug_info=True, print_generic_op_form=True)
        return str(generic), (names[0] if names else "")
