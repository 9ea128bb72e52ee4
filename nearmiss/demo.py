"""``nearmiss demo``: the engine on bundled data, in two parts.

1. ``check`` on a sample of the corpus — one operator per category with all its near-miss
   variants, and a few cheats of the integrity corpus: every verdict must match its label.
2. ``repair`` with the zero-token playbook on a few near-misses, as durable Temporal sessions
   with every step recorded in PostgreSQL (the embedded dev stack, started for the demo).

``--all`` does both on the whole corpus (every golden, variant and cheat; several minutes).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nearmiss.check import check
from nearmiss.render import table
from pallas_ops.catalog import integrity_cases, operators

DIAGNOSIS_CHARS = 400  # the full text is in `nearmiss check`; the demo shows the gist
SAMPLE_CHEATS = ("partial_softmax_divide", "ragged_fallback", "credential_reader")
# Playbook repairs shown by default, with the stop each must reach: certified, or a plain
# "no recipe applies" (the playbook does not guess scale factors).
SAMPLE_REPAIRS = {
    "matmul/missing_init": "certified",
    "softmax_rows/floor_grid": "certified",
    "flash_attention/bf16_accumulator": "certified",
    "layer_norm/f32_output": "certified",
    "attention/scale_one_over_d": "no_fix",
}
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
    """0 when every verdict matches its label and every sample repair stops as expected."""
    misses = run_checks(seed, everything)
    misses += asyncio.run(run_repairs(everything))
    return 0 if misses == 0 else 1


def run_checks(seed: int, everything: bool) -> int:
    """Goldens certify, variants fail as labelled, cheats are rejected with their rule."""
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
    return misses


async def run_repairs(everything: bool) -> int:
    """Playbook repairs as Temporal sessions; returns how many stopped other than expected."""
    from nearmiss.service import services, start_session
    from nearmiss.settings import Settings
    from workflows.loop import Guards

    variants = {
        f"{op.name}/{v.path.stem}": (op.spec, v.path) for op in operators() for v in op.variants
    }
    chosen = list(variants) if everything else list(SAMPLE_REPAIRS)
    print(f"\nrepairing {len(chosen)} near-misses with the playbook (zero tokens)...", flush=True)
    async with services(Settings.from_env()) as (client, store):
        handles = [
            await start_session(client, store, *variants[name], "playbook", Guards())
            for name in chosen
        ]
        results = await asyncio.gather(*(h.result() for h in handles))
    rows, misses = [], 0
    for name, result in zip(chosen, results, strict=True):
        expected = SAMPLE_REPAIRS.get(name)
        ok = expected is None or result.stop_reason == expected
        misses += not ok
        rows.append(
            [
                name,
                "certified" if result.certified else "not certified",
                str(result.rounds),
                result.stop_reason,
                str(result.tokens.total),
                result.session_id,
            ]
        )
    print(table(["near-miss", "verdict", "rounds", "stop", "tokens", "session"], rows))
    certified = sum(r.certified for r in results)
    print(f"\nthe playbook certified {certified}/{len(results)} with 0 tokens.")
    for name, result in zip(chosen, results, strict=True):
        if result.stop_reason == "no_fix":
            print(f"{name}: {result.stop_detail[:300]}")
    return misses
