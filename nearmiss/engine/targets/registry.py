"""The targets a kernel can be certified for, and which of them this machine can serve.

A target names where a kernel must be right: ``interpret`` (CPU interpret mode), a TPU generation
(the real Mosaic compiler through libtpu's compile-only topologies: no TPU needed) or ``gpu``.
Nothing here imports JAX or libtpu: the engine parses ``--target`` cheaply, and what needs
libtpu loaded (creating a topology) runs in a short probe child (``nearmiss.engine.targets.probe``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import nearmiss
from nearmiss.engine.errors import UsageError

INTERPRET, TPU, GPU = "interpret", "tpu", "gpu"


@dataclass(frozen=True)
class Target:
    """One target. For TPU targets: the compile-only topology libtpu builds for the chip, the
    device kind its devices report (what Pallas' ``tpu_info`` reads when lowering), the chip
    (``tpu_info.ChipVersion`` value) and the TensorCores of one compile-only device."""

    name: str
    kind: str  # INTERPRET, TPU or GPU
    description: str
    topology: str | None = None
    device_kind: str | None = None
    chip: str | None = None
    num_cores: int | None = None

    @property
    def is_tpu(self) -> bool:
        return self.kind == TPU


# Topology names: what libtpu 0.0.42 accepts with its default chips-per-host bounds (2x2x1), so
# one host's worth of chips; a kernel compiles for one device of it. v4's compile-only devices
# are single TensorCores (libtpu offers no megacore v4 topology); v5p's are megacore (2 cores).
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(INTERPRET, INTERPRET, "CPU interpret mode (JAX's Pallas interpreter)"),
        Target("tpu-v4", TPU, "TPU v4 (Mosaic, compile-only)", "v4:2x2x1", "TPU v4", "v4", 1),
        Target(
            "tpu-v5e", TPU, "TPU v5e (Mosaic, compile-only)", "v5e:2x2", "TPU v5 lite", "v5e", 1
        ),
        Target("tpu-v5p", TPU, "TPU v5p (Mosaic, compile-only)", "v5p:2x2x1", "TPU v5", "v5p", 2),
        Target(
            "tpu-v6e", TPU, "TPU v6e (Mosaic, compile-only)", "v6e:2x2", "TPU v6 lite", "v6e", 1
        ),
        Target(GPU, GPU, "GPU (the cases run on the GPU where one answers; else grid semantics)"),
    )
}
DEFAULT_TARGETS = (INTERPRET,)
TPU_TARGETS = tuple(name for name, t in TARGETS.items() if t.is_tpu)


def get_target(name: str) -> Target:
    """The registered target called ``name``; UsageError for any other name."""
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target `{name}`: choose from {', '.join(TARGETS)}") from None


def parse_targets(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"interpret,tpu-v5e"`` (or a list of names) -> ``("interpret", "tpu-v5e")``, in order,
    without repeats. UsageError (one line) for an empty list, an unknown name, or a TPU target
    where libtpu is not installed or does not match the installed jax."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    names: list[str] = []
    for part in parts:
        name = part.strip().lower()
        if not name:
            continue
        get_target(name)
        if name not in names:
            names.append(name)
    if not names:
        raise UsageError(f"no target given: choose from {', '.join(TARGETS)}")
    if any(TARGETS[name].is_tpu for name in names):
        problem = libtpu_problem()
        if problem:
            raise UsageError(problem)
    return tuple(names)


def _jax_version() -> str:
    try:
        return importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def libtpu_pin() -> str | None:
    """The libtpu requirement of jax's own ``tpu`` extra (e.g. ``==0.0.42.*``), if it has one."""
    try:
        requires = importlib.metadata.requires("jax") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in requires:
        match = re.match(r"libtpu\s*([^;]*);.*extra\s*==\s*['\"]tpu['\"]", line)
        if match and match.group(1).strip():
            return match.group(1).strip().strip("()")
    return None


def _satisfies(version: str, pin: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(pin).contains(version, prereleases=True)
    except ImportError:  # packaging is nearly always there; else accept only plain == pins
        match = re.fullmatch(r"==\s*([\w.]+?)(\.\*)?", pin)
        if not match:
            return True
        return version == match.group(1) or (
            bool(match.group(2)) and version.startswith(match.group(1) + ".")
        )


@functools.cache
def libtpu_problem() -> str | None:
    """Why TPU targets cannot be used here (one line), or None. Cheap: looks at the installed
    distributions only, never loads libtpu."""
    jax_version = _jax_version()
    hint = f"run `make setup` (installs jax[tpu] matching jax {jax_version})"
    spec = importlib.util.find_spec("libtpu")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return f"TPU targets need libtpu: {hint}"
    library = Path(next(iter(spec.submodule_search_locations))) / "libtpu.so"
    if not library.is_file():
        return f"TPU targets need libtpu, and {library} is missing: {hint}"
    try:
        found = importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return f"TPU targets need libtpu, and its installation is broken: {hint}"
    pin = libtpu_pin()
    if pin and not _satisfies(found, pin):
        return f"TPU targets need libtpu{pin} for jax {jax_version}, found {found}: {hint}"
    return None


# -- what this machine can serve (probed in a child: libtpu and GPU plugins stay out of the engine)


PROBE_TIMEOUT_S = 120


def _run_probe(*args: str, env: dict[str, str] | None = None) -> dict:
    root = str(Path(nearmiss.__file__).resolve().parents[1])  # where `nearmiss` is importable
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (root, child_env.get("PYTHONPATH", "")) if p
    )
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nearmiss.engine.targets.probe", *args],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"the probe did not run ({exc})"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()
        return {"error": tail[-1] if tail else f"the probe exited with {done.returncode}"}


def _gpu_plugins() -> list[str]:
    """JAX's CUDA/ROCm plugins installed here (``jax-cuda12-plugin``...): 'cuda' / 'rocm'."""
    found = set()
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        match = re.fullmatch(r"jax-(cuda|rocm)\d*-plugin", name)
        if match:
            found.add(match.group(1))
    return sorted(found)


@functools.cache
def target_status() -> dict[str, str | None]:
    """Every target -> None when this machine can serve it, else why not (one line).

    ``interpret`` always; a TPU target when libtpu can create its compile-only topology (probed
    in a child, about a second and a half, once per process); ``gpu`` when a GPU backend is
    present (probed only where a JAX GPU plugin is installed)."""
    status: dict[str, str | None] = {INTERPRET: None}
    problem = libtpu_problem()
    probed = {} if problem else _run_probe("tpu")
    for name in TPU_TARGETS:
        if problem:
            status[name] = problem
            continue
        answer = probed.get("topologies", {}).get(TARGETS[name].topology)
        if answer == TARGETS[name].device_kind:
            status[name] = None
        else:
            why = probed.get("errors", {}).get(TARGETS[name].topology) or probed.get("error")
            status[name] = f"libtpu cannot create topology {TARGETS[name].topology}: " + (
                why or f"its devices are {answer!r}, not {TARGETS[name].device_kind!r}"
            )
    platform, why = _gpu_backend()
    status[GPU] = None if platform else why
    return status


@functools.cache
def _gpu_backend() -> tuple[str | None, str]:
    """(JAX's platform name of a GPU that answers here, e.g. 'cuda', or None; why not)."""
    why = "no GPU backend (no JAX GPU plugin installed)"
    for platform in _gpu_plugins():
        env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
        env["JAX_PLATFORMS"] = platform  # no CPU fallback: jax fails without that GPU
        answer = _run_probe("gpu", env=env)
        if answer.get("devices"):
            return platform, ""
        why = f"no GPU backend ({answer.get('error', 'no devices')})"
    return None, why


def run_platform(targets: tuple[str, ...] | None) -> str:
    """Where a check of ``targets`` runs its cases: JAX's platform name of this machine's GPU
    (``cuda``) when ``gpu`` is the one target asked for and a GPU answers here, else ``cpu``
    (interpret mode). On the GPU every pallas_call is compiled for it, so the other targets,
    whose meaning is CPU interpret mode or a TPU compiler's view of it, cannot share that run:
    asked for with them, ``gpu`` is judged by grid semantics, as on a machine without a GPU, and
    its report says so."""
    if not targets or parse_targets(targets) != (GPU,):
        return "cpu"
    platform, _ = _gpu_backend()
    return platform or "cpu"


def available_targets() -> tuple[str, ...]:
    """The targets this machine can serve, in registry order (``interpret`` always)."""
    return tuple(name for name, why in target_status().items() if why is None)
