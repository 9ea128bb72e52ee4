"""Sandbox child that runs a fix agent's probe: an instrumented kernel returning intermediates.

The probe file defines ``probe(*inputs)`` returning a dict name → array; the agent's reference
expressions (pure JAX, e.g. ``jnp.cumsum(x, axis=1)``) are evaluated here too, with the case's
inputs bound to the spec's names — both are untrusted, so neither ever runs in the engine. The
child only files arrays; every statistic and comparison is computed by the engine.
"""

from __future__ import annotations

from nearmiss.engine.runner.candidate_child import Stages, load_case_inputs, serve
from nearmiss.engine.runner.child import describe_exception
from nearmiss.engine.runner.protocol import OUTPUT_FILE

MAX_VALUES = 32  # arrays one probe may return


def _named_arrays(values) -> tuple[list[str], list]:
    """The probe's dict as (names, numpy arrays); a TypeError says what was wrong with it."""
    if not isinstance(values, dict) or not values:
        raise TypeError(
            f"probe must return a non-empty dict name -> array, got {type(values).__name__}"
        )
    if len(values) > MAX_VALUES:
        raise TypeError(f"probe returned {len(values)} arrays; at most {MAX_VALUES} are allowed")
    if not all(isinstance(name, str) for name in values):
        raise TypeError("the keys of the probe's dict must be strings")
    return list(values), [_numeric(name, value) for name, value in values.items()]


def _numeric(name: str, value):
    """``value`` as a numpy array; a TypeError when it is not numeric (strings, objects...)."""
    import ml_dtypes
    import numpy as np

    array = np.asarray(value)
    if array.dtype.kind not in "biuf" and not hasattr(ml_dtypes, array.dtype.name):
        raise TypeError(f"{name!r} is not a numeric array ({array.dtype})")
    return array


# Builtins a reference expression may need (comprehensions, slicing); nothing that reaches out.
SAFE_BUILTINS: tuple[str, ...] = ("abs", "enumerate", "float", "int", "len", "list", "max")
SAFE_BUILTINS += ("min", "range", "slice", "sum", "tuple", "zip")


def _namespace(names: list[str], args) -> dict:
    """What a reference expression may use: the inputs by name, and JAX/NumPy."""
    import builtins

    import jax
    import jax.numpy as jnp
    import numpy as np

    return {
        "__builtins__": {name: getattr(builtins, name) for name in SAFE_BUILTINS},
        "jax": jax,
        "jnp": jnp,
        "lax": jax.lax,
        "np": np,
        "inputs": tuple(args),
        **dict(zip(names, args, strict=False)),
    }


def _evaluate(expressions: dict, namespace: dict) -> tuple[list[str], list, dict[str, str]]:
    """(names, arrays, errors) of the reference expressions; one failing leaves the rest."""
    names, arrays, errors = [], [], {}
    for name, expression in expressions.items():
        try:
            value = _numeric(name, eval(expression, dict(namespace)))  # only in this child
        except BaseException as exc:  # the expression is the agent's; report, don't die
            errors[name] = f"{type(exc).__name__}: {exc}"[:300]
            continue
        names.append(name)
        arrays.append(value)
    return names, arrays, errors


def run_probe(probe, request: dict) -> dict:
    from nearmiss.engine.runner.arrays import save_arrays

    case_dir, _, args, extra = load_case_inputs(request)
    result: dict = {"event": "case_done", "suite": request["suite"], "name": request["name"]}
    stages = Stages()
    try:
        _, values = stages.run(probe, args, result)
        names, arrays = _named_arrays(values)
    except (Exception, SystemExit) as exc:
        result.update(ok=False, error=describe_exception(exc, stages.phase))
        return result
    # The spec's child names every case's inputs (x0, x1, ... where the reference has none).
    ref_names, ref_arrays, ref_errors = _evaluate(
        request.get("expressions") or {}, _namespace(extra["names"], args)
    )
    save_arrays(
        case_dir / OUTPUT_FILE,
        arrays + ref_arrays,
        {"names": names, "reference_names": ref_names, "reference_errors": ref_errors},
    )
    result.update(ok=True, treedef=f"probe{sorted(names)}")
    return result


def main() -> None:
    serve("probe", run_probe)


if __name__ == "__main__":
    main()
