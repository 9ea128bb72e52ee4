"""The integrity gate: static rules on the source, dynamic rules on the run, one verdict.

``judge`` turns a run's evidence into an ``IntegrityReport``; ``check`` calls it on every run.
It reads each case through ``CaseEvidence``, the part of the runner's ``RawCase`` it needs, so
the gate sits below the runner that gathers the evidence and the check that runs it.

Modes: ``enforce`` (the default) blocks certification on any violation and never executes a
candidate whose source reaches outside the contract (``forbidden_import``); ``report`` runs and
lists everything, and the report's ``passed`` is the numbers' verdict alone (the no-anti-cheat
ablation, sandbox tests); ``off`` skips the gate entirely (the baseline the gate's cost is
measured against). Only ``enforce`` ever certifies (``check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from nearmiss.engine.integrity.dynamic import (
    DYNAMIC_RULES,
    ArtifactAudit,
    Probe,
    audit_violations,
    callback_violations,
    merge,
    mutation_violations,
    probe_violations,
)
from nearmiss.engine.integrity.static import (
    STATIC_RULES,
    EditScan,
    changed_lines,
    static_violations,
)
from nearmiss.engine.models import IntegrityReport, Violation

RULES = tuple(dict.fromkeys(STATIC_RULES + DYNAMIC_RULES))  # host_callback is in both
MODES = ("enforce", "report", "off")
# Static findings that make running the candidate pointless and unsafe under ``enforce``.
BLOCKS_EXECUTION = ("forbidden_import",)


class _CaseKey(Protocol):
    @property
    def key(self) -> str: ...


class CaseEvidence(Protocol):
    """What the gate reads of one case's run (``nearmiss.engine.runner.session.RawCase`` has it)."""

    @property
    def info(self) -> _CaseKey: ...
    @property
    def reference(self) -> list[Any]: ...
    @property
    def outputs(self) -> list[Any] | None: ...
    @property
    def audited(self) -> bool: ...
    @property
    def audit(self) -> ArtifactAudit | None: ...
    @property
    def audit_error(self) -> str: ...
    @property
    def reference_work(self) -> int | None: ...
    @property
    def inputs_changed(self) -> list[int]: ...
    @property
    def probes(self) -> list[Probe]: ...
    @property
    def traced_callbacks(self) -> list[str]: ...


def _case_violations(raw: CaseEvidence) -> list[Violation]:
    if raw.audit is None:
        found = [
            Violation(
                rule="wrapper_compute",
                detail="the kernel's artifact could not be audited, so the work outside it is "
                f"unknown ({raw.audit_error})",
            )
        ]
    else:
        outputs = sum(a.size for a in raw.reference)
        found = audit_violations(raw.audit, max(raw.reference_work or 0, outputs, 1))
    found += mutation_violations(raw.inputs_changed)
    found += probe_violations(raw.probes, raw.reference, raw.outputs or [])
    return found


def judge(static: list[Violation], cases: Sequence[CaseEvidence], mode: str) -> IntegrityReport:
    """The integrity verdict of one run: static findings plus what each audited case showed."""
    if mode == "off":
        return IntegrityReport(ok=True, mode=mode)
    audited = [raw for raw in cases if raw.audited and raw.outputs is not None]
    dynamic = merge(
        [(raw.info.key, _case_violations(raw)) for raw in audited]
        + [(raw.info.key, callback_violations(raw.traced_callbacks)) for raw in cases]
    )
    violations = static + dynamic
    return IntegrityReport(
        ok=not violations,
        mode=mode,
        violations=violations,
        rules_checked=list(RULES if audited else STATIC_RULES),
        audited_cases=len(audited),
    )


def blocks_execution(static: list[Violation], mode: str) -> bool:
    return mode == "enforce" and any(v.rule in BLOCKS_EXECUTION for v in static)


__all__ = [
    "MODES",
    "RULES",
    "CaseEvidence",
    "EditScan",
    "blocks_execution",
    "changed_lines",
    "judge",
    "static_violations",
]
