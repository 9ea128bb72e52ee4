"""Run the corpus's goldens on a real NVIDIA GPU: does each lower, is it right, racy, how fast?

For a machine with an NVIDIA GPU. Without a GPU the engine judges the
``gpu`` target by emulation (Pallas' Triton lowering on the CPU, TF32 dots, values nobody wrote
in a ragged block's tail, and grid semantics: two grid points writing one output block are a
``grid_race``); this script measures what the hardware does with the same kernels, so that
verdict can be compared with the machine. It is never needed for CI; its dry run
(``--cpu-dry-run``) is tested on two goldens (tests/test_gpu_check_script.py).

For every ``pallas_ops/<op>/golden.py`` (then every variant that ``variants.json`` labels for the
``gpu`` target), for every case of ``SPEC.suite("all")``:

- inputs from ``spec.make_inputs(case, key)`` on the CPU (the engine's own keys), the ground truth
  from ``spec.reference`` on the CPU (what the engine certifies against: no TF32);
- the kernel compiled for the GPU for real (no interpret mode), with Pallas' Triton lowering
  first and Mosaic GPU second (``--backends``); a kernel that neither lowers (TPU-style
  compiler params, block shapes Triton refuses...) is a row saying so, with the error;
- the largest error against the reference at the spec's tolerance (``spec.tolerance_for``:
  ``|out - ref| <= atol + rtol * |ref|``, NaN/Inf only where the reference has them);
- the engine's static verdict: the kernel exported for TPU v5e on this host
  (``nearmiss.engine.targets.tpu.export_for_tpu``) and read by ``grid_findings(exported, "gpu")``
  (``race?``), live, or from ``--predictions`` written here beforehand by ``--predict-only``;
- the engine's own verdict for the ``gpu`` target on a CPU host (``--predict-only`` runs
  ``check(..., targets=("gpu",))`` here: Triton lowering, TF32, fill, grid), held against what
  the device did with each case: agree / certified-but-wrong / refused-but-right;
- the kernel run many times (more when a race is predicted; plus a case with every dim scaled
  by ``--stress-scale`` for those): do the results differ between runs, or from the reference?
- kernel and reference times: median of warm runs, each ended by ``block_until_ready`` (the
  reference is the spec's pure-JAX function compiled by XLA for the GPU; how far its values are
  from the CPU's is ``reference_device_err`` in the JSON).

Each kernel runs in a worker process, one kernel at a time with a hard time limit: a kernel that
hangs or leaves the CUDA context broken costs its own rows and a worker restart, never the run.
A global budget (``--budget-s``, counted from the start, the workers' start-up included) ends
the run with one ``skipped: budget`` row per kernel not reached; with ``--predictions`` the
kernels with a predicted race go first. Results go out as one table on stdout and, where ``$OUT``
is set (the device machine), as ``$OUT/gpu_check.json`` (rewritten after every case, so a run cut
short keeps its rows) and ``$OUT/gpu_check.txt``. Exit status: 0 the run went through (whatever
the kernels did), 2 no GPU (or no JAX) in the worker, 143 interrupted (SIGTERM).

On the device machine (docs/gpu.md): ``bash infra/gpu_check.sh``.
Here: ``.venv/bin/python infra/gpu_check.py --cpu-dry-run --ops col_sum,leaky_relu``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # nearmiss and pallas_ops from this checkout, on any python3

OPS_DIR = ROOT / "pallas_ops"
SCHEMA = 1
TPU_TARGET = "tpu-v5e"  # the chip the kernels are exported for, to read their grid and index maps
CPU_REFERENCE = "cpu"

# Row statuses. A kernel's result is data, never a crash of the script.
OK = "ok"
MISMATCH = "mismatch"
NOT_LOWERED = "not_lowered"
RUNTIME_ERROR = "runtime_error"
ERROR = "error"  # inputs or reference failed: the harness's problem, not the kernel's
TIMEOUT = "timeout"
WORKER_DIED = "worker_died"
SKIPPED_BUDGET = "skipped: budget"
SKIPPED_KERNEL = "skipped: kernel budget"
SKIPPED_AFTER = "skipped: worker restarted"

# Settings per mode: (GPU, --cpu-dry-run). The GPU run must end well inside 8 minutes, leaving a
# 15-minute device lease room for a rerun; the dry run must fit a test (< 60 s for 2 goldens).
DEFAULTS = {
    "budget_s": (300.0, 45.0),
    "per_op_s": (30.0, 25.0),
    "startup_s": (150.0, 60.0),
    "timing_runs": (20, 2),
    "race_runs": (50, 2),
    "stress_scale": (4, 0),
}
GRACE_S = 20.0  # beyond a kernel's soft limit before its worker is killed
MIN_OP_S = 3.0  # a kernel is not started with less budget than this left


# ------------------------------------------------------------------------------------------------
# Discovery (no JAX)


def discover(ops: Sequence[str] | None, variants: bool = True) -> list[str]:
    """The kernels to run: every golden (by operator name, sorted), then the near-miss variants
    labelled for the ``gpu`` target (``op:variant``, from each ``variants.json``); ``ops`` names
    them instead, in its own order."""
    goldens = sorted(
        p.parent.name for p in OPS_DIR.glob("*/golden.py") if (p.parent / "spec.py").is_file()
    )
    if not ops:
        return goldens + (gpu_variants() if variants else [])
    unknown = [unit for unit in ops if not all(p.is_file() for p in unit_paths(unit))]
    if unknown:
        raise SystemExit(f"gpu_check: no spec and kernel for {', '.join(unknown)} under {OPS_DIR}")
    return list(dict.fromkeys(ops))


def unit_paths(unit: str) -> tuple[Path, Path]:
    """(spec, kernel file) of ``op`` (its golden) or ``op:variant`` (``variants/variant.py``)."""
    op, _, variant = unit.partition(":")
    kernel = OPS_DIR / op / "variants" / f"{variant}.py" if variant else OPS_DIR / op / "golden.py"
    return OPS_DIR / op / "spec.py", kernel


def gpu_variants() -> list[str]:
    """Variants whose ``variants.json`` entry names the ``gpu`` target under a key with
    "target" in its name (``"target": "gpu"``, ``"targets": ["gpu"]``...)."""
    units = []
    for path in sorted(OPS_DIR.glob("*/variants.json")):
        try:
            entries = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
                continue
            for key, value in entry.items():
                values = value if isinstance(value, list) else [value]
                if "target" in key and "gpu" in values:
                    units.append(f"{path.parent.name}:{Path(entry['file']).stem}")
                    break
    return units


def racy_first(ops: list[str], predictions: dict[str, Any] | None) -> list[str]:
    """Kernels with a predicted race first (the point of the check), then the rest, stably."""
    if not predictions:
        return ops
    table = predictions.get("ops", {})

    def racy(op: str) -> bool:
        return any(entry.get("race_predicted") for entry in table.get(op, {}).values())

    return [op for op in ops if racy(op)] + [op for op in ops if not racy(op)]


def short(text: str, limit: int = 240) -> str:
    """One line of an error: its first meaningful line, cut."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    head = next((line for line in lines if not line.startswith("Traceback")), "")
    return head if len(head) <= limit else head[: limit - 3] + "..."


