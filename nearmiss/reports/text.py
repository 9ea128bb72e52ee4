"""Human-readable rendering of a CheckReport: a table of cases, the verdict, the diagnosis."""

from __future__ import annotations

import math

from nearmiss.engine.models import CaseResult, CheckReport, ControlResult

# A passing case that used more than this share of its tolerance may fail on another seed's
# inputs: worth saying before it flakes in someone's CI.
TOLERANCE_WARN = 0.5


def _dims(case: CaseResult) -> str:
    return " ".join(f"{k}={v}" for k, v in case.dims.items())


def _error_columns(case: CaseResult) -> list[str]:
    """'max abs err' and 'mismatched' of the output leaf with the most mismatches."""
    if not case.leaves:
        return ["-", "-"]
    worst = max(case.leaves, key=lambda leaf: leaf.mismatched)
    if worst.nan_count or worst.inf_count:
        error = f"{worst.nan_count} NaN {worst.inf_count} Inf"
    else:
        error = f"{worst.max_abs_error:.2e}"
    return [error, f"{worst.mismatched} ({worst.mismatched_fraction:.1%})"]


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def _target_lines(report: CheckReport) -> list[str]:
    """Per target: accepted or not, and what stands behind that."""
    lines = []
    for name, target in report.targets.items():
        state = "ok" if target.ok else f"FAIL {target.failure_class or 'unverified'}"
        extra = f", {target.compile_s:.1f} s to compile" if target.compile_s else ""
        memory = target.memory
        if memory.get("argument_bytes") is not None:
            total = sum(memory.get(k, 0) for k in ("argument_bytes", "output_bytes", "temp_bytes"))
            extra += f", {total / 1024:.0f} KiB of buffers"
        if memory.get("vmem_blocks_bytes") is not None and memory.get("vmem_limit_bytes"):
            mib = {k: memory[k] / (1 << 20) for k in ("vmem_blocks_bytes", "vmem_limit_bytes")}
            blocks, limit = mib["vmem_blocks_bytes"], mib["vmem_limit_bytes"]
            extra += f", blocks {blocks:.1f} of {limit:.1f} MiB VMEM"
        lines.append(f"target {name}: {state} ({target.verified_by}{extra})")
        if not target.ok:
            lines.append(f"  {target.error or '; '.join(target.undetermined)}")
        lines += [f"  note: {note}" for note in target.notes]
    return lines


def not_certified_because(report: CheckReport) -> str:
    """Why a report is not certified, in a word or three: its failure class; else the
    integrity gate; else the targets that could not verify the kernel (an undetermined grid is
    no failure class, and no integrity violation either); else "integrity" as before."""
    if report.failure_class:
        return report.failure_class
    if report.integrity.violations and report.integrity.mode == "enforce":
        return "integrity"
    if report.integrity.mode != "enforce":
        rules = sorted({v.rule for v in report.integrity.violations})
        fired = f"; it found {', '.join(rules)}" if rules else ""
        numbers = "the numbers pass" if report.passed else "the numbers fail"
        return f"the integrity gate was {report.integrity.mode!r}, not enforced ({numbers}{fired})"
    unverified = [name for name, t in report.targets.items() if not t.ok and not t.failure_class]
    if unverified:
        return f"unverified on {', '.join(unverified)}"
    return "integrity"


def _share_used(used: float) -> str:
    """The share as "at most N%", rounded up so it stays true (0.501 reads 51%, over half)."""
    if used < 0.01:
        return "under 1%"
    return f"at most {math.ceil(round(used * 100, 6))}%"


def tolerance_line(report: CheckReport) -> str | None:
    """One line on how close a passing run came to its tolerance, naming the case that came
    closest; None unless every case passed and says how much it used (older reports do not)."""
    cases = report.cases
    if not cases or not all(c.passed for c in cases):
        return None
    measured = [c for c in cases if c.tolerance_used is not None]
    if not measured:
        return None
    closest = max(measured, key=lambda c: c.tolerance_used or 0.0)
    used = closest.tolerance_used or 0.0
    if used == 0:
        return "tolerance: none used (every case matched the reference exactly)"
    line = (
        f"tolerance: {_share_used(used)} used (case {closest.name}, "
        f"{closest.dtype} atol={closest.atol:g} rtol={closest.rtol:g})"
    )
    if used > TOLERANCE_WARN:
        line += (
            "\n  more than half of it: this case may fail (flake) with a fresh seed; "
            f"see `nearmiss spec check {report.spec}`"
        )
    return line


