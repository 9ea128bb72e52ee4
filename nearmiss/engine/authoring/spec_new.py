"""``nearmiss spec new``: a starting spec from a reference function and its input shapes.

The spec's child sees only the spec file, so the reference's module is copied into it whole
(its imports and constants come along) and the generated part is appended: ``make_inputs``
drawing normal values for each named input, a compact ``base`` case at the given dims, and an
extended suite with the structural variations most kernels get wrong — a ``ragged`` case whose
dims are not multiples of the usual block sizes, and a ``bf16`` case. Structural variations are
*cases* (their own dims or dtype), never profiles: a profile other than ``normal`` is an
adversarial value distribution, and a failure confined to one reads as ``unstable``.

The user's file is only parsed here, never run; the engine then measures the new spec in the
spec's sandbox (``spec check``) and writes the tolerance that measurement supports.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from nearmiss.engine.errors import UsageError
from nearmiss.engine.inputs import parse_source, read_source
from nearmiss.engine.spec import CATEGORIES

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names the generated part defines: a reference module that defines them would be overwritten.
_GENERATED = ("make_inputs", "SPEC", "Case", "OpSpec", "INPUTS")


@dataclass(frozen=True)
class NewSpec:
    name: str
    category: str
    reference_file: Path
    function: str
    inputs: tuple[tuple[str, tuple[str, ...]], ...]  # (name, dim names)
    dims: dict[str, int]
    dtype: str = "float32"


def parse_input(text: str) -> tuple[str, tuple[str, ...]]:
    """``x=M,N`` -> ("x", ("M", "N")); ``s=`` (a scalar) -> ("s", ())."""
    name, sep, shape = text.partition("=")
    dims = tuple(d.strip() for d in shape.split(",") if d.strip())
    if not sep or not _NAME.match(name.strip()) or not all(_NAME.match(d) for d in dims):
        raise UsageError(f"--input {text!r}: expected NAME=DIM,DIM,... (e.g. x=M,N)")
    return name.strip(), dims


def parse_dims(text: str) -> dict[str, int]:
    """``M=128,N=256`` -> {"M": 128, "N": 256}."""
    dims = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not _NAME.match(key.strip()) or not value.strip().isdigit():
            raise UsageError(f"--dims {text!r}: expected NAME=INT,NAME=INT,... (e.g. M=128,N=256)")
        if int(value) <= 0:
            raise UsageError(f"--dims: {key.strip()}={value.strip()} must be positive")
        dims[key.strip()] = int(value)
    return dims


def ragged(value: int) -> int:
    """A nearby size that is a multiple of neither 8 nor 128 (and smaller: cheap to run)."""
    if value < 3:
        return value
    candidate = max(value - value // 8 - 1, 2)
    while candidate % 8 == 0 and candidate > 2:
        candidate -= 1
    return candidate


def _reference_source(new: NewSpec) -> str:
    source = read_source("reference", new.reference_file)
    try:
        tree = parse_source(source, str(new.reference_file))
    except SyntaxError as exc:
        raise UsageError(f"syntax error in {new.reference_file}:{exc.lineno}: {exc.msg}") from None
    defined = {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.ClassDef)
    } | {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    if new.function not in defined:
        raise UsageError(f"{new.reference_file} defines no function {new.function!r}")
    clash = sorted(defined & set(_GENERATED))
    if clash:
        raise UsageError(
            f"{new.reference_file} defines {', '.join(clash)}, which the spec needs for itself"
        )
    return source.rstrip() + "\n"


def render(new: NewSpec) -> str:
    """The spec file's text."""
    if not _NAME.match(new.name):
        raise UsageError(f"spec name {new.name!r} must be an identifier")
    if new.category not in CATEGORIES:
        raise UsageError(
            f"unknown category {new.category!r}; expected one of {', '.join(CATEGORIES)}"
        )
    if not new.inputs:
        raise UsageError("name at least one input (--input x=M,N)")
    used = {d for _, dims in new.inputs for d in dims}
    missing = sorted(used - set(new.dims))
    if missing:
        raise UsageError(f"--dims gives no size for {', '.join(missing)}")
    unused = sorted(set(new.dims) - used)
    if unused:
        raise UsageError(f"--dims names {', '.join(unused)}, which no --input uses")
    reference = _reference_source(new)
    base = dict(new.dims)
    uneven = {k: ragged(v) for k, v in base.items()}
    extended = []
    if uneven != base:
        extended.append(f'        Case("ragged", {uneven!r}),')
    if new.dtype != "bfloat16":
        extended.append(f'        Case("bf16", {base!r}, dtype="bfloat16"),')
    inputs = ", ".join(f"({name!r}, {dims!r})" for name, dims in new.inputs)
    extended_text = "\n".join(extended)
    return f'''{reference}

# ---- generated by `nearmiss spec new`; edit freely, then run `nearmiss spec check` ----
import jax as _jax
import jax.numpy as _jnp

from nearmiss.engine.spec import Case, OpSpec

# Each input of {new.function}: its name and the case dims that size it.
INPUTS = ({inputs},)


def make_inputs(case, key):
    """Normal values for every input, in the case's dtype. A profile other than "normal" is an
    adversarial value distribution (large offsets, constant rows...): add one here with
    `if case.profile == ...` and a Case using it. Sizes and dtypes belong in a case's dims."""
    keys = _jax.random.split(key, len(INPUTS))
    return tuple(
        _jax.random.normal(k, tuple(case.dims[d] for d in dims), _jnp.float32).astype(case.dtype)
        for k, (_, dims) in zip(keys, INPUTS)
    )


SPEC = OpSpec(
    name={new.name!r},
    category={new.category!r},
    reference={new.function},
    make_inputs=make_inputs,
    compact=[Case("base", {base!r}, dtype={new.dtype!r})],
    extended=[
{extended_text}
    ],
    tolerance={{}},
    description={f"{new.function} from {new.reference_file.name}"!r},
)
'''


_TOLERANCE_LINE = re.compile(r"^    tolerance=\{.*\},$", re.MULTILINE)


def with_tolerance(text: str, tolerance: dict[str, tuple[float, float]]) -> str:
    """The generated spec with its ``tolerance=`` line set (the one ``render`` wrote)."""
    value = "{" + ", ".join(f"{d!r}: ({a:g}, {r:g})" for d, (a, r) in tolerance.items()) + "}"
    line = f"    tolerance={value},"
    if len(_TOLERANCE_LINE.findall(text)) != 1:
        raise ValueError("the generated spec has no single tolerance line")
    return _TOLERANCE_LINE.sub(lambda _: line, text)
