"""The reference's own numerical noise, measured in the spec's sandbox child (``spec check``).

For every case it files three sets of output leaves under the case's directory:
``reference.npz`` (the reference as the check computes it), ``truth.npz`` (the same traced
computation in float64) and, for cases whose outputs are float32 or wider, ``coarse.npz`` (the
same computation in bfloat16, cast back to the output's type: what a kernel that computes in
bfloat16 would return), and for each small constant written into the reference (an eps: a float
scalar above 0 and at most ``SMALL``) ``zeroed-N.npz``, the float64 computation with that
constant read as 0, cast to the output's type (what a kernel that left it out would return), and
where the reference has float32 dots ``chip.npz``: the same computation with every one of them
one bfloat16 pass, as a TPU computes a dot at DEFAULT precision (``runner.chip_arithmetic``).
A quantised reference (one that rounds floats to integer values: ``round``, a float cast to an
int) keeps its own rounding in ``truth.npz`` (``retype.pinned_evaluation``), and its case says
how many such steps it has ("rounding": [kept, inside loops or branches]).
The engine judges them (``nearmiss.engine.authoring.calibration``); this side
only computes. All cases are drawn and traced before x64 is switched on, so the inputs and the
traces are exactly the check's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nearmiss.engine.errors import exception_line
from nearmiss.engine.runner.child import Channel

NARROW = "bfloat16"
SMALL = 1e-3  # a constant at most this size may be an eps the cases cannot tell from 0
MAX_CONSTANTS = 4
_WIDE_OUTPUTS = ("float32", "float64")


def _first_line(exc: BaseException) -> str:
    return exception_line(type(exc).__name__, str(exc))


def calibrate(channel: Channel, request: dict) -> None:
    import jax
    import ml_dtypes
    import numpy as np

    from nearmiss.engine.runner.arrays import is_float, save_arrays
    from nearmiss.engine.runner.case_draw import arrays_or_none, case_key
    from nearmiss.engine.runner.chip_arithmetic import DEFAULT_PASSES, on_the_chip
    from nearmiss.engine.runner.retype import (
        pinned_evaluation,
        retyped_evaluation,
        rounding_steps,
        small_constants,
    )
    from nearmiss.engine.runner.selection import select_cases
    from nearmiss.engine.spec import SpecError, load_spec

    try:
        spec = load_spec(request["spec"], request.get("shown"))
        cases = select_cases(spec, request["suite"], None)
    except SpecError as exc:
        channel.send(event="spec_error", message=str(exc))
        return
    from nearmiss.engine.hidden import describe, domains
    from nearmiss.engine.runner.hidden_cases import serve_hidden

    try:  # what a certifying check could draw beyond the listed cases, and what it could not
        _, hidden_notes = serve_hidden(jax, np, spec, int(request["seed"]))
    except Exception as exc:
        hidden_notes = [f"no hidden case could be drawn: {_first_line(exc)}"]
    channel.send(
        event="spec",
        name=spec.name,
        cases=len(cases),
        domains={dim: describe(domain) for dim, domain in domains(spec).items()},
        hidden_notes=hidden_notes,
    )
    workdir = Path(request["workdir"])
    traced = []
    for suite, case in cases:
        label = f"{suite} case {case.name!r}"
        started = time.perf_counter()
        try:
            inputs = spec.make_inputs(case, case_key(jax, request["seed"], suite, case.name))
            arrays = arrays_or_none(jax, np, inputs) if isinstance(inputs, tuple | list) else None
            if arrays is None:
                raise SpecError("make_inputs must return a tuple of arrays")
            reference = jax.tree_util.tree_leaves(jax.block_until_ready(spec.reference(*inputs)))
            closed = jax.make_jaxpr(spec.reference)(*inputs)
        except Exception as exc:
            channel.send(event="spec_error", message=f"{label}: {_first_line(exc)}")
            return
        leaves = arrays_or_none(jax, np, reference)
        if not leaves:
            channel.send(event="spec_error", message=f"{label}: the reference returned no arrays")
            return
        case_dir = workdir / f"{suite}-{case.name}"
        case_dir.mkdir(parents=True, exist_ok=True)
        save_arrays(case_dir / "reference.npz", leaves)
        traced.append(
            (suite, case, closed, arrays, leaves, case_dir, time.perf_counter() - started)
        )
    # Only now: float64 changes the default types of anything traced afterwards.
    jax.config.update("jax_enable_x64", True)
    for suite, case, closed, arrays, leaves, case_dir, reference_s in traced:
        message: dict[str, Any] = {
            "event": "case_noise",
            "suite": suite,
            "name": case.name,
            "dims": dict(case.dims),
            "dtype": case.dtype,
            "profile": case.profile,
            "tolerance": list(spec.tolerance_for(case.dtype)),
            "dir": str(case_dir),
            "reference_s": reference_s,
            "truth": None,
            "coarse": None,
            "chip": None,
            "constants": [],
        }
        # A quantised reference (it rounds floats to integers) keeps its own rounding in the
        # float64 run: a rounding flipped on a boundary is no noise a faithful kernel shows.
        pinned, nested = rounding_steps(closed)
        message["rounding"] = [pinned, nested]
        try:
            if pinned:
                truth = pinned_evaluation(closed, arrays, np.float64)
            else:
                truth = retyped_evaluation(closed, arrays, np.float64)
            save_arrays(case_dir / "truth.npz", truth)
            message["truth"] = "ok"
        except Exception as exc:
            message["truth"] = f"the reference cannot be evaluated in float64: {_first_line(exc)}"
        else:
            for index, value in enumerate(small_constants(closed, SMALL)[:MAX_CONSTANTS]):
                try:
                    zeroed = retyped_evaluation(closed, arrays, np.float64, frozenset({value}))
                except Exception:  # a constant that cannot be 0 there is no eps to drop
                    continue
                name = f"zeroed-{index}.npz"
                restored = [z.astype(leaf.dtype) for z, leaf in zip(zeroed, leaves, strict=True)]
                save_arrays(case_dir / name, restored)
                message["constants"].append([value, name])
        if all(leaf.dtype.name in _WIDE_OUTPUTS for leaf in leaves if is_float(leaf.dtype)):
            try:
                coarse = retyped_evaluation(closed, arrays, ml_dtypes.bfloat16)
                restored = [c.astype(leaf.dtype) for c, leaf in zip(coarse, leaves, strict=True)]
                save_arrays(case_dir / "coarse.npz", restored)
                message["coarse"] = "ok"
            except Exception as exc:
                message["coarse"] = f"not evaluated in {NARROW}: {_first_line(exc)}"
        try:
            rewritten, found = on_the_chip(closed, every_dot=DEFAULT_PASSES)
            if found.reduced:
                chip = jax.core.eval_jaxpr(rewritten.jaxpr, rewritten.consts, *arrays)
                save_arrays(case_dir / "chip.npz", [np.asarray(c) for c in chip])
                message["chip"] = "ok"
        except Exception as exc:
            message["chip"] = f"not evaluated with the chip's matmuls: {_first_line(exc)}"
        channel.send(**message)
    channel.send(event="done")
