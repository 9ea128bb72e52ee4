"""What does the integrity gate add to a `check` run?

Runs ``check`` on the same kernels with the gate off and enforced, interleaved so load drifts hit
both alike, and prints the median wall time of each and their ratio. The gate's work: static
rules on the source, the jaxpr audit of every case, the reference's own work count, an input
check after each call, and one probe per input on the first case (a reference call in the spec's
child, a kernel call in the candidate's).

    .venv/bin/python benchmarks/integrity_gate.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from nearmiss.engine.check import check
from nearmiss.reports.text import table

OPS = Path(__file__).resolve().parent.parent / "pallas_ops"
KERNELS = [
    ("softmax_rows", OPS / "softmax_rows" / "golden.py"),
    ("matmul", OPS / "matmul" / "golden.py"),
    ("softmax_rows", OPS / "integrity" / "honest" / "padded_softmax.py"),
    ("matmul", OPS / "integrity" / "cheats" / "partial_matmul_epilogue.py"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows, ratios = [], []
    for op, kernel in KERNELS:
        times: dict[str, list[float]] = {"off": [], "enforce": []}
        for seed in range(args.repeat):
            for mode in ("off", "enforce"):
                report = check(OPS / op / "spec.py", kernel, seed=seed, integrity=mode)
                times[mode].append(report.wall_s)
        off, on = statistics.median(times["off"]), statistics.median(times["enforce"])
        ratios.append(on / off)
        rows.append(
            [
                str(kernel.relative_to(OPS)),
                f"{off:.2f}",
                f"{on:.2f}",
                f"{on - off:+.2f}",
                f"{on / off:.2f}x",
            ]
        )
    print(table(["kernel", "gate off s", "gate on s", "added s", "ratio"], rows))
    print(f"\nmedian ratio gate on / gate off: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