def error_text(exc: BaseException) -> str:
    return short(f"{type(exc).__name__}: {exc}")


def error_detail(exc: BaseException, limit: int = 1200) -> str:
    """More of an error for the JSON: whitespace folded, cut."""
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------------------------
# Worker side: everything that imports JAX


def prepare_jax_environment(dry_run: bool) -> None:
    """Before JAX is imported: the CPU only for the dry run (libtpu quiet, as in the tests); on
    the GPU, allocate as needed instead of taking 75 % of the card up front."""
    from nearmiss.engine.targets.libtpu_env import prepare_environment

    prepare_environment(cpu_only=dry_run)
    if not dry_run:
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class Runner:
    """One worker's JAX session: environment facts and the per-kernel work."""

    def __init__(self, settings: dict[str, Any]) -> None:
        import jax
        import numpy as np

        self.jax, self.np = jax, np
        self.settings = settings
        self.dry_run = settings["dry_run"]
        self.cpu = jax.devices("cpu")[0]
        self.predictions = settings.get("predictions") or {}
        if self.dry_run:
            from nearmiss.engine.runner.interpret import force_interpret_on_cpu

            force_interpret_on_cpu()  # every pallas_call in interpret mode, as the engine runs it
            self.device = self.cpu
        else:
            self.device = jax.devices()[0]

    # -- environment ----------------------------------------------------------------------------

    def environment(self) -> dict[str, Any]:
        jax = self.jax
        info: dict[str, Any] = {
            "python": platform.python_version(),
            "executable": sys.executable,
            "jax": jax.__version__,
            "jaxlib": _version("jaxlib"),
            "cuda_plugin": _version("jax-cuda13-plugin") or _version("jax-cuda12-plugin"),
            "default_backend": jax.default_backend(),
            "device": str(self.device),
            "device_kind": getattr(self.device, "device_kind", None),
            "mode": "cpu-dry-run" if self.dry_run else "gpu",
        }
        for name, module in (
            ("pallas_triton", "jax.experimental.pallas.triton"),
            ("pallas_mosaic_gpu", "jax.experimental.pallas.mosaic_gpu"),
        ):
            try:
                __import__(module)
                info[name] = True
            except Exception as exc:
                info[name] = error_text(exc)
        state = _mosaic_gpu_flag()
        info["jax_pallas_use_mosaic_gpu"] = None if state is None else bool(state.value)
        gpu = jax.default_backend() in ("gpu", "cuda") and self.device.platform == "gpu"
        info["ok"] = self.dry_run or gpu
        if not info["ok"]:
            info["problem"] = (
                f"JAX's backend is {jax.default_backend()!r}, not a GPU: this python3 has no "
                "CUDA JAX (jax-cuda*-plugin) or sees no GPU"
            )
        return info

    def healthy(self) -> bool:
        """The device still computes after a kernel (a CUDA fault poisons the context)."""
        try:
            jnp = self.jax.numpy
            value = self.jax.device_put(jnp.arange(8.0), self.device).sum()
            return float(value.block_until_ready()) == 28.0
        except Exception:
            return False

    # -- one kernel -----------------------------------------------------------------------------

    def cases(self, op: str):
        from nearmiss.engine.spec import Case, load_spec

        spec = load_spec(unit_paths(op)[0])
        cases = list(spec.suite("all"))
        return spec, cases, Case

    def run_op(self, op: str, soft_s: float, announce) -> Iterator[dict[str, Any]]:
        """Rows for every case of ``op``; the cases are announced first (``announce(names)``)."""
        start = time.monotonic()
        try:
            spec, cases, case_type = self.cases(op)
            kernel = _load_kernel(op)
        except Exception as exc:
            announce(["(all)"])
            yield {"kernel": op, "case": "(all)", "status": ERROR, "error": error_text(exc)}
            return
        scale = int(self.settings["stress_scale"])
        stress = None
        if scale > 1:
            base = cases[0]
            stress = case_type(
                f"{base.name}_x{scale}",
                {k: v * scale for k, v in base.dims.items()},
                base.dtype,
                base.profile,
            )
        announce([c.name for c in cases] + ([stress.name] if stress else []))
        racy = False
        backends = list(self.settings["backends"])
        for number, case in enumerate(cases):
            if number and time.monotonic() - start > soft_s:  # the first case always runs
                yield _row(op, case, status=SKIPPED_KERNEL)
                continue
            row = self.run_case(op, spec, kernel, case, backends)
            racy = racy or bool(row.get("race_predicted"))
            if row.get("lowered") and row["lowered"] in backends:
                # The backend that lowered this kernel goes first for its other cases.
                backends.remove(row["lowered"])
                backends.insert(0, row["lowered"])
            yield row
        if stress is not None:
            if not racy:
                yield _row(op, stress, status="skipped: no race predicted")
            elif time.monotonic() - start > soft_s:
                yield _row(op, stress, status=SKIPPED_KERNEL)
            else:
                yield self.run_case(op, spec, kernel, stress, backends, stress=True)

    def run_case(self, op, spec, kernel, case, backends, stress=False) -> dict[str, Any]:
        jax, np = self.jax, self.np
        row = _row(op, case, stress=stress)
        atol, rtol = spec.tolerance_for(case.dtype)
        row.update(atol=atol, rtol=rtol)
        key = case_key(jax, int(self.settings["seed"]), spec, case)
        try:
            with jax.default_device(self.cpu):
                inputs = tuple(spec.make_inputs(case, key))
                expected = jax.block_until_ready(jax.jit(spec.reference)(*inputs))
            expected_host = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(expected)]
            device_inputs = tuple(jax.device_put(x, self.device) for x in inputs)
        except Exception as exc:
            row.update(status=ERROR, error="inputs/reference: " + error_text(exc))
            return row
        row.update(self.predict(op, case, kernel, inputs, stress))
        verdict = self.predictions.get("ops", {}).get(op, {}).get(case.name, {}).get("engine")
        if verdict and not stress:
            row["engine_verdict"] = verdict

        compiled, errors = None, {}
        for backend in backends:
            try:
                with _backend(backend):
                    compiled = jax.jit(kernel).lower(*device_inputs).compile()
                row["lowered"] = backend
                break
            except Exception as exc:
                errors[backend] = exc
        row["backend_errors"] = {name: error_detail(exc) for name, exc in errors.items()}
        if compiled is None:
            first = next(iter(errors.values()), None)
            row.update(status=NOT_LOWERED, error=first and error_text(first))
            return row

        runs = int(self.settings["timing_runs"])
        if row.get("race_predicted"):
            runs = max(runs, int(self.settings["race_runs"]))
        try:
            first = jax.block_until_ready(compiled(*device_inputs))  # warm-up, and run 1
            outputs, times = [first], []
            for _ in range(runs):
                t0 = time.perf_counter()
                out = jax.block_until_ready(compiled(*device_inputs))
                times.append(time.perf_counter() - t0)
                outputs.append(out)
            hosts = [[np.asarray(x) for x in jax.tree_util.tree_leaves(o)] for o in outputs]
        except Exception as exc:
            row.update(status=RUNTIME_ERROR, error=error_text(exc), error_detail=error_detail(exc))
            return row
        row["kernel_ms"] = 1e3 * statistics.median(times) if times else None

        structure = jax.tree_util.tree_structure(expected)
        if jax.tree_util.tree_structure(first) != structure:
            got = jax.tree_util.tree_structure(first)
            row.update(status=MISMATCH, error=f"output structure {got} != {structure}")
            return row
        verdicts = [_compare(np, host, expected_host, atol, rtol) for host in hosts]
        worst = max(verdicts, key=lambda v: (v["worst_ratio"], v["max_abs_err"]))
        row.update(
            max_abs_err=worst["max_abs_err"],
            worst_ratio=worst["worst_ratio"],
            passed=all(v["passed"] for v in verdicts),
            wrong_runs=sum(not v["passed"] for v in verdicts),
            runs=len(hosts),
            distinct_results=_distinct(np, hosts),
        )
        row["nondeterministic"] = row["distinct_results"] > 1
        if worst.get("problem"):
            row["error"] = worst["problem"]
        row["status"] = OK if row["passed"] else MISMATCH
        row.update(self.time_reference(spec, device_inputs, expected_host))
        return row

    def time_reference(self, spec, device_inputs, expected_host) -> dict[str, Any]:
        """The reference compiled by XLA for the device: its time, and how far its values are
        from the CPU's (XLA on a GPU may use TF32 for float32 products)."""
        jax, np = self.jax, self.np
        try:
            from nearmiss.engine.runner.timing import warm_median_s

            compiled = jax.jit(spec.reference).lower(*device_inputs).compile()
            runs = max(1, int(self.settings["timing_runs"]))
            median_s = warm_median_s(lambda: compiled(*device_inputs), runs)
            out = jax.block_until_ready(compiled(*device_inputs))
            host = [np.asarray(x) for x in jax.tree_util.tree_leaves(out)]
            drift = _compare(np, host, expected_host, 0.0, 0.0)["max_abs_err"]
            return {"reference_ms": 1e3 * median_s, "reference_device_err": drift}
        except Exception as exc:
            return {"reference_ms": None, "reference_error": error_text(exc)}

    def predict(self, op, case, kernel, inputs, stress) -> dict[str, Any]:
        """The engine's static GPU verdict on this case's shapes: ``grid_findings(exported for
        TPU, "gpu")``. Falls back to ``--predictions`` (written here by ``--predict-only``)."""
        live = predict_race(self.jax, kernel, inputs)
        if live.get("race_predicted") is not None or stress:
            return live
        stored = self.predictions.get("ops", {}).get(op, {}).get(case.name)
        if stored and stored.get("race_predicted") is not None:
            live_error = live.get("race_error")
            return {**stored, "race_source": "predictions file", "live_error": live_error}
        return live


