"""``probe``: run an instrumented variant of the kernel and summarise what it captured.

The agent writes a whole file defining ``probe(*inputs)`` that returns a dict name → array
(typically the kernel with intermediates written to extra outputs of its pallas_call), plus,
optionally, reference expressions for some of those names. The probe passes the same static
integrity gate as a candidate before anything runs, then runs in the untrusted sandbox child with
the expressions; the engine only ever sees arrays, and computes every statistic itself. A probe
summarises — it never certifies anything, and its result never enters a verdict.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from nearmiss.engine.check import binds_kernel, case_result, require_file
from nearmiss.engine.errors import UsageError
from nearmiss.engine.forensics.compare import compare_leaf
from nearmiss.engine.inputs import parse_source
from nearmiss.engine.integrity.static import static_violations
from nearmiss.engine.models import Violation
from nearmiss.engine.runner.session import Entry, Limits, RawCase
from nearmiss.engine.tools.experiment import CaseRequest, Refused, case_ref, refusal, run_one
from nearmiss.engine.tools.models import Comparison, ProbeResult, ValueStats
from nearmiss.engine.tools.text import case_line, clip, error_lines, finish, number

PROBE_MODULE = "nearmiss.engine.runner.probe_child"
PROBE_FILE = "probe.py"
MAX_SOURCE_CHARS = 64_000
MAX_EXPRESSIONS = 12
MAX_EXPRESSION_CHARS = 1000
MAX_NAME_CHARS = 64
MAX_LISTED = 12


def admit_probe(source: str, reference: dict[str, str]) -> list[Violation]:
    """The integrity rules the probe or its expressions break (the probe must not run when
    any is broken); Refused for what is not a probe at all."""
    if len(source) > MAX_SOURCE_CHARS:
        raise Refused(f"probe_source has {len(source)} characters; at most {MAX_SOURCE_CHARS}")
    if len(reference) > MAX_EXPRESSIONS:
        raise Refused(f"{len(reference)} reference expressions; at most {MAX_EXPRESSIONS}")
    if binds_kernel(source, "probe") is False:
        raise Refused("probe_source defines no top-level function `probe`")
    violations = static_violations(source, PROBE_FILE)
    for name, expression in reference.items():
        if not 0 < len(name) <= MAX_NAME_CHARS:
            raise Refused(f"reference names must have 1 to {MAX_NAME_CHARS} characters")
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise Refused(f"reference {name!r} is longer than {MAX_EXPRESSION_CHARS} characters")
        try:
            parse_source(expression, mode="eval")
        except SyntaxError as exc:
            raise Refused(f"reference {name!r} is not one Python expression: {exc.msg}") from exc
        violations += static_violations(expression, f"reference[{name}]")
    return violations


def value_stats(name: str, array: np.ndarray) -> ValueStats:
    values = np.asarray(array).astype(np.float64)
    finite = values[np.isfinite(values)]
    return ValueStats(
        name=name,
        shape=list(values.shape),
        dtype=np.asarray(array).dtype.name,
        min=float(finite.min()) if finite.size else None,
        max=float(finite.max()) if finite.size else None,
        mean=float(finite.mean()) if finite.size else None,
        nan_count=int(np.isnan(values).sum()),
        inf_count=int(np.isinf(values).sum()),
    )


def compare(name: str, expression: str, got, want, atol: float, rtol: float) -> Comparison:
    """The probe's value against the reference's, with the case's tolerances."""
    result = Comparison(name=name, expression=clip(expression, 300), atol=atol, rtol=rtol)
    result.reference = value_stats(name, want)
    if got is None:
        result.note = f"the probe returned no value named {name!r}"
    elif got.shape != want.shape:
        result.note = f"shapes differ: probe {list(got.shape)}, reference {list(want.shape)}"
    else:
        leaf = compare_leaf(name, want, got, atol, rtol)
        result.differing, result.total = leaf.stats.mismatched, leaf.stats.total
        result.max_abs_diff = leaf.stats.max_abs_error
        result.worst_index = leaf.stats.worst_index
        if leaf.stats.mismatched:
            result.first_index = [int(i) for i in np.argwhere(leaf.bad)[0]]
    return result


