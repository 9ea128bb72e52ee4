"""Compact text for the model: every summary is bounded, whatever the kernel or probe did.

A tool's summary enters the prompt of every later turn, so nothing in it may grow with the size
of a kernel, an output or an error message: strings are clipped, lists cut with "… N more".
"""

from __future__ import annotations

from collections.abc import Sequence

from nearmiss.engine.forensics.errors import headline
from nearmiss.engine.models import ErrorInfo
from nearmiss.engine.tools.models import CaseRef

SUMMARY_CHARS = 2000
LINE_CHARS = 300


def clip(text: str, limit: int = LINE_CHARS) -> str:
    """``text`` cut to about ``limit`` characters, saying how much was cut."""
    text = text.strip()
    if len(text) <= limit:
        return text
    note = f" … ({len(text) - limit} more chars)"
    return text[: max(0, limit - len(note))].rstrip() + note


def capped(items: Sequence[str], limit: int) -> list[str]:
    """The first ``limit`` items, then one saying how many were left out."""
    items = list(items)
    if len(items) <= limit:
        return items
    return items[:limit] + [f"… {len(items) - limit} more"]


def finish(lines: Sequence[str], limit: int = SUMMARY_CHARS) -> str:
    """Join a summary's lines, dropping whole lines from the end once over ``limit``."""
    kept: list[str] = []
    used = 0
    for index, line in enumerate(lines):
        if used + len(line) + 1 > limit - 40:
            kept.append(f"… ({len(lines) - index} more lines)")
            break
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)


def number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def case_line(case: CaseRef) -> str:
    """'case extended/ragged R=45 C=320 float32 normal; inputs x: float32[45, 320]'."""
    dims = " ".join(f"{k}={v}" for k, v in case.dims.items())
    inputs = f"; inputs {', '.join(capped(case.inputs, 6))}" if case.inputs else ""
    label = case.name if case.suite == case.name else f"{case.suite}/{case.name}"
    return clip(
        f"case {label} {dims} {case.dtype} {case.profile}{inputs}; "
        f"tolerance atol={case.atol:g} rtol={case.rtol:g}",
        400,
    )


def _shape(values: Sequence[int]) -> str:
    """A grid or block as Pallas writes it: (5,), (6, 1)."""
    inner = ", ".join(str(v) for v in values)
    return f"({inner},)" if len(values) == 1 else f"({inner})"


def _count(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


def grid_line(
    kernel_grid: Sequence[int] | None,
    block_shape: Sequence[int] | None = None,
    tiles: Sequence[int] | None = None,
) -> str | None:
    """The kernel's grid beside the output tiles its blocks make, one form for every tool:
    'grid: kernel (5,) = 5 programs; output block (8, 320) needs (6, 1) = 6 tiles'. None when
    there is nothing to show."""
    parts = []
    if kernel_grid:
        n = _count(kernel_grid)
        parts.append(f"kernel {_shape(kernel_grid)} = {n} program{'s' if n != 1 else ''}")
    if block_shape and tiles:
        n = _count(tiles)
        parts.append(
            f"output block {_shape(block_shape)} needs {_shape(tiles)} = {n} "
            f"tile{'s' if n != 1 else ''}"
        )
    return "grid: " + "; ".join(parts) if parts else None


def error_lines(
    error: ErrorInfo, message_lines: int = 6, first_chars: int = LINE_CHARS
) -> list[str]:
    """Where it failed (the file's own line when known), what, and the message's first lines."""
    where = f" at {error.location}" if error.location else ""
    code = f" (`{clip(error.source_line, 120)}`)" if error.source_line else ""
    first = f"{error.phase} error{where}{code}: {error.type}: {headline(error.message)}"
    lines = [clip(first, first_chars)]
    rest = [line for line in error.message.splitlines()[1:] if line.strip()]
    lines += [f"  {clip(line, 200)}" for line in capped(rest, message_lines)]
    frames = [f for f in error.excerpt if not f.startswith(f"{error.type}:")]
    if frames:
        lines.append("  trace: " + clip(" | ".join(capped(frames, 4)), 400))
    return lines
