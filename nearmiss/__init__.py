"""nearmiss: repair near-miss JAX/Pallas kernels by debugging them.

The public API, for spec authors and scripts: ``from nearmiss import Case, OpSpec, check``.
Every name in ``__all__`` keeps its import path across releases; a name that moves keeps a shim
at its old path that warns (``DeprecationWarning``) for at least one release (CHANGELOG.md).
The names are loaded on first use, so ``import nearmiss`` alone imports neither JAX nor the
engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Public name -> the module that defines it.
_PUBLIC = {
    "Case": "nearmiss.engine.spec",
    "Dim": "nearmiss.engine.spec",
    "OpSpec": "nearmiss.engine.spec",
    "SpecError": "nearmiss.engine.spec",
    "load_spec": "nearmiss.engine.spec",
    "check": "nearmiss.engine.check",
    "CheckReport": "nearmiss.engine.models",
    "UsageError": "nearmiss.engine.errors",
}

__all__ = [
    "Case",
    "CheckReport",
    "Dim",
    "OpSpec",
    "SpecError",
    "UsageError",
    "__version__",
    "check",
    "load_spec",
]

if TYPE_CHECKING:
    from nearmiss.engine.check import check
    from nearmiss.engine.errors import UsageError
    from nearmiss.engine.models import CheckReport
    from nearmiss.engine.spec import Case, Dim, OpSpec, SpecError, load_spec


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'nearmiss' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
