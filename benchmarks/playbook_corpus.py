"""How much of the bundled corpus does the zero-token playbook repair?

Sweeps every corpus variant whose failure class has a recipe (``tests/test_playbook.py``:
``VARIANTS``) the way the suite's representative sweep does (``sweep_variant``: the engine's
check must give the variant's labelled class on its labelled suite and target, then up to three
playbook rounds, each edit checked again), and prints per variant what the playbook did, then
the counts: repaired, expected (``EXPECTED_REPAIRS``), and where they differ. The suite keeps one
variant per bug family and target; this is the capability count.

    .venv/bin/python benchmarks/playbook_corpus.py [--only op/variant,...]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma list of op/variant names")
    args = parser.parse_args()

    from test_playbook import EXPECTED_REPAIRS, VARIANTS, sweep_variant, variant_id

    only = {n for n in args.only.split(",") if n}
    known = {variant_id(op, v) for op, v in VARIANTS}
    if only - known:
        parser.error(f"--only names no corpus variant with a recipe class: {args.only}")
    chosen = [(op, v) for op, v in VARIANTS if not only or variant_id(op, v) in only]
    repaired, mislabelled, started = set(), [], time.perf_counter()
    for number, (op, variant) in enumerate(chosen, 1):
        name = variant_id(op, variant)
        began = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="nearmiss-playbook-corpus-") as scratch:
            try:
                certified, steps, _ = asyncio.run(sweep_variant(op, variant, Path(scratch)))
            except AssertionError as exc:  # the check disagrees with the variant's label
                mislabelled.append(name)
                certified, steps = False, [f"label not reproduced: {str(exc)[:120]}"]
        if certified:
            repaired.add(name)
        seconds = time.perf_counter() - began
        print(f"[{number}/{len(chosen)}] {name}: {' | '.join(steps)} ({seconds:.0f} s)", flush=True)
    expected = EXPECTED_REPAIRS & {variant_id(op, v) for op, v in chosen}
    print(f"\nrepaired at 0 tokens: {len(repaired)}/{len(chosen)} (expected {len(expected)})")
    print(f"expected but not repaired: {sorted(expected - repaired) or 'none'}")
    print(f"repaired but not expected: {sorted(repaired - expected) or 'none'}")
    print(f"labels not reproduced: {mislabelled or 'none'}")
    print(f"wall: {time.perf_counter() - started:.0f} s")
    sys.exit(1 if expected != repaired or mislabelled else 0)


if __name__ == "__main__":
    main()
