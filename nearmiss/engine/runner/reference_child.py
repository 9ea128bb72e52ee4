"""Sandbox child that runs the spec: inputs and reference outputs for every case.

It never sees the candidate, so a candidate cannot tamper with the ground truth. It first draws
every case's inputs (``inputs.npz``, reported as ``case_inputs`` with their shapes, so tracing can
start), then computes each reference (``reference.npz``, reported as ``case_ready``) under the
engine's work directory; anything wrong with the spec itself is reported as ``spec_error``.

Asked to (``controls``), it then stays for one more round: the engine's control cases
(``forensics.controls``), drawn and computed the same way with the spec already loaded. A control
the spec cannot serve (its ``make_inputs`` or ``reference`` raises on those dims) is reported as
``case_unrunnable`` — evidence that the control does not apply, never a spec error.

Then it waits: a worker that keeps it (``runner.spares.keep_spec``) sends the next check's
``prepare`` of the same spec, which it answers with the spec still loaded and JAX's compiled
operations still cached (the spec's file is read again and compared: other bytes load afresh).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from nearmiss.engine.runner.case_draw import arrays_or_none, case_key
from nearmiss.engine.runner.child import Channel, freeze_imports, start_child
from nearmiss.engine.runner.hidden_cases import ServedHidden, serve_hidden
from nearmiss.engine.runner.protocol import ChannelClosed

# Folded into a case's key to draw the fresh inputs of the input-independence probes.
PROBE_TAG = 0x5EED
# The suite label of the engine's control cases (they are custom cases, never certified on).
CONTROL_SUITE = "custom"


def reference_work(jax, spec, inputs) -> int | None:
    """The reference's total work, the yardstick for work a candidate does outside its kernel:
    measured on its StableHLO by the same audit that measures the candidate's artifact."""
    from nearmiss.engine.integrity.audit import total_work

    try:
        return total_work(jax.jit(spec.reference).lower(*inputs).compiler_ir("stablehlo"))
    except Exception:
        return None


def write_probes(jax, np, spec, case, key, arrays, reference, case_dir: Path) -> list[dict]:
    """Probe inputs for ``input_independent``: the case's inputs with one of them re-drawn.

    Only probes where the fresh input differs and changes the reference are worth running: there
    the candidate's output must change too.
    """
    from nearmiss.engine.runner.arrays import save_arrays

    fresh = arrays_or_none(jax, np, spec.make_inputs(case, jax.random.fold_in(key, PROBE_TAG)))
    if fresh is None or len(fresh) != len(arrays):
        return []
    probes = []
    for index, value in enumerate(fresh):
        if value.shape != arrays[index].shape or value.tobytes() == arrays[index].tobytes():
            continue
        mixed = [*arrays[:index], value, *arrays[index + 1 :]]
        leaves = jax.tree_util.tree_leaves(jax.block_until_ready(spec.reference(*mixed)))
        changed = arrays_or_none(jax, np, leaves)
        if changed is None or len(changed) != len(reference):
            continue
        if all(a.tobytes() == b.tobytes() for a, b in zip(changed, reference, strict=True)):
            continue
        probe_dir = case_dir / f"probe-{index}"
        probe_dir.mkdir(exist_ok=True)
        save_arrays(probe_dir / "inputs.npz", mixed)
        save_arrays(probe_dir / "reference.npz", changed)
        probes.append({"input": index, "dir": str(probe_dir)})
    return probes


def _profile_reference(jax, spec, inputs, runs: int) -> dict:
    """The reference compiled by XLA on this child's device, timed as the executor times the
    kernel (``runner.timing``); nothing when no runs are asked for. A reference that will not
    jit costs the comparison only: its values were already computed eagerly."""
    if runs < 1:
        return {}
    from nearmiss.engine.runner.timing import warm_median_s

    try:
        compiled = jax.jit(spec.reference)
        # Timed as a user would run it on the device: XLA's default precision (TF32 dots on a
        # GPU), not the full precision the ground truth is computed at (``main``).
        with jax.default_matmul_precision("default"):
            return {"reference_warm_s": warm_median_s(lambda: compiled(*inputs), runs)}
    except Exception as exc:
        return {"reference_profile_error": f"{type(exc).__name__}: {exc}"[:200]}


