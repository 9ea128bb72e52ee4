"""``check``: certify or diagnose a candidate kernel against a spec.

The engine — never the candidate — decides: spec and candidate run in sandbox children, the
outputs come back as files, and every comparison and classification happens here.
"""

from __future__ import annotations

import ast
import logging
import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from nearmiss.engine.errors import UsageError, exception_line
from nearmiss.engine.forensics import reach
from nearmiss.engine.forensics.attribution import attribute_error
from nearmiss.engine.forensics.classify import (
    classify_numeric,
    describe_numeric,
    describe_run,
    error_class,
    ranked_classes,
    refine_unstable,
)
from nearmiss.engine.forensics.compare import LeafComparison, compare_outputs, structure_difference
from nearmiss.engine.forensics.controls import ControlPlan
from nearmiss.engine.forensics.errors import crash_evidence, headline, summarise_error
from nearmiss.engine.forensics.localise import localise
from nearmiss.engine.forensics.triggers import geometry_blocks, value_trigger
from nearmiss.engine.hidden import HIDDEN_SUITE as HIDDEN
from nearmiss.engine.hidden import listed as listed_cases
from nearmiss.engine.inputs import parse_source, read_source
from nearmiss.engine.integrity.gate import MODES, blocks_execution, judge, static_violations
from nearmiss.engine.integrity.static import execution_mode_notes
from nearmiss.engine.models import (
    CaseResult,
    CheckReport,
    CheckSuite,
    ErrorInfo,
    IntegrityReport,
    LeafStats,
    TargetResult,
    Violation,
)
from nearmiss.engine.runner.environment import isolation_level
from nearmiss.engine.runner.session import Limits, RawCase, RawRun, run_sandboxed
from nearmiss.engine.runner.target_plan import plan_targets
from nearmiss.engine.runner.timing import speedup
from nearmiss.engine.targets.registry import run_platform
from nearmiss.engine.targets.verdict import judge_target

log = logging.getLogger(__name__)
T = TypeVar("T")

SUITES = ("compact", "extended", "all")


