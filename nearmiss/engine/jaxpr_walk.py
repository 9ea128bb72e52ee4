"""Walking a traced program's jaxpr: the equations nested in loops, conditionals, calls and
(where asked) kernel bodies. Shared by the runner (which traces and rewrites programs) and the
targets (which lower their kernels); imports nothing.
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