def parameter_names(spec) -> list[str]:
    """The reference's positional parameter names, in order (none where it has no signature)."""
    import inspect

    try:
        parameters = list(inspect.signature(spec.reference).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in parameters if p.kind in kinds]


def input_names(named: list[str], count: int) -> list[str]:
    """Names for ``count`` inputs: the reference's parameters (x0, x1, ... past them)."""
    return [named[i] if i < len(named) else f"x{i}" for i in range(count)]


def _save_inputs(case_dir: Path, parameters: list[str], arrays) -> tuple[Path, list[str]]:
    """Write a case's inputs where the candidate's child reads them: (the case's dir, the
    inputs' names). They carry their names: a probe's reference expressions refer to them."""
    from nearmiss.engine.runner.arrays import save_arrays

    case_dir.mkdir(parents=True, exist_ok=True)
    names = input_names(parameters, len(arrays))
    save_arrays(case_dir / "inputs.npz", arrays, {"names": names})
    return case_dir, names


# The spec loaded by an earlier request of this child, keyed by what it was loaded from.
_loaded: dict[tuple[str, str | None, bytes], Any] = {}


def _spec_for(request: dict):
    """The spec the request names: the one already loaded where the file holds the same bytes
    under the same names (a kept child's next check), else loaded now."""
    from nearmiss.engine.spec import load_spec

    path, shown = request["spec"], request.get("shown")
    try:
        key = (path, shown, Path(path).read_bytes())
    except OSError:
        return load_spec(path, shown)  # says what is wrong with it
    if key not in _loaded:
        _loaded.clear()  # one spec per child: another's module state is not kept around
        _gradients.clear()
        _loaded[key] = load_spec(path, shown)
    return _loaded[key]


