"""Deprecated path of the spec API: ``from nearmiss import Case, OpSpec`` (or
``nearmiss.engine.spec``) instead. Specs written for 0.0 import from here; they keep loading,
with a ``DeprecationWarning``, for at least one release."""

from __future__ import annotations

import warnings

from nearmiss.engine.spec import Case, Dim, OpSpec, SpecError, load_spec

warnings.warn(
    "nearmiss.spec is deprecated: import Case, OpSpec and Dim from nearmiss "
    "(from nearmiss import Case, OpSpec)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["Case", "Dim", "OpSpec", "SpecError", "load_spec"]
