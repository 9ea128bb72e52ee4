"""`nearmiss repair` as a user runs it: configured services, or the embedded stack it starts."""

from __future__ import annotations

import json
import os
from pathlib import Path

from fake_openai import FakeOpenAI, answer

from conftest import OPS, PLANTED, private_stack, run_cli
from infra.devstack import PostgresService, pid_alive
from nearmiss.engine.check import check

SOFTMAX = OPS / "softmax_rows"


def test_repair_with_a_model_certifies_writes_the_fix_and_prints_json(
    temporal_address, postgres_dsn, tmp_path
):
    candidate = tmp_path / "floor_grid.py"
    candidate.write_text((SOFTMAX / "variants" / "floor_grid.py").read_text())
    # The candidate's author planted a link where the fix is written by default: before, the
    # repair wrote the certified kernel through it, over any file the user could write.
    victim = tmp_path / "authorized_keys"
    victim.write_text("ssh-ed25519 AAAA the user's own key\n")
    (tmp_path / "floor_grid.fixed.py").symlink_to(victim)
    fix = (
        "Round the grid up.\n"
        "<<<<<<< SEARCH\n        grid=(rows // BLOCK_R,),\n=======\n"
        "        grid=(pl.cdiv(rows, BLOCK_R),),\n>>>>>>> REPLACE\n"
    )
    with FakeOpenAI() as fake:
        fake.script(answer(fix, prompt_tokens=700, cached_tokens=100, completion_tokens=40))
        env = dict(
            os.environ,
            TEMPORAL_ADDRESS=temporal_address,
            NEARMISS_DATABASE_URL=postgres_dsn,
            OPENAI_BASE_URL=fake.base_url,  # the SDK's own variables are honoured
            OPENAI_API_KEY="test-key",
        )
        result = run_cli(
            "repair", SOFTMAX / "spec.py", candidate, "--model", "openai:fake", "--json", env=env
        )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is True and report["rounds"] == 1
    assert report["stop_reason"] == "certified" and report["session_id"].startswith("repair-")
    assert report["tokens"] == {"input": 700, "cached_input": 100, "output": 40}
    fixed = tmp_path / "floor_grid.fixed.py"
    assert report["fixed_path"] == str(fixed)
    assert "pl.cdiv(rows, BLOCK_R)" in fixed.read_text()
    assert "+        grid=(pl.cdiv(rows, BLOCK_R),)," in report["diff"]
    assert not fixed.is_symlink() and victim.read_text() == "ssh-ed25519 AAAA the user's own key\n"


def test_a_repair_blocked_by_the_integrity_gate_says_so(temporal_address, postgres_dsn, tmp_path):
    # Right numbers, the work done by XLA outside the kernel: the playbook has no edit for an
    # integrity verdict, and the stop names the gate's rule and line, not "nothing to fix".
    candidate = tmp_path / "copy_kernel_softmax.py"
    candidate.write_text((OPS / "integrity" / "cheats" / "copy_kernel_softmax.py").read_text())
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    result = run_cli("repair", OPS / "softmax_rows" / "spec.py", candidate, "--json", env=env)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is False and report["stop_reason"] == "integrity"
    assert "wrapper_compute" in report["stop_detail"], report["stop_detail"]
    assert "copy_kernel_softmax.py:" in report["stop_detail"]


