"""Target attack (gpu, integrity enforce, no trick at all): a read-write race between grid
programs through an aliased buffer, where the grid check judges only writes.

Spec ``target_shift_spec.py``: out block i = x block i + x block i+1 (the last block doubled).
The kernel copies x into a fresh buffer y with a first pallas_call, then updates y *in place*
(``input_output_aliases={0: 0}``; y is an intermediate, not the caller's input, so
``input_mutation`` has nothing to say). Operand 0, the one aliased to the output, is read through
a window one block *ahead* of the output's: program i reads block i+1 of the very buffer that
program i+1 writes (operand 1, y again, gives block i; XLA copies y for whichever operand is not
written in place, so the aliased operand is the output buffer itself). In program order
(interpret mode, or a TPU grid run in order) block i+1 is read before program i+1 overwrites it,
so the numbers are right; GPU programs run concurrently, and program i+1 may already have written
y[i+1] + y[i+2] over the block program i reads. Every output block is written by exactly one grid
point, so the outputs' index maps show no race.

Outcome at the time of writing: CERTIFIED for gpu. Now ``integrity.grid`` also compares the
blocks each grid point reads from an input aliased to an output with the blocks every other
point writes: an ``aliased_read_race`` (``test_target_forgeries``). Its honest counterpart,
``tests/planted/alias_own_block.py``, stays certified.
"""

import jax
from jax.experimental import pallas as pl

BR = 8


def _copy_body(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def _add_next_body(next_ref, this_ref, o_ref):
    o_ref[...] = this_ref[...] + next_ref[...]


def kernel(x):
    r, c = x.shape
    last = r // BR - 1
    y = pl.pallas_call(
        _copy_body,
        grid=(r // BR,),
        in_specs=[pl.BlockSpec((BR, c), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BR, c), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    return pl.pallas_call(
        _add_next_body,
        grid=(r // BR,),
        in_specs=[
            pl.BlockSpec((BR, c), lambda i: (jax.numpy.minimum(i + 1, last), 0)),  # aliased
            pl.BlockSpec((BR, c), lambda i: (i, 0)),
        ],
        out_specs=pl.BlockSpec((BR, c), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
    )(y, y)
