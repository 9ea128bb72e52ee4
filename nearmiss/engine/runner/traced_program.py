"""One trace per shape: every artifact of a case is derived from the same traced program.

A check needs the candidate's kernel three ways: built for CPU interpret mode (the artifact whose
numbers are compared), lowered for a TPU chip (the artifact libtpu compiles and ``integrity.grid``
reads) and run under TPU interpret mode (the chip's semantics). Tracing the candidate's Python
once for each would let it tell the traces apart — a counter in a module-level list is enough —
and show the compiler one kernel and the comparison another
(``tests/forgeries/target_trace_counter.py``). So the candidate's Python runs once per input
shape: ``TracedProgram.trace`` keeps the jaxpr, and each use re-evaluates that jaxpr with every
``pallas_call``'s execution mode set by the engine (its ``interpret`` parameter, which is all
that Pallas' lowering reads to choose between the interpreter, an ``InterpretParams``
simulation and the chip's compiler). Re-evaluating a jaxpr runs no candidate code: kernel bodies
are jaxprs too, and source locations travel with the equations, so errors still name the
candidate's lines.

The same pass labels the kernels: each pallas_call is put inside a function named
``audit.KERNEL_LABEL`` (with the operands it writes in place), which is how the audit finds a
kernel in interpret mode's plain HLO. Doing it here, on the traced program, leaves JAX's public
objects as the candidate found them: a ``pallas_call`` replaced by a labelling wrapper was
something a candidate could see (its ``__wrapped__``) and compute wrong everywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nearmiss.engine.integrity.audit import ALIAS_MARK, KERNEL_LABEL
from nearmiss.engine.jaxpr_walk import iter_eqns, rewrite_eqns

PALLAS_CALL = "pallas_call"


class RetargetError(Exception):
    """A pallas_call the engine could not set the execution mode of (the candidate's fault)."""


@dataclass(frozen=True)
class TracedProgram:
    """The candidate's kernel traced once on one list of input shapes."""

    jaxpr: Any  # ClosedJaxpr of the jitted kernel
    out_tree: Any

    @classmethod
    def trace(cls, kernel: Any, avals: list[Any]) -> TracedProgram:
        import jax

        traced = jax.jit(kernel).trace(*avals)
        return cls(traced.jaxpr, traced.out_tree)

    def kernels(self) -> int:
        return sum(e.primitive.name == PALLAS_CALL for e in iter_eqns(self.jaxpr.jaxpr))

    def function(
        self, interpret: Any = None, *, grid_only: bool = False, label: str = KERNEL_LABEL
    ):
        """A function of the inputs that evaluates this program; with ``interpret`` (``False``
        for the chip's compiler, an ``InterpretParams``...) every pallas_call runs that way.

        ``grid_only``: every pallas_call keeps its grid, BlockSpecs (index maps), scratch and
        aliases but gets an empty body and no other platform's compiler parameters — what the
        ``gpu`` target's grid is read from through a TPU lowering, without a GPU: the body and
        a Triton kernel's ``plgpu.CompilerParams`` say nothing about which grid point writes
        which block, and the TPU lowering would refuse them for reasons no GPU has."""
        return self.evaluate(self.retargeted(interpret, grid_only=grid_only, label=label))

    def retargeted(
        self, interpret: Any = None, *, grid_only: bool = False, label: str = KERNEL_LABEL
    ) -> Any:
        """The program's ClosedJaxpr as ``function`` evaluates it, for a further rewrite
        (``runner.chip_arithmetic``) before ``evaluate``."""
        rewrite = _grid_only if grid_only else None
        if rewrite is None and _tpu_interpreter(interpret):
            # The TPU interpreter reads Mosaic's compiler parameters and asserts on others: a
            # Triton kernel's are for its GPU lowering, which this run stands in for.
            rewrite = _tpu_compiler_params_only
        if interpret is None and rewrite is None:
            return self.jaxpr
        return retargeted(self.jaxpr, interpret, rewrite, label=label)

    def evaluate(self, closed: Any):
        """A function of the inputs that evaluates ``closed`` (this program, rewritten)."""
        import jax
        from jax._src import core

        out_tree = self.out_tree

        def program(*args: Any) -> Any:
            flat = core.eval_jaxpr(closed.jaxpr, closed.consts, *args)
            return jax.tree_util.tree_unflatten(out_tree, flat)

        return program


def _grid_only(params: dict[str, Any]) -> dict[str, Any]:
    """A pallas_call's parameters with an empty kernel body (its refs kept, no equation) and
    compiler parameters only where they are Mosaic TPU's (others: the TPU default)."""
    body = params["jaxpr"]
    stub = body.replace(eqns=[], outvars=[], effects=set())
    return _tpu_compiler_params_only({**params, "jaxpr": stub})


def _tpu_interpreter(interpret: Any) -> bool:
    if interpret is None or isinstance(interpret, bool):
        return False
    from jax.experimental.pallas import tpu as pltpu

    return isinstance(interpret, pltpu.InterpretParams)


def _tpu_compiler_params_only(params: dict[str, Any]) -> dict[str, Any]:
    """A pallas_call's parameters with compiler parameters only where they are Mosaic TPU's
    (others: the TPU default)."""
    from jax._src.pallas.mosaic import core as tpu_core

    compiler = params.get("compiler_params")
    if compiler is not None and not isinstance(compiler, tpu_core.CompilerParams):
        return {**params, "compiler_params": None}
    return params


def retargeted(closed: Any, interpret: Any, rewrite: Any = None, label: str | None = None) -> Any:
    """``closed`` with every pallas_call's ``interpret`` parameter set to ``interpret`` (and
    its parameters passed through ``rewrite``, where given), checked: a pallas_call the
    rewrite did not reach is refused, never left as traced. With ``label`` each pallas_call
    also lowers into a function of that name, for the audit (``labelled_call``)."""

    def retarget(eqn: Any, in_kernel: bool) -> Any:
        if eqn.primitive.name != PALLAS_CALL:
            return None  # look inside: a pallas_call may be nested in a jit or a branch
        params = {**eqn.params, "interpret": interpret}
        if rewrite is not None:
            params = rewrite(params)
        # How a pallas_call runs decides its effects (the TPU interpreter calls back into the
        # host in order); ``rewrite_eqns`` has every enclosing equation declare them.
        _, effects = eqn.primitive.abstract_eval(*(v.aval for v in eqn.invars), **params)
        eqn = eqn.replace(params=params, effects=set(eqn.effects) | set(effects))
        return labelled_call(eqn, label) if label else eqn

    jaxpr, _ = rewrite_eqns(closed.jaxpr, retarget)
    result = closed if jaxpr is closed.jaxpr else closed.replace(jaxpr=jaxpr)
    calls = [e for e in iter_eqns(result.jaxpr) if e.primitive.name == PALLAS_CALL]
    before = sum(e.primitive.name == PALLAS_CALL for e in iter_eqns(closed.jaxpr))
    if len(calls) != before or any(e.params.get("interpret") is not interpret for e in calls):
        raise RetargetError("a pallas_call is nested where the engine cannot set how it runs")
    return result


def kernel_label(params: dict[str, Any], label: str) -> str:
    """The name a pallas_call's function gets: the check's label, then each operand it writes in
    place and the output it becomes (``__alias_0_0``), for the audit's ``input_mutation``."""
    aliases = params.get("input_output_aliases") or ()
    pairs = aliases.items() if isinstance(aliases, dict) else aliases
    return label + "".join(f"{ALIAS_MARK}{i}_{o}" for i, o in sorted(pairs) if isinstance(i, int))


def labelled_call(eqn: Any, label: str) -> Any:
    """A pallas_call equation put inside a ``jit`` named ``kernel_label``: the equation JAX
    would have traced for ``jax.jit(f)`` where ``f`` binds this pallas_call, on the same
    variables and source location."""
    params = eqn.params

    def call(*operands: Any) -> Any:
        return eqn.primitive.bind(*operands, **params)

    call.__name__ = call.__qualname__ = kernel_label(params, label)
    return as_jit_equation(eqn, call)


def as_jit_equation(eqn: Any, function: Any) -> Any:
    """``function`` of ``eqn``'s operands as one ``jit`` equation (named as ``function`` is) on
    ``eqn``'s variables, with its source location: how the engine replaces an equation of a
    traced program (a labelled kernel, a matmul computed as a chip computes it) without
    tracing the candidate again."""
    import jax

    traced = jax.make_jaxpr(jax.jit(function))(*(v.aval for v in eqn.invars))
    (wrapper,) = traced.jaxpr.eqns
    return wrapper.replace(
        invars=list(eqn.invars), outvars=list(eqn.outvars), source_info=eqn.source_info
    )