def predict_race(jax, kernel, inputs) -> dict[str, Any]:
    from nearmiss.engine.integrity.grid import grid_findings
    from nearmiss.engine.targets.tpu import export_for_tpu

    result: dict[str, Any] = {"race_predicted": None, "race_source": "live"}
    try:
        avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
        exported = jax.export.deserialize(export_for_tpu(jax.jit(kernel), avals, TPU_TARGET))
        report = grid_findings(exported, "gpu")
    except Exception as exc:
        result["race_error"] = f"export for {TPU_TARGET}: " + error_text(exc)
        return result
    races = [f for f in report.findings if f.kind in ("grid_race", "aliased_read_race")]
    if races:
        result.update(
            race_predicted=True,
            race_axes=sorted({a for f in races for a in f.axes}),
            race_detail=short(races[0].detail),
        )
    elif report.undetermined:
        result["race_error"] = "undetermined: " + short(report.undetermined[0]["reason"])
    else:
        result["race_predicted"] = False
    return result


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


def _mosaic_gpu_flag():
    try:
        from jax._src import config

        return getattr(config, "jax_pallas_use_mosaic_gpu", None)
    except Exception:
        return None


class _backend:
    """Lower with one Pallas GPU backend: ``triton`` or ``mosaic`` (JAX's flag, which applies to
    pallas_calls without backend-specific compiler params); ``interpret``: as the runner set it."""

    def __init__(self, name: str) -> None:
        self.name, self.context = name, None

    def __enter__(self):
        state = _mosaic_gpu_flag()
        if self.name in ("triton", "mosaic") and state is not None:
            self.context = state(self.name == "mosaic")
            self.context.__enter__()
        return self

    def __exit__(self, *exc):
        if self.context is not None:
            return self.context.__exit__(*exc)
        return False


