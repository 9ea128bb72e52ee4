"""Which elements each grid program of a kernel stores: what the ``gpu`` grid check needs where
BlockSpecs alone say two programs write one block.

The grid check (``integrity.grid``) reads each output's BlockSpec: two grid points whose index
maps name one block are a race on a GPU, whose programs run concurrently. A Triton-style kernel
often gives every program the whole array as its block and stores its own tile through a mask
(``pltriton.store(o_ref.at[rows, cols], value, mask=...)``): one block, disjoint elements, no
race. Telling the two apart needs what each program actually stores.

The candidate child builds, from the same traced program as every other artifact
(``traced_program``), the *footprint program*: each pallas_call runs twice more under JAX's plain
interpreter with its outputs starting at zero and every store into an output replaced by
``max(old, mark)`` over the same elements, under the same mask — the mark being ``p + 1`` in the
first run and ``G - p`` in the second (``p`` the program's linear index, ``G`` the grid's size).
An element then ends as ``(highest writer + 1, G - lowest writer)``, so it was written by one
program exactly when the two add up to ``G + 1`` (or both are zero: never written). Stores in a
branch, a loop or a call (``pl.when``, ``fori_loop``) are followed there: they flag what they
store, and the body's top marks the flagged elements right after (``_mark_stores``). The executor
runs that program on the case's own inputs (``shared_element``); only then is a block-level race
on that output let through, as a note. Anything the footprint cannot stand behind keeps the
finding (``_only_plain_access``): a kernel that reads an output back (what it loads could decide
what it stores, and reads of another program's elements race too), or does anything with it
but store (atomics add onto the marks), a kernel that stores into an input, a grid too large
for the output's dtype to hold the marks exactly, a kernel nested in a loop or a conditional,
a batched or dynamic grid. Marks no run can leave (a value that is not a mark, a shape apart)
leave the finding too.

Like the GPU_GRID lowering whose BlockSpecs made the finding, this program comes from the
candidate child, derived from the same single trace (``traced_program``); the executor runs it,
refusing what it runs for no artifact (host callbacks, unknown custom calls), checks that its
kernels have the report's grids, and never takes a number from it into a verdict.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

FOOTPRINT_FILE = "footprint.bin"
MAX_PROGRAMS = 4096  # grid programs a footprint is taken over (two interpreted runs of each)
_CALLS = ("pjit", "jit", "closed_call", "core_call")  # calls the footprint evaluates through
_STORES = ("swap", "masked_swap", "addupdate")
_LOADS = ("get", "masked_load")


class NoFootprint(Exception):
    """Why a kernel's footprint cannot be taken (the finding stays)."""


def footprint_program(closed: Any) -> Any:
    """A function of the program's inputs returning, for each pallas_call in the order
    ``integrity.grid`` numbers kernels, a header ``[outputs, *grid]``, each output's first
    marked run, then each output's second. ``closed``: the traced program with every
    pallas_call interpreted (the marked runs need their inputs as the program computes them).
    NoFootprint where one kernel has none."""
    from nearmiss.engine.jaxpr_walk import iter_eqns, sub_jaxprs

    runs: list[tuple[Any, Any]] = []
    for eqn in iter_eqns(closed.jaxpr):
        if eqn.primitive.name == "pallas_call":
            runs.append(_marked_calls(eqn))
        elif _called(eqn) is None and any(
            e.primitive.name == "pallas_call"
            for sub in sub_jaxprs(eqn.params)
            for e in iter_eqns(sub)
        ):
            raise NoFootprint(f"a kernel runs inside {eqn.primitive.name}")
    if not runs:
        raise NoFootprint("the program has no kernel")

    def program(*args: Any) -> list[Any]:
        found: list[Any] = []
        left = iter(runs)
        _evaluate(closed.jaxpr, closed.consts, list(args), left, found)
        if next(left, None) is not None:  # a kernel the evaluation did not reach
            raise NoFootprint("the program's kernels and its evaluation do not line up")
        return found

    return program


