"""``nearmiss demo``: check every bundled golden kernel and near-miss variant, print a table."""

from __future__ import annotations

from nearmiss.check import check
from nearmiss.render import table
from pallas_ops.catalog import operators

DIAGNOSIS_CHARS = 400  # the full text is in `nearmiss check`; the demo shows the gist


def run_demo(seed: int = 0) -> int:
    """0 when every verdict matches its label: goldens certify, variants fail as labelled."""
    rows, diagnoses, misses = [], [], 0
    for op in operators():
        kernels = [(op.golden, None)] + [(v.path, v.failure_class) for v in op.variants]
        for path, expected in kernels:
            report = check(op.spec, path, "all", seed)
            got = report.failure_class
            ok = report.certified if expected is None else got == expected
            misses += not ok
            rows.append(
                [
                    op.name,
                    path.name,
                    expected or "certified",
                    "certified" if report.certified else str(got),
                    "yes" if ok else "NO",
                    f"{report.wall_s:.1f}",
                ]
            )
            if not report.certified:
                text = report.diagnosis
                text = text if len(text) <= DIAGNOSIS_CHARS else text[:DIAGNOSIS_CHARS] + " …"
                diagnoses.append(f"{op.name}/{path.name}: {text}")
            print(f"  checked {op.name}/{path.name}", flush=True)
    print()
    print(table(["operator", "kernel", "expected", "verdict", "match", "seconds"], rows))
    print()
    print("\n\n".join(diagnoses))
    print(f"\n{len(rows) - misses}/{len(rows)} verdicts match their labels.")
    return 0 if misses == 0 else 1