def binds_kernel(source: str, name: str = "kernel") -> bool | None:
    """Whether the module binds a top-level ``name`` (``kernel``, or a probe's ``probe``); None
    when that cannot be told statically."""
    try:
        tree = parse_source(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # a finding for the sandbox (or the static gate) to report, not a usage error
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name:
                    return True
        elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
            return None  # conditional definitions: let the import decide
    return False


def _failure_result(base: CaseResult, raw: RawCase, candidate_name: str) -> CaseResult:
    if raw.error is not None:
        error = summarise_error(raw.error, candidate_name)
        base.failure_class = error_class(error)
        where = f" at {error.location}" if error.location else ""
        code = f" (`{error.source_line}`)" if error.source_line else ""
        base.diagnosis = (
            f"{error.phase.capitalize()} failed{where}{code}: {error.type}: "
            f"{headline(error.message)}"
        )
        base.error = error
        return base
    timed_out = raw.failure == "timeout"
    base.failure_class = "timeout" if timed_out else "runtime_error"
    location, excerpt = crash_evidence(raw.log_tail, candidate_name)
    base.error = ErrorInfo(
        phase="sandbox",
        type="Timeout" if timed_out else "ProcessDied",
        message=raw.failure_detail,
        location=location,
        excerpt=excerpt,
    )
    if timed_out:
        base.diagnosis = f"No result in time ({raw.failure_detail}); the process was killed."
    else:
        where = f" at {location}" if location else ""
        base.diagnosis = f"The candidate's process failed{where}: {raw.failure_detail}."
    if excerpt:
        base.diagnosis += f" Evidence: {'; '.join(excerpt)}"
    return base


def case_result(raw: RawCase, candidate_name: str) -> CaseResult:
    return case_evidence(raw, candidate_name)[0]


def case_verdict(raw: RawCase, candidate_name: str) -> CaseResult:
    """The case's result without the leads only its diagnosis sentence reads (a value that
    triggers the error, the input positions it follows): the same pass, class and leaves at a
    fraction of the cost (measured: attribution took 33 of a 39 s check that judged its control
    cases with it). For control cases and screened edits, which are read for those alone."""
    return case_evidence(raw, candidate_name, leads=False)[0]


def case_evidence(
    raw: RawCase, candidate_name: str, leads: bool = True
) -> tuple[CaseResult, LeafComparison | None]:
    """The case's result, and the comparison of its worst output leaf (the one localised) when
    the outputs could be compared. ``leads=False``: see ``case_verdict``."""
    info = raw.info
    grid = raw.geometry[-1]["grid"] if raw.geometry else None
    base = CaseResult(
        suite=info.suite,
        name=info.name,
        dims=info.dims,
        dtype=info.dtype,
        profile=info.profile,
        passed=False,
        atol=info.atol,
        rtol=info.rtol,
        compile_s=raw.compile_s,
        run_s=raw.run_s,
        kernel_s=raw.kernel_warm_s,
        reference_s=raw.reference_warm_s,
        profile_error=raw.kernel_profile_error or raw.reference_profile_error,
        kernel_grid=grid,
    )
    if raw.outputs is None:
        return _failure_result(base, raw, candidate_name), None
    structure = structure_difference(
        raw.reference, raw.reference_tree, raw.outputs, raw.output_tree or ""
    )
    if structure:
        base.failure_class = "shape_mismatch"
        base.structure = structure
        base.diagnosis = f"Output structure is wrong: {structure}."
        return base, None
    comparisons = compare_outputs(raw.reference, raw.outputs, info.atol, info.rtol)
    base.leaves = [c.stats for c in comparisons]
    base.tolerance_used = case_tolerance_used(base.leaves)
    worst = max(comparisons, key=lambda c: c.stats.mismatched)
    if worst.stats.mismatched == 0:
        base.passed = True
        return base, worst
    base.localisation = localise(worst.stats.path, worst.bad, raw.geometry)
    narrow = raw.narrow_floats
    # The class reads the localisation's shape (tail, spread), never the leads below.
    base.failure_class = classify_numeric(worst.stats, base.localisation, narrow)
    if not leads:
        return base, worst
    base.localisation.trigger = lead(
        value_trigger, worst.bad, raw.input_arrays, info.dims, geometry_blocks(raw.geometry)
    )
    leaf = comparisons.index(worst)
    base.localisation.follows = lead(
        attribute_error, raw.outputs[leaf], raw.reference[leaf], worst.bad, raw.input_arrays
    )
    base.diagnosis = describe_numeric(base.failure_class, worst.stats, base.localisation, narrow)
    return base, worst


def lead(find: Callable[..., T], *args: Any) -> T | None:
    """A diagnosis helper's finding, or None when it fails: a lead is evidence, and a check
    must never fail because a way of finding one did (the failure is logged)."""
    try:
        return find(*args)
    except Exception:
        log.warning("diagnosis helper %s failed; no lead from it", find.__qualname__, exc_info=True)
        return None


def case_tolerance_used(leaves: list[LeafStats]) -> float | None:
    """How much of its tolerance the case used: its most demanding leaf's figure, None when any
    leaf's is unbounded (then the case fails anyway) or there is no leaf to measure."""
    used = [leaf.tolerance_used for leaf in leaves]
    if not used or None in used:
        return None
    return max(u for u in used if u is not None)


def require_file(role: str, path: Path) -> str:
    """The text of the ``role`` file at ``path``; UsageError (one line) unless it is a regular
    UTF-8 ``.py`` file in the user's tree, within the size limit (``nearmiss.engine.inputs``)."""
    return read_source(role, path)


def admit(
    spec: str | Path, candidate: str | Path, integrity: str, label: str | None = None
) -> tuple[str, list[Violation], bool]:
    """(source, static violations, whether to execute) for a candidate about to run on a spec.

    Raises UsageError (one-line reason) unless both are regular UTF-8 ``.py`` files in the
    user's tree (``nearmiss.engine.inputs.read_source``) and the candidate may define ``kernel``.
    ``label`` names the candidate in that last reason (its path by default). ``integrity`` is a
    valid gate mode; "off" skips the static rules.
    """
    spec, candidate = Path(spec), Path(candidate)
    require_file("spec", spec)
    source = require_file("candidate", candidate)
    if binds_kernel(source) is False:
        raise UsageError(f"candidate {label or candidate} defines no `kernel`")
    # Static rules read the source before any candidate code runs. Most violations still let
    # the sandboxed run happen, for the evidence it gives; reaching outside the contract does not.
    static = [] if integrity == "off" else static_violations(source, candidate.name)
    return source, static, not blocks_execution(static, integrity)


def integrity_note(integrity: IntegrityReport, executed: bool) -> str:
    if integrity.ok:
        return ""
    rules = sorted({v.rule for v in integrity.violations})
    note = f"Integrity violated ({', '.join(rules)}): {integrity.violations[0].detail}."
    if not executed:
        return note + " The candidate was not executed."
    return note + " Forensics: "


def check(
    spec: str | Path,
    candidate: str | Path,
    suite: str = "all",
    seed: int | None = None,
    limits: Limits | None = None,
    integrity: str = "enforce",
    targets: tuple[str, ...] | None = None,
    controls: bool = True,
    profile_runs: int | None = None,
    hidden: bool = True,
    show_at: Path | None = None,
) -> CheckReport:
    """Run the spec's ``suite`` on the candidate in the sandbox and return the full report.

    ``integrity`` is the gate's mode (see ``nearmiss.engine.integrity.gate``). Raises UsageError
    (one-line reason) for unusable input; a candidate that fails to import, compile or run is a
    finding in the report, never an exception. ``targets`` (default: the spec's, else
    interpret): certified means right numbers *and* every target accepts the kernel; ``gpu``
    alone, on a machine whose GPU answers, runs the cases on it (``targets.run_platform``).
    ``controls``: failing numeric cases get control experiments (``forensics.controls``), run
    in the same children after the suite; they name the trigger and settle the class, never
    the verdict. ``profile_runs``: warm runs timed per case, kernel and reference
    (``runner.timing``; default: some on a device, none in emulation, whose times are never
    compared). ``hidden``: suite ``all`` adds the cases the engine draws from ``seed``
    (``nearmiss.engine.hidden``); a fixer that checks its edits asks for none, never seeing
    them before the verdict. ``show_at``: the folder the candidate's child shows its file in
    (default: the candidate's own; a checkout passes its user's, ``runner.session.user_folder``).
    """
    started = time.perf_counter()
    spec, candidate = Path(spec), Path(candidate)
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}; expected one of {', '.join(SUITES)}")
    if integrity not in MODES:
        raise UsageError(
            f"unknown integrity mode {integrity!r}; expected one of {', '.join(MODES)}"
        )
    platform = run_platform(targets)  # the GPU's, for the gpu target where one answers
    source, static, execute = admit(spec, candidate, integrity)
    seed = secrets.randbelow(2**31) if seed is None else seed
    plan = ControlPlan(source, require_file("spec", spec)) if controls else None
    results: list[CaseResult] = []
    nudges: reach.NudgePlan | None = None  # once the suite's cases are in
    judged: dict[str, CaseResult | str] = {}  # control results, each judged once

    def control_results(ran: dict[str, RawCase]) -> dict[str, CaseResult | str]:
        """Each control case's result, or why the spec could not serve it."""
        for name, r in ran.items():
            if name not in judged:
                unrunnable = r.failure == "unrunnable"
                judged[name] = r.failure_detail if unrunnable else case_verdict(r, candidate.name)
        return {name: judged[name] for name in ran}

    def planner(raws: list[RawCase], ran: dict[str, RawCase]) -> list[dict]:
        nonlocal nudges
        assert plan is not None
        if not results:  # the first round; with none to run, the second may have some
            results[:] = [case_result(r, candidate.name) for r in raws]
            # Controls and nudges redraw listed cases only: a hidden case's scaled values are
            # not what its dims and profile would draw again.
            listed = [(c, r) for c, r in zip(results, raws, strict=True) if c.suite != HIDDEN]
            cases_, raws_ = [c for c, _ in listed], [r for _, r in listed]
            wanted = plan.plan(cases_, [r.geometry for r in raws_])
            nudges = lead(reach.NudgePlan, cases_, raws_)
            wanted += (nudges and lead(nudges.next, {})) or []
            return wanted or plan.split({})
        more = (nudges and lead(nudges.next, ran)) or []
        return plan.split(control_results(ran)) + more

    raw = run_sandboxed(
        spec,
        candidate,
        suite,
        seed,
        limits or Limits(),
        platform=platform,
        audit=integrity != "off",
        execute=execute,
        source=source,
        targets=targets,
        controls=planner if plan is not None else None,
        profile_runs=profile_runs,
        hidden=hidden,
        show_at=show_at,
    )
    verdict = judge(static, raw.cases, integrity)
    if integrity != "off":
        verdict.notes = execution_mode_notes(source, candidate.name)
    cases = results if len(results) == len(raw.cases) else []
    cases = cases or [case_result(r, candidate.name) for r in raw.cases]
    listed = listed_cases(cases)
    decided = plan.conclude(listed, control_results(raw.controls)) if plan else set()
    if nudges:
        lead(nudges.conclude, listed, raw.controls)
    if hidden and suite == "all":  # the probes' re-drawn inputs judged too, as hidden cases
        cases += redrawn_results(raw, cases)
    refine_unstable(cases, decided)
    on_targets = target_results(raw, cases, on_device=platform != "cpu") if execute else {}
    # The listed cases' classes lead: they are the evidence a fixer can reproduce; a hidden
    # case's class is the primary one only where every listed case passes.
    classes = ranked_classes(
        [c.failure_class for c in listed if c.failure_class]
        + [t.failure_class for t in on_targets.values() if t.failure_class]
    )
    hidden_classes = ranked_classes(
        [c.failure_class for c in cases if c.suite == HIDDEN and c.failure_class]
    )
    classes += [c for c in hidden_classes if c not in classes]
    primary = classes[0] if classes else None
    times: Literal["emulated", "device"] = "emulated" if raw.platform == "cpu" else "device"
    for case in cases:
        case.speedup = speedup(case.kernel_s, case.reference_s, times)
    compact = [c.passed for c in cases if c.suite == "compact"]
    extended = [c.passed for c in cases if c.suite == "extended"]
    passed = bool(cases) and all(c.passed for c in cases) and all(t.ok for t in on_targets.values())
    return CheckReport(
        op=raw.op,
        category=raw.category,
        spec=str(spec),
        candidate=str(candidate),
        suite=cast(CheckSuite, suite),  # checked against SUITES above
        seed=seed,
        platform=raw.platform,
        jax_version=raw.jax_version,
        isolation=isolation_level(),
        passed=passed,
        # Only ever with the gate enforcing: a flag must not turn a kernel with no pallas_call
        # into exit 0 for a CI job that reads the exit code alone.
        certified=passed and verdict.ok and integrity == "enforce",
        failure_class=primary,
        failure_classes=classes,
        integrity=verdict,
        cases=cases,
        diagnosis=integrity_note(verdict, execute)
        + target_note(on_targets)
        + (describe_run(cases, primary) if execute else "")
        + hidden_note(cases, seed),
        compact_passed=all(compact) if compact else None,
        extended_passed=all(extended) if extended else None,
        wall_s=time.perf_counter() - started,
        times=times,
        targets=on_targets,
        notes=raw.notes,
        domains=raw.domains,
        **overall_speedup(cases),
    )


