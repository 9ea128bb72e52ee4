"""What a traced kernel's pallas_calls look like: grid and output block shapes.

Runs inside the candidate child on the jaxpr of the jitted candidate. The result only *informs*
forensics (tile localisation); it never decides a verdict.
"""

from __future__ import annotations

from typing import Any

from nearmiss.engine.jaxpr_walk import iter_eqns


def _block_dim(dim: Any) -> int:
    if dim is None:
        return 1
    if isinstance(dim, int):
        return dim
    size = getattr(dim, "block_size", None)
    return int(size) if isinstance(size, int) else 1


def kernel_geometry(closed_jaxpr: Any) -> list[dict[str, Any]]:
    """One entry per pallas_call: its grid and, per output, the array and block shapes."""
    calls = []
    for eqn in iter_eqns(closed_jaxpr.jaxpr):
        if eqn.primitive.name != "pallas_call":
            continue
        mapping = eqn.params["grid_mapping"]
        grid = [g if isinstance(g, int) else -1 for g in mapping.grid]
        first_out = mapping.num_inputs
        outputs = []
        for block in mapping.block_mappings[first_out : first_out + mapping.num_outputs]:
            outputs.append(
                {
                    "array_shape": [int(s) for s in block.array_aval.shape],
                    "block_shape": [_block_dim(d) for d in block.block_shape],
                }
            )
        calls.append({"grid": grid, "outputs": outputs})
    return calls
