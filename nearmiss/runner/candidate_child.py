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