def redrawn_results(raw: RawRun, cases: list[CaseResult]) -> list[CaseResult]:
    """The input-independence probes judged as cases too: each ran the kernel on its case's
    inputs with one re-drawn, and the spec's child computed the reference there. A kernel right
    on the listed draw and wrong on the re-drawn one is right on the suite only: a hidden case
    it fails (``<case>-redraw-<input>``). Probes the kernel answered nothing for are the
    ``input_independent`` rule's."""
    found = []
    for case, r in zip(cases, raw.cases, strict=False):
        if not case.passed:
            continue
        for probe in r.probes:
            if probe.outputs is None or len(probe.outputs) != len(probe.reference):
                continue
            compared = compare_outputs(probe.reference, probe.outputs, r.info.atol, r.info.rtol)
            worst = max(compared, key=lambda c: c.stats.mismatched)
            if not worst.stats.mismatched:
                continue
            stats = worst.stats
            found.append(
                CaseResult(
                    suite=HIDDEN,
                    name=f"{case.name}-redraw-{probe.input}",
                    dims=case.dims,
                    dtype=case.dtype,
                    profile=case.profile,
                    passed=False,
                    atol=r.info.atol,
                    rtol=r.info.rtol,
                    failure_class="nan_inf"
                    if stats.nan_count or stats.inf_count
                    else "wrong_values",
                    leaves=[c.stats for c in compared],
                    diagnosis=f"With input #{probe.input} of {case.suite}/{case.name} re-drawn, "
                    f"{stats.mismatched} of {stats.total} values of {stats.path} are wrong "
                    f"(max abs error {stats.max_abs_error:.3g}): right on the listed draw only.",
                )
            )
    return found


