"""Check operators of the corpus against their labels: ``python -m pallas_ops.verify [OP...]``.

For corpus authors: every golden must certify, and every variant must fail with its labelled
failure class, first on its labelled suite — on the target its label names (a variant labelled
for a TPU generation or the GPU is checked with ``targets=("interpret", target)``, and must be
right in interpret mode). Prints one line per kernel and exits 1 on any miss.
"""

from __future__ import annotations

import re
import sys

from nearmiss.engine.check import check
from pallas_ops.catalog import BUG_FAMILIES, FAILS_ON, operators

_CASE_KEY = re.compile(r"\((compact|extended)-[^)\s]*\)")


def first_failing_suite(report, target: str | None = None) -> str | None:
    """The first suite whose numbers fail; when they all pass and ``target`` refused the kernel,
    the suite of the first case the target's evidence names (findings carry their case). None
    when neither is known: ``target_fails_on`` then asks."""
    if report.compact_passed is False:
        return "compact"
    if report.extended_passed is False:
        return "extended"
    result = report.targets.get(target) if target else None
    if result is None or result.ok:
        return None
    if result.failure_class == "compile_error" and (match := _CASE_KEY.search(result.error or "")):
        return match.group(1)  # a refusal: the target judges the cases in order
    named = [f["case"].split("-", 1)[0] for f in result.findings if f.get("case")]
    if result.failure_class != "compile_error" and named:
        return "compact" if "compact" in named else "extended"
    return None


def target_fails_on(spec, path, target: str, report, seed: int = 0) -> str | None:
    """``first_failing_suite`` for a variant labelled for ``target``; where the report cannot
    tell (a grid finding names no case), a check of the compact suite alone decides."""
    suite = first_failing_suite(report, target)
    if suite is not None or report.targets.get(target) is None or report.targets[target].ok:
        return suite
    compact = check(spec, path, "compact", seed, targets=("interpret", target))
    return "extended" if compact.targets[target].ok else "compact"


def right_in_interpret(report) -> bool:
    """Whether a report's CPU interpret run certifies on its own: every case's numbers, the
    interpret target and the integrity gate (what a plain ``check`` would certify)."""
    interpret = report.targets.get("interpret")
    return (
        bool(report.cases)
        and all(c.passed for c in report.cases)
        and (interpret is None or interpret.ok)
        and report.integrity.ok
    )


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
            report = check(op.spec, v.path, seed=seed, targets=v.targets)
            if v.targets:
                right = right_in_interpret(report)
                got = (report.failure_class, target_fails_on(op.spec, v.path, v.target, report))
            else:
                right = True
                got = (report.failure_class, first_failing_suite(report))
            want = (v.failure_class, v.fails_on)
            label_ok = v.bug_family in BUG_FAMILIES and v.fails_on in FAILS_ON
            ok = got == want and label_ok and not report.certified and right
            misses += not ok
            note = "" if label_ok else "  <- unknown bug_family or fails_on"
            if not right:
                note += "  <- wrong in interpret mode too"
            if got != want:
                note += f"  <- {report.diagnosis[:200]}"
            where = f" [{v.target}]" if v.targets else ""
            print(
                f"{'ok  ' if ok else 'MISS'} {op.name}/{v.path.name}{where}  want={want} "
                f"got={got}{note}",
                flush=True,
            )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(verify(sys.argv[1:]))
