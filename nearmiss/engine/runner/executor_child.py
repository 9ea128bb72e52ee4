"""Sandbox child that runs a candidate's *artifact*: engine code only, the candidate never imported.

Each ``run`` request names a case directory holding ``artifact.bin`` (what the candidate child
exported), ``inputs.npz`` (from the spec's child) and, for the first audited case, probe
directories with one input re-drawn. The child checks the artifact against the case, audits its
module (``integrity.audit``), compiles it, runs it and writes ``output.npz``; the engine compares.
Nothing the candidate's Python did can reach this process: only the bytes of its artifact.
On a CPU a worker may keep the runs' executor for the next check (``spares.give_back``):
``reset`` forgets every artifact and verdict of the last one and says ``ready`` again.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from nearmiss.engine.integrity.audit import requested_label
from nearmiss.engine.runner.artifact import (
    ARTIFACT_FILE,
    ArtifactRejected,
    check_signature,
    read_artifact,
    vetted,
)
from nearmiss.engine.runner.child import describe_exception, freeze_imports, start_child
from nearmiss.engine.runner.cpu_compile import compile_lowered
from nearmiss.engine.runner.protocol import OUTPUT_FILE


def _audit(module, exported, label: str) -> tuple[dict | None, str]:
    """The artifact's audit, or None and why: the engine judges a missing audit as unverified.
    On a device only compiled kernels count: this child's backend, not the candidate's say."""
    import jax

    from nearmiss.engine.integrity.audit import audit_module

    kept = tuple(sorted(exported.module_kept_var_idx))
    try:
        on_device = jax.default_backend() != "cpu"
        return audit_module(module, kept, compiled_only=on_device, label=label), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]


def changed_inputs(args, originals) -> list[int]:
    """Indices of inputs whose bytes differ after the call (or that the call consumed)."""
    import numpy as np

    changed = []
    for index, (arg, original) in enumerate(zip(args, originals, strict=True)):
        try:
            same = np.asarray(arg).tobytes() == original.tobytes()
        except Exception:  # a deleted (donated) buffer cannot be read back
            same = False
        if not same:
            changed.append(index)
    return changed


def run_probes(compiled, probes: list[dict]) -> list[int]:
    """Run the compiled kernel on the probe inputs (one input re-drawn each); return those done."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from nearmiss.engine.runner.arrays import load_arrays, save_arrays

    done = []
    for probe in probes:
        probe_dir = Path(probe["dir"])
        try:
            inputs, _ = load_arrays(probe_dir / "inputs.npz")
            output = jax.block_until_ready(compiled(*[jnp.asarray(a) for a in inputs]))
            leaves = jax.tree_util.tree_leaves(output)
            save_arrays(probe_dir / OUTPUT_FILE, [np.asarray(leaf) for leaf in leaves])
        except Exception:  # an unanswered probe is judged by the engine
            continue
        done.append(probe["input"])
    return done


class _Prepared:
    """An artifact deserialized, audited, vetted and compiled: cases with the same artifact
    (the same shapes) reuse it, as a jit cache would."""

    def __init__(self, data: bytes, args: list, label: str) -> None:
        import jax

        from nearmiss.engine.integrity.audit import GLUE_TARGETS

        artifact = vetted(data, args)
        self.exported = artifact.exported
        self.audit, self.audit_error = _audit(artifact.module, self.exported, label)
        # Native code it calls (a kernel on a device, XLA's LAPACK or FFT): vouched for to run,
        # but not plain XLA, so this executor is not kept for another check after it.
        self.native = any(t not in GLUE_TARGETS for t in artifact.custom_calls)
        started = time.perf_counter()
        self.compiled = compile_lowered(jax.jit(self.exported.call).lower(*args))
        self.compile_s = time.perf_counter() - started


_PREPARED: dict[str, _Prepared] = {}


