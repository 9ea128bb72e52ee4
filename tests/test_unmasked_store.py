"""A ragged last output block stored whole writes past the array on a GPU
(``targets.triton.unmasked_store_past_the_end``): found through the jaxprs a store is nested in,
with each operand followed to the variable it arrives as (``jaxpr_walk.operands_inside``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from nearmiss.engine.jaxpr_walk import iter_eqns
from nearmiss.engine.targets.triton import unmasked_store_past_the_end

ROWS, BLOCK = 20, 8  # three programs, the last one's block runs 4 rows past the array


def _inside_the_last_row(shape):
    rows = pl.program_id(0) * BLOCK + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    return rows < ROWS


def store_in_scoped_body(x_ref, o_ref):
    def scoped(scratch):
        scratch[...] = x_ref[...]
        o_ref[...] = scratch[...] * 2  # unmasked, inside run_scoped

    pl.run_scoped(scoped, pltpu.VMEM((BLOCK, 128), jnp.float32))


def masked_output_scratch_stored_whole(x_ref, o_ref):
    def scoped(scratch):
        scratch[...] = x_ref[...] * 2  # a scratch stored whole: no array to run past
        mask = _inside_the_last_row((BLOCK, 128))
        pltriton.store(o_ref, scratch[...], mask=mask)

    pl.run_scoped(scoped, pltpu.VMEM((BLOCK, 128), jnp.float32))


def store_in_while_body(x_ref, o_ref):
    def more(step):
        return step < 3

    def add(step):
        o_ref[...] = o_ref[...] + x_ref[...]  # unmasked, inside a while loop's body
        return step + 1

    jax.lax.while_loop(more, add, 0)


def masked_store_in_while_body(x_ref, o_ref):
    def more(step):
        return x_ref[0, 0] < step  # the condition reads a ref: constants on both sides

    def add(step):
        mask = _inside_the_last_row((BLOCK, 128))
        pltriton.store(o_ref, x_ref[...], mask=mask)
        return step - 1.0

    jax.lax.while_loop(more, add, 3.0)


def _params(body):
    call = pl.pallas_call(
        body,
        grid=(pl.cdiv(ROWS, BLOCK),),
        in_specs=[pl.BlockSpec((BLOCK, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
        interpret=True,
    )
    traced = jax.make_jaxpr(call)(jnp.ones((ROWS, 128), jnp.float32))
    eqn = next(e for e in iter_eqns(traced.jaxpr) if e.primitive.name == "pallas_call")
    return eqn.params


@pytest.mark.parametrize("body", [store_in_scoped_body, store_in_while_body])
def test_an_unmasked_store_nested_in_the_kernel_is_found_with_its_line(body):
    found = unmasked_store_past_the_end(_params(body))
    assert found is not None and "test_unmasked_store.py" in found, found


@pytest.mark.parametrize("body", [masked_output_scratch_stored_whole, masked_store_in_while_body])
def test_a_masked_output_is_not_blamed_for_another_refs_store(body):
    assert unmasked_store_past_the_end(_params(body)) is None
