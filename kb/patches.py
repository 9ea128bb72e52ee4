"""Learned patches: a diff from one certified repair, re-applied to another kernel.

The diff of a repair is kept as unified-diff hunks. To apply one elsewhere, each hunk's old lines
are looked up in the target comparing stripped text (indentation and trailing spaces may differ
between kernels); when the surrounding context differs too, the changed lines alone must match.
A hunk must match exactly once, or the patch does not apply: a wrong guess costs a validation
round, an ambiguous one could edit the wrong place.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class Hunk:
    old: list[str]  # context and removed lines, in order
    new: list[str]  # context and added lines, in order
    removed: list[str]  # only the lines the hunk removes
    added: list[str]  # only the lines it adds


def make_diff(before: str, after: str) -> str:
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile="before",
            tofile="after",
            n=1,
        )
    )


def parse_hunks(diff: str) -> list[Hunk]:
    hunks: list[Hunk] = []
    current: Hunk | None = None
    for line in diff.splitlines():
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            current = Hunk([], [], [], [])
            hunks.append(current)
        elif current is None:
            continue
        elif line.startswith("-"):
            current.old.append(line[1:])
            current.removed.append(line[1:])
        elif line.startswith("+"):
            current.new.append(line[1:])
            current.added.append(line[1:])
        else:
            text = line[1:] if line.startswith(" ") else line
            current.old.append(text)
            current.new.append(text)
    return [h for h in hunks if h.removed or h.added]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _find(lines: list[str], block: list[str]) -> list[int]:
    wanted = [b.strip() for b in block]
    size = len(wanted)
    return [
        i
        for i in range(len(lines) - size + 1)
        if [x.strip() for x in lines[i : i + size]] == wanted
    ]


def _reindent(block: list[str], reference: str, target: str) -> list[str]:
    """Move ``block`` from the diff's indentation (``reference``) to the target's."""
    out = []
    for line in block:
        if line.strip() and line.startswith(reference):
            out.append(target + line[len(reference) :])
        else:
            out.append(line)
    return out


def apply_patch(diff: str, source: str) -> str | None:
    """The source with every hunk applied, or None when any hunk does not match exactly once."""
    hunks = parse_hunks(diff)
    if not hunks:
        return None
    lines = source.splitlines()
    for hunk in hunks:
        for old, new in ((hunk.old, hunk.new), (hunk.removed, hunk.added)):
            if not old:
                continue
            found = _find(lines, old)
            if len(found) == 1:
                start = found[0]
                target = _indent(lines[start])
                lines[start : start + len(old)] = _reindent(new, _indent(old[0]), target)
                break
        else:
            return None
    patched = "\n".join(lines) + ("\n" if source.endswith("\n") else "")
    return patched if patched != source else None


def _line_opcodes(before: str, after: str) -> tuple[list[str], list[str], list[tuple]]:
    """Both texts as lines, and difflib's opcodes from the first to the second."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    return old, new, difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()


def change_blocks(before: str, after: str) -> list[tuple[int, int, int, int]]:
    """The places ``after`` differs from ``before``, line by line: ``(i1, i2, j1, j2)``, the
    lines ``before[i1:i2]`` that became ``after[j1:j2]`` (difflib's opcodes that change)."""
    _, _, opcodes = _line_opcodes(before, after)
    return [(i1, i2, j1, j2) for tag, i1, i2, j1, j2 in opcodes if tag != "equal"]


def with_blocks_undone(before: str, after: str, undone: set[int]) -> str:
    """``after`` with the change blocks numbered in ``undone`` (``change_blocks``) put back as
    they were in ``before``."""
    old, new, opcodes = _line_opcodes(before, after)
    out: list[str] = []
    block = 0
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "equal":
            out.extend(new[j1:j2])
            continue
        out.extend(old[i1:i2] if block in undone else new[j1:j2])
        block += 1
    return "".join(out)
