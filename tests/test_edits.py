"""Parsing a model's answer into an edit and applying it (pure logic, no JAX, no network)."""

from __future__ import annotations

import random

import pytest

from activities.fixers.edits import EditError, apply_answer, parse_blocks, summary_line

SOURCE = '''"""Softmax over rows."""

import jax
from jax.experimental import pallas as pl

BLOCK_R = 8


def _body(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x


def kernel(x):
    rows, cols = x.shape
    return pl.pallas_call(
        _body,
        grid=(rows // BLOCK_R,),
        in_specs=[pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BLOCK_R, cols), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
'''


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE\n"


def reason(answer: str, source: str = SOURCE) -> str:
    with pytest.raises(EditError) as info:
        apply_answer(source, answer)
    assert str(info.value) == info.value.reason
    return info.value.reason


def test_one_block_is_applied():
    answer = "Round the grid up.\n" + block(
        "        grid=(rows // BLOCK_R,),", "        grid=(pl.cdiv(rows, BLOCK_R),),"
    )
    result = apply_answer(SOURCE, answer)
    assert result == SOURCE.replace("rows // BLOCK_R", "pl.cdiv(rows, BLOCK_R)")


def test_blocks_apply_in_order_each_to_the_edited_source():
    first = block("BLOCK_R = 8", "BLOCK_R = 16")
    # The second block's SEARCH only exists after the first one applied.
    second = block("BLOCK_R = 16", "BLOCK_R = 32\nEXTRA = 1")
    result = apply_answer(SOURCE, "Two steps.\n" + first + "\n" + second)
    assert "BLOCK_R = 32\nEXTRA = 1\n" in result
    assert "BLOCK_R = 8" not in result and "BLOCK_R = 16" not in result


def test_blocks_inside_a_code_fence_and_multiline_with_deletion():
    answer = (
        "Drop the copy.\n```python\n"
        + block("    x = x_ref[...]\n    o_ref[...] = x", "    o_ref[...] = x_ref[...] * 2")
        + "```\n"
    )
    result = apply_answer(SOURCE, answer)
    assert "    o_ref[...] = x_ref[...] * 2\n" in result
    assert "    x = x_ref[...]\n" not in result


def test_trailing_whitespace_is_tolerated_both_ways():
    answer = block("BLOCK_R = 8   ", "BLOCK_R = 16")
    assert "BLOCK_R = 16\n" in apply_answer(SOURCE, answer)
    padded = SOURCE.replace("BLOCK_R = 8\n", "BLOCK_R = 8  \t\n")
    assert "BLOCK_R = 16\n" in apply_answer(padded, block("BLOCK_R = 8", "BLOCK_R = 16"))


def test_leading_whitespace_is_not_tolerated_and_the_reason_says_so():
    text = reason(block("grid=(rows // BLOCK_R,),", "grid=(1,),"))
    assert "not found" in text and "indentation" in text
    assert "'grid=(rows // BLOCK_R,),'" in text


def test_search_not_found_quotes_its_first_line():
    text = reason(block("\n    y = x_ref[0]\n    more", "    y = 1"))
    assert text == "SEARCH block 1 not found in the source (first line: 'y = x_ref[0]')"


def test_second_block_not_found_is_numbered():
    answer = block("BLOCK_R = 8", "BLOCK_R = 16") + block("nothing like this", "x = 1")
    assert reason(answer).startswith("SEARCH block 2 not found")


def test_a_partial_line_is_not_a_match():
    assert "not found" in reason(block("lambda i: (i, 0)", "lambda i: (0, i)"))


def test_empty_search():
    assert reason(block("", "x = 1")) == "SEARCH block 1 is empty"
    assert reason(block("\n  ", "x = 1")) == "SEARCH block 1 is empty"


def test_search_found_several_times():
    twice = SOURCE + "\nBLOCK_R = 8\n"
    text = reason(block("BLOCK_R = 8", "BLOCK_R = 16"), twice)
    assert text == (
        "SEARCH block 1 found 2 times in the source (first line: 'BLOCK_R = 8'); "
        "include more lines to make it unique"
    )


def test_search_with_prompt_line_numbers_gets_a_hint():
    text = reason(block("  7 | BLOCK_R = 8", "BLOCK_R = 16"))
    assert "not found" in text and "line numbers" in text