def _profile(prepared: _Prepared, args: list, runs: int) -> dict:
    """The compiled artifact's time (``runner.timing``), after its outputs are saved: a kernel
    that fails only when run again costs its profile, never its verdict. The artifact is called
    without donation, so the same inputs serve every run."""
    from nearmiss.engine.runner.timing import warm_median_s

    try:
        return {"kernel_warm_s": warm_median_s(lambda: prepared.compiled(*args), runs)}
    except Exception as exc:
        return {"profile_error": f"{type(exc).__name__}: {exc}"[:200]}


def run_artifact(request: dict) -> dict:
    import hashlib

    import jax
    import jax.numpy as jnp
    import numpy as np

    from nearmiss.engine.runner.arrays import load_arrays, save_arrays

    case_dir = Path(request["dir"])
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    phase = "compile"
    try:
        inputs, _ = load_arrays(case_dir / "inputs.npz")
        args = [jnp.asarray(a) for a in inputs]
        data = read_artifact(case_dir / ARTIFACT_FILE)
        digest = hashlib.sha256(data).hexdigest()
        if digest not in _PREPARED:
            _PREPARED[digest] = _Prepared(data, args, requested_label(request.get("label")))
            result["compile_s"] = _PREPARED[digest].compile_s
        prepared = _PREPARED[digest]
        result["native"] = prepared.native
        check_signature(prepared.exported, args)
        if request.get("audit"):
            result["audit"], result["audit_error"] = prepared.audit, prepared.audit_error
        phase = "run"
        started = time.perf_counter()
        output = jax.block_until_ready(prepared.compiled(*args))
        result["run_s"] = time.perf_counter() - started
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / OUTPUT_FILE, [np.asarray(leaf) for leaf in leaves])
        result.update(ok=True, treedef=str(treedef))
        if request.get("profile_runs"):
            result.update(_profile(prepared, args, int(request["profile_runs"])))
    except ArtifactRejected as exc:
        result.update(ok=False, error={**describe_exception(exc, phase), "frames": []})
        return result
    except Exception as exc:
        result.update(ok=False, error=describe_exception(exc, phase))
        return result
    if request.get("audit"):
        result["inputs_changed"] = changed_inputs(args, inputs)
        result["probes_done"] = run_probes(prepared.compiled, request.get("probes", []))
    return result


def probe_artifact(request: dict) -> dict:
    """The case's artifact (prepared when it ran) on the probe inputs; the engine compares."""
    import hashlib

    import jax.numpy as jnp

    from nearmiss.engine.runner.arrays import load_arrays

    result: dict = {"event": "probes_done", "suite": request["suite"], "name": request["name"]}
    try:
        case_dir = Path(request["probes"][0]["dir"]).parent if request["probes"] else None
        if case_dir is None:
            return {**result, "probes_done": []}
        data = read_artifact(case_dir / ARTIFACT_FILE)
        digest = hashlib.sha256(data).hexdigest()
        if digest not in _PREPARED:
            inputs, _ = load_arrays(case_dir / "inputs.npz")
            _PREPARED[digest] = _Prepared(
                data, [jnp.asarray(a) for a in inputs], requested_label(request.get("label"))
            )
        done = run_probes(_PREPARED[digest].compiled, request["probes"])
    except Exception:  # an unanswered probe is judged by the engine
        done = []
    return {**result, "probes_done": done}


