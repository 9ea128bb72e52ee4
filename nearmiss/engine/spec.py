"""The operator spec contract: what a kernel must compute, on which cases, to what tolerance.

A spec file is engine-owned Python that defines ``SPEC = OpSpec(...)``. The agent never edits it.
Everything here is validated at construction so a malformed spec fails with one clear line
instead of an obscure error deep inside a run.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearmiss.engine.targets.registry import TARGETS

CATEGORIES = (
    "elementwise",
    "reduction",
    "normalization",
    "matmul",
    "attention",
    "scan",
    "gather",
    "convolution",
    "other",
)

# (atol, rtol) used when a spec gives no tolerance for a case's dtype. Integer and boolean
# results must match exactly.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-5, 1e-5),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1e-2, 1e-2),
    "int8": (0.0, 0.0),
    "int16": (0.0, 0.0),
    "int32": (0.0, 0.0),
    "int64": (0.0, 0.0),
    "uint8": (0.0, 0.0),
    "uint32": (0.0, 0.0),
    "bool": (0.0, 0.0),
}
DTYPES = tuple(DEFAULT_TOLERANCES)
# A tolerance should leave a correct kernel this much room over the reference's own noise (its
# float32 result against the same computation in float64): ``spec check`` suggests no less, and
# a hidden case widens its tolerance to at least this (``runner.hidden_cases``).
NOISE_MARGIN = 8.0

# The value profile of ordinary random inputs; any other profile is adversarial (large
# magnitudes, constant rows, ...) and a failure confined to one is classified `unstable`.
NORMAL_PROFILE = "normal"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


class SpecError(ValueError):
    """A spec that breaks the contract; the message says what to change."""


@dataclass(frozen=True)
class Case:
    """One test case: named dimensions, an input dtype and a value profile."""

    name: str
    dims: Mapping[str, int]
    dtype: str = "float32"
    profile: str = NORMAL_PROFILE

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _IDENTIFIER.match(self.name):
            raise SpecError(f"case name {self.name!r} must be a non-empty identifier-like string")
        if not isinstance(self.dims, Mapping):
            raise SpecError(f"case {self.name!r}: dims must be a dict of name -> int")
        for key, value in self.dims.items():
            if not isinstance(key, str) or isinstance(value, bool) or not isinstance(value, int):
                raise SpecError(f"case {self.name!r}: dim {key!r}={value!r} must be str -> int")
            if value <= 0:
                raise SpecError(f"case {self.name!r}: dim {key!r}={value} must be positive")
        if self.dtype not in DTYPES:
            raise SpecError(
                f"case {self.name!r}: unknown dtype {self.dtype!r}; expected one of "
                + ", ".join(DTYPES)
            )
        if not isinstance(self.profile, str) or not _IDENTIFIER.match(self.profile):
            raise SpecError(f"case {self.name!r}: profile {self.profile!r} must be a word")
        # Freeze dims so a Case is hashable and cannot be changed behind the engine's back.
        object.__setattr__(self, "dims", dict(self.dims))

    @property
    def adversarial(self) -> bool:
        return self.profile != NORMAL_PROFILE


@dataclass(frozen=True)
class Dim:
    """The values a dimension may take: where the engine draws its hidden cases' sizes
    (``nearmiss.engine.hidden``). ``multiple_of``: multiples of it from ``min``; ``step``
    instead: ``min``, ``min + step``, ... (odd sizes: ``Dim(min=3, step=2)``). Without one, a
    dimension's domain is what its listed values imply: from the smallest to twice the
    largest, in steps of the largest power of two dividing their differences."""

    min: int = 1
    max: int | None = None
    multiple_of: int = 1
    step: int | None = None

    def __post_init__(self) -> None:
        for name in ("min", "multiple_of", "step"):
            value = getattr(self, name)
            if name == "step" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"Dim {name}={value!r} must be a positive integer")
        if self.step is not None and self.multiple_of != 1:
            raise SpecError("Dim takes multiple_of or step, not both")
        if self.max is not None and (
            isinstance(self.max, bool) or not isinstance(self.max, int) or self.max < self.min
        ):
            raise SpecError(f"Dim max={self.max!r} must be an integer of at least min={self.min}")

    def values(self, limit: int) -> range:
        """The domain's values up to ``limit`` (its own max where that is lower)."""
        top = limit if self.max is None else min(self.max, limit)
        if self.step is not None:
            return range(self.min, top + 1, self.step)
        first = -(-self.min // self.multiple_of) * self.multiple_of
        return range(first, top + 1, self.multiple_of)


@dataclass(frozen=True)
class OpSpec:
    """An operator: its pure-JAX reference, input generator, test suites and tolerances."""

    name: str
    category: str
    reference: Callable[..., Any]
    make_inputs: Callable[[Case, Any], tuple]
    compact: Sequence[Case]
    extended: Sequence[Case] = ()
    tolerance: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    description: str = ""
    # Where its kernels are meant to run (``nearmiss.engine.targets``): checked there unless the
    # command line names other targets. Empty: the interpret target.
    targets: Sequence[str] = ()
    # What the inputs may be beyond the listed cases (``nearmiss.engine.hidden``): each named
    # dim's domain (the others': what the listed values imply), and the factors the engine may
    # scale signal-like float inputs by (None: its default; () none: values the kernel may
    # assume bounded, as the listed profiles are).
    domains: Mapping[str, Dim] = field(default_factory=dict)
    value_scales: Sequence[float] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _IDENTIFIER.match(self.name):
            raise SpecError(f"spec name {self.name!r} must be a non-empty identifier-like string")
        if self.category not in CATEGORIES:
            raise SpecError(
                f"spec {self.name!r}: unknown category {self.category!r}; expected one of "
                + ", ".join(CATEGORIES)
            )
        for attr in ("reference", "make_inputs"):
            if not callable(getattr(self, attr)):
                raise SpecError(f"spec {self.name!r}: {attr} must be callable")
        compact, extended = tuple(self.compact), tuple(self.extended)
        if not compact:
            raise SpecError(f"spec {self.name!r}: the compact suite is empty")
        names: set[str] = set()
        for case in compact + extended:
            if not isinstance(case, Case):
                raise SpecError(f"spec {self.name!r}: suites must hold Case objects, got {case!r}")
            if case.name in names:
                raise SpecError(f"spec {self.name!r}: duplicate case name {case.name!r}")
            names.add(case.name)
        tolerance = dict(self.tolerance)
        for dtype, pair in tolerance.items():
            if dtype not in DTYPES:
                raise SpecError(f"spec {self.name!r}: tolerance for unknown dtype {dtype!r}")
            if (
                not isinstance(pair, tuple | list)
                or len(pair) != 2
                or not all(isinstance(v, int | float) and v >= 0 for v in pair)
            ):
                raise SpecError(
                    f"spec {self.name!r}: tolerance[{dtype!r}] must be (atol, rtol) >= 0"
                )
            tolerance[dtype] = (float(pair[0]), float(pair[1]))
        targets = (self.targets,) if isinstance(self.targets, str) else tuple(self.targets)
        for name in targets:
            if name not in TARGETS:
                raise SpecError(
                    f"spec {self.name!r}: unknown target {name!r}; expected any of "
                    + ", ".join(TARGETS)
                )
        listed = {dim for case in compact + extended for dim in case.dims}
        domains = dict(self.domains) if isinstance(self.domains, Mapping) else None
        if domains is None:
            raise SpecError(f"spec {self.name!r}: domains must be a dict of dim name -> Dim")
        for dim, domain in domains.items():
            if dim not in listed:
                raise SpecError(
                    f"spec {self.name!r}: domain for {dim!r}, which no case has "
                    f"(dims: {', '.join(sorted(listed))})"
                )
            if not isinstance(domain, Dim):
                raise SpecError(f"spec {self.name!r}: domains[{dim!r}] must be a Dim")
        scales = self.value_scales
        if scales is not None:
            scales = tuple(scales)
            if not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in scales
            ):
                raise SpecError(f"spec {self.name!r}: value_scales must be positive numbers")
            scales = tuple(float(v) for v in scales)
        object.__setattr__(self, "domains", domains)
        object.__setattr__(self, "value_scales", scales)
        object.__setattr__(self, "targets", targets)
        object.__setattr__(self, "compact", compact)
        object.__setattr__(self, "extended", extended)
        object.__setattr__(self, "tolerance", tolerance)

    def tolerance_for(self, dtype: str) -> tuple[float, float]:
        """(atol, rtol) for a case dtype: the spec's own, else the engine default."""
        return self.tolerance.get(dtype, DEFAULT_TOLERANCES[dtype])

    def suite(self, which: str) -> tuple[Case, ...]:
        """Cases of ``compact``, ``extended`` or ``all``."""
        if which == "compact":
            return tuple(self.compact)
        if which == "extended":
            return tuple(self.extended)
        if which == "all":
            return tuple(self.compact) + tuple(self.extended)
        raise SpecError(f"unknown suite {which!r}; expected compact, extended or all")