def test_no_edit_at_all():
    text = reason("I think the grid is wrong but I am not sure.")
    assert text == "no SEARCH/REPLACE block and no ```python block with the full file found"


def test_python_block_without_kernel():
    text = reason("Try this:\n```python\ndef helper():\n    return 1\n```\n")
    assert "no ```python block defines `kernel`" in text


def test_unclosed_python_block():
    text = reason("Here:\n```python\ndef kernel(x):\n    return x\n")
    assert "not closed" in text


def test_full_file_fallback_takes_the_last_block_defining_kernel():
    new = SOURCE.replace("rows // BLOCK_R", "pl.cdiv(rows, BLOCK_R)")
    answer = (
        "Rewrite.\n```python\nimport jax\n```\n"
        f"```python\n{SOURCE.replace('BLOCK_R = 8', 'BLOCK_R = 4')}```\n"
        f"Better:\n```py\n{new.rstrip()}\n```\nDone."
    )
    assert apply_answer(SOURCE, answer) == new  # the trailing newline is kept


def test_markers_win_over_fences():
    answer = "```python\ndef kernel(x):\n    return x\n```\n" + block("BLOCK_R = 8", "BLOCK_R = 16")
    assert "def _body" in apply_answer(SOURCE, answer)


def test_result_that_does_not_parse_names_the_line():
    text = reason(block("BLOCK_R = 8", "BLOCK_R = (8"))
    assert text.startswith("the edited source does not parse as Python:")
    assert "line " in text


def test_result_identical_to_the_source():
    assert reason(block("BLOCK_R = 8", "BLOCK_R = 8")) == "the edit leaves the source unchanged"
    assert reason(f"```python\n{SOURCE}```") == "the edit leaves the source unchanged"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("<<<<<<< SEARCH\nBLOCK_R = 8\n>>>>>>> REPLACE\n", "has no '=======' divider"),
        ("<<<<<<< SEARCH\nBLOCK_R = 8\n=======\nBLOCK_R = 9\n", "ends inside the SEARCH block"),
        (
            "<<<<<<< SEARCH\na\n=======\nb\n<<<<<<< SEARCH\nc\n=======\nd\n>>>>>>> REPLACE",
            "not closed by '>>>>>>> REPLACE'",
        ),
        ("x\n>>>>>>> REPLACE\n", "has no SEARCH before it"),
        ("", "the answer is empty"),
        ("   \n\n", "the answer is empty"),
    ],
)
def test_malformed_blocks(answer, expected):
    assert expected in reason(answer)


def test_non_text_answer_is_an_edit_error():
    with pytest.raises(EditError, match="empty"):
        apply_answer(SOURCE, None)  # type: ignore[arg-type]


def test_crlf_answer():
    answer = block("BLOCK_R = 8", "BLOCK_R = 16").replace("\n", "\r\n")
    assert "BLOCK_R = 16\n" in apply_answer(SOURCE, answer)


def test_parse_blocks():
    blocks = parse_blocks("text\n" + block("a\nb", "") + block("c", "d\ne"))
    assert [(b.search, b.replace) for b in blocks] == [(["a", "b"], [""]), (["c"], ["d", "e"])]
    assert parse_blocks("no markers") == []


def test_garbage_never_crashes():
    rng = random.Random(1234)
    pieces = [
        "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE", "```python", "```", "def kernel(x):",
        "BLOCK_R = 8", "    return x", "\x00", "é", "(", "", "    ", "\t", "{", "\r",
    ]  # fmt: skip
    for _ in range(2000):
        answer = "\n".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        try:
            result = apply_answer(SOURCE, answer)
        except EditError as exc:
            assert exc.reason
        else:
            assert isinstance(result, str) and result != SOURCE


def test_summary_line():
    assert summary_line("## **Round the grid up.**\n" + block("a", "b")) == "Round the grid up."
    assert summary_line("\n\n- Fix the mask\nmore") == "Fix the mask"
    assert summary_line(block("a", "b")) == "model edit"
    assert summary_line("```python\nx\n```") == "model edit"
    assert summary_line("") == "model edit"
    assert len(summary_line("x" * 500)) == 200
