"""A target's verdict over a check's cases: the evidence the executor gathered, judged.

Per case the run holds the candidate child's lowering for the target's chip (a refusal counts
against the candidate; an artifact proves nothing by itself), the target compiler's verdict on
that artifact and its grid report (``integrity.grid``). A target accepts the kernel when every
case lowered, compiled where it has a compiler here, and kept the target's grid semantics with
nothing left undetermined. Pure: plain dicts in, a ``TargetResult`` out.
"""

from __future__ import annotations

from typing import Any

from nearmiss.engine.models import FailureClass, TargetResult
from nearmiss.engine.targets.vmem import close_to_limit

MAX_FINDINGS = 5


def judge_target(
    target: str,
    verified_by: str,
    structure: str | None,
    compiles: bool,
    cases: list[dict[str, Any]],
) -> TargetResult:
    """``cases``: per case ``{"key", "exported" (bool), "lowered", "compiled", "grid", "error"}``.

    ``structure`` None: the interpret target, whose verdict is the numbers'; the caller says so.
    """
    result = TargetResult(ok=True, verified_by=verified_by)
    if structure is None:
        return result
    seen_findings: set[tuple] = set()
    compile_s = 0.0
    for case in cases:
        key = case["key"]
        if not case.get("exported"):
            _unverified(result, f"{key}: the kernel did not export")
            continue
        lowered = case.get("lowered") or {}
        if not lowered.get("ok"):
            why = lowered.get("error") or "the lowering failed without saying why"
            if structure != target:
                # A lowering borrowed to read the grid (the gpu target's, through a TPU
                # lowering without a GPU): its refusal is that lowering's, not the target's.
                _unverified(
                    result,
                    f"{key}: its grid could not be read without a {target.upper()}: the TPU "
                    f"lowering it is read from failed: {why}",
                )
            else:
                _refused(result, f"{target} refuses the kernel ({key}): {why}")
            continue
        if case.get("error"):
            _unverified(result, f"{key}: {case['error']}")
            continue
        compiled = case.get("compiled")
        if compiles:
            if not isinstance(compiled, dict):
                _unverified(result, f"{key}: the target's compiler gave no verdict")
                continue
            compile_s += float(compiled.get("compile_s") or 0.0)
            memory = compiled.get("memory") or {}
            if _footprint(memory) >= _footprint(result.memory):
                result.memory = {k: int(v) for k, v in memory.items() if isinstance(v, int)}
            warning = close_to_limit(memory, target) if compiled.get("ok") else None
            if warning and not any(n.startswith("VMEM close") for n in result.notes):
                result.notes.append(warning)
            if not compiled.get("ok"):
                why = compiled.get("error") or "the compiler failed without saying why"
                _refused(result, f"{target} refuses the kernel ({key}): {why}")
                continue
        grid = case.get("grid")
        if not isinstance(grid, dict):
            _unverified(result, f"{key}: the kernel's grid could not be read")
            continue
        for finding in grid.get("findings", []):
            signature = (finding.get("kind"), finding.get("kernel"), finding.get("output"))
            if signature in seen_findings:
                continue
            seen_findings.add(signature)
            if len(result.findings) < MAX_FINDINGS:
                result.findings.append(dict(finding) | {"case": key})
            result.ok = False
            result.failure_class = result.failure_class or "grid_race"
            result.error = result.error or f"{target}: {finding.get('detail', '')}"
        footprint = lowered.get("footprint") or {}
        races = any(f.get("kind") == "grid_race" for f in grid.get("findings", []))
        if races and footprint.get("why") and len(result.notes) < MAX_FINDINGS:
            # why the race stands at block level: what each program stores was not taken
            result.notes.append(f"{key}: no footprint of the stores: {footprint['why']}"[:300])
        for item in grid.get("undetermined", []):
            _unverified(result, f"{key}: {item.get('reason') or 'undetermined'}")
        for note in grid.get("notes", []):
            if note not in result.notes and len(result.notes) < MAX_FINDINGS:
                result.notes.append(str(note)[:300])
        if "triton" in lowered:
            _judge_triton(result, target, key, lowered["triton"], case.get("triton"))
        _judge_semantics(result, target, key, case.get("semantics"), seen_findings)
    if compiles:
        result.compile_s = round(compile_s, 3)
    return result


def _judge_triton(result: TargetResult, target: str, key: str, lowering: Any, read: Any) -> None:
    """The kernel through Pallas' Triton lowering, or Mosaic GPU's where it asks for it
    (``targets.triton``): a refusal, in the candidate child, counts against the candidate (its
    text names the lowering); its modules count only once the executor has read and verified
    them. A grid race found first stays the verdict's class."""
    lowering = lowering if isinstance(lowering, dict) else {}
    if lowering.get("ok") is False:
        _refused_too(
            result,
            f"{target} refuses the kernel ({key}): "
            f"{lowering.get('error') or 'a GPU lowering refused it without saying why'}",
        )
        return
    if lowering.get("ok") is None:
        _unverified(result, f"{key}: the GPU lowering did not run: {lowering.get('error')}")
        return
    if not isinstance(read, dict) or read.get("ok") is None:
        why = read.get("error") if isinstance(read, dict) else "no GPU module reached it"
        _unverified(result, f"{key}: the engine could not read the GPU lowering: {why}")
    elif not read.get("ok"):
        _refused_too(result, f"{target} refuses the kernel ({key}): {read.get('error')}")