def hidden_note(cases: list[CaseResult], seed: int) -> str:
    """What a failing hidden case means, where every listed case passes."""
    failing = [c for c in cases if c.suite == HIDDEN and not c.passed]
    if not failing or not all(c.passed for c in cases if c.suite != HIDDEN):
        return ""
    names = ", ".join(
        f"{c.name} ({', '.join(f'{k}={v}' for k, v in c.dims.items())})" for c in failing
    )
    return (
        f" Every listed case passes, but hidden cases the engine drew for this check fail: "
        f"{names}. The kernel is right on the spec's listed inputs only; `--seed {seed}` draws "
        "the same hidden cases again."
    )


def overall_speedup(cases: list[CaseResult]) -> dict[str, Any]:
    """The report's speedup: the geometric mean of the cases' (each a ratio, so no case of a
    few microseconds weighs less than one of milliseconds) and the case that gains least."""
    timed = [c for c in cases if c.speedup]
    if not timed:
        return {}
    mean = math.exp(sum(math.log(cast(float, c.speedup)) for c in timed) / len(timed))
    least = min(timed, key=lambda c: cast(float, c.speedup))
    return {"speedup": mean, "slowest_case": f"{least.suite}/{least.name}"}


def target_results(
    raw: RawRun, cases: list[CaseResult], on_device: bool = False
) -> dict[str, TargetResult]:
    """Each target's verdict, from what the executor gathered per case. A case already wrong
    in program order says nothing about the target's order: only its races and exceptions
    under the target's semantics count there."""
    in_order = {(c.suite, c.name): c.passed for c in cases}
    results = {}
    for plan in plan_targets(raw.targets, on_device=on_device):
        if plan.on_device:
            results[plan.target] = device_verdict(plan.verified_by, cases)
            continue
        per_case = [
            {"key": r.info.key, "exported": plan.target in r.targets}
            | r.targets.get(plan.target, {})
            | {
                "lowered": r.lowered.get(plan.structure) if plan.structure else None,
                "semantics": semantics_verdict(
                    r, r.targets.get(plan.target, {}), in_order.get((r.info.suite, r.info.name))
                ),
            }
            for r in raw.cases
        ]
        results[plan.target] = judge_target(
            plan.target, plan.verified_by, plan.structure, plan.compile, per_case
        )
    return results


