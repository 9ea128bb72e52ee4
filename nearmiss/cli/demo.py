"""``nearmiss demo``: the engine on bundled data, in two parts.

1. ``check`` on a sample of the corpus — one operator per category with all its near-miss
   variants, and a few cheats of the integrity corpus: every verdict must match its label
   (``--all``: every golden, variant and cheat).
2. A fleet repair of the whole near-miss corpus with the zero-token playbook: durable Temporal
   sessions with every step recorded in PostgreSQL (the embedded dev stack, started for the
   demo and stopped after), a summary table, and the fleet's HTML report.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nearmiss.engine.check import check
from nearmiss.reports.text import table
from pallas_ops.catalog import CORPUS_ROOT, integrity_cases, operators

DIAGNOSIS_CHARS = 400  # the full text is in `nearmiss check`; the demo shows the gist
SAMPLE_CHEATS = ("partial_softmax_divide", "ragged_fallback", "credential_reader")
# Known playbook outcomes the demo verifies in the fleet: certified, or a plain "no recipe
# applies" (the playbook does not guess a constant it has no rule for).
SAMPLE_REPAIRS = {
    "matmul/missing_init": "certified",
    "softmax_rows/floor_grid": "certified",
    "flash_attention/bf16_accumulator": "certified",
    "layer_norm/f32_output": "certified",
    "gelu_tanh/wrong_constant": "no_fix",
}
# Each check runs in its own child processes; two at a time keep two cores busy.
PARALLEL_CHECKS = 2
FLEET_CONCURRENCY = 4


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
    """0 when every verdict matches its label and every sample repair stops as expected."""
    misses = run_checks(seed, everything)
    misses += asyncio.run(run_repairs())
    return 0 if misses == 0 else 1


def run_checks(seed: int, everything: bool) -> int:
    """Goldens certify, variants fail as labelled, cheats are rejected with their rule."""
    jobs = _jobs(everything)
    # A variant labelled for a target (a TPU generation, the GPU) is checked on it too: right in
    # interpret mode, its label holds there.
    targets = {v.path: v.targets for op in operators() for v in op.variants}
    print(f"checking {len(jobs)} kernels ({PARALLEL_CHECKS} at a time)...", flush=True)

    def run(job):
        name, spec, kernel, _ = job
        report = check(spec, kernel, "all", seed, targets=targets.get(kernel))
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
    return misses


def fleet_members() -> list:
    """The demo fleet's members: the corpus's near-misses, in discovery order. A fleet repairs
    for fleet-wide targets: variants labelled for a TPU generation or the GPU (right in
    interpret mode) are left out of this interpret-target fleet."""
    from nearmiss.client.fleet import discover

    elsewhere = {v.path for op in operators() for v in op.variants if v.targets}
    return [m for m in discover(CORPUS_ROOT) if m.candidate not in elsewhere]


async def run_repairs() -> int:
    """A playbook fleet over the whole near-miss corpus; returns how many of the known cases
    (SAMPLE_REPAIRS) stopped other than expected."""
    from nearmiss.client.fleet import fleet_summary, follow, start_fleet, verdict_counts
    from nearmiss.client.fleet import results_table as fleet_table
    from nearmiss.client.service import services
    from nearmiss.client.settings import Settings
    from nearmiss.reports import write_fleet_report
    from workflows.loop import Guards

    members = fleet_members()
    settings = Settings.from_env()
    print(
        f"\nrepairing {len(members)} near-misses as one fleet with the playbook (zero tokens), "
        f"{FLEET_CONCURRENCY} at a time...",
        flush=True,
    )
    async with services(settings) as (client, store):
        handle = await start_fleet(
            client, store, members, model="playbook", guards=Guards(), concurrency=FLEET_CONCURRENCY
        )
        await follow(client, handle)
        summary = await fleet_summary(store, handle.id)
        if summary is None:  # cancelled (Ctrl-C, SIGTERM) before its first act
            print("\nthe demo's fleet was cancelled before it started", flush=True)
            return 1
        sessions = [r["session_id"] for r in summary["results"]]
        out = settings.stack.home / "reports" / handle.id
        report = await write_fleet_report(store, f"nearmiss demo fleet {handle.id}", sessions, out)
    results = summary["results"]
    print()
    print(fleet_table(results))
    misses = 0
    for r in results:
        expected = SAMPLE_REPAIRS.get(r["name"])
        if expected is not None and r["verdict"] != expected:
            misses += 1
            print(f"UNEXPECTED: {r['name']} stopped with {r['verdict']}, expected {expected}")
    print(
        f"\nthe playbook certified {summary['certified']}/{summary['total']} with 0 tokens "
        f"({verdict_counts(results)})."
    )
    print(f"fleet report: {report}")
    if results:
        print(f"replay a session: nearmiss replay {results[0]['session_id']}")
    return misses