def load_spec(path: str | Path, shown: str | None = None) -> OpSpec:
    """Execute a spec file and return its validated ``SPEC``.

    Raises SpecError with a one-line reason for anything that makes the file unusable, naming
    the file ``shown`` (default ``path``: the engine loads a copy and names the user's file).
    Runs arbitrary spec code: the engine calls it only inside a sandbox child process.
    """
    source = Path(path)
    path = Path(shown) if shown else source
    if not source.is_file():
        raise SpecError(f"spec file not found: {path}")
    module_name = f"nearmiss_spec_{abs(hash(str(source.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, source)
    if loader_spec is None or loader_spec.loader is None:
        raise SpecError(f"cannot load spec file {path}")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except SpecError:
        raise
    except SyntaxError as exc:
        raise SpecError(f"syntax error in spec {path}:{exc.lineno}: {exc.msg}") from exc
    except Exception as exc:
        raise SpecError(f"spec {path} failed to import: {type(exc).__name__}: {exc}") from exc
    spec = getattr(module, "SPEC", None)
    if spec is None:
        raise SpecError(f"spec file {path} defines no SPEC")
    if not isinstance(spec, OpSpec):
        raise SpecError(f"SPEC in {path} is a {type(spec).__name__}, not an OpSpec")
    return spec
