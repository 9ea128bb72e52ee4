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

Two things the interpreter does not do as the chip does are put right here. Its arithmetic is a
CPU's: ``runner.chip_arithmetic`` rewrites the program so each float32 matmul computes as the
MXU does (bfloat16 passes by precision) and each integer operation the chip leaves undefined
reports the operand that makes it so (``numerics="chip"``; ``"exact"`` keeps float32, to tell a
precision failure from another). And its fresh memory is always NaN: scratch, outputs before
their first write, the padding of a ragged block. On a chip it is whatever was there, so a kernel
that tells padding or a fresh carry by ``x == x`` is right only here
(``tests/forgeries/fill_*.py``). A second run (``fill="arbitrary"``) gives every such element a
value drawn from the check's seed, finite and of the data's kind, that no kernel can tell from
data; the first keeps NaN, which shows any use at all (``0 * garbage`` included).

The gpu target without a GPU runs the same two runs under JAX's plain interpreter instead
(``interpret=True``: it runs the masked loads and stores Triton kernels use, which the TPU
interpreter refuses), with a GPU's arithmetic (TF32) and ``fill_arbitrary_plain`` for the
second: Pallas' Triton lowering reads a ragged block whole, so the rows past an array's end
hold whatever memory follows it on a GPU.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.protocol import OUTPUT_FILE

# Compiled runs by input shapes, target, fill, numerics and seed: this child's cases only.
_COMPILED: dict[str, tuple[Any, Any]] = {}


def run_under_tpu_semantics(programs, request: dict) -> dict:
    """Run the case of ``request["dir"]`` as the chip ``request["target"]`` would.

    ``programs(shapes)``: the kernel's one trace on those input shapes
    (``candidate_child.traced_program``); this run re-evaluates it, never traces again.
    ``request["fill"]``: "nan" (the default) or "arbitrary"; ``request["numerics"]``: "chip"
    (the default) or "exact"."""
    import jax
    import numpy as np
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter
    from jax.experimental.pallas import tpu as pltpu

    from nearmiss.engine.runner.arrays import load_arrays, save_arrays, shapes_of
    from nearmiss.engine.runner.child import describe_exception
    from nearmiss.engine.runner.chip_arithmetic import on_the_chip
    from nearmiss.engine.runner.cpu_compile import compile_lowered
    from nearmiss.engine.targets import get_target, lowering_for

    case_dir = Path(request["dir"])
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    target = get_target(request["target"])
    # The gpu target: JAX's plain interpreter (it runs what Triton kernels use, masked loads
    # and stores, where the TPU interpreter does not) with a GPU's arithmetic; a GPU's grid
    # order is judged by ``integrity.grid``.
    gpu = not target.is_tpu
    arbitrary = request.get("fill") == "arbitrary"
    seed = int(request["seed"])
    interpret: Any = True
    if not gpu:
        interpret = pltpu.InterpretParams(
            # Another order of the 'parallel' axes for the second run (and another cache entry
            # in the interpreter, whose traces hold the fill values).
            random_seed=seed + 1 if arbitrary else seed,
            detect_races=not arbitrary,  # the first run watched for races already
            num_cores_or_threads=target.num_cores or 1,
            out_of_bounds_reads="raise",
            uninitialized_memory="nan",
        )

    @contextlib.contextmanager
    def scope() -> Iterator[None]:  # a fresh one each time: the fills draw from the seed anew
        with contextlib.ExitStack() as stack:
            if not gpu:
                stack.enter_context(lowering_for(target))
            if arbitrary:
                stack.enter_context((fill_arbitrary_plain if gpu else fill_arbitrary)(seed))
            yield

    try:
        inputs, _ = load_arrays(case_dir / "inputs.npz")
        shapes = shapes_of(inputs)
        numerics = request.get("numerics", "chip")
        # Cases of the same shapes (a hidden case's values scaled) run one program: the same
        # trace, and the same parallel order and fill values, both drawn from the seed.
        key = json.dumps([shapes, request["target"], arbitrary, numerics, seed])
        if key not in _COMPILED:
            program = programs(shapes)
            chip = None
            if numerics == "chip":
                try:
                    closed, chip = on_the_chip(program.retargeted(interpret), gpu=gpu)
                except Exception as exc:  # the engine's rewrite failed: nothing the kernel did
                    error = describe_exception(exc, "emulation")
                    error["message"] = (
                        f"the engine could not emulate the target: {error['message']}"
                    )
                    result.update(ok=False, error=error)
                    return result
                function = program.evaluate(closed)
            else:
                function = program.function(interpret=interpret)
            with scope():
                compiled = compile_lowered(jax.jit(function).trace(*inputs).lower())
            _COMPILED[key] = compiled, chip
        compiled, chip = _COMPILED[key]
        with scope():
            output = jax.block_until_ready(compiled(*inputs))
        leaves, treedef = jax.tree_util.tree_flatten(output)
        save_arrays(case_dir / OUTPUT_FILE, [np.asarray(leaf) for leaf in leaves])
        races = None if gpu else interpreter.races
        result.update(ok=True, treedef=str(treedef), races=bool(races and races.races_found))
        if chip is not None:
            result.update(reduced=chip.reduced[:8], undefined=chip.undefined)
    except Exception as exc:
        pltpu.reset_tpu_interpret_mode_state()  # the interpreter's own rule after an exception
        result.update(ok=False, error=describe_exception(exc, "run"))
    return result


