"""Where the evidence points in the source: the lines an input the engine named reaches.

The engine's leads name inputs, not lines: "Nudging k[0, 37, 5] ... moves 4096 elements of the
output in the reference and none in the kernel: the kernel ignores k[0, 37, 5]", "the kernel
takes q for k and k for q". An engineer reading that follows the input through the code: the
entry point's parameter, the wrapper's reshapes and pads, the operand handed to
``pallas_call``, its BlockSpec (the index map that picks its blocks), the body's ref and the
first computations on what is read from it. ``evidence_lines`` does the same on the syntax
tree, so the search screens the edits of those lines first and says, of the edit it answers
with, whether it is where the evidence points, and why not where it is not.

A static over-approximation of a few steps, never a verdict: a line outside it can still be the
fix (a loop bound shared by every input), and the search screens every other edit after these.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from activities.fixers.playbook.source import (
    _functions,
    _index_map,
    _is_call,
    _kwarg,
    _Module,
    _module,
    _name_bindings,
    _pallas_calls,
    _PallasCall,
    _refs,
    _resolve,
    walk,
)
from activities.fixers.search.mutants import ENTRY
from kb.patches import change_blocks
from nearmiss.engine.forensics.localise import MAX_RANGES, index_ranges
from nearmiss.engine.inputs import parse_source

# Inside a kernel body a ref's reads are followed this many assignments on: far enough for
# ``k = k_ref[...]`` and ``s = q @ k.T``, not so far that every line after them is "on k's path".
BODY_STEPS = 2
# Outside the bodies (the wrapper's reshapes, pads and casts) every assignment on is followed,
# up to this many: a bound on the work a hostile module's chain of names can ask for.
WRAPPER_STEPS = 32

# The reach leads (``nearmiss.engine.forensics.reach``): a nudged input the kernel treats
# otherwise than the reference does, and two inputs the kernel takes for each other.
_NUDGED = re.compile(r"Nudging (\w+)\[[^\]]*\] \(up by")
_SWAPPED = re.compile(r"with (\w+) and (\w+) swapped")


@dataclass(frozen=True)
class Localised:
    """The inputs the evidence names and the source lines they reach (1-based)."""

    inputs: tuple[str, ...]
    lines: frozenset[int]

    def __bool__(self) -> bool:
        return bool(self.lines)

    def touched_by(self, changed: tuple[int, int]) -> bool:
        """Whether an edit changing lines ``changed`` (first, last) edits one of these lines;
        an edit that only adds lines touches the line it adds them before."""
        first, last = changed
        return any(line in self.lines for line in range(first, max(first, last) + 1))

    def describe(self, most: int = MAX_RANGES) -> str:
        """'k reaches lines 12, 40-44, 51', cut after ``most`` ranges of lines."""
        names = " and ".join(self.inputs)
        lines = index_ranges(np.array(sorted(self.lines)), most)
        return f"{names} {'reach' if len(self.inputs) > 1 else 'reaches'} lines {lines}"


NOWHERE = Localised((), frozenset())


def named_inputs(diagnosis: str) -> tuple[str, ...]:
    """The inputs the diagnosis's reach leads name, in the order named, each once."""
    named = _NUDGED.findall(diagnosis)
    named += [name for pair in _SWAPPED.findall(diagnosis) for name in pair]
    return tuple(dict.fromkeys(named))


def evidence_lines(source: str, spec_source: str, diagnosis: str) -> Localised:
    """The lines of ``source`` the inputs named by ``diagnosis`` reach (``NOWHERE`` when it
    names none, or none of them can be followed into the kernel)."""
    inputs = named_inputs(diagnosis)
    if not inputs:
        return NOWHERE
    parameters = reference_parameters(spec_source)
    followed: list[str] = []
    lines: set[int] = set()
    for name in inputs:
        position = parameters.index(name) if name in parameters else None
        reached = input_lines(source, name, position)
        if reached:
            followed.append(name)
            lines |= reached
    return Localised(tuple(followed), frozenset(lines)) if lines else NOWHERE


