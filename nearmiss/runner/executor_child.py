"""Sandbox child that runs a candidate's *artifact*: engine code only, the candidate never imported.

Each ``run`` request names a case directory holding ``artifact.bin`` (what the candidate child
exported), ``inputs.npz`` (from the spec's child) and, for the first audited case, probe
directories with one input re-drawn. The child checks the artifact against the case, audits its
module (``integrity.audit``), compiles it, runs it and writes ``output.npz``; the engine compares.
Nothing the candidate's Python did can reach this process: only the bytes of its artifact.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from nearmiss.runner.artifact import ARTIFACT_FILE, ArtifactRejected, load_artifact
from nearmiss.runner.child import describe_exception, start_child


def _audit(module, exported) -> tuple[dict | None, str]:
    """The artifact's audit, or None and why: the engine judges a missing audit as unverified."""
    from nearmiss.integrity.audit import audit_module

    try:
        return audit_module(module, kept=tuple(sorted(exported.module_kept_var_idx))), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]


def run_artifact(request: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from nearmiss.integrity.audit import parse_module
    from nearmiss.runner.arrays import load_arrays, save_arrays
    from nearmiss.runner.artifact import refuse_unrunnable
    from nearmiss.runner.candidate_child import changed_inputs, run_probes

    case_dir = Path(request["dir"])
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    phase = "compile"
    try:
        inputs, _ = load_arrays(case_dir / "inputs.npz")
        exported = load_artifact(case_dir / ARTIFACT_FILE, inputs)
        module, _context = parse_module(exported.mlir_module())
        if request.get("audit"):
            result["audit"], result["audit_error"] = _audit(module, exported)
        refuse_unrunnable(module)
        args = [jnp.asarray(a) for a in inputs]
        started = time.perf_counter()
        compiled = jax.jit(exported.call).lower(*args).compile()
        result["compile_s"] = time.perf_counter() - started
        phase = "run"
        started = time.perf_counter()
        output = jax.block_until_ready(compiled(*args))
        result["run_s"] = time.perf_counter() - started
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / "output.npz", [np.asarray(leaf) for leaf in leaves])
        result.update(ok=True, treedef=str(treedef))
    except ArtifactRejected as exc:
        result.update(ok=False, error={**describe_exception(exc, phase), "frames": []})
        return result
    except Exception as exc:
        result.update(ok=False, error=describe_exception(exc, phase))
        return result
    if request.get("audit"):
        result["inputs_changed"] = changed_inputs(args, inputs)
        result["probes_done"] = run_probes(compiled, request.get("probes", []))
    return result


def main() -> None:
    channel = start_child()
    import jax

    channel.send(event="ready", platform=jax.default_backend(), jax_version=jax.__version__)
    while True:
        request = channel.receive()
        if request.get("cmd") != "run":
            break
        channel.send(**run_artifact(request))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
