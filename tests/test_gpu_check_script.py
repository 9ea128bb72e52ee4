"""infra/gpu_check.py, the script for a session lent a GPU, tested through its CPU dry run.

The dry run is the whole flow — worker process, spec cases, kernel vs reference at the spec's
tolerance, the engine's static race verdict, repeated runs, timings, budget, table and JSON —
with the kernels in interpret mode. What only a GPU can say (does it lower through Triton or
Mosaic GPU, does a predicted race show on the hardware) is left to the device run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "infra" / "gpu_check.py"
OPS = ("leaky_relu", "col_sum")  # col_sum accumulates across its row axis: a GPU grid race


def _run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}  # no $OUT: nothing written there
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def test_dry_run_on_two_goldens(tmp_path):
    predictions = tmp_path / "predictions.json"
    done = _run("--predict-only", str(predictions), "--ops", ",".join(OPS))
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = json.loads(predictions.read_text())["ops"]
    assert {c: v["race_predicted"] for c, v in verdicts["col_sum"].items()} == {
        "base": True,
        "ragged": True,
        "tall": True,
    }
    assert not any(v["race_predicted"] for v in verdicts["leaky_relu"].values())

    out = tmp_path / "gpu_check.json"
    done = _run(
        "--cpu-dry-run",
        "--ops",
        ",".join(OPS),
        "--predictions",
        str(predictions),
        "--budget-s",
        "55",
        "--json",
        str(out),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["schema"] == 1 and data["mode"] == "cpu-dry-run" and data["complete"]
    assert data["environment"]["ok"] and data["environment"]["default_backend"] == "cpu"
    rows = data["rows"]
    # A predicted race goes first; every case of each spec is a row.
    assert [r["kernel"] for r in rows] == ["col_sum"] * 3 + ["leaky_relu"] * 4
    assert [r["case"] for r in rows[:3]] == ["base", "ragged", "tall"]
    for row in rows:
        assert row["status"] == "ok", row
        assert row["lowered"] == "interpret" and row["passed"] and row["wrong_runs"] == 0
        bound = row["atol"] + row["rtol"] * 100  # |ref| stays far below 100 in these cases
        assert 0 <= row["max_abs_err"] <= bound and row["worst_ratio"] <= 1
        assert row["runs"] >= 3 and row["distinct_results"] == 1 and not row["nondeterministic"]
        assert row["kernel_ms"] > 0 and row["reference_ms"] > 0
        assert row["race_source"] == "live"
    for row in rows[:3]:
        assert row["race_predicted"] is True and row["race_axes"] == [1]
        assert "grid points" in row["race_detail"]
    assert all(row["race_predicted"] is False for row in rows[3:])
    race = data["summary"]["race"]
    assert race["predicted"] == {
        "cases": 3,
        "nondeterministic": 0,
        "wrong": 0,
        "kernels": ["col_sum"],
    }
    assert race["not_predicted"]["cases"] == 4

    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("kernel "))
    for column in ("lowered", "max_err", "atol/rtol", "race?", "nondet", "kern_ms", "ref_ms"):
        assert column in lines[header]
    table = lines[header + 1 : header + 1 + len(rows)]
    assert [line.split()[:3] for line in table[:3]] == [
        ["col_sum", "base", "interpret"],
        ["col_sum", "ragged", "interpret"],
        ["col_sum", "tall", "interpret"],
    ]
    assert all("yes@1" in line for line in table[:3])
    assert any(line.startswith("summary: 2 kernels, 7 rows") for line in lines)


def test_a_spent_budget_gives_one_skipped_row_per_kernel(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = _run("--cpu-dry-run", "--ops", ",".join(OPS), "--budget-s", "0", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["complete"] and data["environment"] is None  # no worker was started
    assert data["rows"] == [
        {"kernel": op, "case": "(all)", "status": "skipped: budget"} for op in OPS
    ]
    skipped = [line.split() for line in done.stdout.splitlines() if line.endswith("budget")]
    assert [(cells[0], cells[1]) for cells in skipped] == [(op, "(all)") for op in OPS]


def test_variants_labelled_for_gpu_join_the_goldens(tmp_path, monkeypatch):
    from infra import gpu_check

    for op in ("matmul", "softmax_rows"):
        (tmp_path / op / "variants").mkdir(parents=True)
        for name in ("spec.py", "golden.py"):
            (tmp_path / op / name).write_text("")
    (tmp_path / "matmul" / "variants" / "k_race.py").write_text("")
    (tmp_path / "matmul" / "variants.json").write_text(
        json.dumps(
            [
                {"file": "k_race.py", "failure_class": "wrong_values", "target": "gpu"},
                {"file": "misaligned.py", "targets": ["tpu-v5e"]},
                {"file": "missing_init.py", "failure_class": "nan_inf"},
            ]
        )
    )
    (tmp_path / "softmax_rows" / "variants.json").write_text("not json")
    monkeypatch.setattr(gpu_check, "OPS_DIR", tmp_path)
    assert gpu_check.discover(None) == ["matmul", "softmax_rows", "matmul:k_race"]
    assert gpu_check.discover(None, variants=False) == ["matmul", "softmax_rows"]
    assert gpu_check.discover(["matmul:k_race", "matmul"]) == ["matmul:k_race", "matmul"]
    assert gpu_check.unit_paths("matmul:k_race")[1] == tmp_path / "matmul/variants/k_race.py"


def test_the_engines_cpu_verdict_is_held_against_what_the_device_did():
    from infra import gpu_check

    def row(kernel, case, verdict, status, passed=False):
        return {
            "kernel": kernel,
            "case": case,
            "engine_verdict": verdict,
            "status": status,
            "passed": passed,
        }

    rows = [
        row("matmul", "base", "certified", gpu_check.OK, passed=True),  # agree
        row("softmax_rows", "ragged", "refused: compile_error", gpu_check.NOT_LOWERED),  # agree
        row("col_sum", "ragged", "certified", gpu_check.MISMATCH),  # the engine was wrong
        row("silu_mul", "base", "refused: precision", gpu_check.OK, passed=True),  # too strict
        row("leaky_relu", "base", "certified", gpu_check.SKIPPED_BUDGET),  # no device result
        {"kernel": "gelu_tanh", "case": "base", "status": gpu_check.OK, "passed": True},
    ]
    found = gpu_check.agreement(rows)
    assert (found["agree"], found["certified-but-wrong"], found["refused-but-right"]) == (2, 1, 1)
    assert found["cases"] == {
        "certified-but-wrong": ["col_sum/ragged"],
        "refused-but-right": ["silu_mul/base"],
    }
    data = {"mode": "gpu", "rows": rows, "elapsed_s": 1}
    assert "2 agree, 1 certified-but-wrong ['col_sum/ragged']" in gpu_check.render(data)


def test_predict_only_records_the_engines_own_gpu_verdict_per_case(tmp_path):
    # The softmax golden: Triton refuses its ragged case's (8, 320) block on a GPU; its other
    # cases' blocks divide their arrays. The verdict the device run is held against.
    out = tmp_path / "predictions.json"
    result = _run("--predict-only", str(out), "--ops", "softmax_rows,col_sum", timeout=300)
    assert result.returncode == 0, result.stderr
    ops = json.loads(out.read_text())["ops"]
    cases = ops["softmax_rows"]
    assert cases["ragged"]["engine"] == "refused: compile_error"
    assert cases["base"]["engine"] == "certified"
    # col_sum accumulates across the grid (a TPU kernel): the race is the kernel's, reported
    # once under its first case, and every case whose own grid races is refused for it.
    for name, case in ops["col_sum"].items():
        assert case["race_predicted"] and case["engine"] == "refused: grid_race", (name, case)
