"""What a traced kernel's pallas_calls look like: grid and output block shapes.

Runs inside the candidate child on the jaxpr of the jitted candidate. The result only *informs*
forensics (tile localisation); it never decides a verdict.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def sub_jaxprs(params: dict[str, Any]) -> Iterator[Any]:
    """Jaxprs nested in an equation's parameters (jit, cond branches, scan/while bodies...)."""
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if hasattr(item, "eqns"):
                yield item
            elif hasattr(item, "jaxpr") and hasattr(item, "consts"):
                yield item.jaxpr


def iter_eqns(jaxpr: Any, *, into_pallas: bool = False) -> Iterator[Any]:
    """Every equation of a jaxpr, recursing into nested jaxprs (not kernel bodies by default)."""
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name == "pallas_call" and not into_pallas:
            continue
        for sub in sub_jaxprs(eqn.params):
            yield from iter_eqns(sub, into_pallas=into_pallas)


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
