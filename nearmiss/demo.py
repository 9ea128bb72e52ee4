"""``nearmiss demo``: check a sample of the bundled corpus — one operator per category with all
its near-miss variants, and a few cheats of the integrity corpus — and print a table.

``--all`` checks the whole corpus (every golden, variant and cheat; minutes, not seconds).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nearmiss.check import check
from nearmiss.render import table
from pallas_ops.catalog import integrity_cases, operators

DIAGNOSIS_CHARS = 400  # the full text is in `nearmiss check`; the demo shows the gist
SAMPLE_CHEATS = ("partial_softmax_divide", "ragged_fallback", "credential_reader")
# Each check runs in its own child processes; two at a time keep two cores busy.
PARALLEL_CHECKS = 2


def _jobs(everything: bool) -> list[tuple[str, Path, Path, str]]:
    """(operator, spec, kernel, expected) where expected is 'certified', a class or a rule."""
    jobs, seen = [], set()
    for op in operators():
        if not everything and op.category in seen:
            continue
        seen.add(op.category)
        jobs.append((op.name, op.spec, op.golden, "certified"))
        jobs += [(op.name, op.spec, v.path, v.failure_class) for v in op.variants]
    for case in integrity_cases():
        if everything or case.path.stem in SAMPLE_CHEATS:
            jobs.append((case.op, case.spec, case.path, case.rule or "certified"))
    return jobs


def _verdict(report, expected: str) -> tuple[str, bool]:
    rules = sorted({v.rule for v in report.integrity.violations})
    if report.certified:
        return "certified", expected == "certified"
    if rules:
        return f"integrity: {', '.join(rules)}", expected in rules
    return str(report.failure_class), report.failure_class == expected


def run_demo(seed: int = 0, everything: bool = False) -> int:
    """0 when every verdict matches its label: goldens certify, variants fail as labelled,
    cheats are rejected with their rule."""
    jobs = _jobs(everything)
    print(f"checking {len(jobs)} kernels ({PARALLEL_CHECKS} at a time)...", flush=True)

    def run(job):
        name, spec, kernel, _ = job
        report = check(spec, kernel, "all", seed)
        print(f"  checked {name}/{kernel.name}", flush=True)
        return report

    with ThreadPoolExecutor(PARALLEL_CHECKS) as pool:
        reports = list(pool.map(run, jobs))
    rows, diagnoses, misses = [], [], 0
    for (name, _, kernel, expected), report in zip(jobs, reports, strict=True):
        verdict, ok = _verdict(report, expected)
        misses += not ok
        label = kernel.name if kernel.parent.name != "cheats" else f"cheats/{kernel.name}"
        rows.append([name, label, expected, verdict, "yes" if ok else "NO", f"{report.wall_s:.1f}"])
        if not report.certified:
            text = report.diagnosis
            text = text if len(text) <= DIAGNOSIS_CHARS else text[:DIAGNOSIS_CHARS] + " …"
            diagnoses.append(f"{name}/{label}: {text}")
    print()
    print(table(["operator", "kernel", "expected", "verdict", "match", "seconds"], rows))
    print()
    print("\n\n".join(diagnoses))
    print(f"\n{len(rows) - misses}/{len(rows)} verdicts match their labels.")
    return 0 if misses == 0 else 1
