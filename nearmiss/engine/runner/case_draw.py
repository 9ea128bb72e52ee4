"""How a case's inputs are drawn, the same in every child that draws them.

The spec's child (``reference_child``), its calibration (``spec_noise``) and the benchmarks must
draw exactly the same inputs for a case, so the key and the array check live here, below all of
them.
"""

from __future__ import annotations

import zlib


def case_key(jax, seed: int, suite: str, name: str):
    """The PRNG key of one case: a function of the engine's seed and the case's identity only."""
    tag = zlib.crc32(f"{suite}/{name}".encode()) & 0x7FFFFFFF
    return jax.random.fold_in(jax.random.PRNGKey(seed), tag)


def arrays_or_none(jax, np, values):
    """The values as numpy arrays, or None when any is not an array."""
    out = []
    for value in values:
        if not isinstance(value, jax.Array | np.ndarray):
            return None
        out.append(np.asarray(value))
    return out
