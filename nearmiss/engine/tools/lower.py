"""``lower``: would the candidate lower for another platform? Errors come back, nothing runs.

A kernel that passes in CPU interpret mode can still be rejected by the TPU (Mosaic) or GPU
(Triton / Mosaic GPU) lowering: block shapes that break the tiling rules, unsupported operations.
The lowering runs in the sandbox child without interpret mode. When this installation cannot
lower for the platform at all (GPU lowering with a CPU-only jaxlib), the answer says so plainly
instead of blaming the kernel.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, cast

from nearmiss.engine.check import case_result
from nearmiss.engine.forensics.errors import summarise_error
from nearmiss.engine.models import ErrorInfo
from nearmiss.engine.runner.lower_child import TARGETS
from nearmiss.engine.runner.session import Entry, Limits
from nearmiss.engine.tools.experiment import CaseRequest, Refused, case_ref, refusal, run_candidate
from nearmiss.engine.tools.models import LowerResult
from nearmiss.engine.tools.text import case_line, clip, error_lines, finish

LOWER_MODULE = "nearmiss.engine.runner.lower_child"
PLATFORMS = tuple(TARGETS)
# What lowering without the hardware does and does not cover, said once with every answer.
SCOPE = {
    "tpu": "Mosaic TPU lowering (block tiling, supported ops; without a TPU against an abstract "
    "TPU v5e); Mosaic's compilation, VMEM limits and numerics are not checked",
    "gpu": "Pallas GPU lowering (Triton block rules, supported ops); PTX compilation, shared "
    "memory limits and numerics are not checked",
}


def lowering_error(raw_error: dict, source: str, name: str) -> ErrorInfo:
    """The child's error record cut down as for a case, keeping what lowering errors need.

    Lowering happens after the candidate's frames have returned, but JAX names the
    pallas_call's source position in its message: that gives the candidate's own line. Its
    messages are long single lines (the rule, then the offending block spec); one sentence per
    line lets the trimming keep both.
    """
    # The child ran a copy in its own directory: keep just the file name.
    path = re.compile(rf"[^\s'\"(]*/{re.escape(name)}:(\d+)")
    message = path.sub(rf"{name}:\1", str(raw_error.get("message", "")))
    message = "\n".join(re.split(r"(?<=\.)\s+(?=[A-Z])", message))
    error = summarise_error({**raw_error, "message": message}, name)
    match = re.search(rf"{re.escape(name)}:(\d+)", message)
    if error.location is None and match:
        error.location = f"{name}:{match[1]}"
        lines = source.splitlines()
        if 1 <= int(match[1]) <= len(lines):
            error.source_line = lines[int(match[1]) - 1].strip() or None
    return error


def _summary(result: LowerResult) -> str:
    head = [case_line(result.case)] if result.case else []
    label = f"lowering for {result.platform} ({result.target}, jax {result.jax_version})"
    if result.status == "ok":
        return finish([*head, f"ok: {label} succeeded", f"checked: {SCOPE[result.platform]}"])
    if result.status == "unavailable":
        return finish(
            [
                *head,
                f"unavailable: this installation cannot do {label}; this says nothing about "
                "the kernel",
                clip(result.detail, 500),
            ]
        )
    assert result.lowering_error is not None
    lines = error_lines(result.lowering_error, message_lines=8, first_chars=600)
    lines[0] = f"FAILED {label}: {lines[0]}"
    return finish([*head, *lines])


def lower(
    spec_path: str | Path,
    candidate_path: str | Path,
    *,
    platform: str = "tpu",
    case: str | None = None,
    dims: dict[str, int] | None = None,
    dtype: str | None = None,
    profile: str | None = None,
    seed: int = 0,
    limits: Limits | None = None,
) -> LowerResult:
    """Lower the candidate for ``platform`` ("tpu" or "gpu") with the shapes of one case
    (chosen as in run_case) and report the errors, ok, or that lowering is unavailable here."""
    if platform not in PLATFORMS:
        return refusal(LowerResult, f"platform must be one of {', '.join(PLATFORMS)}", seed=seed)
    entry = Entry(LOWER_MODULE, "kernel", {"platform": platform})
    try:
        request = CaseRequest(case, dims, dtype, profile)
        source, run, raw = run_candidate(spec_path, candidate_path, request, seed, limits, entry)
    except Refused as exc:
        return refusal(LowerResult, str(exc), seed=seed, platform=platform)
    result = LowerResult(
        case=case_ref(raw),
        seed=seed,
        platform=cast(Literal["tpu", "gpu"], platform),  # one of PLATFORMS (checked above)
        target=TARGETS[platform],  # the engine's own mapping, never the untrusted child's word
        jax_version=run.jax_version,
    )
    extra = raw.output_extra
    name = Path(candidate_path).name
    if raw.error is not None:
        result.status = "failed"
        result.lowering_error = lowering_error(raw.error, source, name)
    elif raw.outputs is None:  # the child timed out or died: the same account as for a case
        result.status = "failed"
        result.lowering_error = case_result(raw, name).error
    elif extra.get("status") in ("ok", "unavailable"):
        result.status = extra["status"]
        result.detail = clip(str(extra.get("detail", "")), 500)
    else:
        return refusal(LowerResult, "the lowering child filed an unusable result", seed=seed)
    result.summary = _summary(result)
    return result