def where_the_fix_is(original: str, fixed: str, spec_source: str, diagnosis: str) -> str:
    """Whether a fix of ``original`` edits a line the inputs its diagnosis names reach: a
    sentence for the certificate, empty where the diagnosis names none that can be followed."""
    reached = evidence_lines(original, spec_source, diagnosis)
    if not reached:
        return ""
    touched = any(
        reached.touched_by((i1 + 1, i2)) for i1, i2, _, _ in change_blocks(original, fixed)
    )
    if touched:
        return f"the fix edits where the first evidence pointed ({reached.describe()})"
    return (
        f"the fix is not where the first evidence pointed ({reached.describe()}): a fault "
        "every input shares (a mask, a loop bound, a dropped term) is on no one input's path"
    )


@functools.lru_cache(maxsize=16)
def reference_parameters(spec_source: str) -> tuple[str, ...]:
    """The positional parameters of the spec's reference, which name its inputs (the engine's
    ``reference_child.parameter_names``), read from the spec's text: the function handed to
    ``OpSpec(reference=...)``, else one named ``reference``."""
    try:
        tree = parse_source(spec_source)
    except SyntaxError:
        return ()
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    name = "reference"
    for node in walk(tree):
        if isinstance(node, ast.Call) and _called(node) == "OpSpec":
            given = next((k.value for k in node.keywords if k.arg == "reference"), None)
            if isinstance(given, ast.Name):
                name = given.id
    reference = functions.get(name)
    if reference is None:
        return ()
    return tuple(a.arg for a in reference.args.posonlyargs + reference.args.args)


def _called(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)


@functools.lru_cache(maxsize=32)
def input_lines(source: str, name: str, position: int | None = None) -> frozenset[int]:
    """The lines the entry point's ``position``-th parameter (else the one named ``name``)
    reaches: where it or a name assigned from it is read, in the entry point and the module
    functions it is handed to; the BlockSpec of the ``pallas_call`` operand it becomes; and in
    the kernel body, where that operand's ref is read and ``BODY_STEPS`` assignments on."""
    mod = _module(source)
    if mod is None:
        return frozenset()
    defined = (n for n in mod.tree.body if isinstance(n, ast.FunctionDef) and n.name == ENTRY)
    entry = next(defined, None)
    if entry is None:
        return frozenset()
    parameters = _refs(entry)
    # The engine calls ``kernel(*inputs)``: the position is what says which parameter gets
    # the input; its name decides only where the spec gives no position.
    if position is not None and position < len(parameters):
        name = parameters[position]
    elif name not in parameters:
        return frozenset()
    return frozenset(_Flow(mod).follow(entry, name))


