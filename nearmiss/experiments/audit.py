"""Audits: re-check an ablation's "successes" with what the ablation switched off.

Which arms are audited, and what takes a success back, is the arm's ``Recheck`` (config.py):
a success of debug-no-integrity is re-checked with the integrity gate enforced (the paper found
wrappers computing the result outside the kernel); a success of debug-compact-only on the full
suite (the paper found compact successes failing the extended suite). Each audit is a fresh,
sandboxed ``nearmiss.engine.check`` in a thread, its report kept by hash like any check's.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass

from kb.events import EventStore
from nearmiss.engine.check import check
from nearmiss.engine.errors import UsageError
from nearmiss.experiments.config import ARMS


@dataclass(frozen=True)
class AuditTarget:
    arm: str
    near_miss: str
    session_id: str
    spec_hash: str
    candidate_hash: str  # the certified candidate
    candidate_name: str
    targets: tuple[str, ...] = ()  # the experiment's (nearmiss.engine.targets); empty: the spec's


def audit_seed(session_id: str) -> int:
    """A seed fixed by the session, so an audit can be reproduced from its record."""
    return zlib.crc32(session_id.encode()) & 0x7FFFFFFF


async def audit(store: EventStore, target: AuditTarget) -> dict:
    """The verdict of one re-check (suite all, integrity enforced), as recorded."""
    seed = audit_seed(target.session_id)
    verdict = {
        "session_id": target.session_id,
        "candidate_hash": target.candidate_hash,
        "suite": "all",
        "integrity": "enforce",
        "seed": seed,
    }
    files = store.checkout(target.spec_hash, target.candidate_hash, target.candidate_name, "audit")
    async with files as (spec_path, candidate_path):
        try:
            report = await asyncio.to_thread(
                check,
                spec_path,
                candidate_path,
                "all",
                seed,
                integrity="enforce",
                targets=target.targets or None,
            )
        except UsageError as exc:  # it was checked before; unusable now means not certifiable
            return verdict | {"rejected": True, "certified": False, "error": str(exc)}
    recheck = ARMS[target.arm].recheck
    assert recheck is not None  # only arms with a re-check are audited (runner.audit_targets)
    return verdict | {
        "rejected": recheck.rejects(report),
        "certified": report.certified,
        "integrity_ok": report.integrity.ok,
        "violations": sorted({v.rule for v in report.integrity.violations}),
        "extended_passed": report.extended_passed,
        "failure_class": report.failure_class,
        "report_hash": await store.put_blob(report.model_dump_json().encode()),
    }


async def run_audits(store: EventStore, targets: list[AuditTarget], parallel: int, say) -> list:
    """(target, verdict) for every target; ``parallel`` checks at a time (each is two JAX
    processes, so more than the cores only slows them all)."""
    gate = asyncio.Semaphore(parallel)

    async def one(target: AuditTarget):
        async with gate:
            verdict = await audit(store, target)
        outcome = "REJECTED" if verdict["rejected"] else "upheld"
        say(f"audit {target.arm} {target.near_miss} ({target.session_id}): {outcome}")
        return target, verdict

    return await asyncio.gather(*(one(t) for t in targets))
