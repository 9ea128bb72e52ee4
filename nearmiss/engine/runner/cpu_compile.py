"""How the engine's children compile for the CPU: without XLA's fusion emitters, in two parts.

XLA's CPU compiler emits fused loops through its newer MLIR "fusion emitters" by default. For
the programs a check compiles (a Pallas kernel's interpret-mode artifact: loops over the grid,
dynamic slices, small element-wise bodies; a spec's inputs and reference, op by op) the older
elemental emitter builds them in about 0.7× the compile CPU, and the numbers are the same bit
for bit: measured over every bundled op's golden, variants and reference on all their cases
(500 compiled programs), and every bundled and shipped spec's inputs on two seeds and eager
reference (970 arrays); none differed. A golden's check for TPU v5e took 0.77× the time.

XLA also splits each program's machine code into up to 32 parts it compiles on a thread pool
(``xla_cpu_parallel_codegen_split_count``). A check's programs are small, and each part costs
its own set-up, so most of the split is overhead. In two parts, the artifacts of four bundled
ops' goldens and variants (95 programs, one compile at a time on two idle cores) took 0.86×
the compile CPU and 0.92× the wall time; in one part 0.84× the CPU but 1.25× the wall time,
the second core left idle. The numbers are the same bit for bit (``benchmarks/cpu_compile.py``:
538 programs, every bundled op's golden and variants on three listed cases and two hidden draws;
540 inputs and references, every bundled and shipped spec's on two seeds): the parts are
separate modules of the same functions, each compiled as it was.

Two ways in, so that a candidate's Python sees nothing of them:

- a program the engine compiles itself (the runs' executor, the search's screen, the TPU
  semantics run in the candidate's child) is compiled with per-compile options
  (``compile_lowered``): nothing in the process's environment or JAX's configuration changes;
- the spec's child, whose inputs and reference run op by op (JAX compiles each operation
  itself), gets them as flags in ``XLA_FLAGS`` (``spec_child_xla_flags``). No candidate runs
  there.

An XLA that lacks an option answers a per-compile request with ``No such compile option`` and
its name: the process then compiles without that one, with the others. An unknown flag in
``XLA_FLAGS`` stops the process instead, so the spec's child gets them only from the jaxlib
releases they were measured on (``FLAG_KNOWN_IN``); elsewhere it computes with XLA's
defaults, which give the same numbers.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False, "xla_cpu_parallel_codegen_split_count": 2}
# XLA's answer to an option it does not know; it names the option.
_UNKNOWN = re.compile(r"No such compile option: '([^']+)'")
# jaxlib releases (prefixes) whose XLA takes ``CPU_OPTIONS`` as flags: measured, bit for bit.
FLAG_KNOWN_IN = ("0.10.",)

# Options this process's XLA refused: asked once, not again; the others are still asked for.
_refused: set[str] = set()


def compile_lowered(lowered: Any) -> Any:
    """``lowered.compile()``, with those of ``CPU_OPTIONS`` the backend knows, where it is the
    CPU."""
    import jax

    if jax.default_backend() != "cpu":
        return lowered.compile()
    while options := {k: v for k, v in CPU_OPTIONS.items() if k not in _refused}:
        try:
            return lowered.compile(compiler_options=options)
        except Exception as exc:  # the program's own failure is raised again, unchanged
            unknown = _UNKNOWN.search(str(exc))
            if unknown is None:
                raise
            named = unknown.group(1)
            _refused.update([named] if named in options else options)
    return lowered.compile()


def spec_child_xla_flags(current: str, jaxlib_version: str | None = None) -> str:
    """``XLA_FLAGS`` for the spec's child: ``CPU_OPTIONS`` first, where this jaxlib is known to
    take them, then ``current`` (the user's, which win where they name the same flag)."""
    if jaxlib_version is None:
        try:
            jaxlib_version = importlib.metadata.version("jaxlib")
        except importlib.metadata.PackageNotFoundError:
            return current
    if not jaxlib_version.startswith(FLAG_KNOWN_IN):
        return current
    return f"{option_flags()} {current}".strip()


def option_flags() -> str:
    """``CPU_OPTIONS`` written as ``XLA_FLAGS`` (``--name=value`` each)."""
    return " ".join(f"--{name}={str(value).lower()}" for name, value in CPU_OPTIONS.items())
