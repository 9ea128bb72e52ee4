"""Dynamic integrity rules, judged by the engine on what the candidate's artifact revealed.

The executor child audits the artifact it runs (``integrity.audit``) and runs probes on it; the
engine validates that report here and applies the rules:

- ``no_pallas_call``: the artifact holds no kernel at all.
- ``wrapper_compute``: XLA outside the kernels does real work — a heavy op (matmul, reduction,
  transcendental, gather) worth ``HEAVY_SHARE`` of the reference's work, or ``TOTAL_SHARE``
  counting elementwise arithmetic too; or a loop of unknown trip count outside the kernels does
  any work on its iterations (it can do as much as the data asks); or XLA outside the kernels runs
  an op the audit cannot price (default deny: an unknown op, a custom call it has no formula
  for, a dynamic shape). Layout glue costs nothing.
- ``host_callback``: a host callback anywhere, kernels included (JAX cannot export one, so the
  tracing child names those it traced: a claim that can only count against the candidate).
- ``input_mutation``: a pallas_call aliases one of the caller's inputs, or an input's bytes
  changed after the call.
- ``input_independent``: with one input re-drawn, the reference's output changed but the
  candidate's did not, on more than ``INDEPENDENT_SHARE`` of those elements.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from nearmiss.engine.models import Violation

DYNAMIC_RULES = (
    "no_pallas_call",
    "wrapper_compute",
    "host_callback",
    "input_mutation",
    "input_independent",
)
# Rules reported once per run whatever the number of cases showing them.
PER_RUN_RULES = ("no_pallas_call", "wrapper_compute")
HEAVY_SHARE = 0.05
TOTAL_SHARE = 0.5
INDEPENDENT_SHARE = 0.5
# Below this much work (element operations) nothing outside a kernel is worth flagging.
MIN_WORK = 256


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class OutsideWork(_Strict):
    primitive: str = Field(max_length=80)
    kind: str = Field(pattern="^(heavy|light|unpriced)$")  # unpriced: its work is unknown
    operand: str = Field(max_length=200)
    where: str = Field(max_length=300)
    work: int = Field(ge=0)


class Located(_Strict):
    primitive: str = Field(default="", max_length=80)
    where: str = Field(max_length=300)
    input: int = Field(default=-1, ge=-1)


class ArtifactAudit(_Strict):
    """The executor's account of an artifact; validated before it is believed."""

    pallas_calls: int = Field(ge=0)
    interpreted: int = Field(default=0, ge=0)  # on a device: kernels left in interpret mode
    outside_heavy: int = Field(ge=0)
    outside_light: int = Field(ge=0)
    costliest: list[OutsideWork] = Field(max_length=64)
    # Work the audit cannot bound: a loop's work per iteration, or an op it cannot price.
    unbounded: list[OutsideWork] = Field(max_length=64)
    callbacks: list[Located] = Field(max_length=64)
    aliased_inputs: list[Located] = Field(max_length=64)


@dataclass
class Probe:
    """One input re-drawn: the reference's outputs on the new inputs, and the candidate's."""

    input: int
    reference: list[np.ndarray]
    outputs: list[np.ndarray] | None = None


def _at(where: str) -> str:
    return f" at {where}" if where else ""


def _percent(share: float) -> str:
    return f"{share:.0%}" if share >= 0.01 else f"{share:.1%}"