def _control_line(control: ControlResult) -> str:
    if control.passed is None:
        outcome = control.note
    else:
        outcome = "pass" if control.passed else f"FAIL {control.failure_class}"
        if control.max_abs_error is not None:
            outcome += f", max abs err {control.max_abs_error:.2e}"
    source = {"suite": f" ({control.note})", "cache": " (cached)"}.get(control.source, "")
    dims = " ".join(f"{k}={v}" for k, v in control.dims.items())
    return f"  {control.name}: {dims} {control.dtype} {control.profile}: {outcome}{source}"


def control_lines(report: CheckReport) -> list[str]:
    """The failing cases' control experiments, a line each (``forensics.controls``)."""
    lines = []
    for case in report.cases:
        if case.controls:
            lines.append(f"controls ({case.suite}/{case.name}): {case.trigger}")
            lines += [_control_line(control) for control in case.controls]
    return lines


def profile_lines(report: CheckReport) -> list[str]:
    """The cases' kernel and reference times where they were measured (``runner.timing``): on
    a device each case's and the speedup; in emulation one line saying they are not compared."""
    timed = [c for c in report.cases if c.kernel_s is not None or c.profile_error]
    if not timed:
        return []
    if report.times == "emulated":
        return ["profile: times emulated (CPU interpret mode), never compared with the reference"]
    lines = ["profile (median of warm runs; reference compiled by XLA on the same device):"]
    for case in timed:
        if case.speedup is not None and case.kernel_s and case.reference_s:
            lines.append(
                f"  {case.suite}/{case.name}: kernel {case.kernel_s * 1e3:.3f} ms, "
                f"reference {case.reference_s * 1e3:.3f} ms ({case.speedup:.2f}x)"
            )
        else:
            lines.append(f"  {case.suite}/{case.name}: not compared ({case.profile_error or '?'})")
    if report.speedup is not None:
        lines.append(
            f"  speedup {report.speedup:.2f}x (geometric mean); least in {report.slowest_case}"
        )
    return lines


def render_report(report: CheckReport) -> str:
    head = (
        f"{report.op} ({report.category}) — candidate {report.candidate}\n"
        f"seed {report.seed} · suite {report.suite} · {report.platform} · jax {report.jax_version}"
        f" · {report.wall_s:.1f} s"
        + (" · case times emulated (CPU interpret mode)" if report.times == "emulated" else "")
    )
    rows = [
        [
            c.suite,
            c.name,
            _dims(c),
            c.dtype,
            c.profile,
            "pass" if c.passed else f"FAIL {c.failure_class}",
            *_error_columns(c),
        ]
        for c in report.cases
    ]
    body = table(
        ["suite", "case", "dims", "dtype", "profile", "result", "max abs err", "mismatched"], rows
    )
    if not report.cases:
        body = "(no case was run)"
    integrity = report.integrity
    if integrity.mode == "off":
        gate = "off (not checked)"
    elif integrity.violations:
        gate = "VIOLATED" + "".join(f"\n  {v.rule}: {v.detail}" for v in integrity.violations)
    else:
        audited = f", {integrity.audited_cases} cases audited" if integrity.audited_cases else ""
        gate = f"ok ({len(integrity.rules_checked)} rules{audited})"
    gate += "".join(f"\n  note: {note}" for note in integrity.notes)
    if report.certified:
        verdict = "CERTIFIED"
        judged = [f"{name}: {t.verified_by}" for name, t in report.targets.items()]
        if judged:
            verdict += f" ({'; '.join(judged)})"
        if report.suite != "all":
            verdict += f" on the {report.suite} suite only (not full coverage)"
    else:
        verdict = f"NOT CERTIFIED — {not_certified_because(report)}"
    lines = [head, "", body, "", f"integrity: {gate}", *_target_lines(report)]
    lines.append(f"verdict: {verdict}")
    tolerance = tolerance_line(report)
    if tolerance:
        lines.append(tolerance)
    lines += profile_lines(report)
    if report.domains and any(c.suite == "hidden" for c in report.cases):
        drawn = ", ".join(f"{dim} {values}" for dim, values in report.domains.items())
        lines.append(f"hidden cases drawn from: {drawn} (--seed {report.seed} draws them again)")
    lines += [f"note: {note}" for note in report.notes]
    if not report.certified:
        lines.append(f"diagnosis: {report.diagnosis}")
        lines += control_lines(report)
        for case in report.cases:
            if case.error and case.error.excerpt:
                lines.append(f"evidence ({case.suite}/{case.name}):")
                lines += [f"  {line}" for line in case.error.excerpt]
                break
    return "\n".join(lines)
