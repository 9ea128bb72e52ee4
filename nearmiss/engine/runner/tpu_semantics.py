"""A case under JAX's TPU interpret mode: the TPU's rules for memory and grid order, on CPU.

Plain interpret mode runs a kernel's grid in order on one core. TPU interpret mode
(``pltpu.InterpretParams``) simulates the chip: out-of-bounds reads raise, fresh buffers hold NaN,
grid axes declared ``parallel`` run in a random order (the seed is the check's, recorded) and are
split over the chip's TensorCores, and a happens-before race detector watches every buffer. A
kernel that is right only in program order shows wrong numbers, a race or an exception here.

It runs in the candidate's child, after every case has been exported (this run is the only one
that gives the child input values), because the interpreter calls back into Python and cannot be
exported. It evaluates the same traced program as the exports (``runner.traced_program``), with
every pallas_call set to the interpreter's parameters: the candidate's Python is not traced
again, so it cannot tell this run from the exports. Its verdict can only count *against* the
candidate: the engine compares the outputs with the reference itself.
"""

from __future__ import annotations

from pathlib import Path

from nearmiss.engine.runner.protocol import OUTPUT_FILE


def run_under_tpu_semantics(programs, request: dict) -> dict:
    """Run the case of ``request["dir"]`` as the chip ``request["target"]`` would.

    ``programs(shapes)``: the kernel's one trace on those input shapes
    (``candidate_child.traced_program``); this run re-evaluates it, never traces again."""
    import jax
    import numpy as np
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter
    from jax.experimental.pallas import tpu as pltpu

    from nearmiss.engine.runner.arrays import load_arrays, save_arrays, shapes_of
    from nearmiss.engine.runner.child import describe_exception
    from nearmiss.engine.targets import get_target, lowering_for

    case_dir = Path(request["dir"])
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    target = get_target(request["target"])
    params = pltpu.InterpretParams(
        random_seed=int(request["seed"]),
        detect_races=True,
        num_cores_or_threads=target.num_cores or 1,
        out_of_bounds_reads="raise",
        uninitialized_memory="nan",
    )
    try:
        inputs, _ = load_arrays(case_dir / "inputs.npz")
        program = programs(shapes_of(inputs)).function(interpret=params)
        with lowering_for(target):  # the chip's facts (cores, generation) for the interpreter
            output = jax.block_until_ready(jax.jit(program)(*inputs))
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / OUTPUT_FILE, [np.asarray(leaf) for leaf in leaves])
        races = interpreter.races
        result.update(ok=True, treedef=str(treedef), races=bool(races and races.races_found))
    except Exception as exc:
        pltpu.reset_tpu_interpret_mode_state()  # the interpreter's own rule after an exception
        result.update(ok=False, error=describe_exception(exc, "run"))
    return result
