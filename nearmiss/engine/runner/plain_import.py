"""What a candidate sees of its interpreter is what a plain ``import`` of its file would show.

A certificate must hold outside the harness: a file that computes right only when it can tell it
is being checked is a forgery, and it can tell by anything the harness leaves in its reach — its
module name (``nearmiss_candidate``), its path (a scratch folder named for the engine), a JAX
function wrapped by the engine (``__wrapped__``), JAX's interpret flag set globally, variables,
``sys.argv``, ``__main__``, the engine's modules in ``sys.modules`` or its folder on
``sys.path``, the hash seed. So the children that import a candidate:

- import it under its file's stem, from a file of its own name in a folder the sandbox shows
  where the file's user keeps it (``sandbox.SandboxChild``: else ``sandbox.CODE_MOUNT``), which
  is also their working directory;
- leave JAX's objects alone: kernels are labelled and their execution mode set on the traced
  program (``runner.traced_program``), not by replacing ``pallas_call`` or setting a flag;
- drop the engine's variables once read (``forget_harness_environment``) and start without a
  fixed hash seed;
- run every line of candidate code (its import, each trace) inside ``as_plain_import``, where
  ``sys.modules`` holds no engine module, ``__main__`` is the blank module ``python -c`` gives,
  ``sys.argv`` is ``['-c']`` and ``sys.path`` starts with the working directory, as with
  ``python -c "import kernel"`` run where the file is.

What is left (the call stack below the candidate's frames, ``/proc``, the sandbox itself) needs
the interpreter's internals or the operating system, which the static gate refuses.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
import types
from collections.abc import Iterator

# Modules of the harness's own that a plain import would not have loaded: the engine, the
# runner of ``python -m`` and what only the engine's start-up uses (measured against
# ``python -c "import jax"``).
HARNESS_MODULES = ("nearmiss", "runpy", "resource")
# Variables the engine starts a child with that a user's Python would not have (all of
# ``NEARMISS_*`` too): read at start-up, then dropped.
HARNESS_VARIABLES = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER")


def _harness_module(name: str) -> bool:
    return name.split(".", 1)[0] in HARNESS_MODULES


def forget_harness_environment() -> None:
    """Drop the engine's variables from this process's environment (read them first)."""
    for name in list(os.environ):
        if name.startswith("NEARMISS_") or name in HARNESS_VARIABLES:
            del os.environ[name]


def module_name(path: str) -> str:
    """The name a plain import gives the file: its stem (``softmax.py`` -> ``softmax``)."""
    base = os.path.basename(path)
    return base[:-3] if base.endswith(".py") else base


@contextlib.contextmanager
def as_plain_import() -> Iterator[None]:
    """The interpreter as ``python -c "import kernel"`` shows it, while the block runs.

    Everything is put back afterwards. Modules the block imported stay, as they would, except
    any it named as the engine's: those were its own copies (``importlib.import_module`` of an
    engine module re-executes it while the engine's are hidden), and the engine must never
    pick them up. Engine code must not import modules of its own inside the block.
    """
    hidden = {name: module for name, module in sys.modules.items() if _harness_module(name)}
    for name in hidden:
        del sys.modules[name]
    main = sys.modules.get("__main__")
    blank = types.ModuleType("__main__")
    blank.__builtins__ = builtins  # type: ignore[attr-defined]
    sys.modules["__main__"] = blank
    argv, path = sys.argv, sys.path
    engine = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    sys.argv = ["-c"]
    sys.path = ["", *(p for p in path[1:] if p and os.path.abspath(p) != engine)]
    try:
        yield
    finally:
        sys.argv, sys.path = argv, path
        if main is not None:
            sys.modules["__main__"] = main
        for name in [name for name in sys.modules if _harness_module(name)]:
            del sys.modules[name]
        sys.modules.update(hidden)