def _load_kernel(unit: str):
    import importlib.util

    path = unit_paths(unit)[1]
    name = "gpu_check_kernel_" + unit.replace(":", "__")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel


def _row(op: str, case, status: str | None = None, stress: bool = False) -> dict[str, Any]:
    row = {
        "kernel": op,
        "case": case.name,
        "dtype": case.dtype,
        "dims": dict(case.dims),
        "stress": stress,
    }
    if status:
        row["status"] = status
    return row


def _compare(np, outs, refs, atol, rtol) -> dict[str, Any]:
    """The engine's rule, per leaf: |out - ref| <= atol + rtol*|ref| where the reference is
    finite, the same NaN/Inf where it is not; shapes and dtypes equal."""
    worst, max_err, problem = 0.0, 0.0, None
    if len(outs) != len(refs):
        return {
            "passed": False,
            "max_abs_err": math.inf,
            "worst_ratio": math.inf,
            "problem": f"{len(outs)} outputs, reference has {len(refs)}",
        }
    for out, ref in zip(outs, refs, strict=True):
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return {
                "passed": False,
                "max_abs_err": math.inf,
                "worst_ratio": math.inf,
                "problem": f"output {out.dtype}{list(out.shape)} != reference "
                f"{ref.dtype}{list(ref.shape)}",
            }
        o, r = out.astype(np.float64), ref.astype(np.float64)
        finite = np.isfinite(r)
        same_special = np.array_equal(o[~finite], r[~finite], equal_nan=True)
        if not same_special:
            problem, worst = "NaN/Inf differ from the reference's", math.inf
        if not finite.any():
            continue
        diff = np.abs(o[finite] - r[finite])
        if not np.all(np.isfinite(diff)):
            problem = problem or "NaN/Inf where the reference is finite"
            max_err, worst = math.inf, math.inf
            continue
        bound = atol + rtol * np.abs(r[finite])
        max_err = max(max_err, float(diff.max(initial=0.0)))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(diff == 0, 0.0, diff / bound)
        worst = max(worst, float(np.nan_to_num(ratio, nan=math.inf).max(initial=0.0)))
    return {
        "passed": worst <= 1.0,
        "max_abs_err": max_err,
        "worst_ratio": worst,
        "problem": problem,
    }


def _distinct(np, runs: list[list[Any]]) -> int:
    """How many bitwise-different results the runs gave."""
    seen: list[list[Any]] = []
    for run in runs:
        if not any(
            all(np.array_equal(a, b, equal_nan=True) for a, b in zip(run, other, strict=True))
            for other in seen
        ):
            seen.append(run)
    return len(seen)


