"""Trimming a certified fix (``activities.trim``): the changes a candidate does not need are
put back as the original had them, one change block at a time, each judged by a check.

The check here is a stand-in that certifies exactly the texts holding the real fix, as the
engine would for a kernel whose spec only tells that line; the engine's own trimming of a
model's proposal runs end to end in ``test_learning``."""

from __future__ import annotations

from activities.trim import trimmed
from kb.patches import change_blocks, with_blocks_undone

ORIGINAL = "a = 1\nb = 2\nscale = 1.0 / d\nc = 3\ne = 5\n"
FIX = "scale = 1.0 / math.sqrt(d)"
# The fix, plus a line changed above it and one added below: neither is needed.
PROPOSED = "a = 1\nb = 2 * (n > 16) or 2\n" + FIX + "\nc = 3\nhidden = 0\ne = 5\n"


def test_change_blocks_are_undone_one_by_one():
    blocks = change_blocks(ORIGINAL, PROPOSED)
    assert len(blocks) == 2  # the b/scale lines changed together, the added line apart
    assert with_blocks_undone(ORIGINAL, PROPOSED, set()) == PROPOSED
    assert with_blocks_undone(ORIGINAL, PROPOSED, {0, 1}) == ORIGINAL
    assert "hidden" not in with_blocks_undone(ORIGINAL, PROPOSED, {1})


async def test_what_the_fix_does_not_need_is_put_back_and_said():
    original = "a = 1\nscale = 1.0 / d\nc = 3\nd2 = 4\ne = 5\n"
    proposed = "a = 1\n" + FIX + "\nc = 3\nd2 = 4 + 0 * (n > 16)\ne = 5\nhidden = 1\n"
    checked: list[str] = []

    async def certifies(text: str):
        checked.append(text)
        return {"certified": text} if FIX in text else None

    text, report, said = await trimmed(original, proposed, certifies)
    assert text == "a = 1\n" + FIX + "\nc = 3\nd2 = 4\ne = 5\n"
    assert report == {"certified": text}  # the check of the text handed back
    assert len(said) == 2 and all("the spec cannot tell" in s for s in said)
    assert "line 4 of the proposed fix (d2 = 4 + 0 * (n > 16))" in said[0]
    # each block tried once; the fix itself is never left undone
    assert len(checked) == 3 and all(FIX in t for t in checked[1:])


async def test_a_fix_of_one_change_or_with_every_change_needed_is_left_as_it_is():
    async def never(text: str):
        return None

    one = await trimmed("x = 1\n", "x = 2\n", never)
    assert one == ("x = 2\n", None, [])
    both = await trimmed("x = 1\ny = 1\nz = 1\n", "x = 2\ny = 1\nz = 2\n", never)
    assert both == ("x = 2\ny = 1\nz = 2\n", None, [])
