"""The fix, not a patch that passes: a certified candidate with every change it does not need
put back.

A fixer's edit can carry more than the fix: a model rewrites a neighbouring line, a search
keeps a harmless edit it tried first, a hostile proposal hides a change that only fires on
inputs the spec does not list (``+ where(num_programs(2) > 16, 0.5, 0)`` in an init). The
certified candidate is then what the user is handed and what the knowledge base learns, hidden
change included, and a learned patch re-applies it to other kernels at zero tokens.

``trimmed`` takes the original and the certified candidate apart into change blocks (the line
ranges where they differ, ``kb.patches.change_blocks``) and, one block at a time, puts the
block back as the original had it and checks the result on the same suite and seed: where it
still certifies, that block was not part of the fix and stays undone. What is left is the
smallest candidate, block by block, that the check still certifies; each block undone is said
("the spec cannot tell the fix with and without it apart"), since the spec passing both does
not prove the block useless on inputs it does not list.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kb.patches import change_blocks, with_blocks_undone

# Change blocks tried one by one (each costs a full check); a fix with more is left as it is.
MAX_BLOCKS = 6


async def trimmed(
    original: str, fixed: str, certifies: Callable[[str], Awaitable[Any | None]]
) -> tuple[str, Any | None, list[str]]:
    """``(smallest text, the check of it or None where nothing was undone, what was undone)``.
    ``certifies(text)`` checks a candidate: its report where it certifies, else None."""
    blocks = change_blocks(original, fixed)
    if not 2 <= len(blocks) <= MAX_BLOCKS:
        return fixed, None, []
    undone: set[int] = set()
    kept_report = None
    for index in range(len(blocks)):
        if len(undone) + 1 == len(blocks):
            break  # the last change left: without it the candidate is the original
        trial = with_blocks_undone(original, fixed, undone | {index})
        report = await certifies(trial)
        if report is not None:
            undone.add(index)
            kept_report = report
    if not undone:
        return fixed, None, []
    text = with_blocks_undone(original, fixed, undone)
    fixed_lines = fixed.splitlines()
    said = []
    for index in sorted(undone):
        _, _, j1, j2 = blocks[index]
        shown = next((line.strip() for line in fixed_lines[j1:j2] if line.strip()), "")
        where = f"line {j1 + 1}" if j2 - j1 <= 1 else f"lines {j1 + 1}-{j2}"
        said.append(
            f"{where} of the proposed fix ({shown[:80] or 'a removal'}): undone, the candidate "
            "certifies without it; the spec cannot tell the fix with and without it apart"
        )
    return text, kept_report, said
