"""Walking and rewriting a traced program's jaxpr: the equations nested in loops,
conditionals, calls and (where asked) kernel bodies. Shared by the runner (which retargets
kernels and computes as a chip computes) and the targets (which lower kernels); imports JAX only
where a rewrite needs it.
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


def operands_inside(eqn: Any) -> Iterator[tuple[Any, dict[int, Any] | None]]:
    """Each jaxpr nested in ``eqn`` with where ``eqn``'s operands arrive in it: {operand's
    position: the nested jaxpr's variable}; None for a form this does not know (the caller says
    what that means for it). Operands are not a suffix of the nested inputs in general: a
    ``while``'s condition and body each get their own constants and the carry, a
    ``run_scoped`` body gets its operands as constants (its inputs are the scoped
    allocations), a conditional's branches get all but the index."""
    name, params, count = eqn.primitive.name, eqn.params, len(eqn.invars)
    if name == "while":
        cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
        carry = range(cond_n + body_n, count)
        for sub, consts in (
            (params["cond_jaxpr"].jaxpr, range(cond_n)),
            (params["body_jaxpr"].jaxpr, range(cond_n, cond_n + body_n)),
        ):
            yield sub, dict(zip([*consts, *carry], sub.invars, strict=True))
        return
    for sub in sub_jaxprs(params):
        if name == "run_scoped" and len(sub.constvars) == count:
            yield sub, dict(enumerate(sub.constvars))
        elif name == "cond" and len(sub.invars) == count - 1:
            yield sub, dict(zip(range(1, count), sub.invars, strict=True))
        elif name not in ("run_scoped", "cond") and len(sub.invars) == count:
            yield sub, dict(enumerate(sub.invars))  # calls, scans: operand for input
        else:
            yield sub, None


def iter_eqns(jaxpr: Any, *, into_pallas: bool = False) -> Iterator[Any]:
    """Every equation of a jaxpr, recursing into nested jaxprs (not kernel bodies by default)."""
    for eqn in jaxpr.eqns:
        yield eqn
        if eqn.primitive.name == "pallas_call" and not into_pallas:
            continue
        for sub in sub_jaxprs(eqn.params):
            yield from iter_eqns(sub, into_pallas=into_pallas)


def rewrite_eqns(jaxpr: Any, rewrite: Any, in_kernel: bool = False) -> tuple[Any, set]:
    """``jaxpr`` with each equation passed through ``rewrite(eqn, in_kernel)``: a new equation,
    or None to keep it and look inside its nested jaxprs (``in_kernel`` True inside a
    pallas_call's body). Returns ``jaxpr`` itself where nothing changed (so untouched jaxprs
    keep their caches), and the effects the rewrite added: every enclosing equation and jaxpr
    (a jit, a cond branch, a pallas_call) declares them, as tracing would have."""
    eqns, added = [], set()
    for eqn in jaxpr.eqns:
        new = rewrite(eqn, in_kernel)
        if new is None:
            new = _rewrite_inside(eqn, rewrite, in_kernel)
        if new is not eqn:
            added |= set(new.effects) - set(eqn.effects)
        eqns.append(new)
    if all(new is old for new, old in zip(eqns, jaxpr.eqns, strict=True)):
        return jaxpr, set()
    return jaxpr.replace(eqns=eqns, effects=set(jaxpr.effects) | added), added


def _rewrite_inside(eqn: Any, rewrite: Any, in_kernel: bool) -> Any:
    inside = in_kernel or eqn.primitive.name == "pallas_call"
    params, more = {}, set()
    for key, value in eqn.params.items():
        params[key], extra = _rewrite_value(value, rewrite, inside)
        more |= extra
    if all(params[key] is eqn.params[key] for key in params):
        return eqn
    if eqn.primitive.name == "pallas_call":  # how its body runs decides its effects
        _, effects = eqn.primitive.abstract_eval(*(v.aval for v in eqn.invars), **params)
        more |= set(effects) - set(eqn.effects)
    return eqn.replace(params=params, effects=set(eqn.effects) | more)


def _rewrite_value(value: Any, rewrite: Any, in_kernel: bool) -> tuple[Any, set]:
    from jax._src import core

    if isinstance(value, tuple | list):
        pairs = [_rewrite_value(item, rewrite, in_kernel) for item in value]
        if all(new is old for (new, _), old in zip(pairs, value, strict=True)):
            return value, set()
        return type(value)(new for new, _ in pairs), set().union(*(a for _, a in pairs))
    if isinstance(value, core.ClosedJaxpr):
        inner, added = rewrite_eqns(value.jaxpr, rewrite, in_kernel)
        return (value if inner is value.jaxpr else value.replace(jaxpr=inner)), added
    if isinstance(value, core.Jaxpr):
        return rewrite_eqns(value, rewrite, in_kernel)
    return value, set()