class _Flow:
    """One module's data flow from a parameter, function to function."""

    def __init__(self, mod: _Module) -> None:
        self.mod = mod
        # module-level functions over nested ones of the same name
        self.functions = _functions(mod.tree) | {
            n.name: n for n in mod.tree.body if isinstance(n, ast.FunctionDef)
        }
        self.calls = _pallas_calls(mod)
        self.bodies = {id(c.body) for c in self.calls if c.body is not None}
        self.lines: set[int] = set()
        self.seen: set[tuple[int, str]] = set()
        # (function, its *args name) -> the offsets into it that hold a followed value
        self.starred: dict[tuple[int, str], set[int]] = {}

    def follow(self, fn: ast.FunctionDef, name: str) -> set[int]:
        todo = [(fn, name)]
        while todo:
            fn, name = todo.pop()
            if (id(fn), name) in self.seen:
                continue
            self.seen.add((id(fn), name))
            todo.extend(self._within(fn, name))
        self._constants()
        return self.lines

    def _constants(self) -> None:
        """A module-level constant read on a reached line is on the path too (JAX's TPU flash
        attention contracts q and k by ``TRANS_B_DIM_NUMBERS``, defined at the top)."""
        constants = {
            target.id: node
            for node in self.mod.tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in walk(self.mod.tree):
            if isinstance(node, ast.Name) and node.lineno in self.lines and node.id in constants:
                constant = constants[node.id]
                self.lines.update(range(constant.lineno, (constant.end_lineno or 0) + 1))

    def _within(self, fn: ast.FunctionDef, name: str) -> Iterator[tuple[ast.FunctionDef, str]]:
        """Record the lines of ``fn`` that ``name`` reaches; yield the (function, parameter)
        pairs it is handed to."""
        # The parameter that receives it: refs named in the wrong order are a fault there.
        arguments = fn.args
        every = arguments.posonlyargs + arguments.args + arguments.kwonlyargs
        self.lines.update(a.lineno for a in every if a.arg == name)
        left = BODY_STEPS if id(fn) in self.bodies else WRAPPER_STEPS
        tainted, frontier = {name}, {name}
        while frontier and left != 0:
            assigned: set[str] = set()
            for node in walk(fn):
                if not isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                    continue
                if node.value is None or not _reads(node.value, frontier):
                    continue
                if self._applied(fn, node.value) is not None:
                    continue  # what a kernel returns is its outputs, not this input
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assigned |= {
                    n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)
                } - tainted
            tainted |= assigned
            frontier = assigned
            left -= 1
        for node in walk(fn):
            if isinstance(node, ast.Name) and node.id in tainted:
                self.lines.add(node.lineno)
            if isinstance(node, ast.Call):
                yield from self._handed(fn, node, tainted)

    def _handed(
        self, fn: ast.FunctionDef, call: ast.Call, tainted: set[str]
    ) -> Iterator[tuple[ast.FunctionDef, str]]:
        """The (function, parameter) pairs a call hands a tainted value to: a module function
        (directly, through a name bound to it, ``functools.partial`` or a transform), or a
        pallas_call's body ref."""
        kernel = self._applied(fn, call)
        if kernel is not None:
            yield from self._operands(fn, kernel, call, tainted)
            return
        for target, bound in self._callees(fn, call.func):
            if target is fn:
                continue
            parameters = _refs(target)
            position = bound
            for arg in call.args:
                if isinstance(arg, ast.Starred):  # later positions are unknown from here on
                    for offset in self.starred.get((id(fn), _name(arg.value) or ""), ()):
                        if position + offset < len(parameters):
                            yield target, parameters[position + offset]
                    break
                if _reads(arg, tainted) and position < len(parameters):
                    yield target, parameters[position]
                position += 1
            for keyword in call.keywords:
                if keyword.arg and _reads(keyword.value, tainted):
                    yield target, keyword.arg

    def _callees(self, fn: ast.FunctionDef, func: ast.expr) -> list[tuple[ast.FunctionDef, int]]:
        """The module functions a call may run, through names bound in ``fn`` (each binding:
        a dispatcher picks one of two kernels), ``partial`` and transforms that take the
        function first (``jax.vmap(inner)``, ``jax.jit(f)``), each with how many leading
        parameters ``partial`` binds."""
        found: list[tuple[ast.FunctionDef, int]] = []
        todo, seen = [(func, 0, 6)], set()
        while todo:
            node, bound, left = todo.pop()
            if id(node) in seen or not left:
                continue
            seen.add(id(node))
            if isinstance(node, ast.Name):  # a name bound in fn hides a module function's
                bound_here = [v for n, v in _name_bindings(fn) if n == node.id]
                todo += [(v, bound, left - 1) for v in bound_here]
                if not bound_here and node.id in self.functions:
                    found.append((self.functions[node.id], bound))
            elif isinstance(node, ast.Call) and node.args:
                more = len(node.args) - 1 if _called(node) == "partial" else 0
                todo.append((node.args[0], bound + more, left - 1))
        return found

    def _operands(
        self, fn: ast.FunctionDef, kernel: _PallasCall, call: ast.Call, tainted: set[str]
    ) -> Iterator[tuple[ast.FunctionDef, str]]:
        body = kernel.body
        refs = _refs(body) if body is not None else []
        for i, operand in enumerate(call.args):
            if not _reads(operand, tainted):
                continue
            spec_at, specs = i - kernel.scalar_prefetch, _in_specs(kernel)
            if 0 <= spec_at < len(specs):
                for shown in self._spec_parts(fn, specs[spec_at]):
                    self.lines.update(range(shown.lineno, (shown.end_lineno or shown.lineno) + 1))
            if body is None:
                continue
            if i < len(refs):
                yield body, refs[i]
            elif body.args.vararg is not None:  # a dispatcher's ``(q_ref, *args, **kwargs)``
                star = body.args.vararg.arg
                self.starred.setdefault((id(body), star), set()).add(i - len(refs))
                yield body, star

    def _spec_parts(self, fn: ast.FunctionDef, spec: ast.expr) -> list[ast.expr | ast.stmt]:
        """What of a BlockSpec decides the blocks an operand gets: the spec itself and its index
        map, a lambda or a function named there (JAX's TPU flash attention's ``q_index_map``)."""
        parts: list[ast.expr | ast.stmt] = [spec]
        index_map: ast.expr | ast.stmt | None = _index_map(spec)
        if index_map is None and isinstance(spec, ast.Call):
            named = _kwarg(spec, "index_map", 1)
            if isinstance(named, ast.Name):
                local = [
                    n for n in walk(fn) if isinstance(n, ast.FunctionDef) and n.name == named.id
                ]
                index_map = local[-1] if local else self.functions.get(named.id)
        if index_map is not None and index_map is not spec:
            parts.append(index_map)
        return parts

    def _applied(self, fn: ast.FunctionDef, node: ast.AST) -> _PallasCall | None:
        """The pallas_call that ``node`` applies to operands (``pl.pallas_call(...)(x)``, or a
        name bound to one), else None."""
        if not isinstance(node, ast.Call):
            return None
        made = _resolve(fn, node.func)
        if made is None or not _is_call(made, self.mod.pl_names, "pallas_call"):
            return None
        return next((c for c in self.calls if c.node is made), None)