def _captured(raw: RawCase) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, str]]:
    """(probe values, reference values, expression errors) as the child filed them, checked:
    the child is untrusted, so a malformed filing is an error, never believed."""
    extra, arrays = raw.output_extra, raw.outputs or []
    names, ref_names = extra.get("names"), extra.get("reference_names")
    errors = extra.get("reference_errors")
    if not (
        isinstance(names, list)
        and isinstance(ref_names, list)
        and isinstance(errors, dict)
        and all(isinstance(n, str) for n in names + ref_names)
        and all(isinstance(v, str) for v in errors.values())
        and len(names) + len(ref_names) == len(arrays)
    ):
        raise Refused("the probe's child filed an unusable result")
    values = dict(zip(names, arrays[: len(names)], strict=True))
    return values, dict(zip(ref_names, arrays[len(names) :], strict=True)), errors


def _summary(result: ProbeResult) -> str:
    lines = [f"probe on {case_line(result.case)}"] if result.case else []
    if result.probe_error is not None:
        return finish([*lines, "the probe failed:", *error_lines(result.probe_error)])
    lines.append("values (min / max / mean over finite elements; NaN; Inf):")
    for v in result.values:
        lines.append(
            f"  {v.name} {v.dtype}{v.shape}: {number(v.min)} / {number(v.max)} / "
            f"{number(v.mean)}; NaN {v.nan_count}; Inf {v.inf_count}"
        )
    if result.more_values:
        lines.append(f"  … {result.more_values} more values")
    if result.comparisons:
        lines.append("against the reference expressions (first = first differing index):")
    for c in result.comparisons:
        head = f"{c.name} vs `{clip(c.expression, 120)}`"
        if c.note:
            lines.append("  " + clip(f"{head}: {c.note}"))
        elif c.differing == 0:
            lines.append(f"  {head}: all {c.total} match (max abs diff {number(c.max_abs_diff)})")
        else:
            lines.append(
                f"  {head}: {c.differing}/{c.total} differ (atol {c.atol:g}, rtol {c.rtol:g}); "
                f"max abs diff {number(c.max_abs_diff)}; first at {c.first_index}; "
                f"worst at {c.worst_index}"
            )
    return finish(lines + ["(a probe only summarises: it never certifies a kernel)"])


def probe(
    spec_path: str | Path,
    candidate_path: str | Path,
    probe_source: str,
    *,
    reference: dict[str, str] | None = None,
    case: str | None = None,
    dims: dict[str, int] | None = None,
    dtype: str | None = None,
    profile: str | None = None,
    seed: int = 0,
    limits: Limits | None = None,
) -> ProbeResult:
    """Run ``probe_source``'s ``probe(*inputs)`` on one case (chosen as in run_case) and
    summarise each array it returns, compared with ``reference`` expressions where given.

    ``candidate_path`` is the kernel the probe instruments; the probe itself is self-contained.
    """
    reference = dict(reference or {})
    try:
        refused = admit_probe(probe_source, reference)
    except Refused as exc:
        return refusal(ProbeResult, str(exc), seed=seed)
    if refused:
        details = "; ".join(f"{v.rule}: {v.detail}" for v in refused[:5])
        message = (
            f"probe refused by the integrity gate, not run ({details}). Probes and reference "
            "expressions follow the candidate's rules: import only jax, numpy and pure standard "
            "modules; no try/except, no interpret=, no callbacks, no eval/open/getattr/dunders"
        )
        return refusal(ProbeResult, message, seed=seed, refused=refused)
    entry = Entry(PROBE_MODULE, "probe", {"expressions": reference})
    with tempfile.TemporaryDirectory(prefix="nearmiss-probe-") as folder:
        path = Path(folder) / PROBE_FILE
        path.write_text(probe_source)
        try:
            require_file("spec", Path(spec_path))
            _, raw = run_one(
                spec_path, path, CaseRequest(case, dims, dtype, profile), seed, limits, entry
            )
            result = ProbeResult(case=case_ref(raw), seed=seed)
            if raw.outputs is None:
                result.probe_error = case_result(raw, PROBE_FILE).error
                result.summary = _summary(result)
                return result
            values, references, errors = _captured(raw)
        except (Refused, UsageError) as exc:
            return refusal(ProbeResult, str(exc), seed=seed)
    stats = [value_stats(name, array) for name, array in values.items()]
    result.values, result.more_values = stats[:MAX_LISTED], max(0, len(stats) - MAX_LISTED)
    for name, expression in reference.items():
        want = references.get(name)
        if want is None:
            failure = errors.get(name, "no value came back")
            note = f"the expression failed: {clip(failure, 240)}"
            result.comparisons.append(Comparison(name=name, expression=expression, note=note))
            continue
        got = values.get(name)
        result.comparisons.append(
            compare(name, expression, got, want, raw.info.atol, raw.info.rtol)
        )
    result.summary = _summary(result)
    return result