def worker_main(conn, settings: dict[str, Any]) -> None:
    """A worker process: start JAX, report the environment, then run kernels on request."""
    try:
        prepare_jax_environment(settings["dry_run"])
        runner = Runner(settings)
        info = runner.environment()
    except BaseException:
        conn.send(("fatal", traceback.format_exc(limit=6)))
        return
    conn.send(("ready", info))
    if not info["ok"]:
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        op, soft_s = message

        def announce(names, op=op):
            conn.send(("cases", op, names))

        try:
            for row in runner.run_op(op, soft_s, announce):
                conn.send(("row", row))
        except Exception as exc:  # a bug of this script: its own row, the run goes on
            conn.send(
                (
                    "row",
                    {"kernel": op, "case": "(harness)", "status": ERROR, "error": error_text(exc)},
                )
            )
        ok = runner.healthy()
        conn.send(("done", op, ok))
        if not ok:
            return


# ------------------------------------------------------------------------------------------------
# Driver side: no JAX; budgets, workers, the report


class Worker:
    def __init__(self, settings: dict[str, Any]) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited CUDA
        self.conn, child = context.Pipe()
        self.process = context.Process(target=worker_main, args=(child, settings), daemon=True)
        self.process.start()
        child.close()

    def receive(self, until: float):
        """The next message, or None when ``until`` passed or the worker is gone."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                if self.conn.poll(min(left, 0.5)):
                    return self.conn.recv()
            except (EOFError, OSError):
                return None
            if not self.process.is_alive() and not self.conn.poll(0):
                return None

    def stop(self, kill: bool = False) -> None:
        if not kill:
            with contextlib.suppress(OSError, ValueError):
                self.conn.send(None)
            self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()


class Report:
    def __init__(self, args, ops: list[str]) -> None:
        self.args = args
        self.started = time.monotonic()
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "mode": "cpu-dry-run" if args.cpu_dry_run else "gpu",
            "ops": ops,
            "settings": {k: getattr(args, k) for k in (*DEFAULTS, "backends", "seed")},
            "environment": None,
            "rows": [],
            "workers_started": 0,
            "complete": False,
        }
        out = os.environ.get("OUT")
        default_json = Path(out) / "gpu_check.json" if out else None
        self.json_path = Path(args.json) if args.json else default_json
        self.text_path = Path(out) / "gpu_check.txt" if out else None

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.data["rows"]

    def save(self) -> None:
        self.data["elapsed_s"] = round(time.monotonic() - self.started, 1)
        self.data["summary"] = summarize(self.rows)
        if self.json_path:
            self.json_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.json_path.with_name(self.json_path.name + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            tmp.replace(self.json_path)


def _finite(value: Any) -> Any:
    """JSON has no Infinity: an infinite error is written as the string "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def drive(args) -> int:
    ops = discover(args.ops, args.variants)
    predictions = None
    if args.predictions:
        predictions = json.loads(Path(args.predictions).read_text())
    ops = racy_first(ops, predictions)
    report = Report(args, ops)
    deadline = report.started + args.budget_s
    settings = {
        "dry_run": args.cpu_dry_run,
        "backends": args.backends,
        "timing_runs": args.timing_runs,
        "race_runs": args.race_runs,
        "stress_scale": args.stress_scale,
        "seed": args.seed,
        "predictions": predictions,
    }
    worker: Worker | None = None
    environment_failed = interrupted = False
    current = None
    try:
        for index, op in enumerate(ops):
            left = deadline - time.monotonic()
            if environment_failed or left < MIN_OP_S:
                status = "skipped: no GPU" if environment_failed else SKIPPED_BUDGET
                report.rows.append({"kernel": op, "case": "(all)", "status": status})
                continue
            if worker is None:
                worker, environment_failed = start_worker(report, settings, args, deadline)
                if worker is None:
                    status = "skipped: no GPU" if environment_failed else SKIPPED_BUDGET
                    report.rows.append({"kernel": op, "case": "(all)", "status": status})
                    continue
            current = op
            soft = min(args.per_op_s, deadline - time.monotonic())
            t0 = time.monotonic()
            alive = run_one(worker, op, soft, report)
            current = None
            _progress(f"[{index + 1}/{len(ops)}] {op}: {time.monotonic() - t0:.1f}s")
            if not alive:
                worker.stop()
                worker = None
            report.save()
    except (SystemExit, KeyboardInterrupt):  # the wrapper's timeout (SIGTERM) or ^C
        interrupted = True
    finally:
        if worker is not None:
            worker.stop(kill=interrupted)
    if interrupted:
        reached = {row["kernel"] for row in report.rows}
        if current is not None:
            report.rows.append({"kernel": current, "case": "(rest)", "status": "interrupted"})
        for op in ops:
            if op not in reached and op != current:
                report.rows.append(
                    {"kernel": op, "case": "(all)", "status": "skipped: interrupted"}
                )
    report.data["complete"] = not interrupted
    report.save()
    text = render(report.data)
    print(text, flush=True)
    if report.text_path:
        report.text_path.write_text(text + "\n")
    if interrupted:
        return 143
    return 2 if environment_failed else 0