def judge_target(request: dict) -> dict:
    """A case's artifact lowered for a target: compiled by the target's compiler (TPU targets,
    compile-only through libtpu) and its grid read for the target's semantics
    (``integrity.grid``) — both on the artifact's bytes, never on the candidate's word."""
    from nearmiss.engine.integrity.grid import grid_findings
    from nearmiss.engine.runner.artifact import target_artifact_file
    from nearmiss.engine.targets import compile_tpu_artifact

    result: dict = {"event": "target_done", "suite": request["suite"], "name": request["name"]}
    target, structure = request["target"], request["structure"]
    try:
        data = read_artifact(Path(request["dir"]) / target_artifact_file(structure))
    except (OSError, ArtifactRejected) as exc:
        return {**result, "compiled": None, "grid": None, "error": str(exc)[:200]}
    import hashlib

    key = (
        hashlib.sha256(data).hexdigest(),
        target,
        request["semantics"],
        bool(request.get("compile")),
    )
    if request["semantics"] == "gpu":
        result["triton"] = _read_triton(Path(request["dir"]), request.get("candidate"))
    if key in _JUDGED:  # cases of one shape: the same bytes, the same verdict, no compile time
        compiled, grid = _JUDGED[key]
        if compiled is not None:
            compiled = {**compiled, "compile_s": 0.0}
        return _judged(request, result, compiled, grid)
    compiled = None
    if request.get("compile"):
        compiled = compile_tpu_artifact(data, target, request.get("candidate"))
    try:
        from jax import export

        module = export.deserialize(bytearray(data)).mlir_module()
        grid = grid_findings(module, request["semantics"]).as_dict()
    except Exception as exc:  # unreadable: the target's grid semantics stay unverified
        grid = {"findings": [], "undetermined": [{"reason": f"{type(exc).__name__}: {exc}"[:200]}]}
    _JUDGED[key] = compiled, grid
    return _judged(request, result, compiled, grid)


def _judged(request: dict, result: dict, compiled: dict | None, grid: dict) -> dict:
    """The target's answer; for a GPU, the modules the candidate child filed count only when
    they are the artifact's kernels (where the grid could be read: otherwise the target is
    undetermined already)."""
    triton = result.get("triton")
    if isinstance(triton, dict) and triton.get("ok") and not grid.get("undetermined"):
        from nearmiss.engine.targets.triton import unmatched_kernels

        mismatch = unmatched_kernels(triton, grid)
        if mismatch:
            result = {**result, "triton": {"ok": None, "error": mismatch}}
    return {**result, "compiled": compiled, "grid": _stored(request, grid)}


def _stored(request: dict, grid: dict) -> dict:
    """For a GPU, the grid's races judged by what each program stores on this case's inputs
    (``runner.footprint``); the block-level report as it is otherwise."""
    if request["semantics"] != "gpu":
        return grid
    from nearmiss.engine.runner.footprint import withdrawn_races

    return withdrawn_races(Path(request["dir"]), grid)


def _read_triton(case_dir: Path, candidate: str | None) -> dict | None:
    """The Triton modules the candidate child lowered for this case, read and verified here
    (``targets.triton``); None where it filed none."""
    from nearmiss.engine.targets.triton import TRITON_FILE, read_triton_modules

    try:
        text = (case_dir / TRITON_FILE).read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        return {"ok": None, "error": f"the Triton modules are unreadable: {exc}"[:200]}
    try:
        return read_triton_modules(text, candidate)
    except Exception as exc:  # not Triton IR this jaxlib reads: the target stays undetermined
        return {"ok": None, "error": f"the Triton modules do not parse: {exc}"[:200]}


# Target verdicts by artifact digest, target, semantics and whether compiled, as _PREPARED keeps
# prepared runs: a verdict is a function of those bytes alone.
_JUDGED: dict[tuple, tuple[dict | None, dict]] = {}


def _forget() -> None:
    """Everything of the last check gone: artifacts, verdicts, compiled programs, and the memory
    they held handed back to the system (the next check's memory limit is the same)."""
    import contextlib
    import ctypes
    import gc

    import jax

    _PREPARED.clear()
    _JUDGED.clear()
    jax.clear_caches()
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: it keeps what it keeps
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def main() -> None:
    from nearmiss.engine.targets import prepare_environment

    prepare_environment()  # libtpu's compile-only settings, before JAX loads (harmless without)
    channel = start_child()
    import jax

    def ready() -> None:
        channel.send(event="ready", platform=jax.default_backend(), jax_version=jax.__version__)

    ready()
    freeze_imports()
    while True:
        request = channel.receive()
        if request.get("cmd") == "run":
            channel.send(**run_artifact(request))
        elif request.get("cmd") == "probe":
            channel.send(**probe_artifact(request))
        elif request.get("cmd") == "target":
            channel.send(**judge_target(request))
        elif request.get("cmd") == "reset":  # kept for the next check (``spares.give_back``)
            _forget()
            ready()
        else:
            break
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
