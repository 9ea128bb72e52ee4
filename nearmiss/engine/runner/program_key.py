"""A key for a traced program: two programs with the same key compute the same outputs from the
same inputs (the search's screening runs such programs once: ``runner.screen_child``).

The key is a hash of the jaxpr walked in full — every equation's primitive, operands, results
and parameters, nested jaxprs (a Pallas kernel's body, its index maps, a loop's body) walked
the same way, every constant and literal by value — with the variables numbered in order of
appearance, so that the names tracing happened to give them do not count. The printed jaxpr
would not do: it leaves out parts of some parameters (a Pallas call's index maps). What a
parameter holds must be known to be a value (numbers, strings, arrays, shapes, dtypes,
dataclasses of these, meshes): anything else, a callable say, leaves the program without a key,
and so does a host callback, whose outputs may depend on Python state. Left out, as they change
no output: names and source locations (a Pallas call's name, where each line was traced from),
and the rules a custom derivative gives for differentiation (the program runs forward only).
Costs milliseconds, where lowering the program costs a tenth of a second and compiling it more.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any

# Parameters only differentiation reads: the forward program never runs them.
_DERIVATIVE_RULES = {
    ("custom_jvp_call", "jvp_jaxpr_fun"),
    ("custom_vjp_call", "fwd_jaxpr_thunk"),
    ("custom_vjp_call", "bwd"),
    ("custom_vjp_call", "out_trees"),
}
# Names and where the code was traced from: no output depends on them.
_NAMES = {"NameAndSrcInfo", "SourceInfo", "DebugInfo"}
# Modules whose objects are values their ``repr`` states in full (meshes, shardings, layouts).
_STATED_BY_REPR = ("jax._src.mesh", "jax._src.named_sharding", "jax._src.sharding_impls")


class Unkeyable(Exception):
    """The program holds something not known to be a value, or a host callback."""


def program_key(closed_jaxpr: Any, out_tree: Any) -> str | None:
    """The key of a traced program (``jax.jit(f).trace(...)``'s ``jaxpr`` and ``out_tree``);
    None where it has none."""
    walk = _Walk()
    try:
        walk.value(closed_jaxpr)
    except Exception:  # Unkeyable, or a value that cannot even be read: no key, it runs
        return None
    walk.said.append(f"out:{out_tree}")
    return hashlib.sha256("\x00".join(walk.said).encode()).hexdigest()[:32]


class _Walk:
    def __init__(self) -> None:
        from jax.extend import core

        self.core = core
        self.said: list[str] = []
        self.numbers: dict[int, int] = {}
        self.held: list[Any] = []  # the variables numbered: ids stay theirs while walking

    def number(self, var: Any) -> str:
        if id(var) not in self.numbers:
            self.numbers[id(var)] = len(self.numbers)
            self.held.append(var)
        return f"v{self.numbers[id(var)]}"

    def operand(self, var: Any) -> None:
        if isinstance(var, self.core.Literal):
            self.said.append(f"literal:{var.aval!r}")
            self.value(var.val)
        else:
            self.said.append(f"{self.number(var)}:{var.aval!r}")

    def effects(self, effects: Any) -> None:
        """Effects by kind and, for a ref's, the ref (numbered as the variables are)."""
        said = []
        for effect in effects:
            where = getattr(effect, "input", getattr(effect, "input_index", None))
            if isinstance(where, self.core.Var):
                where = self.number(where)
            said.append(f"{type(effect).__name__}:{where if where is not None else effect!r}")
        self.said.append(repr(sorted(said)))

    def jaxpr(self, jaxpr: Any) -> None:
        self.said.append("{")
        for var in (*jaxpr.constvars, *jaxpr.invars):
            self.operand(var)
        for eqn in jaxpr.eqns:
            name = eqn.primitive.name
            if "callback" in name:
                raise Unkeyable(name)
            self.said.append(f"eqn:{name}")
            for var in eqn.invars:
                self.operand(var)
            self.said.append("->")
            for var in eqn.outvars:
                self.operand(var)
            for param in sorted(eqn.params):
                if (name, param) not in _DERIVATIVE_RULES:
                    self.said.append(f"param:{param}")
                    self.value(eqn.params[param])
            self.effects(eqn.effects)
        self.said.append("return")
        for var in jaxpr.outvars:
            self.operand(var)
        self.effects(jaxpr.effects)
        self.said.append("}")

    def value(self, value: Any) -> None:
        import jax
        import numpy as np

        core, said = self.core, self.said
        if isinstance(value, core.ClosedJaxpr):
            said.append(f"closed:{len(value.consts)}")
            for const in value.consts:
                self.value(const)
            self.jaxpr(value.jaxpr)
        elif isinstance(value, core.Jaxpr):
            self.jaxpr(value)
        elif value is None or isinstance(value, bool | int | float | complex | str | bytes):
            said.append(f"{type(value).__name__}:{value!r}")
        elif isinstance(value, enum.Enum):
            said.append(f"{type(value).__qualname__}.{value.name}")
        elif isinstance(value, tuple | list | set | frozenset):
            items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
            said.append(f"{type(value).__name__}:{len(items)}")
            for item in items:
                self.value(item)
        elif isinstance(value, dict) or type(value).__name__ == "FrozenDict":
            said.append(f"dict:{len(value)}")
            for key in sorted(value, key=repr):
                self.value(key)
                self.value(value[key])
        elif isinstance(value, np.ndarray | np.generic | jax.Array):
            array = np.asarray(value)
            digest = hashlib.sha256(array.tobytes()).hexdigest()
            said.append(f"array:{array.dtype}:{array.shape}:{digest}")
        elif isinstance(value, np.dtype | type):
            said.append(f"type:{value!r}")
        elif type(value).__name__ in _NAMES:
            pass
        elif _stated_by_repr(value):
            said.append(f"{type(value).__name__}:{value!r}")
        elif dataclasses.is_dataclass(value):
            said.append(f"{type(value).__module__}.{type(value).__qualname__}(")
            for field in dataclasses.fields(value):
                said.append(field.name)
                self.value(getattr(value, field.name))
            said.append(")")
        else:
            raise Unkeyable(f"{type(value).__module__}.{type(value).__qualname__}")


def _stated_by_repr(value: Any) -> bool:
    """Whether ``repr`` states the value in full: an abstract value (shape, dtype, memory
    space), a pytree's structure, a mesh or sharding."""
    import jax

    abstract: Any = getattr(jax.core, "AbstractValue", None)
    if abstract is None:  # pragma: no cover - a JAX that keeps it private
        from jax._src.core import AbstractValue as abstract
    kind = type(value)
    return (
        isinstance(value, abstract)
        or kind.__name__ == "PyTreeDef"
        or kind.__module__.startswith(_STATED_BY_REPR)
    )