def start_worker(report: Report, settings, args, deadline) -> tuple[Worker | None, bool]:
    """A started worker, or (None, environment unusable?)."""
    t0 = time.monotonic()
    worker = Worker(settings)
    report.data["workers_started"] += 1
    message = worker.receive(min(deadline, t0 + args.startup_s))
    if message is not None and message[0] == "ready":
        info = message[1]
        info["startup_s"] = round(time.monotonic() - t0, 1)
        if report.data["environment"] is None:
            report.data["environment"] = info
            _progress(f"environment: {json.dumps(info)}")
        if info["ok"]:
            return worker, False
        worker.stop()
        return None, True
    worker.stop()
    problem = message[1] if message else f"no worker ready within {time.monotonic() - t0:.0f}s"
    report.data.setdefault("worker_problems", []).append(problem[-4000:])
    _progress(f"worker failed to start: {problem}")
    # A worker that cannot start at all (no JAX) is the environment's fault; one cut by the
    # budget is the budget's.
    return None, message is not None


def run_one(worker: Worker, op: str, soft_s: float, report: Report) -> bool:
    """Run one kernel's cases in ``worker``; False when the worker must be replaced."""
    worker.conn.send((op, soft_s))
    limit = soft_s + GRACE_S
    until = time.monotonic() + limit
    names: list[str] | None = None
    done: set[str] = set()
    while True:
        message = worker.receive(until)
        if message is None:
            alive = worker.process.is_alive()
            status = TIMEOUT if alive else WORKER_DIED
            detail = (
                f"no result within {limit:.0f}s: worker killed"
                if alive
                else f"worker exited (code {worker.process.exitcode})"
            )
            pending = [n for n in (names or ["(all)"]) if n not in done]
            for number, name in enumerate(pending):
                row = {"kernel": op, "case": name, "status": SKIPPED_AFTER}
                if number == 0:
                    row.update(status=status, error=detail)
                report.rows.append(row)
            worker.stop(kill=True)
            return False
        kind = message[0]
        if kind == "cases":
            names = list(message[2])
        elif kind == "row":
            row = {key: _finite(value) for key, value in message[1].items()}
            report.rows.append(row)
            done.add(row["case"])
            report.save()  # a run cut short keeps every row it finished
        elif kind == "done":
            return bool(message[2])


def _progress(text: str) -> None:
    print(f"gpu_check: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# The report


def _lowered(row) -> bool:
    return bool(row.get("lowered"))


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row.get("status", "?")] = statuses.get(row.get("status", "?"), 0) + 1
    ran = [r for r in rows if _lowered(r) and r.get("runs")]
    backends: dict[str, int] = {}
    for row in rows:
        if _lowered(row):
            backends[row["lowered"]] = backends.get(row["lowered"], 0) + 1

    def group(predicted):
        members = [r for r in ran if r.get("race_predicted") is predicted]
        return {
            "cases": len(members),
            "nondeterministic": sum(bool(r.get("nondeterministic")) for r in members),
            "wrong": sum(not r.get("passed") for r in members),
            "kernels": sorted({r["kernel"] for r in members}),
        }

    return {
        "agreement": agreement(rows),
        "rows": len(rows),
        "kernels": len({r["kernel"] for r in rows}),
        "statuses": statuses,
        "lowered_cases": sum(_lowered(r) for r in rows),
        "not_lowered_cases": statuses.get(NOT_LOWERED, 0),
        "passed_cases": statuses.get(OK, 0),
        "by_backend": backends,
        "race": {
            "predicted": group(True),
            "not_predicted": group(False),
            "undetermined": group(None),
        },
    }


