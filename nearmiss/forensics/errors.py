"""Cut a candidate's exception down to the lines that point at the bug.

A JAX tracing error can carry a long traceback and a long message; an agent needs the candidate's
own line, the code on it, and the first lines of the message.
"""

from __future__ import annotations

from typing import Any

from nearmiss.models import ErrorInfo

MAX_MESSAGE_LINES = 8
MAX_LINE_CHARS = 300
MAX_FRAMES = 4
# Boilerplate JAX appends to its errors; it says nothing about the kernel.
_NOISE_PREFIXES = (
    "For simplicity, JAX has removed",
    "--------------------",
    "The stack trace below excludes",
    "See https://",
)


def trim_message(message: str) -> str:
    lines = [
        line[:MAX_LINE_CHARS] + ("…" if len(line) > MAX_LINE_CHARS else "")
        for line in message.strip().splitlines()
        if line.strip() and not line.strip().startswith(_NOISE_PREFIXES)
    ]
    if len(lines) > MAX_MESSAGE_LINES:
        lines = lines[:MAX_MESSAGE_LINES] + [f"… ({len(lines) - MAX_MESSAGE_LINES} more lines)"]
    return "\n".join(lines)


def summarise_error(raw: dict[str, Any], candidate_name: str) -> ErrorInfo:
    """ErrorInfo from the child's exception record, located in the candidate's own file."""
    frames = [f for f in raw.get("frames", []) if f["file"].endswith("/" + candidate_name)]
    location = source_line = None
    syntax = raw.get("syntax")
    if syntax and str(syntax.get("file", "")).endswith(candidate_name):
        location = f"{candidate_name}:{syntax['line']}"
        source_line = (syntax.get("text") or "").strip() or None
    elif frames:
        deepest = frames[-1]
        location = f"{candidate_name}:{deepest['line']}"
        source_line = deepest["code"] or None
    excerpt = [
        f"{candidate_name}:{f['line']} in {f['name']}: {f['code']}" for f in frames[-MAX_FRAMES:]
    ]
    message = trim_message(raw.get("message", ""))
    excerpt.append(f"{raw['type']}: {message.splitlines()[0] if message else ''}")
    return ErrorInfo(
        phase=raw["phase"], type=raw["type"], message=message, location=location,
        source_line=source_line, excerpt=excerpt,
    )
