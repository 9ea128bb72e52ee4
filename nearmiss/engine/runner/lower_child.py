"""Sandbox child that lowers the candidate for another platform, without running it.

Lowering needs no hardware: Pallas's TPU (Mosaic) lowering ships with jaxlib and checks block
tiling and unsupported operations on any machine. For a GPU on a machine without one, the
kernel goes through the lowering the engine's ``gpu`` target uses (``targets.triton``: Pallas'
Triton lowering, Mosaic GPU's for a kernel that asks for it), as Pallas would on a GPU host;
with a GPU, through JAX's own GPU lowering.
Interpret mode stays off here — it would lower every kernel as plain XLA and hide exactly what
this is for. The outcome is filed as ``ok`` (lowered), ``unavailable`` (this installation cannot
lower for that platform: a fact about the machine, not the kernel) or an error record.
"""

from __future__ import annotations

import contextlib

from nearmiss.engine.runner.candidate_child import load_case_inputs, serve
from nearmiss.engine.runner.child import describe_exception
from nearmiss.engine.runner.protocol import OUTPUT_FILE
from nearmiss.engine.runner.traced_program import TracedProgram

# Names of the platforms the agent sees → JAX's lowering platform names.
TARGETS = {"tpu": "tpu", "gpu": "cuda"}
# Messages that say the installation, not the kernel, cannot lower for the platform.
UNAVAILABLE = (
    "Cannot lower pallas_call on platform",
    "install jaxlib",
    "Unsupported TPU device kind",
    "Unknown backend",
    "Unable to initialize backend",
)
# Without a TPU, Pallas's TPU lowering asks an abstract device for its generation (tiling of
# 1-D blocks, VMEM size); v5e is a common, middle-of-the-road target.
ABSTRACT_TPU = "TPU v5 lite"


def _target_context(jax, platform: str):
    """An abstract TPU device to lower against when this machine has none (where JAX has one)."""
    sharding = jax.sharding
    if platform != "tpu" or jax.default_backend() == "tpu":
        return contextlib.nullcontext()
    if not (hasattr(sharding, "AbstractDevice") and hasattr(sharding, "use_abstract_mesh")):
        return contextlib.nullcontext()
    try:
        device = sharding.AbstractDevice(device_kind=ABSTRACT_TPU, num_cores=1, platform="tpu")
        mesh = sharding.AbstractMesh((1,), ("lowering",), abstract_device=device)
    except TypeError:  # another JAX version's signature: lower against the default device
        return contextlib.nullcontext()
    return sharding.use_abstract_mesh(mesh)


def _lower(jax, kernel, traced, structs, target: str) -> None:
    try:
        traced.lower(lowering_platforms=(target,))
    except TypeError as exc:  # a JAX without per-call lowering platforms: export instead
        if "lowering_platforms" not in str(exc):
            raise
        jax.export.export(jax.jit(kernel), platforms=[target])(*structs)


class LoweringRefused(Exception):
    """A GPU lowering's refusal, in its own words (``targets.triton``)."""


def _lowered_without_a_gpu(program: TracedProgram) -> str:
    """The kernel through the gpu target's lowering (``targets.triton``): what lowered, or
    LoweringRefused with the lowering's words."""
    from nearmiss.engine.runner import candidate_child
    from nearmiss.engine.targets.triton import lower_for_triton

    found = lower_for_triton(program.jaxpr, candidate_child._candidate_path or None)
    if not found["ok"]:
        raise LoweringRefused(found["error"])
    mosaic = found["mosaic_gpu"]
    kernels = len(found["modules"])
    by = f"{kernels - mosaic} through Pallas' Triton lowering, {mosaic} through Mosaic GPU's"
    return f"lowered for cuda without a GPU ({by}; no GPU compile)"


def run_lowering(kernel, request: dict) -> dict:
    import jax

    from nearmiss.engine.runner.arrays import save_arrays

    case_dir, inputs, _, _ = load_case_inputs(request)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs]
    platform = request["platform"]
    target = TARGETS[platform]
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    status, detail = "ok", f"lowered for {target}"
    phase = "trace"  # a tracing error is the kernel's on every platform; lowering is "compile"
    try:
        with _target_context(jax, platform):
            # Lowered with every pallas_call set for the platform's compiler, whatever
            # ``interpret=`` the kernel passes: interpreted, it would lower to plain XLA.
            program = TracedProgram.trace(kernel, structs)
            phase = "compile"
            if platform == "gpu" and jax.default_backend() == "cpu":
                detail = _lowered_without_a_gpu(program)
            else:
                function = program.function(interpret=False)
                _lower(jax, function, jax.jit(function).trace(*structs), structs, target)
    except (Exception, SystemExit) as exc:
        message = str(exc)
        if phase == "trace" or not any(marker in message for marker in UNAVAILABLE):
            result.update(ok=False, error=describe_exception(exc, phase))
            return result
        status, detail = "unavailable", f"{type(exc).__name__}: {message}"[:500]
    save_arrays(case_dir / OUTPUT_FILE, [], {"status": status, "detail": detail})
    result.update(ok=True, treedef="lowering")
    return result


def main() -> None:
    serve("kernel", run_lowering, interpret=False)


if __name__ == "__main__":
    main()
