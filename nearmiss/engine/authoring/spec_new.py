"""``nearmiss spec new``: a starting spec from a reference function and its input shapes.

The spec's child sees only the spec file, so the reference's module is copied into it whole
(its imports and constants come along) and the generated part is appended: ``make_inputs``
drawing normal values for each named input, a compact ``base`` case at the given dims, and an
extended suite with the structural variations most kernels get wrong — a ``ragged`` case whose
dims are not multiples of the usual block sizes, and a ``bf16`` case. Structural variations are
*cases* (their own dims or dtype), never profiles: a profile other than ``normal`` is an
adversarial value distribution, and a failure confined to one reads as ``unstable``.

Each input may name its dtype (``w=K,N:int8``); an input without one follows the case's dtype
(float32 unless ``--dtype`` says else), and only those change in the ``bf16`` case. Integer
inputs draw from a range the spec states (``INTEGER_RANGES``, [low, high)): the whole range of
an 8-bit type, else [0, 128) — lengths and indices need their real range written there.

The user's file is only parsed here, never run; the engine then measures the new spec in the
spec's sandbox (``spec check``) and writes the tolerance that measurement supports.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nearmiss.engine.errors import UsageError
from nearmiss.engine.inputs import parse_source, read_source
from nearmiss.engine.spec import CATEGORIES, DEFAULT_TOLERANCES, DTYPES, NOISE_MARGIN

if TYPE_CHECKING:
    from nearmiss.engine.authoring.calibration import SpecNoise

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Names the generated part defines: a reference module that defines them would be overwritten.
_GENERATED = ("make_inputs", "SPEC", "Case", "OpSpec", "INPUTS")


@dataclass(frozen=True)
class NewSpec:
    name: str
    category: str
    reference_file: Path
    function: str
    # (name, dim names, dtype: None follows the case's dtype)
    inputs: tuple[tuple[str, tuple[str, ...], str | None], ...]
    dims: dict[str, int]
    dtype: str = "float32"


# An integer input draws from [low, high): the whole range of an 8-bit type (quantised values),
# else a small non-negative range (lengths, indices, counts), which the user sets to the real one.
SMALL_INTEGERS = (0, 128)


def integer_range(dtype: str) -> tuple[int, int] | None:
    """[low, high) an integer input of ``dtype`` draws from; None for float and bool inputs."""
    if dtype in ("int8", "uint8"):
        return (-128, 128) if dtype == "int8" else (0, 256)
    if dtype.startswith(("int", "uint")):
        return SMALL_INTEGERS
    return None


def parse_input(text: str) -> tuple[str, tuple[str, ...], str | None]:
    """``x=M,N`` -> ("x", ("M", "N"), None); ``w=K,N:int8`` -> ("w", ("K", "N"), "int8");
    ``s=`` (a scalar) -> ("s", (), None)."""
    name, sep, rest = text.partition("=")
    shape, colon, dtype = rest.partition(":")
    dims = tuple(d.strip() for d in shape.split(",") if d.strip())
    if not sep or not _NAME.match(name.strip()) or not all(_NAME.match(d) for d in dims):
        raise UsageError(
            f"--input {text!r}: expected NAME=DIM,DIM,...[:DTYPE] (e.g. x=M,N or w=K,N:int8)"
        )
    if colon and dtype.strip() not in DTYPES:
        raise UsageError(
            f"--input {text!r}: unknown dtype {dtype.strip()!r}; expected one of "
            + ", ".join(DTYPES)
        )
    return name.strip(), dims, (dtype.strip() if colon else None)


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
    used = {d for _, dims, _ in new.inputs for d in dims}
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
    # Only inputs without a dtype of their own follow a case's dtype.
    if new.dtype != "bfloat16" and any(dtype is None for _, _, dtype in new.inputs):
        extended.append(f'        Case("bf16", {base!r}, dtype="bfloat16"),')
    inputs = ", ".join(f"({name!r}, {dims!r}, {dtype!r})" for name, dims, dtype in new.inputs)
    ranges = {
        name: integer_range(dtype)
        for name, _, dtype in new.inputs
        if dtype and integer_range(dtype)
    }
    extended_text = "\n".join(extended)
    return f'''{reference}

# ---- generated by `nearmiss spec new`; edit freely, then run `nearmiss spec check` ----
import jax as _jax
import jax.numpy as _jnp

from nearmiss.engine.spec import Case, OpSpec

# Each input of {new.function}: its name, the case dims that size it, and its dtype (None: the
# case's dtype).
INPUTS = ({inputs},)
# The values each integer input draws from, [low, high): set a length or an index to its real
# range (at most the dim it counts along).
INTEGER_RANGES = {ranges!r}


def _draw(key, name, shape, dtype):
    if dtype == "bool":
        return _jax.random.bernoulli(key, 0.5, shape)
    if name in INTEGER_RANGES:
        low, high = INTEGER_RANGES[name]
        return _jax.random.randint(key, shape, low, high, _jnp.int32).astype(dtype)
    return _jax.random.normal(key, shape, _jnp.float32).astype(dtype)


def make_inputs(case, key):
    """Normal values for every float input, in its dtype (else the case's); integers from
    INTEGER_RANGES. A profile other than "normal" is an adversarial value distribution (large
    offsets, constant rows...): add one here with `if case.profile == ...` and a Case using it.
    Sizes and dtypes belong in a case's dims."""
    keys = _jax.random.split(key, len(INPUTS))
    return tuple(
        _draw(k, name, tuple(case.dims[d] for d in dims), dtype or case.dtype)
        for k, (name, dims, dtype) in zip(keys, INPUTS)
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


def with_tolerance(text: str, tolerance: dict[str, tuple[float, float] | None]) -> str:
    """The generated spec with its ``tolerance=`` line set (the one ``render`` wrote); a dtype
    whose tolerance is None is left out (the engine default applies)."""
    pairs = [(d, pair) for d, pair in tolerance.items() if pair is not None]
    value = "{" + ", ".join(f"{d!r}: ({a:g}, {r:g})" for d, (a, r) in pairs) + "}"
    line = f"    tolerance={value},"
    if len(_TOLERANCE_LINE.findall(text)) != 1:
        raise ValueError("the generated spec has no single tolerance line")
    return _TOLERANCE_LINE.sub(lambda _: line, text)


# The largest atol = rtol that rounding in an output's float type plausibly needs: a measured
# noise above it is no rounding (a quantisation flipped, a discontinuity, a value the float64
# run cannot follow), and a tolerance that wide would certify kernels wrong by as much.
SANE_TOLERANCE = {"float64": 1e-8, "float32": 1e-3, "float16": 2e-2, "bfloat16": 1e-1}


@dataclass(frozen=True)
class ChosenTolerance:
    dtype: str  # the cases' dtype the tolerance is for
    value: tuple[float, float] | None  # None: nothing measured, the engine default applies
    reason: str  # one line: why this value
    warning: str = ""  # one line when the value is above what the output type explains


def choose_tolerances(result: SpecNoise) -> list[ChosenTolerance]:
    """The tolerance ``spec new`` writes for each case dtype, from the reference's outputs and
    their measured noise, with its reason; a value above ``SANE_TOLERANCE`` for the output's
    type carries a warning."""
    chosen = []
    advised = {advice.dtype for advice in result.advice}
    for dtype in sorted({c.dtype for c in result.cases} - advised):
        notes = sorted({c.note for c in result.cases if c.dtype == dtype and c.note})
        atol, rtol = DEFAULT_TOLERANCES[dtype]
        chosen.append(
            ChosenTolerance(
                dtype,
                None,
                f"not measured ({'; '.join(notes) or 'no float64 run'}): the engine default "
                f"atol={atol:g} rtol={rtol:g} applies",
            )
        )
    for advice in result.advice:
        cases = [c for c in result.cases if c.dtype == advice.dtype]
        names = sorted({d for c in cases for d in c.outputs}) or [advice.dtype]
        outputs = ", ".join(names)
        if advice.basis == "integer":
            chosen.append(
                ChosenTolerance(
                    advice.dtype,
                    (0.0, 0.0),
                    f"every output is an integer array ({outputs}): a correct kernel matches "
                    "it exactly",
                )
            )
            continue
        value = advice.at_least
        if advice.basis == "exact":
            reason = (
                f"the reference agrees exactly with float64 on every case; {value:g} covers "
                f"{NOISE_MARGIN:g}x its {outputs} outputs' own rounding"
            )
        else:
            noise = max((c.noise_scaled or 0.0) for c in cases)
            reason = (
                f"{NOISE_MARGIN:g}x the reference's own noise against float64 "
                f"(max |ref - float64| / (1 + |ref|) = {noise:.2g}, outputs {outputs})"
            )
        floats = [n for n in names if n in SANE_TOLERANCE]
        # The narrowest float output bounds what rounding explains.
        narrowest = max(floats, key=lambda n: SANE_TOLERANCE[n], default=None)
        warning = ""
        if narrowest is not None and value > SANE_TOLERANCE[narrowest]:
            warning = (
                f"WARNING: tolerance {value:g} for {advice.dtype} cases is above anything "
                f"{narrowest} rounding explains (at most {SANE_TOLERANCE[narrowest]:g}): the "
                "reference differs from its float64 computation by more than rounding (a "
                "cancellation, a discontinuity, a value float64 cannot follow), and a kernel "
                "wrong by that much would certify; check the inputs' dtypes "
                "(--input NAME=DIM,...:DTYPE) and the values make_inputs draws, or set the "
                "tolerance by hand"
            )
        chosen.append(ChosenTolerance(advice.dtype, (value, value), reason, warning))
    return chosen
