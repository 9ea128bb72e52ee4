"""Check operators of the corpus against their labels: ``python -m pallas_ops.verify [OP...]``.

For corpus authors: every golden must certify, and every variant must fail with its labelled
failure class, first on its labelled suite. Prints one line per kernel and exits 1 on any miss.
"""

from __future__ import annotations

import sys

from nearmiss.check import check
from pallas_ops.catalog import BUG_FAMILIES, FAILS_ON, operators


def first_failing_suite(report) -> str | None:
    if report.compact_passed is False:
        return "compact"
    if report.extended_passed is False:
        return "extended"
    return None


def verify(names: list[str], seed: int = 0) -> int:
    misses = 0
    chosen = [op for op in operators() if not names or op.name in names]
    unknown = set(names) - {op.name for op in chosen}
    if unknown:
        print(f"unknown operators: {', '.join(sorted(unknown))}")
        return 2
    for op in chosen:
        report = check(op.spec, op.golden, seed=seed)
        ok = report.certified
        misses += not ok
        detail = "" if ok else f"  <- {report.failure_class}: {report.diagnosis[:200]}"
        print(f"{'ok  ' if ok else 'MISS'} {op.name}/golden  certified={ok}{detail}", flush=True)
        for v in op.variants:
            report = check(op.spec, v.path, seed=seed)
            got = (report.failure_class, first_failing_suite(report))
            want = (v.failure_class, v.fails_on)
            label_ok = v.bug_family in BUG_FAMILIES and v.fails_on in FAILS_ON
            ok = got == want and label_ok and not report.certified
            misses += not ok
            note = "" if label_ok else "  <- unknown bug_family or fails_on"
            if got != want:
                note += f"  <- {report.diagnosis[:200]}"
            print(
                f"{'ok  ' if ok else 'MISS'} {op.name}/{v.path.name}  want={want} got={got}{note}",
                flush=True,
            )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(verify(sys.argv[1:]))
