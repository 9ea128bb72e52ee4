"""Is `check` slower than it was at another revision? Side by side, in one run.

Checks a few bundled kernels with this tree and with a baseline revision (a temporary git
worktree, same virtual environment), alternating the two so that both see the same machine
load, and prints each kernel's median wall time and the ratio. This tree is measured twice:
with the spec's compilation cache cold (a fresh ``NEARMISS_CACHE_DIR`` per check: a first
check) and warm (the cache filled by an earlier check of the same spec: every later one).

    .venv/bin/python benchmarks/check_vs_revision.py --baseline 8390593 [--repeat 5] [--target T]

``--target`` (e.g. ``interpret,tpu-v5e``) checks every kernel for those targets on both sides:
what a change to a target's judging costs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from throwaway import CLI, ROOT, baseline_worktree

KERNELS = [
    ("softmax_rows", "golden.py"),
    ("softmax_rows", "variants/floor_grid.py"),
    ("matmul", "golden.py"),
    ("matmul", "variants/missing_init.py"),
]


def timed_check(
    tree: Path, op: str, kernel: str, env: dict[str, str], extra: tuple[str, ...] = ()
) -> float:
    """Wall seconds of one `nearmiss check` of the kernel, run from ``tree``'s sources."""
    spec, candidate = ROOT / "pallas_ops" / op / "spec.py", ROOT / "pallas_ops" / op / kernel
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", CLI, "check", str(spec), str(candidate), *extra],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        check=False,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--target", help="targets to check for, on both sides")
    args = parser.parse_args()
    extra = ("--target", args.target) if args.target else ()
    # Only the CPU backend for both trees: an older tree does not ask for it itself.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    with (
        tempfile.TemporaryDirectory(prefix="nearmiss-bench-") as scratch,
        baseline_worktree(args.baseline, Path(scratch) / "baseline") as baseline,
    ):
        warm_cache = Path(scratch) / "warm-cache"
        rows = []
        for op, kernel in KERNELS:
            timed_check(ROOT, op, kernel, {**env, "NEARMISS_CACHE_DIR": str(warm_cache)}, extra)
            old, cold, warm = [], [], []
            for attempt in range(args.repeat):
                fresh = Path(scratch) / f"cold-{op}-{attempt}"
                old.append(timed_check(baseline, op, kernel, env, extra))
                cold.append(
                    timed_check(ROOT, op, kernel, {**env, "NEARMISS_CACHE_DIR": str(fresh)}, extra)
                )
                warm.append(
                    timed_check(
                        ROOT, op, kernel, {**env, "NEARMISS_CACHE_DIR": str(warm_cache)}, extra
                    )
                )
            o, c, w = (statistics.median(x) for x in (old, cold, warm))
            rows.append((f"{op}/{kernel}", o, c, w))
            print(
                f"{op}/{kernel}: baseline {o:.2f} s, cold {c:.2f} s ({c / o:.2f}x), "
                f"warm {w:.2f} s ({w / o:.2f}x)",
                flush=True,
            )
        cold_ratio = statistics.median(c / o for _, o, c, _ in rows)
        warm_ratio = statistics.median(w / o for _, o, _, w in rows)
        print(
            f"\nmedian ratio to {args.baseline}: cold cache {cold_ratio:.2f}x, "
            f"warm cache {warm_ratio:.2f}x (median of {args.repeat}, alternated)"
        )


if __name__ == "__main__":
    main()