def device_verdict(verified_by: str, cases: list[CaseResult]) -> TargetResult:
    """The target the cases ran on: its verdict is theirs, its compiler's refusal included."""
    failed = [c for c in cases if not c.passed]
    if not failed:
        return TargetResult(ok=bool(cases), verified_by=verified_by)
    first = failed[0]
    why = exception_line(first.error.type, first.error.message) if first.error else first.diagnosis
    return TargetResult(
        ok=False,
        verified_by=verified_by,
        failure_class=first.failure_class,
        error=f"{len(failed)}/{len(cases)} cases fail; {first.suite}/{first.name}: {why}"[:300],
    )


def semantics_verdict(raw: RawCase, evidence: dict, in_order: bool | None) -> dict | None:
    """The case under the target's semantics (TPU interpret mode), judged here: {"passed",
    "races", "error", "detail", "max_error", "reduced", "undefined", "fill"}; None where it did
    not run. ``fill`` is the run with values nobody wrote in fresh memory, judged the same way.
    Numbers are compared only where the case is right in program order (``in_order``)."""
    run = evidence.get("semantics")
    if run is None:
        return None
    verdict = _semantics_run_verdict(raw, run, in_order)
    verdict["atol"] = raw.info.atol
    verdict["reduced"] = run.get("reduced") or []
    verdict["undefined"] = run.get("undefined") or []
    fill = evidence.get("semantics_fill")
    if fill is not None:
        verdict["fill"] = _semantics_run_verdict(raw, fill, in_order)
    return verdict


