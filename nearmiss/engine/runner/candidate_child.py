"""Sandbox child that imports the candidate and exports it for each case the engine sends.

Untrusted code runs only here, and only to trace — once per input shapes
(``runner.traced_program``). Each ``run`` request gives a case directory and the inputs' shapes
and dtypes — never their values. The child traces the candidate, exports the traced computation
to ``artifact.bin`` (``runner.artifact``) and records the phase it reached (trace, compile).
The executor child runs the artifact; comparison happens in the engine.
``Stages``, ``load_case_inputs`` and ``serve`` also serve the fix agent's probe and lowering
children, which run untrusted code on real inputs but never certify.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nearmiss.engine.integrity.audit import requested_label
from nearmiss.engine.runner.child import describe_exception, start_child
from nearmiss.engine.runner.geometry import kernel_geometry
from nearmiss.engine.runner.plain_import import (
    as_plain_import,
    forget_harness_environment,
    module_name,
)
from nearmiss.engine.runner.traced_program import TracedProgram

CANDIDATE_ENV = "NEARMISS_CANDIDATE"
# The candidate's path as this child sees it (its variable is dropped before the import).
_candidate_path = ""


def import_candidate(path: str, name: str | None = None):
    """The module at ``path`` imported as ``name`` (default: the file's stem, as a plain import
    names it; the screening child names each edit). It is registered in ``sys.modules`` as a
    plain import would, unless that name is taken (a file named like a module already loaded:
    a plain import would have found that module instead)."""
    name = name or module_name(path)
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:  # the engine always names a .py file
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules.setdefault(name, module)
    loader_spec.loader.exec_module(module)
    return module


class Stages:
    """Takes a function through JAX's stages — trace, compile, run — remembering the phase
    reached, so that an exception is attributed to the phase that raised it."""

    def __init__(self) -> None:
        self.phase = "trace"

    def run(self, function, args, result: dict):
        """(compiled, output) of ``function(*args)``; timings go into ``result``."""
        import jax

        self.phase = "trace"
        started = time.perf_counter()
        traced = jax.jit(function).trace(*args)
        self.phase = "compile"
        compiled = traced.lower().compile()
        result["compile_s"] = time.perf_counter() - started
        self.phase = "run"
        started = time.perf_counter()
        output = jax.block_until_ready(compiled(*args))
        result["run_s"] = time.perf_counter() - started
        return compiled, output


def load_case_inputs(request: dict):
    """(case directory, the case's inputs as numpy arrays, as JAX arrays, the file's extras)."""
    import jax.numpy as jnp

    from nearmiss.engine.runner.arrays import load_arrays

    case_dir = Path(request["dir"])
    inputs, extra = load_arrays(case_dir / "inputs.npz")
    return case_dir, inputs, [jnp.asarray(a) for a in inputs], extra


def avals_of(request: dict) -> list:
    """The case's inputs as shapes and dtypes: a tracing child never sees their values."""
    import jax
    import jax.numpy as jnp

    from nearmiss.engine.runner.arrays import restore_dtype

    return [
        jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(restore_dtype(dtype)))
        for shape, dtype in request["avals"]
    ]


def traced_callbacks(jaxpr) -> list[str]:
    """Host callbacks in a traced program (they cannot be exported; the engine is told why)."""
    from nearmiss.engine.integrity.audit import CALLBACK_PRIMITIVES
    from nearmiss.engine.jaxpr_walk import iter_eqns

    return sorted(
        {e.primitive.name for e in iter_eqns(jaxpr, into_pallas=True)} & CALLBACK_PRIMITIVES
    )


def narrow_floats(jaxpr) -> list[str]:
    """Float types narrower than 32 bits the traced program computes in (kernel bodies too):
    without one, small spread errors are not rounding in a narrower type."""
    import jax.numpy as jnp

    from nearmiss.engine.jaxpr_walk import iter_eqns

    found = set()
    values = [v for e in iter_eqns(jaxpr, into_pallas=True) for v in e.outvars]
    for value in values + list(jaxpr.invars):
        dtype: Any = getattr(getattr(value, "aval", None), "dtype", None)
        try:  # JAX's own dtype lattice: NumPy does not count bfloat16 as floating
            narrow = jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize < 4
        except TypeError:  # not an array type (a semaphore, a token)
            narrow = False
        if narrow:
            found.add(str(dtype))
    return sorted(found)


# The kernel traced once per input shapes — or the exception its trace raised. Every artifact of
# those shapes (the interpret export, each chip's lowering, the TPU-semantics run) is derived
# from this one program (``runner.traced_program``): the candidate's Python never learns which
# artifact it is being traced for.
_TRACED: dict[str, TracedProgram | BaseException] = {}
# Exports by input shapes: cases with the same shapes get the same artifact, as a jit cache
# would give them the same executable.
_EXPORTED: dict[str, tuple[list, list[str], bytes, list[str] | None]] = {}
# Lowerings for targets, by input shapes and target: the artifact's bytes, or why there is none.
_EXPORTED_FOR: dict[str, bytes | str] = {}