def _refused_too(result: TargetResult, error: str) -> None:
    """A refusal that leaves a grid race already found as the verdict's class."""
    if result.failure_class == "grid_race":
        result.ok = False
        if len(result.findings) < MAX_FINDINGS:
            result.findings.append({"kind": "compile_error", "detail": error[:300]})
        return
    _refused(result, error)


def _judge_semantics(
    result: TargetResult, target: str, key: str, run: dict | None, seen: set[tuple]
) -> None:
    """The case under the target's interpreter (TPU interpret mode) with the chip's arithmetic,
    then with values nobody wrote in fresh memory: an operation the chip leaves undefined, a
    race, an exception, or numbers that differ from program order's are findings, each named
    for what the chip does differently."""
    if run is None:
        return
    if run.get("emulation_failed"):
        _unverified(result, f"{key}: {run.get('error')}")
        return
    fill = run.get("fill") or {}
    fill_error = str(fill.get("error") or "")
    if fill_error.startswith("NotImplementedError"):
        _unverified(result, f"{key}: {fill_error}")
        fill = {}
    undefined = run.get("undefined") or []
    reduced = run.get("reduced") or []
    fill_ok = not fill or (fill.get("passed") and not fill.get("races"))
    if run.get("passed") and not run.get("races") and fill_ok and not undefined:
        return
    failure: FailureClass = "grid_race"
    if undefined:
        first = undefined[0]
        kind, failure = "undefined_on_chip", "runtime_error"
        text = (
            f"{first.get('what')} at {first.get('line')} is undefined on {target}: its compiler "
            "may give any value there, where XLA on a CPU gives a fixed one"
        )
    elif run.get("races"):
        kind, text = (
            "race_detected",
            (
                "TPU interpret mode's race detector saw two unordered accesses to one buffer: "
                "TensorCores sharing a block along an axis declared 'parallel', or a DMA used "
                "before its wait"
            ),
        )
    elif run.get("error"):
        kind, failure = "interpreter_error", "runtime_error"
        text = f"it raised under TPU semantics: {run['error']}"
    elif not run.get("passed") and reduced and fill_ok:
        # Right in float32 with the same order and arbitrary fill: its matmul precision.
        kind, failure = "chip_precision", "precision"
        error = float(run.get("max_error") or 0.0)
        text = (
            f"{describe_reduced(reduced[0], target)}: {run.get('detail') or 'its output differs'}"
            f" (max error {error:.2g} > atol {float(run.get('atol') or 0.0):g}); pass "
            "precision=jax.lax.Precision.HIGHEST to the dot, or loosen the spec's float32 "
            f"tolerance to about {2 * error:.1g}"
        )
    elif not run.get("passed"):
        kind = "order_dependent"
        text = (
            f"under TPU semantics ('parallel' axes in a random order, fresh buffers NaN) "
            f"{run.get('detail') or 'its output differs'}, though it is right in program order"
        )
    elif fill.get("error"):
        kind, failure = "interpreter_error", "runtime_error"
        text = f"it raised with values nobody wrote in fresh memory: {fill['error']}"
    else:
        kind, failure = "fill_dependent", "wrong_values"
        text = (
            f"with fresh buffers and block padding holding values nobody wrote, as on the hardware "
            f"(not NaN), {fill.get('detail') or 'its output differs'}, though it is right with NaN "
            "there: the kernel tells padding or unwritten memory by its value; mask by index "
            "and initialise what it reads"
        )
    result.ok = False
    if (kind, key) not in seen and len(result.findings) < MAX_FINDINGS:
        seen.add((kind, key))
        result.findings.append({"kind": kind, "case": key, "detail": text})
    if result.failure_class != "compile_error":
        result.failure_class = result.failure_class or failure
    result.error = result.error or f"{target} ({key}): {text}"


_PASS_WORDS = {
    "1": "one bfloat16 pass",
    "3": "three bfloat16 passes",
    "tf32": "TF32 (operands cut to a 10-bit mantissa)",
}


def describe_reduced(entry: dict[str, Any], target: str) -> str:
    """One line for a float32 matmul the target computes in bfloat16 passes or TF32
    (``runner.chip_arithmetic``)."""
    passes = _PASS_WORDS.get(str(entry.get("passes")), "bfloat16 passes")
    where = "in the kernel" if str(entry.get("in_kernel")) == "True" else "outside the kernel"
    return (
        f"a float32 dot at {entry.get('precision') or 'DEFAULT'} precision ({where}, "
        f"{entry.get('line') or '?'}) runs as {passes} on {target}"
    )


def _footprint(memory: dict[str, Any]) -> int:
    return sum(int(memory.get(k) or 0) for k in ("argument_bytes", "output_bytes", "temp_bytes"))


def _refused(result: TargetResult, error: str) -> None:
    result.ok = False
    result.failure_class = "compile_error"
    if result.error is None:
        result.error = error[:600]


def _unverified(result: TargetResult, reason: str) -> None:
    result.ok = False
    if reason not in result.undetermined and len(result.undetermined) < MAX_FINDINGS:
        result.undetermined.append(reason[:300])