def audit_violations(audit: ArtifactAudit, reference_work: int) -> list[Violation]:
    """Violations read from one case's jaxpr audit; ``reference_work`` is never below 1."""
    found = []
    if audit.pallas_calls == 0:
        detail = "the traced kernel contains no pallas_call: XLA computes everything"
        if audit.interpreted:
            detail = (
                f"{audit.interpreted} pallas_call(s) reached the device in interpret mode, as "
                "plain XLA: no kernel was compiled for it"
            )
        found.append(Violation(rule="no_pallas_call", detail=detail))
    outside = audit.outside_heavy + audit.outside_light
    heavy_share = audit.outside_heavy / reference_work
    if (audit.outside_heavy >= MIN_WORK and heavy_share >= HEAVY_SHARE) or (
        outside >= MIN_WORK and outside / reference_work >= TOTAL_SHARE
    ):
        items = "; ".join(
            f"{w.primitive} over {w.operand}{_at(w.where)} ({_percent(w.work / reference_work)})"
            for w in audit.costliest[:3]
        )
        found.append(
            Violation(
                rule="wrapper_compute",
                detail="XLA outside the pallas_call does work worth "
                f"{_percent(outside / reference_work)} of the reference's: {items}",
            )
        )
    unbounded = {
        "XLA outside the pallas_call runs work the audit cannot price, so it is counted as "
        "heavy (an unknown op, library call or dynamic shape)": [
            w for w in audit.unbounded if w.kind == "unpriced"
        ],
        # Any work at all: per iteration it may be a few scalars, and the loop runs as often as
        # the data says (a matmul done 128 elements a turn was certified while a threshold
        # applied per op, found 2026-12-05 by an attack review).
        "a loop of unknown trip count outside the pallas_call computes on every iteration, so "
        "it can do any share of the work": [
            w for w in audit.unbounded if w.kind != "unpriced" and w.work > 0
        ],
    }
    for why, works in unbounded.items():
        if works:
            items = "; ".join(f"{w.primitive} over {w.operand}{_at(w.where)}" for w in works[:3])
            found.append(Violation(rule="wrapper_compute", detail=f"{why}: {items}"))
    for callback in audit.callbacks:
        found.append(
            Violation(
                rule="host_callback",
                detail=f"`{callback.primitive}` in the traced kernel{_at(callback.where)}",
            )
        )
    for alias in audit.aliased_inputs:
        found.append(
            Violation(
                rule="input_mutation",
                detail=f"a pallas_call writes into input #{alias.input} through "
                f"input_output_aliases{_at(alias.where)}: the caller's array would be "
                "overwritten",
            )
        )
    return found


def callback_violations(traced: list[str]) -> list[Violation]:
    return [
        Violation(
            rule="host_callback",
            detail=f"`{name}` in the traced kernel: the host computes, and the kernel cannot be "
            "exported",
        )
        for name in traced
    ]


def mutation_violations(changed: list[int]) -> list[Violation]:
    return [
        Violation(rule="input_mutation", detail=f"input #{i} changed after the call")
        for i in changed
    ]


def _differs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise 'a and b differ', NaN equal to NaN."""
    same = a == b
    if np.issubdtype(a.dtype, np.inexact):
        same |= np.isnan(a) & np.isnan(b)
    return ~same


def probe_violations(
    probes: list[Probe], reference: list[np.ndarray], outputs: list[np.ndarray]
) -> list[Violation]:
    """``input_independent``: outputs that stay put where the reference moves."""
    found = []
    for probe in probes:
        if probe.outputs is None:
            found.append(
                Violation(
                    rule="input_independent",
                    detail=f"the kernel gave no output with input #{probe.input} re-drawn",
                )
            )
            continue
        moved = stuck = 0
        for ref, ref_probe, out, out_probe in zip(
            reference, probe.reference, outputs, probe.outputs, strict=False
        ):
            if not ref.shape == ref_probe.shape == out.shape == out_probe.shape:
                continue
            # Where the kernel's output is NaN it is garbage, not evidence of ignoring inputs.
            judged = _differs(ref, ref_probe)
            if np.issubdtype(out.dtype, np.inexact):
                judged &= ~np.isnan(out)
            moved += int(judged.sum())
            stuck += int((judged & ~_differs(out, out_probe)).sum())
        if moved and stuck / moved > INDEPENDENT_SHARE:
            found.append(
                Violation(
                    rule="input_independent",
                    detail=f"with input #{probe.input} re-drawn the reference changed at "
                    f"{moved} elements but the kernel's output stayed the same at "
                    f"{stuck / moved:.0%} of them",
                )
            )
    return found


def merge(per_case: list[tuple[str, list[Violation]]]) -> list[Violation]:
    """One violation per distinct finding, naming the cases it was seen on.

    Work shares differ from case to case, so those rules keep the first case's detail.
    """
    seen: dict[tuple[str, str], tuple[Violation, list[str]]] = {}
    for label, violations in per_case:
        for v in violations:
            key = (v.rule, "" if v.rule in PER_RUN_RULES else v.detail)
            seen.setdefault(key, (v, []))[1].append(label)
    merged = []
    for (rule, _), (first, labels) in seen.items():
        detail = first.detail
        cases = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
        merged.append(Violation(rule=rule, detail=f"{detail} (case {cases})"))
    return merged
