"""Cut a candidate's exception down to the lines that point at the bug.

A JAX tracing error can carry a long traceback and a long message; an agent needs the candidate's
own line, the code on it, and the first lines of the message.
"""

from __future__ import annotations

import re
from typing import Any

from nearmiss.engine.errors import last_error_line
from nearmiss.engine.models import ErrorInfo

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
        # Keep the last line too: wrapped tracebacks end with the actual exception.
        hidden = len(lines) - MAX_MESSAGE_LINES
        lines = lines[: MAX_MESSAGE_LINES - 1] + [f"… ({hidden} more lines)", lines[-1]]
    return "\n".join(lines)


def headline(message: str) -> str:
    """The line that says what went wrong; for a wrapped traceback, its last line."""
    lines = [line for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    if "Traceback (most recent call last)" in lines[0] and len(lines) > 1:
        return f"{lines[0].split('Traceback')[0].strip()} {lines[-1].strip()}".strip()
    return lines[0]


_FAULT_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


def crash_evidence(log: str, candidate_name: str) -> tuple[str | None, list[str]]:
    """(location, excerpt) from a dead child's log: faulthandler's fatal-error line and frames.

    faulthandler lists the most recent call first; the first frame in the candidate's file is
    where it crashed.
    """
    location = None
    excerpt = []
    for line in log.splitlines():
        text = line.strip()
        if text.startswith("Fatal Python error"):
            excerpt.append(text)
        match = _FAULT_FRAME.search(text)
        if match and match["file"].endswith("/" + candidate_name):
            where = f"{candidate_name}:{match['line']}"
            location = location or where
            excerpt.append(f"{where} in {match['name']}")
    last = last_error_line(log)
    if not excerpt and last:
        excerpt = [trim_message(last)]
    return location, excerpt[: MAX_FRAMES + 1]


def summarise_error(raw: dict[str, Any], candidate_name: str) -> ErrorInfo:
    """ErrorInfo from the child's exception record, located in the candidate's own file."""
    frames = raw.get("frames")
    frames = [
        f
        for f in (frames if isinstance(frames, list) else [])
        if isinstance(f, dict) and str(f.get("file", "")).endswith("/" + candidate_name)
    ]
    location = source_line = None
    syntax = raw.get("syntax")
    if isinstance(syntax, dict) and str(syntax.get("file", "")).endswith(candidate_name):
        location = f"{candidate_name}:{syntax['line']}"
        source_line = (syntax.get("text") or "").strip() or None
    elif frames:
        deepest = frames[-1]
        location = f"{candidate_name}:{deepest.get('line')}"
        source_line = deepest.get("code") or None
    excerpt = [
        f"{candidate_name}:{f.get('line')} in {f.get('name')}: {f.get('code')}"
        for f in frames[-MAX_FRAMES:]
    ]
    message = trim_message(str(raw.get("message", "")))
    kind = str(raw.get("type", "Exception"))
    excerpt.append(f"{kind}: {headline(message)}")
    return ErrorInfo(
        phase=raw["phase"],
        type=kind,
        message=message,
        location=location,
        source_line=source_line,
        excerpt=excerpt,
    )