def _semantics_run_verdict(raw: RawCase, run: dict, in_order: bool | None) -> dict:
    if "error" in run:
        error = run["error"]
        # A callback's exception arrives wrapped: its own last line says what went wrong.
        message = exception_line(str(error.get("type", "Error")), str(error.get("message", "")))
        return {
            "passed": False,
            "races": False,
            "error": message[:300],
            # The engine's own emulation failed: undetermined, never the kernel's fault.
            "emulation_failed": error.get("phase") == "emulation",
        }
    outputs = run["outputs"]
    if not in_order:
        return {"passed": True, "races": run["races"], "error": "", "detail": ""}
    if structure_difference(raw.reference, raw.reference_tree, outputs, run["tree"]):
        return {"passed": False, "races": run["races"], "error": "", "detail": "its structure"}
    leaves = compare_outputs(raw.reference, outputs, raw.info.atol, raw.info.rtol)
    wrong = [leaf.stats for leaf in leaves if leaf.stats.mismatched]
    detail, max_error = "", 0.0
    if wrong:
        stats = wrong[0]
        max_error = max(s.max_abs_error for s in wrong)
        detail = (
            f"{stats.mismatched} of {stats.total} values of {stats.path} wrong"
            f"{f', {stats.nan_count} NaN' if stats.nan_count else ''}"
        )
    return {
        "passed": not wrong,
        "races": run["races"],
        "error": "",
        "detail": detail,
        "max_error": max_error,
    }


def target_note(results: dict[str, TargetResult]) -> str:
    """What the targets refused, first: a kernel its target refuses is not certified however
    right its numbers."""
    said: dict[str, list[str]] = {}  # one sentence for the targets that say the same
    for name, result in results.items():
        if not result.ok:
            text = result.error or "; ".join(result.undetermined)
            text = text.removeprefix(name).removeprefix(":").strip()
            if not result.error and not result.failure_class:  # nothing failed: not verified
                text = f"unverified: {text}"
            said.setdefault(text, []).append(name)
    return "".join(f"{', '.join(names)}: {text.rstrip('.')}. " for text, names in said.items())