# Arbitrary values' magnitudes: powers of two from 2**-4 to 2**10, either sign — data-like, and
# far enough from 0 that adding one to a sum shows.
_SMALLEST, _LARGEST = -4.0, 10.0


def arbitrary_values(rng: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An array of ``shape`` and ``dtype`` as memory nobody wrote might hold it: finite floats of
    data-like magnitude, integers over the type's range, random booleans."""
    import numpy as np

    dtype = np.dtype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        magnitude = np.exp2(rng.uniform(_SMALLEST, _LARGEST, size=shape))
        sign = np.where(rng.random(size=shape) < 0.5, -1.0, 1.0)
        return (sign * magnitude).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if dtype.kind == "b":
        return rng.random(size=shape) < 0.5
    return np.zeros(shape, dtype)


@contextlib.contextmanager
def fill_arbitrary_plain(seed: int) -> Iterator[None]:
    """JAX's plain interpreter (``interpret=True``), for the block, filling fresh outputs and
    block padding with ``arbitrary_values`` drawn from ``seed`` instead of NaN (a padding takes
    one value throughout). ``NotImplementedError`` where this JAX has no such point."""
    import numpy as np

    rng = np.random.default_rng([seed, 0xF112])
    with plain_fill(lambda shape, dtype: arbitrary_values(rng, tuple(shape), dtype)):
        yield


@contextlib.contextmanager
def plain_fill(values: Callable[[tuple, Any], Any]) -> Iterator[None]:
    """JAX's plain interpreter, for the block, filling fresh float and integer outputs and
    block padding with ``values(shape, dtype)``: its one fill point,
    ``pallas.primitives.uninitialized_value``, is swapped. ``NotImplementedError`` where this
    JAX has no such point."""
    import jax.numpy as jnp
    from jax._src.pallas import primitives

    if not hasattr(primitives, "uninitialized_value"):
        raise NotImplementedError("this JAX's interpreter fills memory where the engine cannot")
    original = primitives.uninitialized_value

    def filled(shape, dtype):
        if not jnp.issubdtype(dtype, jnp.floating) and not jnp.issubdtype(dtype, jnp.integer):
            return original(shape, dtype)  # semaphores, booleans: the interpreter's own
        return jnp.asarray(values(tuple(shape), dtype))

    primitives.uninitialized_value = filled
    try:
        yield
    finally:
        primitives.uninitialized_value = original


@contextlib.contextmanager
def fill_arbitrary(seed: int) -> Iterator[None]:
    """JAX's TPU interpreter, for the block, filling fresh buffers and block padding with
    ``arbitrary_values`` drawn from ``seed`` instead of NaN: each fill point of
    ``jax._src.pallas.mosaic.interpret`` (the fill value, a fresh array, an input padded to its
    blocks, a buffer padded to its tiles) is swapped for one that draws. A JAX whose interpreter
    lacks them raises ``NotImplementedError``: the run is then not made, never made with NaN."""
    import jax.numpy as jnp
    import numpy as np

    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as calls
        from jax._src.pallas.mosaic.interpret import utils
    except ImportError as exc:
        raise NotImplementedError(f"this JAX's TPU interpreter has no fill points: {exc}") from exc
    names = ("get_uninitialized_value", "get_uninitialized_array", "pad_to_block_dimension")
    if not all(hasattr(utils, n) for n in names) or not hasattr(calls, "_get_with_padding"):
        raise NotImplementedError("this JAX's TPU interpreter fills memory where the engine cannot")
    rng = np.random.default_rng([seed, 0xF111])

    def value(dtype, mode):
        return arbitrary_values(rng, (), dtype)[()]

    def array(shape, dtype, mode):
        return jnp.asarray(arbitrary_values(rng, tuple(shape), dtype))

    def padded(value, block_shape, mode):
        if block_shape is None:
            return value
        shape = tuple(
            ((v - 1) // b + 1) * b for v, b in zip(value.shape, block_shape, strict=False)
        )
        if shape == tuple(value.shape):
            return value
        garbage = jnp.asarray(arbitrary_values(rng, shape, value.dtype))
        return garbage.at[tuple(slice(0, d) for d in value.shape)].set(value)

    def tile_padded(x, mode):
        shape = calls._get_padded_shape(x.shape, x.dtype)
        result = np.array(arbitrary_values(rng, tuple(shape), x.dtype))
        result[tuple(slice(0, d) for d in x.shape)] = x
        return result

    originals = {n: getattr(utils, n) for n in names}
    original_tiles = calls._get_with_padding
    utils.get_uninitialized_value = value
    utils.get_uninitialized_array = array
    utils.pad_to_block_dimension = padded
    calls._get_with_padding = tile_padded
    try:
        yield
    finally:
        for n, f in originals.items():
            setattr(utils, n, f)
        calls._get_with_padding = original_tiles