def _in_specs(kernel: _PallasCall) -> list[ast.expr]:
    """A pallas_call's in_specs, one per operand after the scalar prefetch, where they can be
    told apart: a list, lists joined by ``+`` (JAX's decode attention writes ``[q's, k's, v's]
    + [None if ... else ...]``), or a name given one with a type annotation (its GPU attention's
    ``in_specs: list[pl.BlockSpec | None] = [...]``, then appended to)."""
    specs = kernel.in_specs
    if len(specs) != 1:
        return specs
    node = specs[0]
    if isinstance(node, ast.Name):
        annotated = [
            n.value
            for n in walk(kernel.scope)
            if isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name)
            and n.target.id == node.id
            and n.value is not None
        ]
        node = annotated[-1] if annotated else node
    parts, todo = [], [node]
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            todo[:0] = [node.left, node.right]
        elif isinstance(node, ast.List | ast.Tuple):
            parts.extend(node.elts)
        else:
            return specs  # built some other way: which operand each is for is not known
    return parts


# What an array says of itself, not of its values: ``n = k.shape[1]`` reads k's line, but n
# is not k's data (followed, every grid and BlockSpec sized from it would be on k's path).
_METADATA = frozenset({"shape", "dtype", "ndim", "size"})


def _name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _reads(node: ast.AST, names: set[str]) -> bool:
    """Whether ``node`` reads the values of one of ``names`` (their metadata aside)."""
    metadata = {
        id(n.value) for n in walk(node) if isinstance(n, ast.Attribute) and n.attr in _METADATA
    }
    return any(
        isinstance(n, ast.Name) and n.id in names and id(n) not in metadata for n in walk(node)
    )


__all__ = [
    "NOWHERE",
    "Localised",
    "evidence_lines",
    "input_lines",
    "named_inputs",
    "reference_parameters",
    "where_the_fix_is",
]