def test_a_repair_for_a_tpu_target_ends_certified_for_it(temporal_address, postgres_dsn, tmp_path):
    # Right in interpret mode, refused by TPU v5e (64-wide blocks off the (8, 128) tiling): the
    # playbook repairs it from the target's own error, and the certificate is for tpu-v5e.
    matmul = OPS / "matmul"
    candidate = tmp_path / "tpu_misaligned_block.py"
    candidate.write_text((matmul / "variants" / "tpu_misaligned_block.py").read_text())
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    result = run_cli(
        "repair", matmul / "spec.py", candidate, "--target", "tpu-v5e", "--json", env=env
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is True and report["stop_reason"] == "certified"
    assert report["rounds"] >= 1  # not certified as it was: the target refused it
    assert report["targets"] == {"tpu-v5e": True}  # what the certificate covers
    fixed = Path(report["fixed_path"])
    assert "BM, BN, BK = 64, 64, 64" not in fixed.read_text()
    # The certified kernel compiles for the target (libtpu, compile-only), checked afresh.
    again = check(matmul / "spec.py", fixed, "compact", 1, targets=("tpu-v5e",))
    tpu = again.targets["tpu-v5e"]
    assert again.certified and tpu.ok and tpu.compile_s > 0, again.diagnosis


def test_a_float32_dot_too_coarse_on_the_chip_is_repaired_for_it_at_zero_tokens(
    temporal_address, postgres_dsn, tmp_path
):
    # The cumsum golden without its precision=HIGHEST: right on a CPU, one bfloat16 pass on
    # TPU v5e, 8e-2 off at atol 2e-4. The target names the dot; the playbook asks it for
    # float32, and the certificate is for tpu-v5e.
    cumsum = OPS / "cumsum_rows"
    candidate = tmp_path / "cumsum_default_precision.py"
    golden = (cumsum / "golden.py").read_text()
    assert "precision=jax.lax.Precision.HIGHEST, " in golden
    candidate.write_text(golden.replace("precision=jax.lax.Precision.HIGHEST, ", ""))
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    result = run_cli(
        "repair", cumsum / "spec.py", candidate, "--target", "tpu-v5e", "--json", env=env
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is True and report["rounds"] >= 1
    assert report["tokens"]["input"] == 0 and report["targets"] == {"tpu-v5e": True}
    assert "Precision.HIGHEST" in Path(report["fixed_path"]).read_text()


def test_without_configured_services_the_embedded_stack_runs_for_the_command(tmp_path):
    config = private_stack(tmp_path / "state")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TEMPORAL_ADDRESS", "NEARMISS_DATABASE_URL")
    }
    env.update(
        NEARMISS_HOME=str(config.home),
        NEARMISS_TEMPORAL_PORT=str(config.temporal_port),
        NEARMISS_POSTGRES_PORT=str(config.postgres_port),
    )
    candidate = PLANTED / "gpu_col_sum.py"  # already right on a GPU: certified without a round
    try:
        # For the GPU without a GPU: on its own stack the command's worker serves that target
        # too (emulated), as nobody else can.
        result = run_cli(
            "repair", OPS / "col_sum" / "spec.py", candidate, "--target", "gpu", env=env
        )
    finally:
        PostgresService(config).remove_data()
    assert result.returncode == 0, result.stderr
    assert "starting the embedded dev stack" in result.stderr
    assert "CERTIFIED after 0 round(s)" in result.stdout
    assert "targets: gpu ok" in result.stdout
    # It stopped what it started: no pidfile left pointing at a live process.
    pidfile = config.home / "run" / "temporal.pid"
    assert not pidfile.exists() or not pid_alive(int(pidfile.read_text()))


def test_bad_input_is_a_usage_error(tmp_path):
    spec = SOFTMAX / "spec.py"
    missing = run_cli("repair", spec, tmp_path / "nope.py")
    assert missing.returncode == 2 and "candidate file not found" in missing.stderr
    model = run_cli("repair", spec, SOFTMAX / "golden.py", "--model", "gpt")
    assert model.returncode == 2 and "unknown model" in model.stderr


def test_repair_with_the_search_certifies_a_bug_no_recipe_knows(
    temporal_address, postgres_dsn, tmp_path
):
    # The body names its two input refs in the wrong order: no recipe's pattern, so the search
    # screens single-site mutants and proposes the swap back; zero tokens, through the workflow.
    search = Path(__file__).parent / "search"
    candidate = tmp_path / "axpy.py"
    candidate.write_text((search / "axpy_swapped_refs.py").read_text())
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    result = run_cli(
        "repair", search / "axpy_spec.py", candidate, "--model", "search", "--json", env=env
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is True and report["tokens"]["input"] == 0
    assert "def _axpy_body(x_ref, y_ref, o_ref):" in (tmp_path / "axpy.fixed.py").read_text()


def test_a_search_repair_never_certifies_a_patch_the_hidden_cases_refuse(
    temporal_address, postgres_dsn, tmp_path
):
    """The spec lists one case, two row blocks: zeroing the accumulator on every block but the
    second (``!= 1``) passes it as well as the fix (``== 0``). The certifying check's hidden
    cases draw more rows (the spec's domain) and refuse the first; whatever the search ends
    with, a certified kernel is right on four blocks too."""
    search = Path(__file__).parent / "search"
    spec = search / "col_sum_one_case_spec.py"
    candidate = tmp_path / "col_sum.py"
    candidate.write_text((search / "col_sum_init_on_second.py").read_text())
    wrong = tmp_path / "wrong_patch.py"
    wrong.write_text(candidate.read_text().replace("== 1)", "!= 1)"))
    refused = check(spec, wrong, "all", 5)
    assert all(c.passed for c in refused.cases if c.suite == "compact")  # the one case admits it
    assert not refused.certified and any(
        c.suite == "hidden" and not c.passed for c in refused.cases
    )
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    result = run_cli("repair", spec, candidate, "--model", "search", "--json", env=env)
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    if report["certified"]:
        fixed = tmp_path / "col_sum.fixed.py"
        deeper = tmp_path / "deeper_spec.py"
        deeper.write_text(spec.read_text().replace('{"R": 64, "C": 128}', '{"R": 128, "C": 128}'))
        assert check(deeper, fixed, "compact", 9).certified, fixed.read_text()


def test_a_certified_fix_says_whether_it_is_where_the_first_evidence_pointed(
    temporal_address, postgres_dsn, tmp_path
):
    """x - 0.5 * y with the body's refs named the wrong way round: the first check finds the
    kernel takes x for y; the search's fix swaps the body's parameters, on both inputs' path,
    and the certificate says so, with the lines, in the JSON and in the text."""
    search = Path(__file__).parent / "search"
    candidate = tmp_path / "axpy.py"
    candidate.write_text((search / "axpy_swapped_refs.py").read_text())
    env = dict(os.environ, TEMPORAL_ADDRESS=temporal_address, NEARMISS_DATABASE_URL=postgres_dsn)
    spec = search / "axpy_spec.py"
    result = run_cli("repair", spec, candidate, "--model", "search", "--json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["certified"] is True
    body = 1 + candidate.read_text().split("\n").index("def _axpy_body(y_ref, x_ref, o_ref):")
    pointed = report["evidence_pointed"]
    assert pointed.startswith("the fix edits where the first evidence pointed (x and y reach")
    assert f"{body}" in pointed.split("lines ")[1], pointed
    # A fix elsewhere is said to be elsewhere (the same log, the fix put on another line).
    from activities.fixers.search.leads import where_the_fix_is

    elsewhere = where_the_fix_is(
        candidate.read_text(),
        candidate.read_text().replace("in the wrong order", "in the wrong order."),
        spec.read_text(),
        "The kernel's out is the reference's with x and y swapped",
    )
    assert elsewhere.startswith("the fix is not where the first evidence pointed"), elsewhere
