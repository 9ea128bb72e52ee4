"""How many planted bugs in Pallas kernels (JAX's own, ejkernel's) do the zero-token fixers
repair, and are the repairs the fix?

Drives each planted kernel of the chosen sets (``tests/test_playbook_*.py``: JAX's installed
Pallas modules, one realistic bug planted in each) through the same rounds the planted-set tests
use (the engine's check, the evidence, a zero-token edit, the check again; a regression
reverted), once with ``playbook`` (recipes only) and once with ``search`` (recipes, then the
screened mutation search), and prints per kernel what each did, the certified counts side by
side, and the search's seconds. Each certified repair is judged (``judge_fix``): the author's
fix (the unplanted text), equivalent (certified on the whole suite with hidden cases at three
fresh seeds), or one that fails a hidden case. Minutes per kernel for the search: choose the
sets.

The suite runs a few cases of each set (``PlantedSet.in_the_suite``); this runs them all, and
reports where a first diagnosis no longer gives the class or lead its set pins, or the playbook
certifies other cases than the set expects.

    .venv/bin/python benchmarks/held_out.py [--sets holdout5,holdout6 | --sets all]
        [--fixers playbook,search] [--only NAME,...] [--checks N] [--seconds S]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

SETS = {  # set name -> (test module, the dict of planted cases in it)
    "shipped": ("test_playbook_shipped", "HELD_OUT"),
    "unseen": ("test_playbook_unseen", "UNSEEN"),
    "fresh": ("test_playbook_fresh", "FRESH"),
    "holdout3": ("test_playbook_holdout3", "HOLDOUT3"),
    "holdout4": ("test_playbook_holdout4", "HOLDOUT4"),
    "holdout5": ("test_playbook_holdout5", "HOLDOUT5"),
    "holdout6": ("test_playbook_holdout6", "HOLDOUT6"),
    "holdout7": ("test_playbook_holdout7", "HOLDOUT7"),
    "holdout8": ("test_playbook_holdout8", "HOLDOUT8"),
    "holdout9": ("test_playbook_holdout9", "HOLDOUT9"),
    "holdout10": ("test_playbook_holdout10", "HOLDOUT10"),
    "holdout11": ("test_playbook_holdout11", "HOLDOUT11"),
    "holdout12": ("test_playbook_holdout12", "HOLDOUT12"),
    "holdout13": ("test_playbook_holdout13", "HOLDOUT13"),
    "holdout14": ("test_playbook_holdout14", "HOLDOUT14"),
    "families": ("test_playbook_families", "FAMILIES"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sets", default="holdout5", help=f"comma list of {', '.join(SETS)}, or all"
    )
    parser.add_argument(
        "--fixers", default="playbook,search", help="comma list of playbook, search"
    )
    parser.add_argument("--only", default="", help="comma list of planted kernels of those sets")
    parser.add_argument("--checks", type=int, default=400, help="screened edits per round")
    parser.add_argument("--seconds", type=float, default=240.0, help="screening time per round")
    args = parser.parse_args()
    names = list(SETS) if args.sets == "all" else [s for s in args.sets.split(",") if s]
    unknown = [s for s in names if s not in SETS]
    if unknown:
        parser.error(f"unknown set(s) {', '.join(unknown)}; expected some of {', '.join(SETS)}")

    from test_playbook_shipped import SPECS, planted, repair_planted

    from activities.fixers.playbook import PlaybookFixer
    from activities.fixers.search import Budget, SearchFixer

    known = {
        "playbook": PlaybookFixer,
        "search": lambda: SearchFixer(Budget(checks=args.checks, seconds=args.seconds)),
    }
    wanted = [f for f in args.fixers.split(",") if f]
    if not wanted or set(wanted) - set(known):
        parser.error(f"--fixers: a comma list of {', '.join(known)}, not {args.fixers!r}")
    fixers = {name: known[name] for name in wanted}
    certified = dict.fromkeys(fixers, 0)
    kinds = {name: dict.fromkeys(FIX_KINDS, 0) for name in fixers}
    total = 0
    planted_sets = {s: getattr(importlib.import_module(SETS[s][0]), SETS[s][1]) for s in names}
    only = {n for n in args.only.split(",") if n}
    if only - {name for cases in planted_sets.values() for name in cases}:
        parser.error(f"--only names kernels none of {', '.join(names)} plants: {args.only}")
    expected = {s: _expected_repairs(SETS[s][0]) for s in names}
    pinned = {s: getattr(importlib.import_module(SETS[s][0]), "SET", None) for s in names}
    surprises: list[str] = []
    for set_name, cases in planted_sets.items():
        for name, case in sorted(cases.items()):
            if only and name not in only:
                continue
            total += 1
            spec = SPECS / f"{case.spec}_spec.py"
            for fixer_name, make in fixers.items():
                started = time.perf_counter()
                with tempfile.TemporaryDirectory(prefix="nearmiss-held-out-") as scratch:
                    kernel = Path(scratch) / "kernel.py"
                    first, report, steps = asyncio.run(
                        repair_planted(spec, planted(case), kernel, make())
                    )
                    if fixer_name == next(iter(fixers)):  # each first diagnosis, once
                        surprises += _unpinned(pinned[set_name], f"{set_name}/{name}", first)
                    if report.certified:
                        judged = judge_fix(spec, case, kernel)
                        steps.append(judged)
                        kinds[fixer_name][judged.split(":")[0]] += 1
                certified[fixer_name] += report.certified
                if fixer_name == "playbook" and report.certified != (name in expected[set_name]):
                    said = "certified" if report.certified else "not certified"
                    surprises.append(f"{set_name}/{name}: {said}")
                verdict = "CERTIFIED" if report.certified else "not certified"
                seconds = time.perf_counter() - started
                print(f"{set_name}/{name} [{fixer_name}, {seconds:.0f} s] {verdict}: ", end="")
                print(" | ".join(steps), flush=True)
    print()
    for fixer_name, count in certified.items():
        said = ", ".join(f"{n} {kind}" for kind, n in kinds[fixer_name].items())
        print(f"{fixer_name:>8}: {count} of {total} certified, zero tokens ({said})")
    if certified.get("playbook") and "search" in certified:
        print(f"search / playbook: {certified['search'] / certified['playbook']:.2f}x")
    print(f"against the sets' pins: {', '.join(surprises) or 'as expected'}")
    if surprises:
        raise SystemExit(1)


def _unpinned(planted_set, label: str, first) -> list[str]:
    """Where a first diagnosis differs from what its set pins: its class, its lead."""
    if planted_set is None:  # the first set pins its repairs only
        return []
    name = label.split("/", 1)[1]
    found = []
    if first.failure_class != planted_set.expected_class[name]:
        found.append(f"{label}: diagnosed {first.failure_class}")
    lead = planted_set.expected_lead.get(name)
    if lead is not None and lead not in first.diagnosis:
        found.append(f"{label}: the diagnosis lost its lead {lead!r}")
    return found


# How a certified repair is judged against the planted bug (``judge_fix``).
FIX_KINDS = ("author's fix", "equivalent", "fails a hidden case")
JUDGE_SEEDS = (101, 102, 103)  # fresh hidden cases, none the repair saw


def judge_fix(spec: Path, case, kernel: Path) -> str:
    """Whether a certified repair is the fix: the unplanted module's own text (the author's
    fix), else a kernel that passes the whole suite with the engine's hidden cases at three
    seeds no repair round used (equivalent, as far as the spec's domain can tell), else not."""
    from test_shipped_kernels import installed_source

    from nearmiss.engine.check import check

    fixed = kernel.read_text()
    if fixed == installed_source(case.module) + "\n\n" + case.entry:
        return "author's fix"
    for seed in JUDGE_SEEDS:
        report = check(spec, kernel, "all", seed, controls=False)
        if not report.certified:
            return f"fails a hidden case: seed {seed}: {report.failure_class}"
    return "equivalent: certified on suite all at seeds " + ", ".join(map(str, JUDGE_SEEDS))


def _expected_repairs(module: str) -> set[str]:
    """The cases a planted set's test file expects the playbook to certify."""
    tests = importlib.import_module(module)
    found = getattr(tests, "SET", None)
    return set(found.expected_certified if found else getattr(tests, "EXPECTED_REPAIRS", ()))


if __name__ == "__main__":
    main()