# The engine's CPU verdict (``--predict-only``: ``check(..., targets=("gpu",))`` here) against
# what the device did with the case: right (lowered, every run within tolerance) or not.
AGREE, CERTIFIED_WRONG, REFUSED_RIGHT = "agree", "certified-but-wrong", "refused-but-right"


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case with an engine verdict and a device result: agree / certified-but-wrong /
    refused-but-right, counted, with the kernels of each disagreement."""
    counts: dict[str, Any] = {AGREE: 0, CERTIFIED_WRONG: [], REFUSED_RIGHT: []}
    for row in rows:
        verdict, status = row.get("engine_verdict"), row.get("status")
        if (
            not verdict
            or row.get("stress")
            or status not in (OK, MISMATCH, NOT_LOWERED, RUNTIME_ERROR)
        ):
            continue
        right = status == OK and bool(row.get("passed"))
        certified = verdict == "certified"
        if certified == right:
            counts[AGREE] += 1
        else:
            counts[CERTIFIED_WRONG if certified else REFUSED_RIGHT].append(
                f"{row['kernel']}/{row['case']}"
            )
    return {
        AGREE: counts[AGREE],
        CERTIFIED_WRONG: len(counts[CERTIFIED_WRONG]),
        REFUSED_RIGHT: len(counts[REFUSED_RIGHT]),
        "cases": {k: counts[k] for k in (CERTIFIED_WRONG, REFUSED_RIGHT)},
    }


def _fmt(value, spec: str, empty: str = "-") -> str:
    if value is None:
        return empty
    if isinstance(value, str):
        return value
    return format(value, spec)


def _cells(row: dict[str, Any], notes: dict[str, int]) -> list[str]:
    status = row.get("status", "?")
    note = ""
    if row.get("error"):
        number = notes.setdefault(row["error"], len(notes) + 1)
        note = f"[{number}]"
    lowered = row.get("lowered") or ("no" if status == NOT_LOWERED else "-")
    tol = f"{row['atol']:.0e}/{row['rtol']:.0e}" if "atol" in row else "-"
    runs = row.get("runs")
    ok = "-"
    if runs:
        ok = "yes" if row.get("passed") else f"NO {row.get('wrong_runs')}/{runs}"
    race = {True: "yes", False: "no", None: "?"}[row.get("race_predicted")]
    if row.get("race_predicted") and row.get("race_axes"):
        race += "@" + ",".join(map(str, row["race_axes"]))
    if row.get("race_source") == "predictions file":
        race += "*"
    if "race_predicted" not in row:
        race = "-"
    nondet = "-"
    if runs:
        distinct = row.get("distinct_results", 1)
        nondet = f"{'YES' if distinct > 1 else 'no'} {distinct}/{runs}"
    case = row["case"] + ("*" if row.get("stress") else "")
    return [
        row["kernel"],
        case,
        lowered,
        _fmt(row.get("max_abs_err"), ".1e"),
        tol,
        ok,
        race,
        nondet,
        _fmt(row.get("kernel_ms"), ".3f"),
        _fmt(row.get("reference_ms"), ".3f"),
        ("" if status == OK else status) + note,
    ]


def _collapse(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For the printed table: a kernel whose cases all end the same way without running (not
    lowered with one error, skipped) is one row."""
    out: list[dict[str, Any]] = []
    by_kernel: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kernel.setdefault(row["kernel"], []).append(row)
    for group in by_kernel.values():
        first = group[0]
        same = all(
            r.get("status") == first.get("status") and r.get("error") == first.get("error")
            for r in group
        )
        idle = not any(r.get("runs") for r in group)
        if len(group) > 1 and same and idle:
            merged = {k: first[k] for k in ("kernel", "status", "error", "lowered") if k in first}
            merged["case"] = f"({len(group)} cases)"
            if all("race_predicted" in r for r in group):
                values = {r.get("race_predicted") for r in group}
                merged["race_predicted"] = values.pop() if len(values) == 1 else None
            out.append(merged)
        else:
            out.extend(group)
    return out


HEADER = [
    "kernel",
    "case",
    "lowered",
    "max_err",
    "atol/rtol",
    "ok",
    "race?",
    "nondet",
    "kern_ms",
    "ref_ms",
    "status",
]


