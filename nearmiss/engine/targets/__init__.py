"""Targets: where a kernel is certified to be right (``interpret``, ``tpu-v4``, ``tpu-v5e``,
``tpu-v5p``, ``tpu-v6e``, ``gpu``), the TPU compile-only toolchain and the GPU's Triton lowering.

- ``registry``: the target names, ``parse_targets`` and ``available_targets`` (nothing heavy is
  imported; libtpu is probed in a child).
- ``libtpu_env``: ``prepare_environment()``, libtpu's settings for compile-only use, called
  before JAX is imported.
- ``tpu``: ``export_for_tpu`` (candidate child: the real Pallas TPU lowering for the target's
  chip, serialized) and ``compile_tpu_artifact`` (executor child: libtpu's compiler on a
  compile-only topology device, with the compiled program's memory).
- ``triton``: the gpu target without a GPU: ``lower_for_triton`` (candidate child: Pallas'
  Triton lowering per pallas_call, and ragged output blocks stored unmasked) and
  ``read_triton_modules`` (executor child: the modules parsed, verified, read for TF32 dots).
- ``vmem``: how much of the chip's scoped VMEM a kernel's blocks take (estimated from the
  artifact, held to the compiler by tests/test_vmem.py), and the warning when it is close.
- ``errors``: ``trim_error``, one or two sentences and the candidate's line.

Importing this package imports neither JAX nor libtpu.
"""

from nearmiss.engine.targets.errors import kernel_sites, trim_error, trim_exception
from nearmiss.engine.targets.libtpu_env import prepare_environment
from nearmiss.engine.targets.registry import (
    DEFAULT_TARGETS,
    TARGETS,
    Target,
    available_targets,
    get_target,
    libtpu_problem,
    parse_targets,
    run_platform,
    target_status,
)
from nearmiss.engine.targets.tpu import compile_tpu_artifact, export_for_tpu, lowering_for

__all__ = [
    "DEFAULT_TARGETS",
    "TARGETS",
    "Target",
    "available_targets",
    "compile_tpu_artifact",
    "export_for_tpu",
    "get_target",
    "kernel_sites",
    "libtpu_problem",
    "lowering_for",
    "parse_targets",
    "prepare_environment",
    "run_platform",
    "target_status",
    "trim_error",
    "trim_exception",
]
