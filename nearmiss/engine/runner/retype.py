"""Re-evaluate a traced computation with every floating-point type replaced by one other.

``nearmiss spec check`` asks how much numerical noise a spec's reference carries at the case's
precision: it traces the reference once, as the check does, then evaluates the same jaxpr with
every float type widened to float64 (the "truth"), and again narrowed to bfloat16 (what a kernel
that computes in bfloat16 would get). Casting only the inputs would not do it: references
routinely widen bf16 inputs with ``x.astype(jnp.float32)`` and narrow the result back, which
would pin the float64 run to float32 (no noise measured) and the bfloat16 run to float32 (no bug
simulated). Here those casts, ``preferred_element_type``, literals and constants all follow the
new type; integer and boolean values are left alone (indices, masks, counters).

Calls (``jit``, ``custom_jvp``, ``checkpoint``, ...) are inlined; a primitive that carries
sub-computations (``scan``, ``while``, ``cond``) gets them retyped and re-traced. A primitive
that cannot take the new type raises: the caller reports the case as uncalibrated, it never
guesses. Runs in the spec's sandbox child (float64 needs ``jax_enable_x64``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core

from nearmiss.engine.runner.arrays import is_float

# Primitives that only call a sub-jaxpr: evaluated inline, so their fixed signatures (and
# shardings, names, custom rules) do not have to be rebuilt for the new type.
_CALLS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
    "checkpoint": "jaxpr",
    "remat": "jaxpr",
}


def _is_float(dtype: Any) -> bool:
    """``arrays.is_float`` for anything a jaxpr holds: no dtype (a Python literal), a dtype, a
    scalar type such as ``jnp.float32``."""
    if dtype is None:
        return False
    try:
        return is_float(dtype)
    except TypeError:
        return False


def _cast(value: Any, dtype: np.dtype) -> Any:
    own = getattr(value, "dtype", None)
    if _is_float(own) and own != dtype:
        return jnp.asarray(value).astype(dtype)
    return value


def _retyped_param(value: Any, dtype: np.dtype, zeroed: frozenset[float]) -> Any:
    if isinstance(value, np.dtype | type) and _is_float(value):
        return dtype
    if isinstance(value, core.ClosedJaxpr):
        return _retyped_closed(value, dtype, zeroed)
    if isinstance(value, tuple) and value and all(isinstance(v, core.ClosedJaxpr) for v in value):
        return tuple(_retyped_closed(v, dtype, zeroed) for v in value)
    return value


def _retyped_closed(
    closed: core.ClosedJaxpr, dtype: np.dtype, zeroed: frozenset[float]
) -> core.ClosedJaxpr:
    """A sub-computation (a loop body, a branch) traced again with the new float type."""
    structs = [
        jax.ShapeDtypeStruct(v.aval.shape, dtype if _is_float(v.aval.dtype) else v.aval.dtype)
        for v in closed.jaxpr.invars
    ]
    return jax.make_jaxpr(lambda *args: evaluate(closed, args, dtype, zeroed))(*structs)


def _scalar_float(value: Any) -> float | None:
    """The value of a float scalar (a literal, a constant), None for anything else."""
    if _is_float(getattr(value, "dtype", None)) and np.ndim(value) == 0:
        return float(value)
    return float(value) if isinstance(value, float) else None


def small_constants(closed: core.ClosedJaxpr | core.Jaxpr, below: float) -> list[float]:
    """The distinct float scalars written into a computation (literals and constants, in its
    sub-computations too) whose size is above 0 and at most ``below``: an eps, a clamp."""
    found: set[float] = set()
    if isinstance(closed, core.ClosedJaxpr):
        jaxpr, values = closed.jaxpr, list(closed.consts)
    else:
        jaxpr, values = closed, []
    for eqn in jaxpr.eqns:
        values += [v.val for v in eqn.invars if isinstance(v, core.Literal)]
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple) else (param,):
                if isinstance(sub, core.ClosedJaxpr | core.Jaxpr):
                    found.update(small_constants(sub, below))
    scalars = (_scalar_float(v) for v in values)
    found.update(v for v in scalars if v is not None and 0 < abs(v) <= below)
    return sorted(found)


def evaluate(
    closed: core.ClosedJaxpr | core.Jaxpr,
    args: Sequence[Any],
    dtype: Any,
    zeroed: frozenset[float] = frozenset(),
) -> list:
    """The outputs of ``closed`` on ``args`` with every float computed in ``dtype``, and each
    float scalar written into it whose value is in ``zeroed`` read as 0 (what a kernel that
    left that constant out computes)."""
    dtype = np.dtype(dtype)
    if isinstance(closed, core.ClosedJaxpr):
        jaxpr, consts = closed.jaxpr, closed.consts
    else:
        jaxpr, consts = closed, ()
    env: dict[Any, Any] = {}

    def written(value: Any) -> Any:
        return value * 0 if zeroed and _scalar_float(value) in zeroed else value

    def read(var: Any) -> Any:
        value = written(var.val) if isinstance(var, core.Literal) else env[var]
        return _cast(value, dtype)

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = written(value)
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = value
    for eqn in jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in _CALLS and _CALLS[name] in eqn.params:
            outputs = evaluate(eqn.params[_CALLS[name]], inputs, dtype, zeroed)
        else:
            params = {k: _retyped_param(v, dtype, zeroed) for k, v in eqn.params.items()}
            outputs = eqn.primitive.bind(*inputs, **params)
            if not eqn.primitive.multiple_results:
                outputs = [outputs]
        for var, value in zip(eqn.outvars, outputs, strict=True):
            if not isinstance(var, core.DropVar):
                env[var] = value
    return [read(v) for v in jaxpr.outvars]


def retyped_evaluation(
    closed: core.ClosedJaxpr,
    inputs: Sequence[Any],
    dtype: Any,
    zeroed: frozenset[float] = frozenset(),
    compiled: bool = False,
) -> list:
    """``evaluate`` on numpy inputs, returning numpy leaves (trace once, evaluate per type).
    ``compiled``: as one jitted program, rather than op by op (one compile instead of one per
    op: several times faster for a single evaluation)."""
    dtype = np.dtype(dtype)
    args = [_cast(jnp.asarray(value), dtype) for value in inputs]
    if compiled:
        outputs = jax.jit(lambda *values: evaluate(closed, values, dtype, zeroed))(*args)
    else:
        outputs = evaluate(closed, args, dtype, zeroed)
    return [np.asarray(value) for value in outputs]


# Steps that round a float to an integer value: a quantised reference's decisions. Where a value
# sits on a rounding boundary, float64 rounds it the other way from float32 and moves its outputs
# by a whole quantum: a difference no kernel that quantises as the reference does would show.
_ROUNDING = frozenset({"round", "floor", "ceil"})


def _rounds(eqn: Any) -> bool:
    """Whether ``eqn`` rounds a float to an integer value (``round``, a float cast to an int)."""
    name = eqn.primitive.name
    if name in _ROUNDING:
        return True
    if name == "convert_element_type":
        source = getattr(eqn.invars[0].aval, "dtype", None)
        target = eqn.params.get("new_dtype")
        return _is_float(source) and target is not None and np.dtype(target).kind in "iu"
    return False


def rounding_steps(closed: core.ClosedJaxpr | core.Jaxpr) -> tuple[int, int]:
    """(steps that round a float to an integer value where ``pinned_evaluation`` keeps the
    reference's own result: at the top or in a call; steps inside a loop or branch, which it
    cannot)."""
    jaxpr = closed.jaxpr if isinstance(closed, core.ClosedJaxpr) else closed
    pinned = nested = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in _CALLS and _CALLS[name] in eqn.params:
            inner, deeper = rounding_steps(eqn.params[_CALLS[name]])
            pinned, nested = pinned + inner, nested + deeper
            continue
        pinned += _rounds(eqn)
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple) else (param,):
                if isinstance(sub, core.ClosedJaxpr | core.Jaxpr):
                    nested += sum(rounding_steps(sub))
    return pinned, nested


def _own_type(var: Any) -> Any:
    """A jaxpr variable's value at its own type (a literal as the trace typed it)."""
    value = var.val
    dtype = getattr(var.aval, "dtype", None)
    return np.asarray(value, dtype) if dtype is not None else value