def render(data: dict[str, Any]) -> str:
    notes: dict[str, int] = {}
    table = [HEADER] + [_cells(row, notes) for row in _collapse(data["rows"])]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = []
    env = data.get("environment") or {}
    where = "no worker started"
    if env:
        where = f"jax {env.get('jax')} jaxlib {env.get('jaxlib')} on "
        where += str(env.get("device_kind") or env.get("device"))
    lines.append(
        f"gpu_check ({data['mode']}): {where}; {data.get('elapsed_s')}s, {len(data['rows'])} rows"
    )
    for line in table:
        cells = (cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
    lines.append(
        "lowered: Pallas backend that compiled it; max_err/ok: worst over all runs vs the CPU "
        "reference (|d| <= atol + rtol*|ref|); race?: grid_findings(exported for TPU, 'gpu') "
        "(@axes; * from --predictions); nondet: distinct results/runs; case*: stress case"
    )
    for text, number in notes.items():
        lines.append(f"[{number}] {text}")
    summary = data.get("summary") or summarize(data["rows"])
    race = summary["race"]
    lines.append(
        f"summary: {summary['kernels']} kernels, {summary['rows']} rows; lowered "
        f"{summary['lowered_cases']} cases {summary['by_backend']}, not lowered "
        f"{summary['not_lowered_cases']}, passed {summary['passed_cases']}; statuses "
        f"{summary['statuses']}"
    )
    agreed = summary.get("agreement") or {}
    if any(agreed.get(k) for k in (AGREE, CERTIFIED_WRONG, REFUSED_RIGHT)):
        lines.append(
            f"  engine's CPU gpu verdict vs the device: {agreed[AGREE]} agree, "
            f"{agreed[CERTIFIED_WRONG]} certified-but-wrong "
            f"{agreed['cases'][CERTIFIED_WRONG][:8]}, {agreed[REFUSED_RIGHT]} refused-but-right "
            f"{agreed['cases'][REFUSED_RIGHT][:8]}"
        )
    for label, key in (
        ("race predicted", "predicted"),
        ("no race predicted", "not_predicted"),
        ("race undetermined", "undetermined"),
    ):
        g = race[key]
        if g["cases"]:
            lines.append(
                f"  {label}: {g['cases']} cases run, {g['nondeterministic']} nondeterministic, "
                f"{g['wrong']} wrong vs reference ({', '.join(g['kernels'])})"
            )
    for problem in data.get("worker_problems", []):
        last = [line for line in problem.splitlines() if line.strip()][-1:] or [""]
        lines.append(f"worker problem: {short(last[0])}")
    if env and not env.get("ok", True):
        lines.append(f"environment: {env.get('problem')}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# --predict-only: the engine's verdicts, computed here (CPU, the project's own JAX)


def case_key(jax, seed: int, spec, case):
    suite = "compact" if case in spec.compact else "extended"
    tag = zlib.crc32(f"{suite}/{case.name}".encode()) & 0x7FFFFFFF
    return jax.random.fold_in(jax.random.PRNGKey(seed), tag)


def engine_verdicts(op: str, seed: int) -> dict[str, str]:
    """The engine's own verdict for the gpu target on this CPU host, per case of the spec's
    "all" suite: "certified", or "refused: <class>" where the gpu target names the case (or
    names none: a grid race is every case's)."""
    from nearmiss.engine.check import check

    spec_path, kernel_path = unit_paths(op)
    try:
        report = check(spec_path, kernel_path, "all", seed, targets=("gpu",))
    except Exception as exc:
        _progress(f"{op}: the engine's check failed: {error_text(exc)}")
        return {}
    gpu = report.targets.get("gpu")
    verdicts = {}
    for case in report.cases:
        if case.suite not in ("compact", "extended"):
            continue
        key = f"{case.suite}-{case.name}"
        said = (
            " ".join(
                [str(gpu.error or "")]
                + [str(f.get("case", "")) for f in gpu.findings]
                + list(gpu.undetermined)
            )
            if gpu
            else ""
        )
        named_any = "compact-" in said or "extended-" in said or "hidden-" in said
        refused = gpu is None or not gpu.ok and (key in said or not named_any)
        if not case.passed:
            verdicts[case.name] = f"refused: {case.failure_class}"
        elif refused:
            verdicts[case.name] = f"refused: {gpu.failure_class if gpu else 'no verdict'}"
        else:
            verdicts[case.name] = "certified"
    return verdicts


def predict_only(args) -> int:
    prepare_jax_environment(True)
    import jax

    from nearmiss.engine.spec import load_spec

    table: dict[str, dict[str, Any]] = {}
    for op in discover(args.ops, args.variants):
        table[op] = {}
        try:
            spec, kernel = load_spec(unit_paths(op)[0]), _load_kernel(op)
        except Exception as exc:
            table[op]["(all)"] = {"race_predicted": None, "race_error": error_text(exc)}
            continue
        for case in spec.suite("all"):
            key = case_key(jax, args.seed, spec, case)
            try:  # avals only: nothing is computed
                shapes = jax.eval_shape(functools.partial(spec.make_inputs, case), key)
            except Exception as exc:
                table[op][case.name] = {"race_predicted": None, "race_error": error_text(exc)}
                continue
            table[op][case.name] = predict_race(jax, kernel, tuple(shapes))
        for name, verdict in engine_verdicts(op, args.seed).items():
            entry = table[op].setdefault(name, {})
            if verdict == "certified" and entry.get("race_predicted"):
                # The engine shows a grid race once, under the first case that had it; this
                # case's own grid (the same reading of its artifact) races too.
                verdict = "refused: grid_race"
            entry["engine"] = verdict
        racy = [c for c, v in table[op].items() if v.get("race_predicted")]
        _progress(f"{op}: race predicted for {racy or 'no case'}")
    data = {"schema": SCHEMA, "jax": jax.__version__, "target": TPU_TARGET, "ops": table}
    path = Path(args.predict_only)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    print(f"gpu_check: predictions for {len(table)} kernels written to {path}")
    return 0


# ------------------------------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpu_check",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="the whole flow on the CPU in interpret mode, with small defaults",
    )
    parser.add_argument(
        "--ops",
        type=lambda s: [x for x in s.split(",") if x],
        help="comma list of operators (their goldens) and op:variant names (default: every "
        "golden, then the variants labelled for gpu)",
    )
    gpu_budget, dry_budget = DEFAULTS["budget_s"]
    parser.add_argument(
        "--budget-s",
        type=float,
        help="global time budget, start-up included "
        f"(default {gpu_budget:.0f}; dry run {dry_budget:.0f})",
    )
    parser.add_argument(
        "--per-op-s",
        type=float,
        help=f"soft limit per kernel; the worker is killed {GRACE_S:.0f}s beyond it",
    )
    parser.add_argument("--startup-s", type=float, help="limit for a worker to start JAX")
    parser.add_argument("--timing-runs", type=int, help="timed warm runs per case")
    parser.add_argument("--race-runs", type=int, help="runs at least, where a race is predicted")
    parser.add_argument(
        "--stress-scale",
        type=int,
        help="extra case with every dim scaled, for kernels with a predicted race (0: none)",
    )
    parser.add_argument(
        "--backends",
        type=lambda s: [x for x in s.split(",") if x],
        default=None,
        help="Pallas GPU backends to try in order (triton,mosaic)",
    )
    parser.add_argument(
        "--no-variants",
        dest="variants",
        action="store_false",
        help="goldens only (default: also the variants labelled for gpu)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--predictions",
        help="JSON from --predict-only: the engine's verdicts "
        "where the live one fails (another JAX on the device)",
    )
    parser.add_argument(
        "--predict-only",
        metavar="PATH",
        help="write the static race verdicts (CPU, no kernel run) and exit",
    )
    parser.add_argument("--json", help="write the JSON here (default: $OUT/gpu_check.json)")
    args = parser.parse_args(argv)
    mode = 1 if args.cpu_dry_run else 0
    for name, values in DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, values[mode])
    if args.cpu_dry_run:
        args.backends = ["interpret"]
    elif not args.backends:
        args.backends = ["triton", "mosaic"]
    bad = [b for b in args.backends if b not in ("triton", "mosaic", "interpret")]
    if bad:
        parser.error(f"unknown backend {bad[0]!r}: triton, mosaic")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    args = parse(argv)
    # A timeout's SIGTERM unwinds through drive()'s finally, which stops the worker.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.predict_only:
        return predict_only(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
