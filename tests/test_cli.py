"""`nearmiss check`: the JSON contract, the human table and the exit codes."""

from __future__ import annotations

import json

import pytest

from conftest import OPS, PLANTED, SOFTMAX_SPEC, check_json, run_cli

GOLDEN = OPS / "softmax_rows" / "golden.py"
REQUIRED_KEYS = {"certified", "failure_class", "failure_classes", "integrity", "cases"}


@pytest.mark.end_to_end
def test_certified_kernel_exits_0_with_the_json_contract():
    code, report = check_json(SOFTMAX_SPEC, GOLDEN)
    assert code == 0
    assert set(report) >= REQUIRED_KEYS
    assert report["certified"] is True and report["failure_class"] is None
    assert report["integrity"]["ok"] is True and isinstance(report["integrity"]["violations"], list)
    assert {c["suite"] for c in report["cases"]} == {"compact", "extended", "hidden"}
    for case in report["cases"]:
        assert {"suite", "name", "passed"} <= set(case)
    assert report["seed"] == 7


@pytest.mark.end_to_end
def test_not_certified_exits_1_and_a_syntax_error_in_the_candidate_is_a_finding():
    code, report = check_json(SOFTMAX_SPEC, PLANTED / "syntax_error.py", "--suite", "compact")
    assert code == 1
    assert report["certified"] is False
    assert report["failure_class"] == "compile_error"
    assert report["failure_classes"] == ["compile_error"]


@pytest.mark.end_to_end
def test_human_output_is_a_table_with_the_verdict_and_diagnosis():
    result = run_cli(
        "check", SOFTMAX_SPEC, OPS / "softmax_rows" / "variants" / "floor_grid.py", "--seed", "3"
    )
    assert result.returncode == 1
    out = result.stdout
    assert "suite" in out and "ragged" in out and "FAIL boundary" in out
    assert "verdict: NOT CERTIFIED — boundary" in out
    assert "diagnosis: boundary:" in out


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


SPEC_HEAD = "import jax\nimport jax.numpy as jnp\nfrom nearmiss.engine.spec import Case, OpSpec\n"


def _spec_with(reference="lambda x: x * 2", make_inputs="lambda case, key: (jnp.ones((8, 8)),)"):
    return SPEC_HEAD + (
        f"SPEC = OpSpec(name='t', category='elementwise', reference={reference}, "
        f"make_inputs={make_inputs}, compact=[Case('base', {{'N': 8}})])\n"
    )