def traced_program(kernel, shapes: list) -> TracedProgram:
    """The kernel's one trace on these input shapes (raises what that trace raised)."""
    import json

    key = json.dumps(shapes)
    if key not in _TRACED:
        avals = avals_of({"avals": shapes})
        try:
            with as_plain_import():  # the candidate's Python runs here: see ``plain_import``
                _TRACED[key] = TracedProgram.trace(kernel, avals)
        except (Exception, SystemExit) as exc:
            _TRACED[key] = exc
    found = _TRACED[key]
    if isinstance(found, BaseException):
        raise found
    return found


def export_case(kernel, request: dict) -> dict:
    """Trace the kernel on the case's shapes and export it to ``artifact.bin`` in the case dir.

    The executor child runs the artifact; nothing here produces an output. Timings and the
    kernel geometry are hints for forensics, never evidence.
    """
    import json

    import jax

    from nearmiss.engine.runner.artifact import ARTIFACT_FILE, export_traced

    if request.get("tpu_semantics"):
        from nearmiss.engine.runner.tpu_semantics import run_under_tpu_semantics

        return run_under_tpu_semantics(
            lambda shapes: traced_program(kernel, shapes), request["tpu_semantics"] | request
        )
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    phase = "trace"
    started = time.perf_counter()
    try:
        label = requested_label(request.get("label"))
        key = json.dumps([request["avals"], label])
        program = traced_program(kernel, request["avals"])
        if key not in _EXPORTED:
            try:
                geometry = kernel_geometry(program.jaxpr)
            except Exception:  # geometry is a forensic hint; never fail a case over it
                geometry = []
            callbacks = traced_callbacks(program.jaxpr.jaxpr)
            try:
                narrow = narrow_floats(program.jaxpr.jaxpr)
            except Exception:  # a forensic hint, like the geometry
                narrow = None
            phase = "compile"
            # On a CPU every pallas_call is interpreted, on a device every one is compiled for
            # it, whatever the candidate passed: a device's verdict is never emulation's.
            on_cpu = jax.default_backend() == "cpu"
            function = program.function(on_cpu, label=label)
            exported = export_traced(jax.jit(function), avals_of(request))
            _EXPORTED[key] = (geometry, callbacks, exported, narrow)
        geometry, callbacks, artifact, narrow = _EXPORTED[key]
        (Path(request["dir"]) / ARTIFACT_FILE).write_bytes(artifact)
        result.update(geometry=geometry, callbacks=callbacks, narrow_floats=narrow)
        result["compile_s"] = time.perf_counter() - started
        result.update(ok=True)
    except (Exception, SystemExit) as exc:
        result.update(ok=False, error=describe_exception(exc, phase))
        return result
    result["lowered"] = {
        name: export_for_target(program, request, name) for name in request.get("lower_for", [])
    }
    return result


def export_for_target(program: TracedProgram, request: dict, target: str) -> dict:
    """The traced kernel lowered for a TPU target's chip (Mosaic) into
    ``artifact-<target>.bin``, or the lowering's refusal, trimmed to the candidate's line. A
    refusal can only count against the candidate; an artifact proves nothing until the
    executor has compiled it."""
    import json

    from nearmiss.engine.runner.artifact import target_artifact_file
    from nearmiss.engine.runner.target_plan import GPU_GRID, STRUCTURE_CHIP
    from nearmiss.engine.targets import export_for_tpu, trim_exception
    from nearmiss.engine.targets.tpu import without_tiling_rules

    def lowered() -> bytes:
        # the chip's compiler, not interpret; for the gpu target's grid, grids only
        grid_only = target == GPU_GRID
        function = program.function(
            interpret=False, grid_only=grid_only, label=requested_label(request.get("label"))
        )
        with without_tiling_rules() if grid_only else contextlib.nullcontext():
            return export_for_tpu(
                function,
                avals_of(request),
                STRUCTURE_CHIP if grid_only else target,
                jaxpr=program.jaxpr,
            )

    key = json.dumps([request["avals"], target, requested_label(request.get("label"))])
    found = _kept(_EXPORTED_FOR, key, lowered, lambda exc: trim_exception(exc, _candidate_path))
    if isinstance(found, str):
        return {"ok": False, "error": found}
    (Path(request["dir"]) / target_artifact_file(target)).write_bytes(found)
    if target == GPU_GRID:
        return {
            "ok": True,
            "triton": lowered_for_triton(program, request),
            "footprint": exported_footprint(program, request),
        }
    return {"ok": True}


