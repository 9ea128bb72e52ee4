"""Turn a model's answer into an edited source: SEARCH/REPLACE blocks, or a whole file.

The preferred answer is one or more blocks::

    <<<<<<< SEARCH
    exact lines from the current file
    =======
    replacement lines
    >>>>>>> REPLACE

applied in order, each SEARCH matching exactly one run of whole lines of the (already edited)
source — exactly, or else ignoring trailing whitespace. Without any block marker, the last
fenced ```python block that defines ``kernel`` is taken as the whole new file. Every failure
is an ``EditError`` whose ``reason`` says precisely what was wrong, for the round's record and
for the next prompt; garbage in never crashes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from nearmiss.engine.inputs import parse_source

_SEARCH = re.compile(r"^\s*<{5,9}\s*SEARCH\s*$")
_DIVIDER = re.compile(r"^\s*={5,9}\s*$")
_REPLACE = re.compile(r"^\s*>{5,9}\s*REPLACE\s*$")
_ANY_MARKER = re.compile(r"^\s*(<{5,9}\s*SEARCH|>{5,9}\s*REPLACE)\s*$", re.MULTILINE)
# A fenced block: ``` or ```python / ```py / ```python3, up to a closing fence on its own line.
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)^[ \t]*```[ \t]*$",
    re.MULTILINE | re.DOTALL | re.IGNORECASE,
)
_FENCE_OPEN = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)[ \t]*$", re.MULTILINE | re.IGNORECASE)
_DEFINES_KERNEL = re.compile(
    r"^(?:def[ \t]+kernel[ \t]*\(|kernel[ \t]*(?::[^=\n]*)?=)", re.MULTILINE
)
# The prompt shows the source as "  12 | code"; a SEARCH copied with those numbers cannot match.
_NUMBERED = re.compile(r"^\s*\d+ \| ")


class EditError(Exception):
    """The answer holds no usable edit; ``reason`` says why in one line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Block:
    """One SEARCH/REPLACE block, as lists of lines without their newlines."""

    search: list[str]
    replace: list[str]


def _quote(lines: list[str]) -> str:
    first = next((line for line in lines if line.strip()), lines[0] if lines else "")
    first = first.strip()
    return repr(first if len(first) <= 80 else first[:77] + "...")


def parse_blocks(answer: str) -> list[Block]:
    """The SEARCH/REPLACE blocks of an answer, in order; [] when it has no marker at all."""
    blocks: list[Block] = []
    state: str | None = None  # in a block: "search", then "replace"
    start = 0
    search: list[str] = []
    replace: list[str] = []
    for number, line in enumerate(answer.split("\n"), 1):
        if state is None:
            if _SEARCH.match(line):
                state, search, start = "search", [], number
            elif _REPLACE.match(line):
                raise EditError(
                    f"'>>>>>>> REPLACE' at answer line {number} has no SEARCH before it"
                )
        elif state == "search":
            if _DIVIDER.match(line):
                state, replace = "replace", []
            elif _SEARCH.match(line) or _REPLACE.match(line):
                raise EditError(f"the SEARCH block at answer line {start} has no '=======' divider")
            else:
                search.append(line)
        elif _REPLACE.match(line):
            blocks.append(Block(search, replace))
            state = None
        elif _SEARCH.match(line) or _DIVIDER.match(line):
            raise EditError(
                f"the SEARCH block at answer line {start} is not closed by '>>>>>>> REPLACE'"
            )
        else:
            replace.append(line)
    if state is not None:
        raise EditError(
            f"the answer ends inside the SEARCH block at answer line {start} (truncated?)"
        )
    return blocks


def _occurrences(lines: list[str], search: list[str], key) -> list[int]:
    target = [key(line) for line in search]
    keyed = [key(line) for line in lines]
    n = len(target)
    return [i for i in range(len(keyed) - n + 1) if keyed[i : i + n] == target]


def apply_blocks(source: str, blocks: list[Block]) -> str:
    """Apply blocks in order to ``source``; each SEARCH must occur exactly once."""
    lines = source.split("\n")
    for k, block in enumerate(blocks, 1):
        if not any(line.strip() for line in block.search):
            raise EditError(f"SEARCH block {k} is empty")
        found = _occurrences(lines, block.search, lambda s: s)
        if not found:
            found = _occurrences(lines, block.search, str.rstrip)
        if not found:
            hint = ""
            if all(_NUMBERED.match(line) for line in block.search if line.strip()):
                hint = "; its lines carry the prompt's line numbers, quote the file without them"
            elif _occurrences(lines, block.search, str.strip):
                hint = "; it matches only if indentation is ignored, check the indentation"
            raise EditError(
                f"SEARCH block {k} not found in the source (first line: {_quote(block.search)})"
                + hint
            )
        if len(found) > 1:
            raise EditError(
                f"SEARCH block {k} found {len(found)} times in the source (first line: "
                f"{_quote(block.search)}); include more lines to make it unique"
            )
        i = found[0]
        lines[i : i + len(block.search)] = block.replace
    return "\n".join(lines)


def full_file(answer: str) -> str:
    """The last fenced Python block of the answer that defines ``kernel``."""
    bodies = [m.group(1) for m in _FENCE.finditer(answer)]
    with_kernel = [body for body in bodies if _DEFINES_KERNEL.search(body)]
    if with_kernel:
        return with_kernel[-1]
    if bodies:
        raise EditError("no SEARCH/REPLACE block, and no ```python block defines `kernel`")
    if _FENCE_OPEN.search(answer):
        raise EditError(
            "no SEARCH/REPLACE block, and the ```python block is not closed (truncated?)"
        )
    raise EditError("no SEARCH/REPLACE block and no ```python block with the full file found")


def check_result(source: str, result: str) -> str:
    """``result`` when it parses as Python and differs from ``source``; else an EditError."""
    try:
        parse_source(result)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno else "unknown line"
        text = (exc.text or "").strip()
        shown = f": {text[:80]!r}" if text else ""
        raise EditError(
            f"the edited source does not parse as Python: {exc.msg} at {where}{shown}"
        ) from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise EditError(f"the edited source does not parse as Python: {exc}") from None
    if result == source:
        raise EditError("the edit leaves the source unchanged")
    return result


def apply_answer(source: str, answer: str) -> str:
    """The new full source from a model's ``answer`` to ``source``, or ``EditError(reason)``."""
    if not isinstance(answer, str) or not answer.strip():
        raise EditError("the answer is empty")
    answer = answer.replace("\r\n", "\n")
    if _ANY_MARKER.search(answer):
        blocks = parse_blocks(answer)
        result = apply_blocks(source, blocks)
    else:
        result = full_file(answer)
        if source.endswith("\n") and not result.endswith("\n"):
            result += "\n"
    return check_result(source, result)


def summary_line(answer: str, default: str = "model edit") -> str:
    """The first line of the explanation before any block or fence, without markdown."""
    if not isinstance(answer, str):
        return default
    for line in answer.replace("\r\n", "\n").split("\n"):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("```") or _SEARCH.match(stripped):
            return default
        text = re.sub(r"^(#+|[-*>]|\d+[.)])\s+", "", stripped).replace("**", "").strip()
        if text:
            return text if len(text) <= 200 else text[:197] + "..."
    return default
