"""Targets: where a kernel is certified to be right (``interpret``, ``tpu-v4``, ``tpu-v5e``,
``tpu-v5p``, ``tpu-v6e``, ``gpu``), and the TPU compile-only toolchain.

- ``registry``: the target names, ``parse_targets`` and ``available_targets`` (nothing heavy is
  imported; libtpu is probed in a child).
- ``libtpu_env``: ``prepare_environment()``, libtpu's settings for compile-only use, called
  before JAX is imported.

Importing this package imports neither JAX nor libtpu.
"""

from nearmiss.targets.libtpu_env import prepare_environment
from nearmiss.targets.registry import (
    DEFAULT_TARGETS,
    TARGETS,
    Target,
    available_targets,
    get_target,
    libtpu_problem,
    parse_targets,
    target_status,
)

__all__ = [
    "DEFAULT_TARGETS",
    "TARGETS",
    "Target",
    "available_targets",
    "get_target",
    "libtpu_problem",
    "parse_targets",
    "prepare_environment",
    "target_status",
]
