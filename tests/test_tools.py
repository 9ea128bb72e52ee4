"""The fix agent's tools on real corpus kernels: run_case, error_map, probe, lower, run_tool.

Each sandboxed tool call starts the spec's and the candidate's children (about 1–2 s here); the
argument checks, refusals, schemas and the pieces of pure logic run without any child.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import OPS, ROOT
from nearmiss.engine.runner.selection import CUSTOM, SelectionError, select_cases
from nearmiss.engine.spec import load_spec
from nearmiss.engine.tools import (
    TOOL_NAMES,
    TOOL_SCHEMAS,
    error_map,
    lower,
    probe,
    run_case,
    run_tool,
)
from nearmiss.engine.tools import experiment as experiment_module
from nearmiss.engine.tools.error_map import picture, tile_counts
from nearmiss.engine.tools.text import SUMMARY_CHARS, capped, clip, finish

SOFTMAX = OPS / "softmax_rows"
CUMSUM = OPS / "cumsum_rows"
MATMUL = OPS / "matmul"
CARRY_PROBE = (ROOT / "tests" / "probes" / "cumsum_carry.py").read_text()
# The carry at the start of column block j of row r should be sum(x[r, :128 j]): 0 for j = 0.
CARRY_REFERENCE = "jnp.pad(jnp.cumsum(x, axis=1)[:, 127:-1:128], ((0, 0), (1, 0)))"


def line_of(path, text: str) -> str:
    """``<file name>:<line>`` of the first line of ``path`` holding ``text``."""
    lines = path.read_text().splitlines()
    return f"{path.name}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


def _bounded(summary: str) -> None:
    assert summary and len(summary) <= SUMMARY_CHARS


# run_case -------------------------------------------------------------------------------------


def test_run_case_on_a_named_case_through_run_tool():
    result = run_tool(
        "run_case",
        '{"case": "ragged"}',  # as the model sends it: JSON text
        spec_path=SOFTMAX / "spec.py",
        candidate_path=SOFTMAX / "variants" / "floor_grid.py",
    )
    assert result.ok and result.tool == "run_case"
    json.dumps(result.data)  # events and reports take it as is
    case = result.data["case"]
    assert (case["suite"], case["name"]) == ("extended", "ragged")
    assert case["dims"] == {"R": 45, "C": 320}
    assert case["inputs"] == ["x: float32[45, 320]"]
    verdict = result.data["result"]
    assert not verdict["passed"] and verdict["failure_class"] == "boundary"
    assert verdict["leaves"][0]["nan_count"] == 5 * 320
    assert verdict["localisation"]["axes"][0]["bad_ranges"] == "40-44"
    assert verdict["localisation"]["heatmap"] is None  # the map is error_map's
    assert "FAIL boundary" in result.summary and "40-44" in result.summary
    _bounded(result.summary)


def test_run_case_on_a_custom_case_varies_the_first_compact_case():
    # The compact case (R=64) passes; 45 rows leave the floor-divided grid a ragged tail.
    outcome = run_case(SOFTMAX / "spec.py", SOFTMAX / "variants" / "floor_grid.py", dims={"R": 45})
    assert outcome.ok
    assert (outcome.case.suite, outcome.case.dims) == (CUSTOM, {"R": 45, "C": 256})
    assert outcome.result.failure_class == "boundary"
    assert outcome.summary.startswith("case custom R=45 C=256 float32 normal")


@pytest.mark.parametrize(
    ("request_", "allowed"),
    [
        ({"case": "nope"}, "cases: base (compact), ragged (extended), large (extended)"),
        ({"profile": "huge"}, "allowed: large, normal"),
    ],
)
def test_a_case_the_spec_does_not_allow_is_an_error_naming_what_it_allows(request_, allowed):
    outcome = run_case(SOFTMAX / "spec.py", SOFTMAX / "golden.py", **request_)
    assert not outcome.ok and outcome.result is None
    assert allowed in outcome.error and outcome.summary.startswith("error: invalid case request")


def test_selection_of_named_and_custom_cases():
    spec = load_spec(CUMSUM / "spec.py")
    assert [c.name for _, c in select_cases(spec, "extended", None)] == ["ragged", "bf16", "drift"]
    assert select_cases(spec, "all", {"case": "bf16"})[0][0] == "extended"
    # A variation that changes nothing is the named case itself, with its suite and seed.
    assert select_cases(spec, "all", {"case": "ragged", "dims": {"R": 20}})[0][1].name == "ragged"
    suite, case = select_cases(
        spec, "all", {"case": "bf16", "dims": {"C": 300}, "profile": "positive_drift"}
    )[0]
    assert (suite, case.dims, case.dtype, case.profile) == (
        CUSTOM,
        {"R": 16, "C": 300},
        "bfloat16",
        "positive_drift",
    )
    problems = {
        "unknown dimension 'Q'; this spec's dimensions are R, C": {"dims": {"Q": 2}},
        "dimension C=0 must be an integer in 1..4096": {"dims": {"C": 0}},
        "dimension R=161 must be an integer in 1..160": {"dims": {"R": 161}},
        "dtype 'float16' is not one this spec tests; allowed: float32, bfloat16": {
            "dtype": "float16"
        },
    }
    for message, request_ in problems.items():
        with pytest.raises(SelectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
            select_cases(spec, "all", request_)


# error_map ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "variant", "block", "grid", "bad_tiles", "picture_rows"),
    [
        # Floor-divided grid: the last, partial row block is never written.
        ("softmax_rows", "floor_grid", [8, 320], [6, 1], [[5, 0]], [".", ".", ".", ".", ".", "#"]),
        # Unmasked ragged column block: NaN padding poisons the last column tile of every row.
        ("cumsum_rows", "unmasked_tail", [8, 128], [3, 3], [[0, 2], [1, 2], [2, 2]], ["..#"] * 3),
    ],
)
def test_error_map_shows_the_bad_tiles(op, variant, block, grid, bad_tiles, picture_rows):
    candidate = OPS / op / "variants" / f"{variant}.py"
    outcome = error_map(OPS / op / "spec.py", candidate, case="ragged")
    assert outcome.ok and outcome.failure_class == "boundary" and outcome.tail_axes
    tiles = outcome.tiles
    assert (tiles.unit, tiles.block_shape, tiles.grid_shape) == ("tile", block, grid)
    assert [t.tile for t in tiles.listed] == bad_tiles and tiles.bad == len(bad_tiles)
    assert all(t.bad == t.total for t in tiles.listed)  # every element of those tiles is bad
    assert [row.split()[-1] for row in tiles.picture] == picture_rows
    assert outcome.heatmap is not None
    assert "\n".join(tiles.picture) in outcome.summary
    _bounded(outcome.summary)


def test_error_map_of_a_case_that_does_not_compile_gives_the_error():
    candidate = MATMUL / "variants" / "index_map_arity.py"
    outcome = error_map(MATMUL / "spec.py", candidate)
    assert outcome.ok and outcome.tiles is None and outcome.failure_class == "compile_error"
    where = line_of(candidate, "return pl.pallas_call(")  # the call its index map breaks
    assert outcome.run_error.location == where
    assert "nothing to map" in outcome.summary and where in outcome.summary


def test_tile_counts_and_a_grouped_picture():
    bad = np.zeros((20, 300), dtype=bool)
    bad[8:16, :] = True  # one whole tile row of 8 × 128 blocks
    counts, totals = tile_counts(bad, [8, 128])
    assert counts.tolist() == [[0, 0, 0], [1024, 1024, 352], [0, 0, 0]]
    assert totals[2].tolist() == [512, 512, 176]  # the partial edge tiles
    lines, cell = picture(np.arange(80 * 70).reshape(80, 70) % 7 == 0, np.ones((80, 70), int))
    assert cell == [3, 3] and len(lines) == 27 and all(len(line.split()[1]) == 24 for line in lines)


# probe ----------------------------------------------------------------------------------------


def test_probe_points_at_the_carry_that_is_not_reset():
    outcome = probe(
        CUMSUM / "spec.py",
        CUMSUM / "variants" / "reset_once.py",
        CARRY_PROBE,
        case="ragged",  # 20 rows: three row blocks, so row block 1 shows the stale carry
        reference={
            "carry_in": CARRY_REFERENCE,
            "broken": "jnp.cumsum(x, axis=7)",
            "absent": "x * 2",
        },
    )
    assert outcome.ok and outcome.probe_error is None
    values = {v.name: v for v in outcome.values}
    assert values["carry_in"].shape == [20, 3] and values["carry_in"].nan_count == 0
    assert values["out"].dtype == "float32"
    carry, broken, absent = outcome.comparisons
    # Row block 0 starts from zero; row block 1 (rows 8-15) inherits row block 0's totals.
    assert carry.first_index == [8, 0] and carry.differing > 0 and carry.note is None
    assert "out of bounds" in broken.note and broken.reference is None
    assert absent.note == "the probe returned no value named 'absent'"
    assert "first at [8, 0]" in outcome.summary and "never certifies" in outcome.summary
    _bounded(outcome.summary)


@pytest.mark.parametrize(
    ("source", "reference", "rule"),
    [
        ("import os\n\ndef probe(x):\n    return {'cwd': os.getcwd()}\n", {}, "forbidden_import"),
        (
            "def probe(x):\n    try:\n        return {'x': x}\n    except Exception:\n"
            "        return {}\n",
            {},
            "exception_fallback",
        ),
        (
            "def probe(x):\n    return {'x': x}\n",
            {"x": "__import__('os').getcwd()"},
            "forbidden_import",
        ),
    ],
)
def test_a_probe_that_breaks_the_integrity_rules_is_refused_and_never_runs(
    monkeypatch, source, reference, rule
):
    def no_run(*args, **kwargs):
        raise AssertionError("a refused probe must not start a sandbox")

    monkeypatch.setattr(experiment_module, "run_sandboxed", no_run)
    outcome = probe(SOFTMAX / "spec.py", SOFTMAX / "golden.py", source, reference=reference)
    assert not outcome.ok and outcome.values == []
    assert rule in {v.rule for v in outcome.refused}
    assert outcome.summary.startswith("error: probe refused by the integrity gate, not run")


def test_a_probe_that_raises_gives_its_error_and_line():
    source = "import jax.numpy as jnp\n\n\ndef probe(x):\n    return {'y': x.reshape(3, 7)}\n"
    outcome = probe(SOFTMAX / "spec.py", SOFTMAX / "golden.py", source)
    assert outcome.ok and outcome.values == []
    error = outcome.probe_error
    assert (error.phase, error.type, error.location) == ("trace", "TypeError", "probe.py:5")
    assert "the probe failed" in outcome.summary and "probe.py:5" in outcome.summary


# lower ----------------------------------------------------------------------------------------


def test_lower_for_tpu_reports_the_tiling_rule_and_the_kernel_line():
    # Rank-1 blocks break Mosaic's tiling rule for 1-D blocks; CPU interpret mode runs them
    # happily (the corpus's near-miss for TPU v5e).
    matvec = OPS / "matvec"
    candidate = matvec / "variants" / "tpu_rank1_blocks.py"
    outcome = lower(matvec / "spec.py", candidate, platform="tpu")
    assert outcome.ok, outcome.error
    if outcome.status == "unavailable":
        pytest.skip(f"this JAX cannot lower for TPU: {outcome.detail}")
    assert outcome.status == "failed" and outcome.target == "tpu"
    assert outcome.lowering_error.location == line_of(candidate, "def _matvec_body(")
    assert "block shape" in outcome.lowering_error.message
    assert outcome.summary.startswith("case compact/base") and "FAILED lowering" in outcome.summary
    _bounded(outcome.summary)


def test_lower_for_a_gpu_says_ok_or_the_lowerings_refusal_plainly():
    import jax

    outcome = lower(SOFTMAX / "spec.py", SOFTMAX / "golden.py", platform="gpu")
    assert outcome.ok and outcome.jax_version == jax.__version__
    assert outcome.status == "ok", outcome.summary
    if jax.default_backend() == "cpu":  # the gpu target's own lowering, as Pallas runs it
        assert "without a GPU (1 through Pallas' Triton lowering" in outcome.detail
        # The ragged case's (8, 320) block: Triton's power-of-two rule, in the lowering's words.
        refused = lower(SOFTMAX / "spec.py", SOFTMAX / "golden.py", platform="gpu", case="ragged")
        assert refused.ok and refused.status == "failed", refused.summary
        assert "Triton needs power-of-two block shapes" in refused.lowering_error.message


# run_tool and the schemas ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("kb_magic", {}, "unknown tool 'kb_magic'; tools: run_case, error_map, probe, lower"),
        ("probe", {"case": "base"}, "missing required probe_source"),
        ("run_case", {"dims": [45]}, "argument dims must be an object of integer values"),
        ("run_case", {"dims": {"R": "45"}}, "argument dims must be an object of integer values"),
        ("run_case", {"seed": -1}, "argument seed must be an integer >= 0"),
        ("run_case", {"rows": 4}, "unknown argument(s) rows; usage: run_case(case: a string"),
        ("lower", {"platform": "cpu"}, "argument platform must be one of tpu, gpu"),
        ("error_map", "{not json", "arguments are not valid JSON"),
        ("error_map", "[1, 2]", "arguments must be a JSON object"),
    ],
)
def test_run_tool_turns_bad_arguments_into_error_results(monkeypatch, name, arguments, message):
    monkeypatch.setattr(experiment_module, "run_sandboxed", None)  # nothing may run
    result = run_tool(name, arguments, spec_path=SOFTMAX / "spec.py", candidate_path="none.py")
    assert not result.ok and message in result.summary and result.data["error"]


def test_run_tool_reports_a_missing_candidate_and_an_engine_failure(monkeypatch):
    result = run_tool("run_case", {}, spec_path=SOFTMAX / "spec.py", candidate_path="none.py")
    assert not result.ok and result.summary == "error: candidate file not found: none.py"

    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(experiment_module, "run_sandboxed", broken)
    golden = SOFTMAX / "golden.py"
    spec = SOFTMAX / "spec.py"
    result = run_tool("run_case", {"seed": 4.0}, spec_path=spec, candidate_path=golden)
    assert not result.ok and "RuntimeError: disk full" in result.summary


def test_tool_schemas_are_openai_function_tools():
    assert TOOL_NAMES == ("run_case", "error_map", "probe", "lower")
    for schema in json.loads(json.dumps(TOOL_SCHEMAS)):
        assert schema["type"] == "function"
        function = schema["function"]
        assert function["description"] and function["parameters"]["type"] == "object"
        assert function["parameters"]["additionalProperties"] is False
        properties = function["parameters"]["properties"]
        assert set(function["parameters"]["required"]) <= set(properties)
        assert all(p["description"] and p["type"] for p in properties.values())
    probe_schema = TOOL_SCHEMAS[2]["function"]["parameters"]
    assert probe_schema["required"] == ["probe_source"]
    assert TOOL_SCHEMAS[3]["function"]["parameters"]["properties"]["platform"]["enum"] == [
        "tpu",
        "gpu",
    ]


def test_text_is_bounded():
    assert clip("x" * 1000, 100).endswith("more chars)") and len(clip("x" * 1000, 100)) <= 100
    assert capped(["a", "b", "c"], 2) == ["a", "b", "… 1 more"]
    text = finish([f"line {i} " + "y" * 90 for i in range(100)])
    assert len(text) <= SUMMARY_CHARS and text.endswith("more lines)")


def test_a_probe_without_a_probe_function_is_refused(monkeypatch):
    monkeypatch.setattr(experiment_module, "run_sandboxed", None)  # nothing may run
    source = "def kernel(x):\n    return x\n"
    outcome = probe(SOFTMAX / "spec.py", SOFTMAX / "golden.py", source, reference={"": "x"})
    assert outcome.summary == "error: probe_source defines no top-level function `probe`"


@pytest.mark.parametrize("tool", ["run_case", "error_map", "lower"])
def test_a_candidate_the_gate_would_not_execute_is_not_executed_by_a_tool(monkeypatch, tool):
    monkeypatch.setattr(experiment_module, "run_sandboxed", None)  # nothing may run
    cheat = OPS / "integrity" / "cheats" / "credential_reader.py"
    result = run_tool(tool, {}, spec_path=SOFTMAX / "spec.py", candidate_path=cheat)
    assert not result.ok
    assert "not executed" in result.summary and "import of `os`" in result.summary