def _pinned(
    closed: core.ClosedJaxpr | core.Jaxpr, own: Sequence[Any], wide: Sequence[Any], dtype: Any
) -> tuple[list, list]:
    """(outputs at the trace's own types, outputs in ``dtype`` with every rounding step at the
    top or in a call taken from the own-type evaluation)."""
    if isinstance(closed, core.ClosedJaxpr):
        jaxpr, consts = closed.jaxpr, closed.consts
    else:
        jaxpr, consts = closed, ()
    at_own: dict[Any, Any] = {}
    at_wide: dict[Any, Any] = {}

    def read_own(var: Any) -> Any:
        return _own_type(var) if isinstance(var, core.Literal) else at_own[var]

    def read_wide(var: Any) -> Any:
        return _cast(var.val if isinstance(var, core.Literal) else at_wide[var], dtype)

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        at_own[var] = at_wide[var] = value
    for var, mine, widened in zip(jaxpr.invars, own, wide, strict=True):
        at_own[var], at_wide[var] = mine, widened
    for eqn in jaxpr.eqns:
        mine = [read_own(v) for v in eqn.invars]
        widened = [read_wide(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in _CALLS and _CALLS[name] in eqn.params:
            own_out, wide_out = _pinned(eqn.params[_CALLS[name]], mine, widened, dtype)
        else:
            own_out = eqn.primitive.bind(*mine, **eqn.params)
            params = {k: _retyped_param(v, dtype, frozenset()) for k, v in eqn.params.items()}
            wide_out = eqn.primitive.bind(*widened, **params)
            if not eqn.primitive.multiple_results:
                own_out, wide_out = [own_out], [wide_out]
            if _rounds(eqn):
                wide_out = [_cast(value, dtype) for value in own_out]
        for var, a, b in zip(eqn.outvars, own_out, wide_out, strict=True):
            if not isinstance(var, core.DropVar):
                at_own[var], at_wide[var] = a, b
    return [read_own(v) for v in jaxpr.outvars], [read_wide(v) for v in jaxpr.outvars]


def pinned_evaluation(closed: core.ClosedJaxpr, inputs: Sequence[Any], dtype: Any) -> list:
    """``retyped_evaluation`` of a quantised computation, keeping its own rounding: every step
    that rounds a float to an integer value (at the top or in a call; not inside a loop or a
    branch) takes the result the trace's own types give, and the rest is computed in ``dtype``.
    The difference from the reference is then the noise of the arithmetic around the rounding,
    not roundings flipped on a boundary."""
    dtype = np.dtype(dtype)
    own = [jnp.asarray(value) for value in inputs]
    wide = [_cast(value, dtype) for value in own]
    return [np.asarray(value) for value in _pinned(closed, own, wide, dtype)[1]]
