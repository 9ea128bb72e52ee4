"""How much does `check` cost on top of the work itself?

For a few bundled kernels, times a full sandboxed ``check`` (three bubblewrap children: the
spec's, the tracing candidate's and the artifact executor; JAX start-up,
file exchange, forensics) against the intrinsic cost: the same reference + compile + run of every
case in one warm in-process loop (JAX imported, caches cleared so compilation is counted).
Prints the ratio; no target is set yet. With ``--target tpu-v5e`` (any TPU target) it also
prints what that target adds to the same check, per kernel: the chip's lowering, libtpu's
compile-only compile and the run under TPU interpret mode, side by side with the plain check.
With ``--spares`` it times checks on a worker that keeps spare children (``runner.spares``)
against checks without: by default each check starts once the spares are warm (their processes
idle, waiting: JAX imported), and the time that took is printed — the gap a worker needs between
two checks (the fix step, the workflow's turn) for the spares to be of full use; ``--gap S``
waits S seconds instead.

    .venv/bin/python benchmarks/check_overhead.py [--repeat N] [--target tpu-v5e] [--spares]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

# ruff: noqa: E402  (JAX is imported after prepare_environment)
from nearmiss.engine.targets.libtpu_env import prepare_environment

prepare_environment()  # JAX on the CPU only, before it is imported (libtpu may be installed)

import jax

from nearmiss.engine.check import check
from nearmiss.engine.runner import spares
from nearmiss.engine.runner.case_draw import case_key
from nearmiss.engine.runner.interpret import force_interpret_on_cpu
from nearmiss.engine.runner.sandbox import Limits, _process_tree
from nearmiss.engine.spec import load_spec
from nearmiss.reports.text import table

OPS = Path(__file__).resolve().parent.parent / "pallas_ops"
KERNELS = [
    ("softmax_rows", OPS / "softmax_rows" / "golden.py"),
    ("softmax_rows", OPS / "softmax_rows" / "variants" / "floor_grid.py"),
    ("matmul", OPS / "matmul" / "golden.py"),
    ("matmul", OPS / "matmul" / "variants" / "missing_init.py"),
]


def intrinsic_seconds(spec_path: Path, candidate: Path, seed: int) -> float:
    """Reference, trace, compile and run of every case, in this (warm) process."""
    jax.clear_caches()
    started = time.perf_counter()
    spec = load_spec(spec_path)
    name = f"bench_{candidate.stem}_{time.perf_counter_ns()}"
    loader = importlib.util.spec_from_file_location(name, candidate)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    for suite in ("compact", "extended"):
        for case in spec.suite(suite):
            inputs = spec.make_inputs(case, case_key(jax, seed, suite, case.name))
            jax.block_until_ready(spec.reference(*inputs))
            try:
                compiled = jax.jit(module.kernel).trace(*inputs).lower().compile()
                jax.block_until_ready(compiled(*inputs))
            except Exception:
                pass  # a failing variant costs what it costs up to the failure
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--target", help="also time checks with this target added")
    parser.add_argument(
        "--spares",
        action="store_true",
        help="time checks with spare executors started between them vs without",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=None,
        help="seconds between checks with --spares (a worker's fix step and workflow turn); "
        "default: until the spares are warm",
    )
    args = parser.parse_args()
    force_interpret_on_cpu()
    if args.target:
        target_cost(args.target, args.repeat)
        return
    if args.spares:
        spare_gain(args.repeat, args.gap)
        return
    rows, ratios = [], []
    for op, candidate in KERNELS:
        spec = OPS / op / "spec.py"
        intrinsic_seconds(spec, candidate, 0)  # warm-up: imports, backend initialisation
        sandboxed = [check(spec, candidate, "all", seed).wall_s for seed in range(args.repeat)]
        inproc = [intrinsic_seconds(spec, candidate, seed) for seed in range(args.repeat)]
        s, i = statistics.median(sandboxed), statistics.median(inproc)
        ratios.append(s / i)
        rows.append(
            [f"{op}/{candidate.name}", f"{s:.2f}", f"{i:.2f}", f"{s / i:.1f}x", f"{s - i:.2f}"]
        )
    print(table(["kernel", "check s", "intrinsic s", "ratio", "overhead s"], rows))
    print(
        f"\nmedian ratio check/intrinsic: {statistics.median(ratios):.1f}x "
        f"(jax {jax.__version__}, {jax.default_backend()}, median of {args.repeat})"
    )


def target_cost(target: str, repeat: int) -> None:
    """The same checks with and without ``target``, alternated so both see the same load."""
    rows, ratios = [], []
    for op, candidate in KERNELS:
        spec = OPS / op / "spec.py"
        check(spec, candidate, "all", 0)  # warm-up: the spec's compilation cache
        plain, targeted = [], []
        for seed in range(repeat):
            plain.append(check(spec, candidate, "all", seed).wall_s)
            report = check(spec, candidate, "all", seed, targets=("interpret", target))
            targeted.append(report.wall_s)
        p, t = statistics.median(plain), statistics.median(targeted)
        ratios.append(t / p)
        verdict = "ok" if report.targets[target].ok else report.targets[target].failure_class
        rows.append([f"{op}/{candidate.name}", f"{p:.2f}", f"{t:.2f}", f"{t / p:.2f}x", verdict])
    print(table(["kernel", "check s", f"+{target} s", "ratio", target], rows))
    print(f"\nmedian ratio with {target}: {statistics.median(ratios):.2f}x (median of {repeat})")


def _cpu_ticks(pids: list[int]) -> int:
    """User and system clock ticks used so far by these processes and their descendants."""
    total = 0
    for pid in {p for root in pids for p in _process_tree(root)}:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def wait_until_warm(timeout_s: float = 60.0) -> float:
    """Seconds until the waiting spares use no CPU for a while: started, JAX imported, blocked
    on their first message."""
    started = time.perf_counter()
    pids = spares.waiting_pids()
    last = _cpu_ticks(pids)
    while time.perf_counter() - started < timeout_s:
        time.sleep(0.3)
        now = _cpu_ticks(pids)
        if now == last:
            break
        last = now
    return time.perf_counter() - started


def spare_gain(repeat: int, gap_s: float | None) -> None:
    """Checks on a worker that keeps spare children (``runner.spares``) vs one that does not,
    alternated so both see the same load, each after ``gap_s`` of idle time (a worker between
    two checks of a repair: the fix step and the workflow's turn) or, without it, once the
    spares are warm, against the intrinsic cost."""
    rows, ratios, overheads, warmups = [], [], [], []
    for op, candidate in KERNELS:
        spec = OPS / op / "spec.py"
        check(spec, candidate, "all", 0)  # warm-up: the spec's compilation cache
        intrinsic = statistics.median(intrinsic_seconds(spec, candidate, s) for s in range(repeat))
        cold, warm = [], []
        for seed in range(repeat):
            spares.disable()
            time.sleep(gap_s or 1.0)
            cold.append(check(spec, candidate, "all", seed).wall_s)
            spares.enable()
            spares.refill(Limits(), "cpu")  # as the worker's previous check would have
            if gap_s is None:
                warmups.append(wait_until_warm())
            else:
                time.sleep(gap_s)
            warm.append(check(spec, candidate, "all", seed).wall_s)
        spares.disable()
        c, w = statistics.median(cold), statistics.median(warm)
        ratios.append(w / c)
        overheads.append(w / intrinsic)
        rows.append(
            [
                f"{op}/{candidate.name}",
                f"{c:.2f}",
                f"{w:.2f}",
                f"{w / c:.2f}x",
                f"{intrinsic:.2f}",
                f"{c / intrinsic:.1f}x",
                f"{w / intrinsic:.1f}x",
            ]
        )
    headers = ["kernel", "check s", "with spares s", "ratio", "intrinsic s", "over", "over+spares"]
    print(table(headers, rows))
    gap = f"{gap_s:.1f} s" if gap_s is not None else "until warm"
    print(
        f"\nmedian ratio with/without spares: {statistics.median(ratios):.2f}x; "
        f"check/intrinsic with spares: {statistics.median(overheads):.2f}x "
        f"(gap {gap}, median of {repeat})"
    )
    if warmups:
        print(
            f"spares warm {statistics.median(warmups):.1f} s after the check that started them "
            f"(median; longest {max(warmups):.1f} s): the gap a worker needs between checks"
        )


if __name__ == "__main__":
    main()
