"""Run the engine's own check (``nearmiss.engine.check``) on a real GPU, sandboxed, on a machine
with an NVIDIA GPU (docs/gpu.md).

``infra/gpu_check.py`` measures what the hardware does with the corpus's kernels, outside the
engine. This script asks the engine itself: ``check(spec, candidate, targets=("gpu",))`` on a
machine whose GPU answers runs every child on it, inside bubblewrap with the GPU's device nodes,
the kernel compiled for the GPU (never interpreted), the ground truth computed there at full
precision, and each case timed (kernel against the XLA reference, median of warm runs). Per
check it records the certificate's fields that say where and how it was made (``platform``,
``times``, ``isolation``, the ``gpu`` target's ``verified_by``), the cases' kernel and reference
times and speedups, and the verdict; the whole report goes to ``$OUT/checks/``.

Before the checks it records what the machine offers (the sandbox, the GPU as the engine's
target probe sees it, JAX inside the sandbox with the device nodes) and, after the first check,
an escape attempt: a candidate that writes marker files outside its sandbox (the host's /tmp,
the checkout, $HOME) at import; none may exist afterwards.

``--cpu-dry-run`` runs the same flow here, on the CPU (``interpret`` target), for a quick test
of the script itself. Output: one JSON (``$OUT/gpu_engine_check.json`` or ``--json``), rewritten
after every check so a run cut short keeps what it did. Exit status 0 whatever the kernels did.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Goldens first (which of them Triton lowers decides what can be certified), then two labelled
# failures, one wrong values and one grid race on a GPU, then more goldens while the budget lasts.
FIRST = ["matmul_k_loop", "matmul", "silu_mul", "softmax_rows"]
FAILURES = [("col_sum", "index_map_drops_column.py"), ("matmul_k_loop", "k_across_grid.py")]
MORE = ["layer_norm", "rms_norm", "gelu_tanh", "col_sum", "matvec", "leaky_relu", "softplus"]

# Prepended to a golden: at import, in the sandbox, it tries to write outside it. Run with the
# integrity gate off, so that the sandbox is all that stands in the way.
ESCAPE_PREFIX = """
for _where in {paths!r}:
    try:
        with open(_where, "w") as _f:
            _f.write("escaped")
    except OSError:
        pass
