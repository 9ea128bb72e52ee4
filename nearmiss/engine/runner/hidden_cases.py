"""The hidden cases a spec can serve, drawn and computed in the spec's child.

``nearmiss.engine.hidden`` says which cases to draw; here they get their inputs (the spec's
``make_inputs`` on a fresh key, then the scale) and references, before the run is described:
only cases the spec can serve are announced, with the tolerance their scale needs. Used by the
certifying run (``reference_child.prepare``) and by ``spec check`` (``spec_noise``), which
reports what could not be served.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nearmiss.engine.runner.case_draw import arrays_or_none, case_key


@dataclass
class ServedHidden:
    """A hidden case the spec serves: drawn and computed before the run is described, so that
    only cases the spec can serve are announced, with the tolerance their scale needs."""

    case: Any
    inputs: tuple
    reference: Any
    tolerance: tuple[float, float]


def _scaled(jax, np, inputs, scale: float) -> tuple | None:
    """The inputs with each signal-like float input multiplied by ``scale`` in its own dtype;
    None when there is none to scale."""
    from nearmiss.engine.hidden import scalable

    if not any(scalable(np, x) for x in inputs):
        return None
    return tuple(
        jax.numpy.asarray(x) * jax.numpy.asarray(scale, jax.numpy.asarray(x).dtype)
        if scalable(np, x)
        else x
        for x in inputs
    )


def serve_hidden(jax, np, spec, seed: int) -> tuple[list[ServedHidden], list[str]]:
    """The check's hidden cases (``nearmiss.engine.hidden``) the spec can serve, and notes on
    what it could not: a spec whose ``make_inputs`` or reference cannot take a drawn size or
    scale has told the engine that size is outside what it allows (a note asks it to say so
    in ``domains`` or ``value_scales``)."""
    from nearmiss.engine.hidden import HIDDEN_SUITE, draw, finite_where, magnitude, narrow
    from nearmiss.engine.spec import Case

    served, notes = [], narrow(spec)
    for hidden in draw(spec, seed):
        case = hidden.case
        key = case_key(jax, seed, HIDDEN_SUITE, case.name)
        try:
            inputs = tuple(spec.make_inputs(case, key))
            if arrays_or_none(jax, np, inputs) is None:
                raise TypeError("make_inputs returned values that are not arrays")
            reference = jax.block_until_ready(spec.reference(*inputs))
        except Exception as exc:
            notes.append(
                f"hidden case {case.name} ({_dims(case)}) left out: the spec cannot serve it "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
                + "); declare the sizes it allows in OpSpec(domains=...)"
            )
            continue
        atol, rtol = spec.tolerance_for(case.dtype)
        base = jax.tree_util.tree_leaves(reference)
        for scale in hidden.scales:
            scaled = None if scale == 1.0 else _scaled(jax, np, inputs, scale)
            if scaled is None:  # nothing to scale: the case is a fresh draw of its base
                name = case.name if scale == 1.0 else "fresh"
                served.append(
                    ServedHidden(
                        Case(name, case.dims, case.dtype, case.profile),
                        inputs,
                        reference,
                        (atol, rtol),
                    )
                )
                break
            try:
                stretched = jax.block_until_ready(spec.reference(*scaled))
            except Exception:
                continue
            leaves = jax.tree_util.tree_leaves(stretched)
            if len(leaves) != len(base) or not finite_where(np, leaves, base):
                continue  # the spec's own reference does not hold at this scale
            grown = magnitude(np, leaves) / max(magnitude(np, base), 1e-30)
            served.append(
                ServedHidden(
                    # Its profile names the scale: scaled values are adversarial, and a kernel
                    # failing only there is unstable, whatever profile they were drawn from.
                    Case(f"values-x{scale:g}", case.dims, case.dtype, f"{case.profile}-x{scale:g}"),
                    scaled,
                    stretched,
                    (atol * max(1.0, grown), rtol),
                )
            )
            break
        else:
            notes.append(
                f"hidden case {case.name} left out: the spec's reference is not finite on its "
                f"inputs scaled by {', '.join(f'{s:g}' for s in hidden.scales)}; declare the "
                "scales it allows in OpSpec(value_scales=...)"
            )
    for item in served:
        item.tolerance = _noise_room(jax, np, spec, item.inputs, item.reference, item.tolerance)
    return served, notes


def _noise_room(jax, np, spec, inputs, reference, tolerance: tuple[float, float]):
    """``tolerance``, both terms widened alike until the reference's own noise on these inputs
    (its result against the same computation in float64, ``retype``) uses at most
    1/``NOISE_MARGIN`` of it: at a drawn size or magnitude the reference may round more than on
    the listed cases (logits scaled 16 times round 16 times coarser), and a correct kernel that
    rounds differently must still fit. As it is where the noise cannot be measured, or where
    the comparison is exact."""
    from nearmiss.engine.hidden import noise_used
    from nearmiss.engine.runner.retype import retyped_evaluation
    from nearmiss.engine.spec import NOISE_MARGIN

    atol, rtol = tolerance
    wide = getattr(jax, "enable_x64", None)
    if not (atol or rtol) or wide is None:
        return tolerance
    try:
        closed = jax.make_jaxpr(spec.reference)(*inputs)
        with wide(True):
            truth = retyped_evaluation(closed, inputs, np.float64, compiled=True)
        used = noise_used(np, jax.tree_util.tree_leaves(reference), truth, atol, rtol)
    except Exception:  # a reference float64 cannot evaluate: the listed tolerance stands
        return tolerance
    factor = NOISE_MARGIN * used
    return (atol * factor, rtol * factor) if factor > 1 else tolerance


def _dims(case) -> str:
    return ", ".join(f"{dim}={value}" for dim, value in case.dims.items())