def _evaluate(jaxpr: Any, consts: Any, args: list[Any], runs: Any, found: list[Any]) -> list[Any]:
    """``jaxpr`` evaluated as ``core.eval_jaxpr`` would, but through calls, with each kernel's
    marked runs appended to ``found`` (in ``iter_eqns`` order, as ``runs`` yields them)."""
    from jax._src import core

    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, core.Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive.name == "pallas_call":
            import jax.numpy as jnp

            grid = eqn.params["grid_mapping"].grid
            found.append(jnp.asarray([len(eqn.outvars), *grid], jnp.int32))  # the header
            for primitive, params in next(runs):
                found.extend(primitive.bind(*invals, **params))
        inner = _called(eqn)
        if inner is not None:
            body, known = getattr(inner, "jaxpr", inner), getattr(inner, "consts", ())
            outs = _evaluate(body, known, invals, runs, found)
        else:
            outs = _bind(eqn, invals)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs, strict=True))
    return [read(v) for v in jaxpr.outvars]


def _called(eqn: Any) -> Any:
    """The jaxpr a call equation evaluates (a jit's ``jaxpr``, a ``closed_call``'s
    ``call_jaxpr``), None for any other equation."""
    if eqn.primitive.name not in _CALLS:
        return None
    return eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")


def _bind(eqn: Any, invals: list[Any]) -> Any:
    """``eqn`` applied to ``invals``, as ``core.eval_jaxpr`` applies it (JAX 0.10 gives the bind
    parameters alone, older ones with the sub-functions first)."""
    from jax._src import source_info_util

    bind = eqn.primitive.get_bind_params(eqn.params)
    subfuns, params = bind if isinstance(bind, tuple) else ((), bind)
    with source_info_util.user_context(eqn.source_info.traceback), eqn.ctx.manager:
        return eqn.primitive.bind(*subfuns, *invals, **params)


def _marked_calls(eqn: Any) -> tuple[Any, Any]:
    """The pallas_call twice (primitive and parameters), under the plain interpreter, with the
    stores into its outputs marked ``p + 1`` and ``G - p`` (see the module doc)."""
    mapping, body = eqn.params["grid_mapping"], eqn.params["jaxpr"]
    grid = mapping.grid
    if not all(isinstance(n, int) for n in grid):
        raise NoFootprint("its grid is dynamic")
    size = math.prod(grid)
    if size > MAX_PROGRAMS:
        raise NoFootprint(f"its grid has {size} programs (footprints go to {MAX_PROGRAMS})")
    if mapping.vmapped_dims:
        raise NoFootprint("the kernel is batched (vmap)")
    blocks = body.invars[mapping.slice_block_ops]
    inputs, outputs = set(blocks[: mapping.num_inputs]), set(blocks[mapping.num_inputs :])
    nested = _only_plain_access(body, outputs, inputs)
    largest = 2 * size + 1 if nested else size  # a flagged mark (``_mark_stores``), or a mark
    for var in eqn.outvars:
        if not _holds_marks(var.aval.dtype, largest):
            raise NoFootprint(f"{var.aval.dtype} cannot hold {size} program marks exactly")

    def mark_run(first: bool) -> tuple[Any, dict[str, Any]]:
        def mark(linear: Any, dtype: Any) -> Any:
            return (linear + 1 if first else size - linear).astype(dtype)

        rewritten = _mark_stores(body, outputs, mapping, mark, size)
        # Outputs start at zero (no mark), aliased ones too: what the input held is no mark.
        params = {
            **eqn.params,
            "jaxpr": rewritten,
            "interpret": True,
            "compiler_params": None,
            "input_output_aliases": (),
        }
        return eqn.primitive, params

    return mark_run(True), mark_run(False)


