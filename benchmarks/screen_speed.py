"""How much faster is screening edits in warm children than checking each in fresh ones?

The search fixer screens a round's edits of a kernel (``activities/fixers/search/screen.py``).
This runs the same first N mutants of one planted kernel (JAX's own modules, a bug of the
held-out sets) both ways, side by side, in the same lanes: each edit a whole sandboxed check in
fresh children (three interpreters importing JAX), and each edit run in a warm child on the
baseline's inputs. Prints edits per second each way and the ratio.

    .venv/bin/python benchmarks/screen_speed.py [--case SET:NAME] [--edits 24]
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent / "benchmarks"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", default="holdout5:layer_norm_variance_unsquared")
    parser.add_argument("--edits", type=int, default=24)
    parser.add_argument("--lanes", type=int, default=2)
    args = parser.parse_args()

    from held_out import SETS
    from test_playbook_shipped import SPECS, planted

    from activities.evidence import evidence_from_report, score_cases
    from activities.fixers.search.mutants import mutants
    from activities.fixers.search.screen import SEED, Budget, _fresh, _rank, _Warm
    from nearmiss.engine.check import case_result, check
    from nearmiss.engine.runner.sandbox import Limits
    from nearmiss.engine.runner.session import run_sandboxed
    from nearmiss.engine.targets.registry import DEFAULT_TARGETS
    from workflows.models import FixRequest

    set_name, name = args.case.split(":")
    module, attribute = SETS[set_name]
    case = getattr(importlib.import_module(module), attribute)[name]
    spec = SPECS / f"{case.spec}_spec.py"
    source = planted(case)
    edits = [m.source for _, m in zip(range(args.edits), mutants(source), strict=False)]
    budget = Budget(checks=len(edits), seconds=10_000, lanes=args.lanes)
    limits = Limits(case_timeout_s=budget.case_timeout_s)
    with tempfile.TemporaryDirectory(prefix="nearmiss-bench-") as scratch:
        folder = Path(scratch)
        (folder / "spec.py").write_text(spec.read_text())
        kernel = folder / "baseline" / "kernel.py"
        kernel.parent.mkdir()
        kernel.write_text(source)
        report = check(folder / "spec.py", kernel, "compact", SEED, limits, controls=False)
        request = FixRequest(
            spec_path=str(spec),
            spec_source=spec.read_text(),
            source=source,
            candidate_name="kernel.py",
            evidence=evidence_from_report(report, "sha256:x", ""),
            round=1,
        )
        started = time.perf_counter()
        fresh = _rank(edits, budget, 2.0, _fresh(request, folder, "compact", limits), started)
        fresh_s = time.perf_counter() - started

        started = time.perf_counter()
        baseline = run_sandboxed(
            folder / "spec.py",
            kernel,
            "compact",
            SEED,
            limits,
            audit=False,
            targets=DEFAULT_TARGETS,
            inputs_to=folder / "inputs",
        )
        base = score_cases([case_result(r, "kernel.py") for r in baseline.cases])
        warm = _Warm(request, baseline, folder / "inputs", limits)
        try:
            hot = _rank(edits, budget, 2.0, warm, started)
        finally:
            warm.close()
        warm_s = time.perf_counter() - started
    print(f"{args.case}: {len(edits)} edits, {args.lanes} lanes (baseline score {base:.3f})")
    for label, found, seconds in (("fresh checks", fresh, fresh_s), ("warm children", hot, warm_s)):
        rate = found.screened / seconds
        print(f"  {label:13s}: {found.screened} edits in {seconds:6.1f} s = {rate:5.2f} edits/s")
    print("  (the warm figure includes its baseline run)")
    print(f"  warm / fresh : {fresh_s / warm_s:.1f}x faster")


if __name__ == "__main__":
    main()
