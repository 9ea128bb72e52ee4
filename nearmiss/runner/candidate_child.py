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
from nearmiss.runner.geometry import kernel_geometry

CANDIDATE_ENV = "NEARMISS_CANDIDATE"
CANDIDATE_MODULE = "nearmiss_candidate"


def import_candidate(path: str):
    loader_spec = importlib.util.spec_from_file_location(CANDIDATE_MODULE, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[CANDIDATE_MODULE] = module
    loader_spec.loader.exec_module(module)
    return module


class Stages:
    """Takes a function through JAX's stages — trace, compile, run — remembering the phase
    reached, so that an exception is attributed to the phase that raised it."""

    def __init__(self) -> None:
        self.phase = "trace"

    def run(self, function, args, result: dict, on_traced=None):
        """(compiled, output) of ``function(*args)``; timings go into ``result``."""
        import jax

        self.phase = "trace"
        started = time.perf_counter()
        traced = jax.jit(function).trace(*args)
        if on_traced is not None:
            on_traced(traced)
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

    from nearmiss.runner.arrays import load_arrays

    case_dir = Path(request["dir"])
    inputs, extra = load_arrays(case_dir / "inputs.npz")
    return case_dir, inputs, [jnp.asarray(a) for a in inputs], extra


def run_case(kernel, request: dict) -> dict:
    import jax
    import numpy as np

    from nearmiss.runner.arrays import save_arrays

    case_dir, inputs, args, _ = load_case_inputs(request)
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}

    def examine(traced) -> None:
        try:
            result["geometry"] = kernel_geometry(traced.jaxpr)
        except Exception:  # geometry is a forensic hint; never fail a case over it
            result["geometry"] = []
        if request.get("audit"):
            result["audit"], result["audit_error"] = _audit(traced.jaxpr)

    stages = Stages()
    try:
        compiled, output = stages.run(kernel, args, result, on_traced=examine)
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / "output.npz", [np.asarray(leaf) for leaf in leaves])
        result.update(ok=True, treedef=str(treedef))
    except (Exception, SystemExit) as exc:
        result.update(ok=False, error=describe_exception(exc, stages.phase))
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


def serve(entry: str, run, *, interpret: bool = True) -> None:
    """The life of a child that runs untrusted code: import the file, find its ``entry``
    function, then answer each ``run`` request with ``run(function, request)``.

    With ``interpret`` (every child that executes kernels) pallas_calls run in interpret mode on
    CPU; a child that only lowers must see the real lowering instead.
    """
    channel = start_child()
    import jax

    from nearmiss.runner.interpret import force_interpret_on_cpu

    platform = force_interpret_on_cpu() if interpret else jax.default_backend()
    try:
        module = import_candidate(os.environ[CANDIDATE_ENV])
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
    serve("kernel", run_case)


if __name__ == "__main__":
    main()