"""


def machine() -> dict[str, Any]:
    """What the engine sees here, before any check."""
    from nearmiss.engine.runner.environment import cuda_toolkit, find_sandbox, isolation_level
    from nearmiss.engine.targets.registry import run_platform, target_status

    found = find_sandbox()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "jax": importlib.metadata.version("jax"),  # not imported: it would take the GPU
        "sandbox": found if isinstance(found, str) else found.level,
        "isolation": isolation_level(),
        "gpu_target": target_status().get("gpu") or "served",
        "cuda_toolkit": str(cuda_toolkit()),
    }
    try:
        info["run_platform"] = run_platform(("gpu",))
    except Exception as exc:  # a UsageError is an answer too
        info["run_platform"] = f"{type(exc).__name__}: {exc}"
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        info["nvidia_smi"] = str(exc)
    return info


# What a child's first steps do on the device: draw inputs, compute, read back.
SANDBOX_PROBE = """
import jax, jax.numpy as jnp, numpy as np
print(jax.devices(), flush=True)
x = jax.random.normal(jax.random.key(0), (256, 256))
print("sum", float(np.asarray(jax.jit(lambda a: (a @ a).sum())(x))), flush=True)
"""


def jax_in_sandbox(platform_name: str, seccomp: bool) -> dict[str, Any]:
    """JAX on the device in a sandboxed child with the device nodes (and the seccomp filter)."""
    from nearmiss.engine.runner.environment import (
        child_environment,
        find_sandbox,
        seccomp_memfd,
    )

    found = find_sandbox()
    if isinstance(found, str):
        return {"ok": False, "error": found}
    fd = seccomp_memfd(found.seccomp) if seccomp and found.seccomp else None
    with tempfile.TemporaryDirectory(prefix="nearmiss-gpu-probe-") as home:
        env = child_environment(Path(home), {}, extra={"JAX_PLATFORMS": platform_name})
        argv = found.command(
            [sys.executable, "-c", SANDBOX_PROBE], Path(home), env, devices=True, seccomp_fd=fd
        )
        started = time.perf_counter()
        try:
            done = subprocess.run(
                argv,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                pass_fds=() if fd is None else (fd,),
            )
        except subprocess.TimeoutExpired:
            return {"ok": False, "seccomp": fd is not None, "error": "no answer within 120 s"}
        finally:
            if fd is not None:
                os.close(fd)
    tail = (done.stdout + done.stderr).strip().splitlines()[-25:]
    return {
        "ok": done.returncode == 0,
        "seccomp": fd is not None,
        "seconds": round(time.perf_counter() - started, 2),
        "output": tail,
    }


def summary(report) -> dict[str, Any]:
    """The fields that say where and how a certificate was made, and the verdict."""
    cases = [
        {
            "case": f"{c.suite}/{c.name}",
            "passed": c.passed,
            "failure_class": c.failure_class,
            "kernel_ms": None if c.kernel_s is None else round(c.kernel_s * 1e3, 4),
            "reference_ms": None if c.reference_s is None else round(c.reference_s * 1e3, 4),
            "speedup": None if c.speedup is None else round(c.speedup, 3),
        }
        for c in report.cases
    ]
    speedups = [c["speedup"] for c in cases if c["speedup"]]
    return {
        "certified": report.certified,
        "platform": report.platform,
        "jax": report.jax_version,
        "times": report.times,
        "isolation": report.isolation,
        "failure_class": report.failure_class,
        "targets": {
            name: {"ok": t.ok, "verified_by": t.verified_by} for name, t in report.targets.items()
        },
        "cases_passed": f"{sum(c['passed'] for c in cases)}/{len(cases)}",
        "speedup": report.speedup,
        "speedup_median": statistics.median(speedups) if speedups else None,
        "wall_s": round(report.wall_s, 1),
        "diagnosis": report.diagnosis[:600],
        "cases": cases,
    }


def escape_attempt(target: str) -> dict[str, Any]:
    """A candidate that writes markers outside its sandbox at import: which of them exist after."""
    from nearmiss.engine.check import check

    tag = f"nearmiss-escape-{os.getpid()}"
    paths = [f"/tmp/{tag}", str(ROOT / tag), str(Path.home() / tag)]
    with tempfile.TemporaryDirectory(prefix="nearmiss-escape-") as scratch:
        candidate = Path(scratch) / "escape.py"
        golden = (ROOT / "pallas_ops/silu_mul/golden.py").read_text()
        candidate.write_text(ESCAPE_PREFIX.format(paths=paths) + golden)
        error, passed = None, None
        try:
            report = check(
                ROOT / "pallas_ops/silu_mul/spec.py",
                candidate,
                "compact",
                0,
                integrity="off",
                targets=(target,),
            )
            passed = report.passed  # the gate is off: the numbers' verdict, never a certificate
        except Exception as exc:  # a refusal is fine: only the markers matter
            error = f"{type(exc).__name__}: {exc}"[:300]
    found = [p for p in paths if os.path.exists(p)]
    for p in found:
        os.unlink(p)
    return {
        "markers_tried": paths,
        "markers_found": found,
        "check_error": error,
        "passed": passed,  # the golden's numbers are right: the check itself ran
    }


# Prepended to a golden whose grid accumulates across programs (right in interpret mode, a race
# when compiled for a GPU): the candidate's process believes it is on a CPU, so it exports
# interpret mode's plain XLA, which would be right on the GPU with no GPU kernel in it.
FORGERY_PREFIX = """
import jax as _jax
_jax.default_backend = lambda: "cpu"
"""


def interpret_forgery(target: str) -> dict[str, Any]:
    """That forgery, with the static rules (which refuse this patch as written) assumed evaded:
    the executor's audit, which counts only compiled kernels on a device, must refuse it."""
    import nearmiss.engine.check as engine

    with tempfile.TemporaryDirectory(prefix="nearmiss-forgery-") as scratch:
        candidate = Path(scratch) / "forged.py"
        golden = (ROOT / "pallas_ops/col_sum/golden.py").read_text()
        candidate.write_text(FORGERY_PREFIX + golden)
        static = engine.static_violations
        engine.static_violations = lambda source, filename: []
        try:
            report = engine.check(
                ROOT / "pallas_ops/col_sum/spec.py", candidate, "compact", 0, targets=(target,)
            )
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            engine.static_violations = static
    return {
        "certified": report.certified,
        "cases_passed": f"{sum(c.passed for c in report.cases)}/{len(report.cases)}",
        "violations": [f"{v.rule}: {v.detail}"[:200] for v in report.integrity.violations],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="the interpret target, here")
    parser.add_argument("--budget-s", type=float, default=330.0, help="no check starts after it")
    parser.add_argument("--ops", help="comma-separated goldens instead of the built-in list")
    parser.add_argument("--suite", default="compact", choices=("compact", "extended", "all"))
    parser.add_argument("--json", help="output file (default: $OUT/gpu_engine_check.json)")
    args = parser.parse_args()
    started = time.perf_counter()
    out = (
        Path(args.json) if args.json else Path(os.environ.get("OUT", ".")) / "gpu_engine_check.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    (out.parent / "checks").mkdir(exist_ok=True)
    target = "interpret" if args.cpu_dry_run else "gpu"
    if args.cpu_dry_run:
        os.environ["JAX_PLATFORMS"] = "cpu"
    result: dict[str, Any] = {"target": target, "suite": args.suite, "machine": machine()}
    result["checks"] = []
    if not args.cpu_dry_run:
        on = str(result["machine"]["run_platform"])
        result["jax_in_sandbox"] = [jax_in_sandbox(on, seccomp) for seccomp in (True, False)]
    print(json.dumps(result, indent=1), flush=True)

    from nearmiss.engine.check import check
    from nearmiss.engine.runner.session import Limits

    if args.ops:
        plan = [(op, "golden.py") for op in args.ops.split(",")]
    else:
        plan = [(op, "golden.py") for op in FIRST] + FAILURES
        plan += [(op, "golden.py") for op in MORE if op not in FIRST]
    for position, (op, file) in enumerate(plan):
        if time.perf_counter() - started > args.budget_s:
            result["checks"].append({"op": op, "candidate": file, "skipped": "budget"})
            continue
        ran = [c for c in result["checks"] if "skipped" not in c]
        if len(ran) >= 3 and all("error" in c for c in ran):  # the engine, not the kernels
            result["checks"].append({"op": op, "candidate": file, "skipped": "first 3 failed"})
            continue
        folder = ROOT / "pallas_ops" / op
        candidate = folder / file if file == "golden.py" else folder / "variants" / file
        entry: dict[str, Any] = {"op": op, "candidate": file}
        try:
            report = check(
                folder / "spec.py", candidate, args.suite, 0, Limits(), targets=(target,)
            )
            entry |= summary(report)
            name = f"{op}-{Path(file).stem}.json"
            (out.parent / "checks" / name).write_text(report.model_dump_json(indent=1))
        except Exception as exc:
            entry["error"] = "".join(traceback.format_exception(exc))[-1500:]
        result["checks"].append(entry)
        print(json.dumps(entry)[:1500], flush=True)
        if position == 0:
            result["escape"] = escape_attempt(target)
            print(json.dumps(result["escape"]), flush=True)
            if not args.cpu_dry_run:  # on a CPU interpret mode is the rule, not a forgery
                result["interpret_forgery"] = interpret_forgery(target)
                print(json.dumps(result["interpret_forgery"]), flush=True)
        result["wall_s"] = round(time.perf_counter() - started, 1)
        out.write_text(json.dumps(result, indent=1))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
