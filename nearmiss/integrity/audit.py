"""What a traced function does, measured on its jaxpr: the facts the dynamic integrity rules need.

This module runs inside the sandbox children — on the candidate's jaxpr in the candidate child and
on the reference's in the reference child — and returns plain JSON-able dicts. It decides
nothing: the engine validates what comes back and applies the rules (``integrity.dynamic``).
The static rules keep candidate code away from this module (no imports beyond JAX, NumPy and a
little of the standard library, no interpreter internals), so the audit describes the kernel as
traced.

Work is counted in element operations, a FLOP-like unit: a matmul costs 2·M·N·K, a reduction or a
transcendental one per element it reads or writes, elementwise arithmetic one per output element,
layout glue nothing. Nested jit, cond (the costliest branch), scan (body × length), while (body
once: the trip count is unknown), remat and custom_jvp/vjp are entered; pallas_call bodies are not,
since that is the kernel's own work.
"""

from __future__ import annotations

import math
from typing import Any

from nearmiss.runner.geometry import iter_eqns, sub_jaxprs

# Layout and bookkeeping: moving or relabelling data, never computing on it.
GLUE = frozenset(
    {
        "pad",
        "reshape",
        "slice",
        "dynamic_slice",
        "dynamic_update_slice",
        "transpose",
        "broadcast_in_dim",
        "convert_element_type",
        "concatenate",
        "squeeze",
        "expand_dims",
        "copy",
        "copy_p",
        "iota",
        "rev",
        "select_n",
        "reduce_precision",
        "bitcast_convert_type",
        "stop_gradient",
        "split",
        "full_like",
        "device_put",
        "sharding_constraint",
        "optimization_barrier",
        "random_bits",
        "random_seed",
        "random_wrap",
        "random_unwrap",
        "threefry2x32",
    }
)
REDUCTIONS = frozenset(
    {
        "reduce_sum",
        "reduce_max",
        "reduce_min",
        "reduce_prod",
        "reduce_and",
        "reduce_or",
        "reduce_xor",
        "argmax",
        "argmin",
        "reduce",
        "cumsum",
        "cumprod",
        "cummax",
        "cummin",
        "cumlogsumexp",
        "reduce_window_sum",
        "reduce_window_max",
        "reduce_window_min",
        "reduce_window",
        "select_and_scatter_add",
    }
)
TRANSCENDENTALS = frozenset(
    {
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sin",
        "cos",
        "tan",
        "asin",
        "acos",
        "atan",
        "atan2",
        "sinh",
        "cosh",
        "asinh",
        "acosh",
        "atanh",
        "sqrt",
        "rsqrt",
        "cbrt",
        "pow",
        "erf",
        "erfc",
        "erf_inv",
        "lgamma",
        "digamma",
        "igamma",
        "bessel_i0e",
        "bessel_i1e",
    }
)
DATA_MOVEMENT = frozenset({"gather", "scatter", "scatter-add", "scatter_add", "scatter_mul"})
CALLBACKS = frozenset(
    {"pure_callback", "io_callback", "debug_callback", "callback", "outside_call"}
)
# Calls whose nested jaxpr takes the equation's operands one for one.
_PASS_THROUGH = frozenset(
    {
        "pjit",
        "jit",
        "closed_call",
        "core_call",
        "remat",
        "checkpoint",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "custom_lin",
    }
)


def _size(aval: Any) -> int:
    shape = getattr(aval, "shape", ())
    return math.prod(int(d) for d in shape) if shape else 1


def _type(var: Any) -> str:
    return str(getattr(var, "aval", "?"))


def _jaxpr(value: Any) -> Any:
    return value.jaxpr if hasattr(value, "jaxpr") and hasattr(value, "consts") else value


def _where(eqn: Any) -> str:
    """'file.py:12' of the user code that emitted an equation, '' when unknown."""
    try:
        from jax._src import source_info_util

        frame = source_info_util.user_frame(eqn.source_info.traceback)
    except Exception:  # a private API: a location is a courtesy, never a requirement
        return ""
    if frame is None:
        return ""
    return f"{frame.file_name.rsplit('/', 1)[-1]}:{frame.start_line}"