def _kept(cache: dict, key: str, make: Callable[[], Any], failed: Callable[[Any], Any]) -> Any:
    """``cache[key]``, made on first asking (cases of one shape share it): what ``make`` gives,
    or ``failed(exc)`` where it raises — the candidate's code runs in it, SystemExit too."""
    if key not in cache:
        try:
            cache[key] = make()
        except (Exception, SystemExit) as exc:
            cache[key] = failed(exc)
    return cache[key]


# Footprint programs by input shapes: the export, or why there is none.
_FOOTPRINT: dict[str, bytes | str] = {}


def exported_footprint(program: TracedProgram, request: dict) -> dict:
    """The gpu target's footprint program (``runner.footprint``: which elements each grid
    program stores), exported into ``footprint.bin`` for the executor to run on the case's
    inputs; or why there is none (then every block-level race stands)."""
    import json

    import jax

    from nearmiss.engine.runner.artifact import export_traced
    from nearmiss.engine.runner.footprint import (
        FOOTPRINT_FILE,
        NoFootprint,
        footprint_program,
        zero_filled,
    )

    def exported() -> bytes:
        function = footprint_program(program.retargeted(True, label=""))
        with zero_filled():
            return export_traced(jax.jit(function), avals_of(request))

    def why_not(exc: BaseException) -> str:  # the engine's own step: no footprint, no verdict
        return str(exc) if isinstance(exc, NoFootprint) else f"{type(exc).__name__}: {exc}"[:300]

    found = _kept(_FOOTPRINT, json.dumps(request["avals"]), exported, why_not)
    if isinstance(found, str):
        return {"ok": False, "why": found}
    (Path(request["dir"]) / FOOTPRINT_FILE).write_bytes(found)
    return {"ok": True}


# Triton lowerings by input shapes: the modules' text, or the lowering's refusal.
_TRITON: dict[str, dict] = {}


def lowered_for_triton(program: TracedProgram, request: dict) -> dict:
    """The traced kernel through Pallas' Triton lowering (``targets.triton``): its modules
    written to ``triton.mlir`` in the case dir for the executor to read, or the refusal."""
    import json

    from nearmiss.engine.targets.triton import MODULE_SEPARATOR, TRITON_FILE, lower_for_triton

    found = _kept(
        _TRITON,
        json.dumps(request["avals"]),
        lambda: lower_for_triton(program.jaxpr, _candidate_path),
        # the engine's own step failed: not a verdict
        lambda exc: {"ok": None, "error": f"{type(exc).__name__}: {exc}"[:300]},
    )
    if not found.get("ok"):
        return {"ok": found.get("ok"), "error": found.get("error")}
    text = MODULE_SEPARATOR.join(found["modules"])
    (Path(request["dir"]) / TRITON_FILE).write_text(text)
    return {"ok": True}


def serve(entry: str, run, *, interpret: bool = True) -> None:
    """The life of a child that runs untrusted code: import the file, find its ``entry``
    function, then answer each ``run`` request with ``run(function, request)``. The file is
    ``CANDIDATE_ENV``'s, or, in a child started as a spare without it, the first message's
    (``{"cmd": "load", "candidate": path}``). The import sees a plain interpreter
    (``plain_import``).

    With ``interpret`` (children that execute kernels themselves: the agent's probes) every
    pallas_call runs in interpret mode on CPU, by JAX's global flag; the certifying child sets
    each kernel's mode on its traced program instead, and a child that only lowers must see the
    real lowering.
    """
    global _candidate_path
    channel = start_child()
    import jax

    from nearmiss.engine.runner.interpret import force_interpret_on_cpu

    platform = force_interpret_on_cpu() if interpret else jax.default_backend()
    _candidate_path = os.environ.get(CANDIDATE_ENV, "")
    forget_harness_environment()
    if not _candidate_path:
        # A spare (``runner.spares``), started before its candidate was known: the engine puts
        # the file in this child's home and names it in the first message.
        request = channel.receive()
        if request.get("cmd") != "load" or not isinstance(request.get("candidate"), str):
            os._exit(0)
        _candidate_path = request["candidate"]
    # Named relative to the working directory: the code folder, wherever the sandbox shows it.
    _candidate_path = os.path.abspath(_candidate_path)
    if channel.engine_gone():  # asked again just before the first untrusted line (``child``)
        os._exit(0)
    try:
        with as_plain_import():
            module = import_candidate(_candidate_path)
    except (Exception, SystemExit) as exc:
        channel.send(event="import_failed", error=describe_exception(exc, "import"))
        os._exit(0)
    function = getattr(module, entry, None)
    if not callable(function):
        channel.send(event="no_kernel")
        os._exit(0)
    channel.send(event="ready", platform=platform, jax_version=jax.__version__)
    while True:
        request = channel.receive()
        if request.get("cmd") != "run":
            break
        channel.send(**run(function, request))
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    serve("kernel", export_case, interpret=False)


if __name__ == "__main__":
    main()
