"""The footprint program (``runner.footprint``): which elements each grid program stores, taken
from the traced program and run the way the executor runs it (exported, on the inputs)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from nearmiss.engine.runner.footprint import (
    NoFootprint,
    footprint_program,
    shared_element,
    zero_filled,
)
from nearmiss.engine.runner.traced_program import TracedProgram

ROWS, TILE = 24, 8


def tiles(also: int | None = None, dtype=jnp.float32, grid: int = 3, then=None):
    """A kernel whose programs each store their own rows of one whole-array block through a
    mask; with ``also``, each also stores row ``also``; ``then(o_ref, value)`` runs after."""

    def body(x_ref, o_ref):
        i = pl.program_id(0)
        rows = i * TILE + jnp.arange(TILE)[:, None]
        value = pltriton.load(x_ref.at[pl.ds(i * TILE, TILE), :])
        pltriton.store(o_ref.at[pl.ds(i * TILE, TILE), :], value * 2, mask=rows < 20)
        if also is not None:
            o_ref[also : also + 1, :] = value[:1]
        if then is not None:
            then(o_ref, value)

    def kernel(x):
        call = pl.pallas_call(
            body,
            out_shape=jax.ShapeDtypeStruct((ROWS, 128), dtype),
            grid=(grid,),
            in_specs=[pl.BlockSpec((ROWS, 128), lambda i: (0, 0))],
            out_specs=pl.BlockSpec((ROWS, 128), lambda i: (0, 0)),
        )
        return jax.jit(call)(x) + 1  # through a nested call, as wrappers do

    return kernel


def marks(kernel, dtype=jnp.float32) -> list[np.ndarray]:
    aval = jax.ShapeDtypeStruct((ROWS, 128), dtype)
    program = TracedProgram.trace(kernel, [aval])
    function = footprint_program(program.retargeted(True, label=""))
    with zero_filled():
        exported = export.export(jax.jit(function), platforms=["cpu"])(aval)
    return [np.asarray(a) for a in exported.call(jnp.ones((ROWS, 128), dtype))]


def test_programs_storing_their_own_rows_share_no_element():
    header, highest, lowest = marks(tiles())
    assert header.tolist() == [1, 3]  # one output, grid (3,)
    assert shared_element(highest, lowest, 3) is None
    # rows 0..7 by program 0, 8..15 by 1, 16..19 by 2 (its mask), 20.. by nobody
    assert highest[:, 0].tolist() == [1] * 8 + [2] * 8 + [3] * 4 + [0] * 4
    assert lowest[:, 0].tolist() == [3] * 8 + [2] * 8 + [1] * 4 + [0] * 4


def test_a_row_every_program_stores_is_shared_and_named():
    _, highest, lowest = marks(tiles(also=9))
    assert shared_element(highest, lowest, 3) == ((9, 0), 0, 2)


def read_back(o_ref, value):
    o_ref[0:1, :] += value[:1]


def atomic_add(o_ref, value):
    pltriton.atomic_add(o_ref, (pl.ds(0, 1), pl.ds(0, 128)), value[:1])


def store_in_a_loop(o_ref, value):
    def step(k, carry):
        o_ref[0:1, :] = value[:1] + k
        return carry

    jax.lax.fori_loop(0, 2, step, 0)


def read_in_a_while_condition(o_ref, value):
    # reads another program's element in the loop's condition, and stores what it counted
    limit = value[0, 0].astype(jnp.int32)
    n = jax.lax.while_loop(lambda c: (c < 3) & (o_ref[0, 0] >= 0), lambda c: c + limit, 0)
    o_ref[20:21, :] = jnp.full((1, 128), n, o_ref.dtype)


@pytest.mark.parametrize(
    ("then", "why"),
    [
        (read_back, "reads an output back"),
        (atomic_add, "an output is passed to atomic_rmw"),
        (read_in_a_while_condition, "reads an output back"),
    ],
)
def test_what_the_footprint_cannot_stand_behind_has_none(then, why):
    with pytest.raises(NoFootprint, match=why):
        marks(tiles(then=then))


def test_a_row_every_program_stores_from_a_loop_is_shared_and_named():
    # followed into the loop: each program's own rows stay its own, row 0 is everyone's
    _, highest, lowest = marks(tiles(then=store_in_a_loop))
    assert shared_element(highest, lowest, 3) == ((0, 0), 0, 2)
    assert highest[8:16, 0].tolist() == [2] * 8 and lowest[8:16, 0].tolist() == [2] * 8


def test_marks_no_run_can_hold_are_not_believed():
    # 300 programs' marks are not exact in bfloat16 (8 bits of mantissa)
    with pytest.raises(NoFootprint, match="cannot hold 300 program marks"):
        marks(tiles(grid=300, dtype=jnp.bfloat16), jnp.bfloat16)
    one = np.array([[1.0, 0.0]])
    assert shared_element(one, np.array([[3.0, 0.0]]), 3) is None
    for forged in ([[np.nan, 0.0]], [[1.5, 0.0]], [[4.0, 0.0]], [[1.0, 2.0]], [[-1.0, 0.0]]):
        assert shared_element(np.array(forged), np.array([[3.0, 0.0]]), 3) == ()
    assert shared_element(one, np.array([3.0, 0.0]), 3) == ()  # shapes apart