@pytest.mark.end_to_end
@pytest.mark.parametrize(
    ("spec_text", "candidate_text", "message"),
    [
        (None, "def kernel(x):\n    return x\n", "spec file not found"),
        ("SPEC = (\n", "def kernel(x):\n    return x\n", "syntax error in spec"),
        ("X = 1\n", "def kernel(x):\n    return x\n", "defines no SPEC"),
        (_spec_with(), "def helper(x):\n    return x\n", "defines no `kernel`"),
        (_spec_with(), "kernel = None\n", "defines no callable `kernel`"),
        (
            _spec_with(reference="lambda x: x.undefined_attr"),
            "def kernel(x):\n    return x\n",
            "reference raised on compact case 'base'",
        ),
        (
            _spec_with(make_inputs="lambda case, key: [1, 2]"),
            "def kernel(x):\n    return x\n",
            "make_inputs must return a tuple of arrays",
        ),
        (
            _spec_with(make_inputs="lambda case, key: jnp.ones(3)"),
            "def kernel(x):\n    return x\n",
            "make_inputs must return a tuple of arrays",
        ),
        (
            SPEC_HEAD + "SPEC = OpSpec(name='t', category='sorting', reference=abs, "
            "make_inputs=abs, compact=[Case('b', {'N': 1})])\n",
            "def kernel(x):\n    return x\n",
            "unknown category 'sorting'",
        ),
    ],
    ids=[
        "missing-spec",
        "spec-syntax",
        "no-SPEC",
        "no-kernel",
        "kernel-not-callable",
        "reference-raises",
        "inputs-not-arrays",
        "inputs-not-tuple",
        "bad-category",
    ],
)
def test_unusable_input_is_one_line_and_exit_2(tmp_path, spec_text, candidate_text, message):
    spec = tmp_path / "spec.py" if spec_text is None else _write(tmp_path, "spec.py", spec_text)
    candidate = _write(tmp_path, "cand.py", candidate_text)
    result = run_cli("check", spec, candidate, "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert result.stdout == ""


def test_missing_candidate_and_bad_arguments_exit_2(tmp_path):
    result = run_cli("check", SOFTMAX_SPEC, tmp_path / "nope.py")
    assert result.returncode == 2 and "candidate file not found" in result.stderr
    result = run_cli("check", SOFTMAX_SPEC, GOLDEN, "--suite", "everything")
    assert result.returncode == 2
    result = run_cli("check", SOFTMAX_SPEC, GOLDEN, "--timeout", "-1")
    assert result.returncode == 2


@pytest.mark.end_to_end
def test_json_is_parseable_even_when_the_candidate_prints(tmp_path):
    noisy = _write(
        tmp_path,
        "noisy.py",
        GOLDEN.read_text().replace(
            "def kernel(x):", "print('{\"certified\": true}')\n\n\ndef kernel(x):"
        ),
    )
    result = run_cli("check", SOFTMAX_SPEC, noisy, "--json", "--suite", "compact")
    assert result.returncode == 0
    assert json.loads(result.stdout)["certified"] is True


@pytest.mark.end_to_end
def test_a_forbidden_import_blocks_certification_and_execution(tmp_path):
    cheat = _write(tmp_path, "cheat.py", "import os\n" + GOLDEN.read_text())
    code, report = check_json(SOFTMAX_SPEC, cheat, "--suite", "compact")
    assert code == 1 and report["certified"] is False
    assert report["cases"] == []  # the gate refused to run it
    assert report["integrity"]["ok"] is False
    assert report["integrity"]["violations"][0] == {
        "rule": "forbidden_import",
        "detail": "import of `os` at cheat.py:1",
    }
    assert report["diagnosis"].startswith("Integrity violated (forbidden_import)")
    assert "not executed" in report["diagnosis"]


@pytest.mark.end_to_end
def test_a_fallback_blocks_certification_though_the_numbers_pass(tmp_path):
    body = GOLDEN.read_text().replace(
        "    return pl.pallas_call(",
        "    try:\n        pass\n    except ValueError:\n"
        "        return x\n    return pl.pallas_call(",
    )
    cheat = _write(tmp_path, "cheat.py", body)
    code, report = check_json(SOFTMAX_SPEC, cheat, "--suite", "compact")
    assert code == 1 and report["certified"] is False
    assert report["cases"][0]["passed"] is True  # executed, numerically right, still refused
    assert [v["rule"] for v in report["integrity"]["violations"]] == ["exception_fallback"]


@pytest.mark.end_to_end
def test_report_and_off_modes_never_certify_a_kernel_the_gate_would_refuse():
    """A CI job that reads only the exit code is not fooled by one flag: without the gate
    enforcing, the numbers' verdict is ``passed``, and ``certified`` stays false (exit 1)."""
    cheat = OPS / "integrity" / "cheats" / "plain_jnp_softmax.py"
    code, report = check_json(SOFTMAX_SPEC, cheat, "--suite", "compact", "--integrity", "report")
    assert code == 1 and report["certified"] is False and report["passed"] is True
    assert report["integrity"]["mode"] == "report"
    assert "no_pallas_call" in {v["rule"] for v in report["integrity"]["violations"]}
    code, report = check_json(SOFTMAX_SPEC, cheat, "--suite", "compact", "--integrity", "off")
    assert code == 1 and report["certified"] is False and report["passed"] is True
    assert report["integrity"]["violations"] == [] and report["integrity"]["rules_checked"] == []


def test_session_options_become_guards_and_bad_values_are_usage_errors(capsys):
    import pytest

    from nearmiss.cli.main import build_parser
    from nearmiss.cli.options import guards_from

    args = build_parser().parse_args(
        ["fleet", "dir", "--tool-calls-per-round", "0", "--max-rounds", "2"]
    )
    guards = guards_from(args)
    assert guards.max_tool_calls_per_round == 0 and guards.max_rounds == 2
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["repair", "s", "c", "--tool-calls-per-round", "-1"])
    assert exit_.value.code == 2 and "must be 0 or more" in capsys.readouterr().err


def test_a_reader_that_goes_away_ends_the_output_quietly():
    """`nearmiss ... | head -1`: no BrokenPipeError traceback once the reader has gone."""
    import subprocess
    import sys

    from conftest import ROOT

    process = subprocess.Popen(
        [sys.executable, "-m", "nearmiss.cli", "corpus", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    process.stdout.close()  # the reader is gone before the first line
    _, stderr = process.communicate(timeout=120)
    assert b"Traceback" not in stderr and b"BrokenPipe" not in stderr
    assert process.returncode == 0


async def test_a_progress_query_the_worker_fails_is_said_once_and_never_fatal(capsys):
    # A worker that cannot replay a session fails its queries (a nondeterminism error); the
    # command following it shows no progress, says why once, and waits on for the result.
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from nearmiss.client.faults import progress_or_none

    class Handle:
        id = "repair-x"

        def __init__(self, error):
            self.error, self.asked = error, 0

        async def query(self, query):
            self.asked += 1
            if self.error is None:
                return "progress"
            raise self.error

    failing = Handle(WorkflowQueryFailedError("[TMPRL1100] Nondeterminism error: ..."))
    assert [await progress_or_none(failing, None) for _ in range(3)] == [None] * 3
    assert failing.asked == 3
    said = capsys.readouterr().err
    assert said.count("no progress from repair-x") == 1 and "Nondeterminism" in said
    away = Handle(RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b""))
    assert await progress_or_none(away, None) is None
    assert capsys.readouterr().err == ""
    assert await progress_or_none(Handle(None), None) == "progress"
