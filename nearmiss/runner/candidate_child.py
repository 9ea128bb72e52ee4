"""Sandbox child that imports the candidate and runs it on the cases the engine sends.

Untrusted code runs only here. Each ``run`` request names a case directory holding the inputs; the
child jits the candidate, records the phase it reached (trace, compile, run) and writes the
outputs to ``output.npz``. Comparison with the reference happens in the engine, not here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

from nearmiss.runner.child import describe_exception, start_child

CANDIDATE_ENV = "NEARMISS_CANDIDATE"
CANDIDATE_MODULE = "nearmiss_candidate"


def import_candidate(path: str):
    loader_spec = importlib.util.spec_from_file_location(CANDIDATE_MODULE, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[CANDIDATE_MODULE] = module
    loader_spec.loader.exec_module(module)
    return module


def run_case(kernel, request: dict) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from nearmiss.runner.arrays import load_arrays, save_arrays
    from nearmiss.runner.geometry import kernel_geometry

    case_dir = Path(request["dir"])
    inputs, _ = load_arrays(case_dir / "inputs.npz")
    args = [jnp.asarray(a) for a in inputs]
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    phase = "trace"
    try:
        started = time.perf_counter()
        traced = jax.jit(kernel).trace(*args)
        try:
            result["geometry"] = kernel_geometry(traced.jaxpr)
        except Exception:  # geometry is a forensic hint; never fail a case over it
            result["geometry"] = []
        if request.get("audit"):
            result["audit"], result["audit_error"] = _audit(traced.jaxpr)
        phase = "compile"
        compiled = traced.lower().compile()
        result["compile_s"] = time.perf_counter() - started
        phase = "run"
        started = time.perf_counter()
        output = jax.block_until_ready(compiled(*args))
        result["run_s"] = time.perf_counter() - started
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / "output.npz", [np.asarray(leaf) for leaf in leaves])
        result.update(ok=True, treedef=str(treedef))
    except (Exception, SystemExit) as exc:
        result.update(ok=False, error=describe_exception(exc, phase))
        return result
    if request.get("audit"):
        result["inputs_changed"] = _changed_inputs(args, inputs)
        result["probes_done"] = _run_probes(compiled, request.get("probes", []))
    return result


def _audit(jaxpr) -> tuple[dict | None, str]:
    """The jaxpr audit, or None and why: the engine judges a missing audit as unverified."""
    from nearmiss.integrity.audit import audit_candidate

    try:
        return audit_candidate(jaxpr), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:200]


def _changed_inputs(args, originals) -> list[int]:
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


def _run_probes(compiled, probes: list[dict]) -> list[int]:
    """Run the compiled kernel on the probe inputs (one input re-drawn each); return those done."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from nearmiss.runner.arrays import load_arrays, save_arrays

    done = []
    for probe in probes:
        probe_dir = Path(probe["dir"])
        try:
            inputs, _ = load_arrays(probe_dir / "inputs.npz")
            output = jax.block_until_ready(compiled(*[jnp.asarray(a) for a in inputs]))
            leaves = jax.tree_util.tree_leaves(output)
            save_arrays(probe_dir / "output.npz", [np.asarray(leaf) for leaf in leaves])
        except Exception:  # an unanswered probe is judged by the engine
            continue
        done.append(probe["input"])
    return done


def main() -> None:
    channel = start_child()
    from nearmiss.runner.interpret import force_interpret_on_cpu

    platform = force_interpret_on_cpu()
    import jax

    try:
        module = import_candidate(os.environ[CANDIDATE_ENV])
    except (Exception, SystemExit) as exc:
        channel.send(event="import_failed", error=describe_exception(exc, "import"))
        os._exit(0)
    kernel = getattr(module, "kernel", None)
    if not callable(kernel):
        channel.send(event="no_kernel")
        os._exit(0)
    channel.send(event="ready", platform=platform, jax_version=jax.__version__)
    while True:
        request = channel.receive()
        if request.get("cmd") != "run":
            break
        channel.send(**run_case(kernel, request))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