def primitive_work(eqn: Any) -> tuple[str, int]:
    """(kind, work) of one equation that holds no nested jaxpr: kind is glue, light or heavy."""
    name = eqn.primitive.name
    out = sum(_size(v.aval) for v in eqn.outvars)
    if name in GLUE:
        return "glue", 0
    if name == "dot_general":
        (lhs_contracting, _), _ = eqn.params["dimension_numbers"]
        lhs_shape = eqn.invars[0].aval.shape
        depth = math.prod(int(lhs_shape[d]) for d in lhs_contracting)
        return "heavy", 2 * out * depth
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval
        out_features = int(rhs.shape[eqn.params["dimension_numbers"].rhs_spec[0]])
        return "heavy", 2 * out * (_size(rhs) // max(out_features, 1))
    if name in REDUCTIONS:
        return "heavy", max(sum(_size(v.aval) for v in eqn.invars), out)
    if name == "sort":
        n = _size(eqn.invars[0].aval)
        return "heavy", int(n * max(math.log2(max(n, 2)), 1))
    if name in TRANSCENDENTALS or name in DATA_MOVEMENT:
        return "heavy", out
    return "light", out


def total_work(closed_jaxpr: Any) -> int:
    """All the work a traced function does, kernels included (for the reference)."""
    return _walk(_jaxpr(closed_jaxpr), 1, [], include_kernels=True)


def _walk(jaxpr: Any, times: int, found: list[dict[str, Any]], include_kernels: bool) -> int:
    """Work done by a jaxpr, executed ``times`` times; records costly equations in ``found``."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call" and not include_kernels:
            continue
        nested = list(sub_jaxprs(eqn.params))
        if name == "scan":
            total += sum(
                _walk(sub, times * int(eqn.params["length"]), found, include_kernels)
                for sub in nested
            )
        elif name == "cond":
            # Only one branch runs: count the costliest, record what it does.
            costs = [(_walk(sub, times, [], include_kernels), sub) for sub in nested]
            cost, branch = max(costs, key=lambda c: c[0], default=(0, None))
            if branch is not None:
                _walk(branch, times, found, include_kernels)
            total += cost
        elif nested:
            total += sum(_walk(sub, times, found, include_kernels) for sub in nested)
        else:
            kind, work = primitive_work(eqn)
            if kind != "glue":
                work *= times
                total += work
                found.append(
                    {
                        "primitive": name,
                        "kind": kind,
                        "work": work,
                        "operand": _type(eqn.invars[0]) if eqn.invars else "",
                        "where": _where(eqn),
                    }
                )
    return total


def _is_var(atom: Any) -> bool:
    """A jaxpr variable, as opposed to a Literal (which carries ``val`` and is unhashable)."""
    return not hasattr(atom, "val")


def _aliased_inputs(jaxpr: Any, inputs: dict[Any, int], found: list[dict[str, Any]]) -> None:
    """pallas_calls that alias (write into) one of the traced function's own inputs."""
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "pallas_call":
            for in_index, _ in eqn.params.get("input_output_aliases", ()):
                var = eqn.invars[in_index]
                if _is_var(var) and var in inputs:
                    found.append({"input": inputs[var], "where": _where(eqn)})
            continue
        operands = eqn.invars[1:] if name == "cond" else eqn.invars
        for sub in list(sub_jaxprs(eqn.params)):
            if name in _PASS_THROUGH or name == "cond":
                mapped = {
                    inner: inputs[outer]
                    for outer, inner in zip(operands, sub.invars, strict=False)
                    if _is_var(outer) and outer in inputs
                }
                if mapped:
                    _aliased_inputs(sub, mapped, found)


# How many of the costliest equations outside the kernels a report carries.
TOP_OUTSIDE = 8


def _costliest(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Equations grouped by (primitive, operand, location), heavy ones first, by work."""
    groups: dict[tuple[str, str, str, str], int] = {}
    for f in found:
        key = (f["primitive"], f["kind"], f["operand"], f["where"])
        groups[key] = groups.get(key, 0) + f["work"]
    ranked = sorted(groups.items(), key=lambda item: (item[0][1] != "heavy", -item[1]))
    return [
        {"primitive": p, "kind": k, "operand": o, "where": w, "work": work}
        for (p, k, o, w), work in ranked[:TOP_OUTSIDE]
    ]


def audit_candidate(closed_jaxpr: Any) -> dict[str, Any]:
    """The facts about a traced candidate that the dynamic rules judge."""
    jaxpr = _jaxpr(closed_jaxpr)
    outside: list[dict[str, Any]] = []
    _walk(jaxpr, 1, outside, include_kernels=False)
    callbacks = [
        {"primitive": eqn.primitive.name, "where": _where(eqn)}
        for eqn in iter_eqns(jaxpr, into_pallas=True)
        if eqn.primitive.name in CALLBACKS
    ]
    aliased: list[dict[str, Any]] = []
    _aliased_inputs(jaxpr, {var: i for i, var in enumerate(jaxpr.invars)}, aliased)
    return {
        "pallas_calls": sum(eqn.primitive.name == "pallas_call" for eqn in iter_eqns(jaxpr)),
        "outside_heavy": sum(f["work"] for f in outside if f["kind"] == "heavy"),
        "outside_light": sum(f["work"] for f in outside if f["kind"] == "light"),
        "costliest": _costliest(outside),
        "callbacks": callbacks[:TOP_OUTSIDE],
        "aliased_inputs": aliased[:TOP_OUTSIDE],
    }