def _holds_marks(dtype: Any, size: int) -> bool:
    """Every mark 0..size is exact in ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return size <= np.iinfo(dtype).max
    if dtype.kind == "f" or "float" in dtype.name:
        import ml_dtypes

        return size <= 2 ** (ml_dtypes.finfo(dtype).nmant + 1)
    return False


def _only_plain_access(body: Any, outputs: set, inputs: set) -> bool:
    """NoFootprint unless every use of an output is a plain store (or, kept as the block-level
    verdict's, a read), at the top of the kernel body or inside a branch, a loop or a call it
    is passed into (``pl.when``, ``fori_loop``, ``jit``: there the store is marked as at the
    top, with the same program index). What is refused and why: an output read back (a load,
    or a store whose old value is used: what it reads could decide what it stores, and reading
    another program's element races too); an output passed to a nested form this reading does
    not know; any other operation on it, atomics included (they add onto the marks); and a
    store into an input (concurrent writes into the caller's buffer, which the grid check does
    not see). Returns whether an output is passed into a nested form."""
    from jax._src import core

    passed_in = False
    used = {v for e in body.eqns for v in e.invars if isinstance(v, core.Var)}
    used |= {v for v in body.outvars if isinstance(v, core.Var)}
    for eqn in body.eqns:
        name = eqn.primitive.name
        touched = {v for v in eqn.invars if isinstance(v, core.Var) and v in outputs}
        if _on(eqn, inputs) and name in _STORES:
            raise NoFootprint("the kernel stores into an input")
        nested = _refs_inside(eqn, outputs | inputs)
        if nested is not None:
            for inner, arriving in nested:
                _only_plain_access(inner, arriving & outputs, arriving & inputs)
            passed_in = passed_in or bool(touched)
            continue
        if not touched:
            continue
        if not _on(eqn, outputs) or len(touched) > 1 or name not in (*_STORES, *_LOADS):
            raise NoFootprint(f"an output is passed to {name}, not only stored")
        if name in _LOADS or any(v in used for v in eqn.outvars):
            raise NoFootprint("the kernel reads an output back")
    return passed_in


# Nested forms a marked store is followed into: branches (pl.when), loops, calls.
_NESTED = ("cond", "while", "scan", *_CALLS)


def _refs_inside(eqn: Any, refs: set) -> list[tuple[Any, _Arrivals]] | None:
    """Where ``eqn`` passes any of ``refs`` into a nested jaxpr of a form in ``_NESTED``: each
    nested jaxpr with the variables ``refs`` arrive as there (arrivals of an output stay
    outputs: ``_only_plain_access`` splits them by which set they came from); None where it
    passes none. NoFootprint for a nested form whose operands this does not map."""
    from jax._src import core

    from nearmiss.engine.jaxpr_walk import operands_inside

    if eqn.primitive.name not in _NESTED:
        return None  # not nested: the caller's plain-access rules judge it
    passed = {i: v for i, v in enumerate(eqn.invars) if isinstance(v, core.Var) and v in refs}
    if not passed:
        return None
    found = []
    for inner, arriving in operands_inside(eqn):
        if arriving is None:
            raise NoFootprint(f"an output is passed into {eqn.primitive.name} in a form not read")
        found.append(
            (
                getattr(inner, "jaxpr", inner),
                _Arrivals({arriving[i]: v for i, v in passed.items() if i in arriving}),
            )
        )
    return found


class _Arrivals(dict):
    """A nested jaxpr's variables that are outer refs, each to the outer ref it stands for;
    ``arrivals & refs`` are the nested variables of those ``refs``."""

    def __and__(self, refs: set) -> set:
        return {inner for inner, outer in self.items() if outer in refs}


def _on(eqn: Any, refs: set) -> bool:
    """Whether ``eqn`` works on one of ``refs`` (its first operand)."""
    from jax._src import core

    return bool(eqn.invars) and isinstance(eqn.invars[0], core.Var) and eqn.invars[0] in refs


def _mark_stores(body: Any, refs: set, mapping: Any, mark: Any, size: int, top: bool = True) -> Any:
    """``body`` with every store into ``refs`` replaced by ``max(old, mark(p))`` over the same
    elements and mask. A store in a branch, loop or call the refs are passed into
    (``_only_plain_access``; ``top`` False for such a body) cannot ask for its program's index
    there (the plain interpreter resolves ``program_id`` at the kernel's top only), so it flags
    what it stores instead (adds ``size + 1`` once), and right after that equation the top of
    the body turns each flagged element into ``max(old, mark(p))`` (``_settled``)."""
    from jax._src import core

    stored = _maximum_with(mark, mapping) if top else _flag(size)
    eqns: list[Any] = []
    for eqn in body.eqns:
        if eqn.primitive.name in _STORES and _on(eqn, refs):
            eqns.extend(_marked_store(eqn, mapping, stored))
            continue
        nested = _refs_inside(eqn, refs)
        if nested is None:
            eqns.append(eqn)
            continue
        eqns.append(_flagged_inside(eqn, nested, mapping, mark, size))
        if top:
            passed = [v for v in eqn.invars if isinstance(v, core.Var) and v in refs]
            for ref in dict.fromkeys(passed):  # each once, in operand order
                eqns.extend(_settled(ref, eqn, mapping, mark, size))
    effects = set(body.effects).union(*(e.effects for e in eqns))
    return body.replace(eqns=eqns, effects=effects)


def _maximum_with(mark: Any, mapping: Any) -> Any:
    """What a store at the kernel's top stores: ``max(old, mark(p))``."""
    import jax.numpy as jnp

    return lambda old: jnp.maximum(old, mark(_linear_program(mapping), old.dtype))


def _flag(size: int) -> Any:
    """What a nested store stores: the old value, flagged once (``size + 1`` added)."""
    import jax.numpy as jnp

    def flagged(old: Any) -> Any:
        flag = jnp.asarray(size + 1, old.dtype)
        return jnp.where(old >= flag, old, old + flag)

    return flagged


def _linear_program(mapping: Any) -> Any:
    """The program's index in the flattened grid (traced at the kernel's top only)."""
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    linear = jnp.int32(0)
    for axis, size in enumerate(mapping.grid):
        linear = linear * size + pl.program_id(axis)
    return linear


def _flagged_inside(
    eqn: Any, nested: list[tuple[Any, _Arrivals]], mapping: Any, mark: Any, size: int
) -> Any:
    """``eqn`` (a branch, loop or call) with the stores in its nested jaxprs flagged, however
    deep (``_mark_stores`` below the top)."""
    from jax._src import core

    flagged = {
        id(inner): _mark_stores(inner, set(arrivals), mapping, mark, size, top=False)
        for inner, arrivals in nested
    }

    def swapped(value: Any) -> Any:
        if isinstance(value, tuple | list):
            return type(value)(swapped(item) for item in value)
        if isinstance(value, core.ClosedJaxpr) and id(value.jaxpr) in flagged:
            return value.replace(jaxpr=flagged[id(value.jaxpr)])
        if isinstance(value, core.Jaxpr) and id(value) in flagged:
            return flagged[id(value)]
        return value

    effects = set(eqn.effects)
    effects |= {_read_effect(e) for e in eqn.effects if _read_effect(e) is not None}
    return eqn.replace(params={k: swapped(v) for k, v in eqn.params.items()}, effects=effects)


def _settled(ref: Any, after: Any, mapping: Any, mark: Any, size: int) -> list[Any]:
    """The equations, at the kernel's top, that turn the elements of ``ref`` a nested store
    flagged into ``max(old, mark(p))`` (``_mark_stores``)."""
    import jax.numpy as jnp

    def settle(ref_value: Any) -> list[Any]:
        whole = ref_value[...]
        flag = jnp.asarray(size + 1, whole.dtype)
        mine = jnp.maximum(whole - flag, mark(_linear_program(mapping), whole.dtype))
        ref_value[...] = jnp.where(whole >= flag, mine, whole)
        return []

    return _traced_on(settle, [ref], [], mapping, after)


def _marked_store(eqn: Any, mapping: Any, stored_value: Any) -> list[Any]:
    """The equations of ``stored_value(old)`` stored where ``eqn`` stores (same elements, same
    mask), on its variables."""
    import jax
    from jax._src.pallas import primitives as pallas_primitives
    from jax._src.state import primitives as state_primitives

    name = eqn.primitive.name

    def stored(*args: Any) -> Any:
        if name == "masked_swap":
            tree = eqn.params["args_tree"]
            ref, transforms, val, mask = tree.unflatten(args)
            load_args, load_tree = jax.tree_util.tree_flatten((ref, transforms, mask, None))
            old = pallas_primitives.load_p.bind(
                *load_args,
                args_tree=load_tree,
                cache_modifier=None,
                eviction_policy=None,
                is_volatile=False,
            )
            store_args, _ = jax.tree_util.tree_flatten((ref, transforms, stored_value(old), mask))
            return [pallas_primitives.swap_p.bind(*store_args, **eqn.params)]
        ref, val, *indexers = args
        old = state_primitives.get_p.bind(ref, *indexers, tree=eqn.params["tree"])
        new = stored_value(old)
        swapped = state_primitives.swap_p.bind(ref, new, *indexers, tree=eqn.params["tree"])
        return [swapped] if name == "swap" else []

    return _traced_on(stored, eqn.invars, eqn.outvars, mapping, eqn)


def _traced_on(function: Any, invars: list, outvars: list, mapping: Any, eqn: Any) -> list[Any]:
    """``function`` traced in the kernel's grid and spliced in on ``invars`` and ``outvars``
    (the body's variables), with ``eqn``'s source and its effects, reads included."""
    from jax._src import api_util, core
    from jax._src import linear_util as lu
    from jax._src.interpreters import partial_eval as pe
    from jax._src.pallas import core as pallas_core

    avals = [v.aval for v in invars]
    debug = api_util.debug_info("footprint", function, tuple(avals), {})
    with pallas_core.tracing_grid_env(mapping.grid, mapping.vmapped_dims):
        traced, _, consts = pe.trace_to_jaxpr_dynamic(
            lu.wrap_init(function, debug_info=debug), avals
        )
    if consts:
        raise NoFootprint("a marked store needs constants")
    rename: dict[Any, Any] = dict(zip(traced.invars, invars, strict=True))
    rename |= dict(zip(traced.outvars, outvars, strict=True))
    effects = set(eqn.effects)
    effects |= {_read_effect(e) for e in eqn.effects if _read_effect(e) is not None}

    def renamed(v: Any) -> Any:
        return rename.get(v, v) if isinstance(v, core.Var) else v

    return [
        e.replace(
            invars=[renamed(v) for v in e.invars],
            outvars=[renamed(v) for v in e.outvars],
            effects=effects,
            source_info=eqn.source_info,
        )
        for e in traced.eqns
    ]


def _read_effect(effect: Any) -> Any:
    from jax._src.state import types as state_types

    if isinstance(effect, state_types.WriteEffect):
        # the ref the effect is on: a variable in this JAX, an input's position in older ones
        where = getattr(effect, "input", None)
        return state_types.ReadEffect(
            getattr(effect, "input_index", None) if where is None else where
        )
    return None


@contextlib.contextmanager
def zero_filled() -> Any:
    """Fresh outputs of the plain interpreter start at zero (no mark) while the block runs."""
    from nearmiss.engine.runner.tpu_semantics import plain_fill

    with plain_fill(lambda shape, dtype: np.zeros(shape, dtype)):
        yield


# -- the executor's side ----------------------------------------------------------------------


def shared_element(highest: np.ndarray, lowest: np.ndarray, programs: int) -> tuple | None:
    """An element of one output stored by two programs, from its two marked runs (``highest`` =
    top writer + 1, ``lowest`` = ``programs`` - bottom writer), as ``(index, bottom, top)``;
    None where every element has at most one writer; ``()`` where the runs hold what no marked
    run can leave (a shape apart, a value not a mark: the footprint is not believed)."""
    # float64 holds every mark of every dtype a footprint is taken in (bfloat16 included)
    highest = np.asarray(highest).astype(np.float64)
    lowest = np.asarray(lowest).astype(np.float64)
    if highest.shape != lowest.shape:
        return ()
    for run in (highest, lowest):
        with np.errstate(invalid="ignore"):
            if not np.all(np.isfinite(run) & (run == np.round(run)) & (run >= 0)):
                return ()
            if not np.all(run <= programs):
                return ()
    if np.any((highest == 0) != (lowest == 0)):
        return ()
    untouched = highest == 0
    shared = np.argwhere(~untouched & (highest + lowest != programs + 1))
    if not len(shared):
        return None
    index = tuple(int(i) for i in shared[0])
    return index, programs - int(lowest[index]), int(highest[index]) - 1


def withdrawn_races(case_dir: Any, grid: dict[str, Any]) -> dict[str, Any]:
    """``grid`` (an ``integrity.grid`` report, as a dict) with each ``grid_race`` withdrawn, as
    a note, where the case's footprint program shows every element of that output written by
    at most one program. Runs in the executor, on the artifact the candidate child exported and
    the case's inputs; anything amiss leaves the findings as they are."""
    from pathlib import Path

    races = [f for f in grid.get("findings", []) if f.get("kind") == "grid_race"]
    path = Path(case_dir) / FOOTPRINT_FILE
    if not races or not path.is_file():
        return grid
    try:
        marks = _footprint_marks(path, Path(case_dir) / "inputs.npz")
    except Exception as exc:  # not run: every race stands
        return {**grid, "notes": [*grid.get("notes", []), f"no footprint: {exc}"[:300]]}
    kernels = grid.get("kernels", [])
    runs = _runs_by_kernel(marks, kernels)
    if runs is None:
        return grid  # not this report's kernels: nothing withdrawn
    kept, notes = [], list(grid.get("notes", []))
    for finding in grid["findings"]:
        k, o = finding.get("kernel"), finding.get("output")
        if finding not in races or not isinstance(k, int) or not 0 <= k < len(runs):
            kept.append(finding)
            continue
        highest, lowest = runs[k]
        if not isinstance(o, int) or not 0 <= o < len(highest):
            kept.append(finding)
            continue
        programs = math.prod(kernels[k]["grid"])
        shared = shared_element(highest[o], lowest[o], programs)
        name = kernels[k].get("name")
        if shared is None:
            notes.append(
                f"output {o} of kernel {name!r}: grid points share a block, but no element is "
                "stored by two programs (what each program stores, on this case's inputs): "
                "no race"
            )
            continue
        if shared == ():  # marks no run can leave: the race stands as the blocks say
            kept.append(finding)
            continue
        index, bottom, top = shared
        kept.append(
            finding
            | {
                "detail": (
                    f"output {o} of kernel {name!r}: programs {bottom} and {top} (of the "
                    f"flattened grid) both store its element {list(index)} (what each program "
                    "stores, on this case's inputs); GPU grid programs run concurrently, so "
                    "either store can land last: store each element from one program only"
                )
            }
        )
    return {**grid, "findings": kept, "notes": notes}


def _runs_by_kernel(marks: list[np.ndarray], kernels: list[dict]) -> list[tuple] | None:
    """The footprint's marked runs per kernel of the grid report, ``(first run's outputs,
    second run's outputs)``; None unless its headers name exactly the report's kernels, in
    order, with their grids."""
    runs, at = [], 0
    for kernel in kernels:
        if at >= len(marks) or marks[at].ndim != 1 or len(marks[at]) < 1:
            return None
        count, *grid = (int(n) for n in marks[at])
        if grid != list(kernel.get("grid", [])) or at + 1 + 2 * count > len(marks):
            return None
        runs.append((marks[at + 1 : at + 1 + count], marks[at + 1 + count : at + 1 + 2 * count]))
        at += 1 + 2 * count
    return runs if at == len(marks) else None


def _footprint_marks(path: Any, inputs: Any) -> list[np.ndarray]:
    import jax.numpy as jnp

    from nearmiss.engine.runner.arrays import load_arrays
    from nearmiss.engine.runner.artifact import read_artifact, vetted

    args = [jnp.asarray(a) for a in load_arrays(inputs)[0]]
    exported = vetted(read_artifact(path), args).exported
    return [np.asarray(a) for a in exported.call(*args)]
