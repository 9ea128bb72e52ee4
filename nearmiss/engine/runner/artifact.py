"""Kernels cross the sandbox as artifacts: exported, serialized computations.

The candidate's Python runs only to *trace*. The candidate child exports what it traced
(``jax.export``, serialized) and writes the bytes to its case directory; the executor child —
engine code that never imports the candidate — deserializes those bytes, audits the module and
runs it on the case's inputs. Whatever the candidate's code does to its own process (replace
JAX's functions, forge messages, rewrite its audit), the outputs that are compared and the module
that is audited are one and the same artifact, in a process it never ran in. The inputs never
reach the candidate child at all: it gets their shapes and dtypes only.

In CPU interpret mode a pallas_call lowers to plain HLO, so the child puts each kernel of the
traced program inside a function labelled ``audit.KERNEL_LABEL`` (in-place operands recorded in
the label; ``runner.traced_program``). The label is only a claim: the audit accepts a labelled
function as a kernel only in the shape interpret mode gives one, and everything outside kernels
is measured on the artifact itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

from nearmiss.engine.integrity.audit import (
    CALLBACK_TARGETS,
    KERNEL_TARGETS,
    PLATFORM_BRANCH_REFUSAL,
    RUNNABLE_TARGET_PREFIXES,
    custom_call_targets,
    parse_module,
    platform_branches,
)

ARTIFACT_FILE = "artifact.bin"


def target_artifact_file(target: str) -> str:
    """The file of a case's artifact lowered for a target (``artifact-tpu-v5e.bin``)."""
    return f"artifact-{target}.bin"


MAX_ARTIFACT_BYTES = 256 * 1024 * 1024


class ArtifactRejected(Exception):
    """The artifact is not one the executor will run (malformed, wrong signature, callbacks)."""


# -- the candidate child's side -------------------------------------------------------------------


def export_traced(jitted: Any, avals: list[Any]) -> bytes:
    """The serialized export of a jitted function for the current backend.

    Host callbacks cannot be serialized at all; JAX refuses them here, which surfaces as a
    compile-phase error of the candidate (the engine also hears which callbacks were traced).
    """
    from jax import export

    checks = [export.DisabledSafetyCheck.custom_call(t) for t in KERNEL_TARGETS]
    platform = export.default_export_platform()  # 'cuda', not 'gpu': export's own names
    exported = export.export(jitted, platforms=[platform], disabled_checks=checks)(*avals)
    return bytes(exported.serialize())


# -- the executor child's side --------------------------------------------------------------------


def read_artifact(path: Path) -> bytes:
    size = path.stat().st_size
    if size > MAX_ARTIFACT_BYTES:
        raise ArtifactRejected(f"the artifact is {size} bytes (at most {MAX_ARTIFACT_BYTES})")
    return path.read_bytes()


def load_artifact(data: bytes) -> Any:
    """The deserialized ``Exported`` for this process's platform; ArtifactRejected otherwise."""
    from jax import export

    try:
        exported = export.deserialize(bytearray(data))
    except Exception as exc:  # a forged or corrupt file: whatever the parser says
        raise ArtifactRejected(f"the artifact does not deserialize: {type(exc).__name__}") from exc
    platform = export.default_export_platform()
    if tuple(exported.platforms) != (platform,):
        raise ArtifactRejected(f"the artifact is for {exported.platforms}, not {platform}")
    if exported.nr_devices != 1 or exported.ordered_effects or exported.unordered_effects:
        raise ArtifactRejected("the artifact needs several devices or has side effects")
    return exported


def check_signature(exported: Any, inputs: list[Any]) -> None:
    """The artifact must take exactly the case's inputs (shapes and dtypes)."""
    import numpy as np

    expected = [(tuple(a.shape), np.dtype(a.dtype)) for a in inputs]
    actual = [(tuple(a.shape), np.dtype(a.dtype)) for a in exported.in_avals]
    if expected != actual:
        raise ArtifactRejected(f"the artifact takes {actual}, the case gives {expected}")


def refuse_unrunnable(module: Any) -> set[str]:
    """Refuse custom calls the executor cannot vouch for (host callbacks, unknown targets) and
    code chosen by platform at lowering (run here, but not what a chip is given). Returns the
    custom calls it lets through."""
    branches = platform_branches(module)
    if branches:
        raise ArtifactRejected(PLATFORM_BRANCH_REFUSAL.format(count=branches))
    targets = custom_call_targets(module)
    for target in sorted(targets):
        if target in CALLBACK_TARGETS:
            raise ArtifactRejected(f"the artifact calls back into the host (`{target}`)")
        if not target.startswith(RUNNABLE_TARGET_PREFIXES):
            raise ArtifactRejected(f"the artifact calls an unknown custom call `{target}`")
    return targets


class Vetted(NamedTuple):
    exported: Any  # the deserialized ``Exported``
    module: Any  # its parsed module...
    context: Any  # ...and the MLIR context that keeps it alive
    custom_calls: set[str]  # the custom calls it makes, every one vouched for


def vetted(data: bytes, args: list[Any]) -> Vetted:
    """An artifact made ready to run on ``args`` in an executor: deserialized, its signature
    theirs, and nothing in its module the executor cannot vouch for (``refuse_unrunnable``);
    ArtifactRejected otherwise."""
    exported = load_artifact(data)
    check_signature(exported, args)
    module, context = parse_module(exported.mlir_module())
    return Vetted(exported, module, context, refuse_unrunnable(module))
