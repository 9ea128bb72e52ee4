"""Sandbox child that runs the spec: inputs and reference outputs for every case.

It never sees the candidate, so a candidate cannot tamper with the ground truth. For each case it
writes ``inputs.npz`` and ``reference.npz`` under the engine's work directory and reports
``case_ready``; anything wrong with the spec itself is reported as ``spec_error``.
"""

from __future__ import annotations

import os
import sys
import time
import zlib
from pathlib import Path

from nearmiss.runner.child import Channel, start_child


def case_key(jax, seed: int, suite: str, name: str):
    """The PRNG key of one case: a function of the engine's seed and the case's identity only."""
    tag = zlib.crc32(f"{suite}/{name}".encode()) & 0x7FFFFFFF
    return jax.random.fold_in(jax.random.PRNGKey(seed), tag)


def _arrays_or_none(jax, np, values):
    """The values as numpy arrays, or None when any is not an array."""
    out = []
    for value in values:
        if not isinstance(value, jax.Array | np.ndarray):
            return None
        out.append(np.asarray(value))
    return out


def prepare(channel: Channel, request: dict) -> None:
    import jax
    import numpy as np

    from nearmiss.runner.arrays import save_arrays
    from nearmiss.spec import SpecError, load_spec

    try:
        spec = load_spec(request["spec"])
        cases = [(suite, case) for suite in ("compact", "extended") for case in spec.suite(suite)]
        cases = [(s, c) for s, c in cases if request["suite"] in ("all", s)]
    except SpecError as exc:
        channel.send(event="spec_error", message=str(exc))
        return
    channel.send(
        event="spec",
        name=spec.name,
        category=spec.category,
        description=spec.description,
        platform=jax.default_backend(),
        jax_version=jax.__version__,
        cases=[
            {
                "suite": suite,
                "name": case.name,
                "dims": dict(case.dims),
                "dtype": case.dtype,
                "profile": case.profile,
                "tolerance": list(spec.tolerance_for(case.dtype)),
            }
            for suite, case in cases
        ],
    )
    workdir = Path(request["workdir"])
    for suite, case in cases:
        label = f"{suite} case {case.name!r}"
        try:
            inputs = spec.make_inputs(case, case_key(jax, request["seed"], suite, case.name))
        except Exception as exc:
            channel.send(
                event="spec_error",
                message=f"make_inputs raised on {label}: {type(exc).__name__}: {exc}",
            )
            return
        arrays = _arrays_or_none(jax, np, inputs) if isinstance(inputs, tuple | list) else None
        if arrays is None:
            channel.send(
                event="spec_error",
                message=f"make_inputs must return a tuple of arrays "
                f"(got {type(inputs).__name__}) on {label}",
            )
            return
        started = time.perf_counter()
        try:
            reference = jax.block_until_ready(spec.reference(*inputs))
        except Exception as exc:
            channel.send(
                event="spec_error",
                message=f"reference raised on {label}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
            return
        leaves, treedef = jax.tree_util.tree_flatten(reference)
        ref_arrays = _arrays_or_none(jax, np, leaves)
        if ref_arrays is None or not ref_arrays:
            channel.send(
                event="spec_error",
                message=f"reference returned non-array values on {label}: {treedef}",
            )
            return
        case_dir = workdir / f"{suite}-{case.name}"
        case_dir.mkdir(parents=True, exist_ok=True)
        save_arrays(case_dir / "inputs.npz", arrays)
        save_arrays(case_dir / "reference.npz", ref_arrays, {"treedef": str(treedef)})
        channel.send(
            event="case_ready",
            suite=suite,
            name=case.name,
            dir=str(case_dir),
            reference_s=time.perf_counter() - started,
        )
    channel.send(event="done")


def main() -> None:
    channel = start_child()
    request = channel.receive()
    prepare(channel, request)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: nothing is left to flush, and JAX's is slow


if __name__ == "__main__":
    main()