def prepare(channel: Channel, request: dict) -> dict | None:
    """Answer one check's request; the message that ended its control rounds, if it had any
    (the next request), else None."""
    import jax
    import numpy as np

    from nearmiss.engine.runner.arrays import save_arrays, shapes_of
    from nearmiss.engine.runner.selection import SelectionError, select_cases
    from nearmiss.engine.spec import SpecError

    if request.get("cache"):
        from nearmiss.engine.runner.compile_cache import enable_persistent_cache

        enable_persistent_cache(jax, request["cache"])
    try:
        spec = _spec_for(request)
        cases = select_cases(spec, request["suite"], request.get("select"))
    except SelectionError as exc:
        channel.send(event="spec_error", message=f"invalid case request: {exc}")
        return None
    except SpecError as exc:
        channel.send(event="spec_error", message=str(exc))
        return None
    from nearmiss.engine.hidden import HIDDEN_SUITE, describe, domains

    # A certifying check adds the hidden cases; a fixer's run never sees them.
    hidden: dict[str, ServedHidden] = {}
    notes: list[str] = []
    if request.get("hidden"):
        try:
            served, notes = serve_hidden(jax, np, spec, int(request["seed"]))
        except Exception as exc:  # make_inputs or the reference misbehaving past their raise
            served, notes = [], [f"no hidden case: {type(exc).__name__}: {exc}"[:300]]
        hidden = {h.case.name: h for h in served}
        cases = [*cases, *((HIDDEN_SUITE, h.case) for h in served)]
    channel.send(
        event="spec",
        name=spec.name,
        category=spec.category,
        description=spec.description,
        platform=jax.default_backend(),
        jax_version=jax.__version__,
        targets=list(spec.targets),
        cases=[
            {
                "suite": suite,
                "name": case.name,
                "dims": dict(case.dims),
                "dtype": case.dtype,
                "profile": case.profile,
                "tolerance": list(
                    hidden[case.name].tolerance
                    if suite == HIDDEN_SUITE
                    else spec.tolerance_for(case.dtype)
                ),
            }
            for suite, case in cases
        ],
        domains={dim: describe(domain) for dim, domain in domains(spec).items()},
        hidden_notes=notes,
    )
    if request.get("describe_only"):
        channel.send(event="done")
        return None
    if request.get("controls_only"):  # the suite's answer was kept (``truth_cache``): only the
        channel.send(event="done")  # controls are asked of this child, drawn from their keys
        return control_round(channel, request, spec, parameter_names(spec), cases)
    workdir = Path(request["workdir"])
    integrity = bool(request.get("integrity"))
    parameters = parameter_names(spec)  # the signature once; a case may have fewer inputs
    # Every case's inputs first: a tracing child needs only their shapes and can start at once,
    # while this child goes on to the references.
    drawn = []
    for suite, case in cases:
        label = f"{suite} case {case.name!r}"
        key = case_key(jax, request["seed"], suite, case.name)
        try:
            inputs = (
                hidden[case.name].inputs if suite == HIDDEN_SUITE else spec.make_inputs(case, key)
            )
        except Exception as exc:
            channel.send(
                event="spec_error",
                message=f"make_inputs raised on {label}: {type(exc).__name__}: {exc}",
            )
            return None
        arrays = arrays_or_none(jax, np, inputs) if isinstance(inputs, tuple | list) else None
        if arrays is None:
            channel.send(
                event="spec_error",
                message=f"make_inputs must return a tuple of arrays "
                f"(got {type(inputs).__name__}) on {label}",
            )
            return None
        case_dir, names = _save_inputs(workdir / f"{suite}-{case.name}", parameters, arrays)
        channel.send(
            event="case_inputs",
            suite=suite,
            name=case.name,
            dir=str(case_dir),
            avals=shapes_of(arrays),
            inputs=[
                f"{name}: {a.dtype.name}{list(a.shape)}"
                for name, a in zip(names, arrays, strict=True)
            ],
        )
        drawn.append((suite, case, label, key, inputs, arrays, case_dir))
    for position, (suite, case, label, key, inputs, arrays, case_dir) in enumerate(drawn):
        started = time.perf_counter()
        try:
            reference = (
                hidden[case.name].reference
                if suite == HIDDEN_SUITE
                else jax.block_until_ready(spec.reference(*inputs))
            )
        except Exception as exc:
            channel.send(
                event="spec_error",
                message=f"reference raised on {label}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
            return None
        leaves, treedef = jax.tree_util.tree_flatten(reference)
        ref_arrays = arrays_or_none(jax, np, leaves)
        if ref_arrays is None or not ref_arrays:
            channel.send(
                event="spec_error",
                message=f"reference returned non-array values on {label}: {treedef}",
            )
            return None
        save_arrays(case_dir / "reference.npz", ref_arrays, {"treedef": str(treedef)})
        reference_s = time.perf_counter() - started
        work, probes = None, []
        if integrity:
            work = reference_work(jax, spec, inputs)
            if position == 0:
                try:
                    probes = write_probes(jax, np, spec, case, key, arrays, ref_arrays, case_dir)
                except Exception as exc:
                    channel.send(
                        event="spec_error",
                        message=f"make_inputs or reference raised on a fresh draw of {label}: "
                        f"{type(exc).__name__}: {exc}",
                    )
                    return None
        channel.send(
            event="case_ready",
            suite=suite,
            name=case.name,
            dir=str(case_dir),
            reference_s=reference_s,
            reference_work=work,
            probes=probes,
            **_profile_reference(jax, spec, inputs, int(request.get("profile_runs") or 0)),
        )
    channel.send(event="done")
    if request.get("controls"):
        return control_round(channel, request, spec, parameters, cases)
    return None


def _unrunnable(channel: Channel, name: str, what: str, exc: Exception) -> None:
    text = str(exc).splitlines()[0] if str(exc) else ""
    channel.send(
        event="case_unrunnable",
        suite=CONTROL_SUITE,
        name=name,
        message=f"{what} raised: {type(exc).__name__}: {text}"[:300],
    )


def control_round(channel: Channel, request: dict, spec, parameters: list[str], suite) -> dict:
    """The engine's control cases, as many rounds as it asks for (``{"cmd": "controls",
    "cases": [...]}``; anything else ends them and is returned). Every case gets
    ``case_inputs`` then ``case_ready`` — or ``case_unrunnable`` at the step the spec could not
    do — in the order asked, then the round ``done``. ``suite``: the run's (suite, case) pairs,
    which a nudge (``forensics.reach``) redraws."""
    edges: dict = {}  # both sides of an edge are asked, in two rounds: found once
    while (asked := channel.receive()).get("cmd") == "controls":
        control_cases(channel, request, spec, parameters, asked.get("cases", []), suite, edges)
    return asked


def _draw(jax, np, spec, request: dict, item: dict, case, suite, edges: dict) -> tuple[tuple, dict]:
    """A control's inputs: drawn fresh for its own ``case``, or — a nudge — the suite case's
    own inputs redrawn from its key, with one element of one input moved up by ``by`` times
    that input's rms, or two inputs swapped (``swap``). With them, what the engine is told of
    the draw: for a nudge at the reference's edge (``boundary``), where that edge is and the
    element moved (``{"index", "used", "ignored"}``); else nothing. ``edges``: the edges found
    so far in this check's control rounds, by case, input and axis."""
    if "nudge" not in item:
        key = case_key(jax, request["seed"], CONTROL_SUITE, case.name)
        return spec.make_inputs(case, key), {}
    nudge = item["nudge"]
    label, name = nudge["of"]
    case = next(c for s, c in suite if (s, c.name) == (label, name))
    inputs = list(spec.make_inputs(case, case_key(jax, request["seed"], label, name)))
    if "swap" in nudge:
        i, j = nudge["swap"]
        inputs[i], inputs[j] = inputs[j], inputs[i]
        return tuple(inputs), {}
    index, told = tuple(nudge["index"]), {}
    if "boundary" in nudge:
        axis, side = int(nudge["boundary"]["axis"]), str(nudge["boundary"]["side"])
        at = (label, name, nudge["input"], axis)
        if at not in edges:
            edges[at] = _edge(jax, np, spec, inputs, nudge["input"], axis)
        used, ignored = edges[at]
        index = index[:axis] + (used if side == "used" else ignored,) + index[axis + 1 :]
        told = {"index": list(index), "used": used, "ignored": ignored}
    original = inputs[nudge["input"]]
    x = np.array(original)  # a copy in the input's own dtype (numpy or JAX, float64 or bf16)
    wide = x.astype(np.float64)
    size = float(np.sqrt(np.mean(np.square(wide))))  # in float64: huge float32 values square
    size = size if np.isfinite(size) and size > 0 else 1.0
    top = float(jax.numpy.finfo(x.dtype).max) / 4  # never past what the dtype holds
    x[index] = min(wide[index] + float(nudge["by"]) * size, top)
    inputs[nudge["input"]] = jax.numpy.asarray(x) if isinstance(original, jax.Array) else x
    return tuple(inputs), told


# The reference's gradient compiled (``_edge``), by reference and input position, for the
# next check of the spec; None where it needs concrete values (differentiated op by op).
_gradients: dict[tuple[Any, int], Any] = {}


def _gradient(reference, position: int, *args):
    """The gradient of ``reference(*args)`` against its ``position``-th argument, for a random
    cotangent drawn from a fixed key."""
    import jax

    def reference_of(value):
        given = list(args)
        given[position] = value
        return reference(*given)

    out, pullback = jax.vjp(reference_of, args[position])
    leaves, tree = jax.tree_util.tree_flatten(out)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    cotangent = [
        jax.random.normal(k, leaf.shape, jax.numpy.float32).astype(leaf.dtype)
        for k, leaf in zip(keys, leaves, strict=True)
    ]
    (grad,) = pullback(jax.tree_util.tree_unflatten(tree, cotangent))
    return grad


def _edge(jax, np, spec, inputs: list, position: int, axis: int) -> tuple[int, int]:
    """Where the reference stops reading the ``position``-th input along ``axis``: (the last
    position some output depends on, the first none does) — a length mask's bound, a window's
    edge, the end of a cache's valid part. Read from the reference's gradient against a random
    cotangent (zero, but for chance, only where nothing depends on the element). ValueError
    unless the positions read form one run with positions unread beside it (one or two
    changes along the axis): an elementwise op's scattered zeros are no edge."""
    import functools

    args = list(inputs)
    args[position] = jax.numpy.asarray(args[position])
    # Evidence only (where a nudge goes), never the ground truth, so it is compiled as one
    # program: op by op, a scan's gradient is hundreds of small compiles (8 CPU-s for a
    # cummax of 512 columns, against 1.3 jitted), and the program is kept for the next check
    # of the spec. (Compiled, a float64 NumPy input is float32 and a float16 intermediate may
    # be kept wider: a difference in the last bits of a gradient whose zeros are the finding.)
    # A reference that needs values concrete (a boolean mask's selection, a length read with
    # ``int``) is differentiated op by op, from its first failed compile on.
    which = (spec.reference, position)
    if which not in _gradients:
        _gradients[which] = jax.jit(functools.partial(_gradient, spec.reference, position))
    grad = None
    if _gradients[which] is not None:
        try:
            grad = _gradients[which](*args)
        except Exception:
            _gradients[which] = None
    if grad is None:
        grad = _gradient(spec.reference, position, *args)
    size = np.abs(np.asarray(grad, np.float64))
    size = np.where(np.isfinite(size), size, 1.0)
    read = size.sum(axis=tuple(a for a in range(size.ndim) if a != axis)) > 0
    changes = np.nonzero(read[1:] != read[:-1])[0]
    if not 1 <= changes.size <= 2:
        raise ValueError(f"no single edge to what the reference reads along axis {axis}")
    at = int(changes[0])  # read[at] != read[at + 1]
    return (at, at + 1) if read[at] else (at + 1, at)


def control_cases(
    channel: Channel, request: dict, spec, parameters: list[str], cases, suite, edges: dict
) -> None:
    import jax
    import numpy as np

    from nearmiss.engine.runner.arrays import save_arrays, shapes_of
    from nearmiss.engine.spec import Case

    workdir = Path(request["workdir"])
    drawn = []
    for item in cases:
        name = str(item.get("name"))
        try:
            case = Case(name, item["dims"], dtype=item["dtype"], profile=item["profile"])
            inputs, told = _draw(jax, np, spec, request, item, case, suite, edges)
            arrays = arrays_or_none(jax, np, inputs) if isinstance(inputs, tuple | list) else None
            if arrays is None:
                raise TypeError(f"make_inputs returned {type(inputs).__name__}, not arrays")
        except Exception as exc:
            _unrunnable(channel, name, "make_inputs", exc)
            continue
        case_dir, _ = _save_inputs(workdir / f"{CONTROL_SUITE}-{name}", parameters, arrays)
        channel.send(
            event="case_inputs",
            suite=CONTROL_SUITE,
            name=name,
            dir=str(case_dir),
            avals=shapes_of(arrays),
            tolerance=list(spec.tolerance_for(case.dtype)),
            nudged=told,
        )
        drawn.append((name, inputs, case_dir))
    for name, inputs, case_dir in drawn:
        try:
            leaves, treedef = jax.tree_util.tree_flatten(
                jax.block_until_ready(spec.reference(*inputs))
            )
            ref_arrays = arrays_or_none(jax, np, leaves)
            if not ref_arrays:
                raise TypeError(f"the reference returned non-array values: {treedef}")
        except Exception as exc:
            _unrunnable(channel, name, "reference", exc)
            continue
        save_arrays(case_dir / "reference.npz", ref_arrays, {"treedef": str(treedef)})
        channel.send(event="case_ready", suite=CONTROL_SUITE, name=name, dir=str(case_dir))
    channel.send(event="done")


def main() -> None:
    channel = start_child()
    # JAX before the request: a child started ahead of its check (``runner.spares``) has it
    # imported while it waits; a child started for its request loses nothing.
    import jax
    import numpy  # noqa: F401

    freeze_imports()
    if os.environ.get("JAX_PLATFORMS", "cpu") != "cpu":  # the engine names the device
        # The ground truth at full precision on a device too, as on the CPU: a GPU's default
        # computes float32 dots in TF32, and a kernel would be certified against rounded values.
        jax.config.update("jax_default_matmul_precision", "highest")

    request = channel.receive()
    if request.get("cmd") == "calibrate":
        from nearmiss.engine.runner.spec_noise import calibrate

        calibrate(channel, request)
    else:
        # One check's request, then (a kept child) the next checks' of the same spec, until
        # the engine closes the channel or asks for something else.
        with contextlib.suppress(ChannelClosed):
            while request.get("cmd") == "prepare":
                request = prepare(channel, request) or channel.receive()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: nothing is left to flush, and JAX's is slow


if __name__ == "__main__":
    main()
