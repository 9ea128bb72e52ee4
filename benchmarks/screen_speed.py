"""How many edits a second does the search's screening get through? This tree beside a baseline
revision, in one run.

The search fixer screens a round's edits of a kernel (``activities/fixers/search/screen.py``).
This screens the same first N mutants of planted kernels (JAX's own modules, bugs of the
held-out sets) with ``screen`` of this tree and of ``--baseline`` (a temporary git worktree,
the same virtual environment), each in a process of its own, alternated so both see the same
load, and prints edits per second each way: the ranking alone (the edits screened over the
seconds spent ranking them) and the whole round (its baseline run and the kernel's traced run
included). Every edit is screened: no stop past a passer, no hidden-case checks. Each tree's
pick is printed (the first passer, else the furthest): the same for both, or the line says
they differ. Medians of ``--repeat``.

    .venv/bin/python benchmarks/screen_speed.py --baseline REV [--case SET:NAME,...]
        [--edits 128] [--lanes 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from throwaway import ROOT, baseline_worktree

sys.path.insert(0, str(ROOT / "tests"))

CASES = (
    "holdout5:layer_norm_variance_unsquared,holdout5:splash_l_curr_broadcast_lanes,"
    "holdout6:flash_logits_divided_by_scale"
)
# Runs in the tree under test (first on PYTHONPATH): one round of its screening, timed.
ROUND = """
import importlib, json, sys, time
from workflows.models import FixRequest

module = importlib.import_module("activities.fixers.search.screen")

request = FixRequest.model_validate_json(open(sys.argv[1]).read())
edits = json.load(open(sys.argv[2]))
ranking = []
rank = module._rank


def timed(*args, **kwargs):
    started = time.perf_counter()
    try:
        return rank(*args, **kwargs)
    finally:
        ranking.append(time.perf_counter() - started)


module._rank = timed
budget = module.Budget(
    checks=len(edits), seconds=1e9, after_pass=len(edits), hidden_checks=0, lanes=int(sys.argv[3])
)
started = time.perf_counter()
found = module.screen(request, edits, budget)
print(json.dumps({
    "screened": found.screened, "unreached": found.unreached, "rank_s": sum(ranking),
    "round_s": time.perf_counter() - started, "best": found.best, "passed": found.passed,
}))
"""


def _request(case_name: str, edits: int, folder: Path) -> tuple[Path, Path]:
    """The planted kernel's fix request (its check at the screening seed) and its first
    ``edits`` mutants, as files."""
    from held_out import SETS
    from test_playbook_shipped import SPECS, planted

    from activities.evidence import evidence_from_report
    from activities.fixers.search.mutants import mutants
    from activities.fixers.search.screen import SEED
    from nearmiss.engine.check import check
    from workflows.models import FixRequest

    set_name, name = case_name.split(":")
    module, attribute = SETS[set_name]
    case = getattr(importlib.import_module(module), attribute)[name]
    spec = SPECS / f"{case.spec}_spec.py"
    source = planted(case)
    kernel = folder / "kernel.py"
    kernel.write_text(source)
    report = check(spec, kernel, "compact", SEED, controls=False)
    request = FixRequest(
        spec_path=str(spec),
        spec_source=spec.read_text(),
        source=source,
        candidate_name="kernel.py",
        evidence=evidence_from_report(report, "sha256:x", ""),
        round=1,
    )
    sources = [m.source for _, m in zip(range(edits), mutants(source), strict=False)]
    (folder / "request.json").write_text(request.model_dump_json())
    (folder / "edits.json").write_text(json.dumps(sources))
    return folder / "request.json", folder / "edits.json"


def _round(tree: Path, request: Path, edits: Path, lanes: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "NEARMISS_CACHE_DIR": "off"}
    done = subprocess.run(
        [sys.executable, "-c", ROUND, str(request), str(edits), str(lanes)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"screen_speed: the round in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git revision to compare against")
    parser.add_argument("--case", default=CASES, help="comma list of SET:NAME (held_out.py)")
    parser.add_argument("--edits", type=int, default=128)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="nearmiss-bench-") as scratch,
        baseline_worktree(args.baseline, Path(scratch) / "baseline") as baseline,
    ):
        trees = {"this tree": ROOT, args.baseline: baseline}
        lines = []
        for number, case_name in enumerate(c for c in args.case.split(",") if c):
            folder = Path(scratch) / f"case{number}"
            folder.mkdir()
            request, edits = _request(case_name, args.edits, folder)
            runs: dict[str, list[dict]] = {name: [] for name in trees}
            for attempt in range(args.repeat):
                for name, tree in trees.items():
                    runs[name].append(_round(tree, request, edits, args.lanes))
                print(f"  {case_name}: run {attempt + 1} of {args.repeat}", file=sys.stderr)
            rates, picked = {}, {}
            lines.append(f"{case_name}: first {args.edits} mutants, {args.lanes} lanes")
            for name, found in runs.items():
                screened = found[0]["screened"]
                rank_s = statistics.median(f["rank_s"] for f in found)
                round_s = statistics.median(f["round_s"] for f in found)
                rates[name] = screened / rank_s
                picks = picked[name] = {(f["best"], f["passed"]) for f in found}
                lines.append(
                    f"  {name[:12]:12}: {screened} screened ({found[0]['unreached']} unreached) "
                    f"ranked in {rank_s:6.1f} s = {rates[name]:5.2f} edits/s; whole round "
                    f"{round_s:6.1f} s = {screened / round_s:5.2f} edits/s; proposes {picks}"
                )
            mine, old = rates["this tree"], rates[args.baseline]
            lines.append(f"  this tree / {args.baseline}: {mine / old:.2f}x the edits per second")
            if len(set().union(*picked.values())) > 1:
                lines.append(f"  the trees propose different edits: {picked}")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
