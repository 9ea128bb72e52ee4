"""The corpus as `nearmiss corpus --json` reports it: counts, labels and readable folders."""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

from conftest import run_cli
from nearmiss.engine.models import FAILURE_CLASSES
from nearmiss.engine.spec import CATEGORIES
from nearmiss.engine.targets.registry import INTERPRET, TARGETS
from pallas_ops.catalog import BUG_FAMILIES, FAILS_ON, integrity_cases

# The minimum per category; gather and convolution count together.
MINIMUM = {
    "elementwise": 4,
    "reduction": 5,
    "normalization": 4,
    "matmul": 5,
    "attention": 3,
    "scan": 3,
    "gather/convolution": 3,
}


def listing() -> list[dict]:
    result = run_cli("corpus", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_the_corpus_has_the_promised_breadth():
    ops = listing()
    assert len(ops) >= 30
    categories = Counter(
        "gather/convolution" if op["category"] in ("gather", "convolution") else op["category"]
        for op in ops
    )
    for category, minimum in MINIMUM.items():
        assert categories[category] >= minimum, (category, categories)
    variants = [v for op in ops for v in op["variants"]]
    assert len(variants) >= 45
    assert all(op["variants"] for op in ops), "every operator has a near-miss variant"
    families = Counter(v["bug_family"] for v in variants)
    assert all(families[f] >= 2 for f in BUG_FAMILIES), families
    severities = Counter(v["fails_on"] for v in variants)
    assert severities["compact"] >= 10 and severities["extended"] >= 10, severities
    # Near-misses right in interpret mode and wrong where they are meant to run.
    targets = Counter(v["target"] for v in variants if v["target"] != INTERPRET)
    assert sum(targets.values()) >= 10 and targets["gpu"] >= 1, targets
    assert sum(n for t, n in targets.items() if TARGETS[t].is_tpu) >= 9, targets


def test_every_entry_is_labelled_and_points_at_real_files():
    for op in listing():
        assert op["category"] in CATEGORIES
        for key in ("spec", "golden"):
            assert Path(op[key]).is_file(), op[key]
        for v in op["variants"]:
            path = Path(v["path"])
            assert path.is_file(), path
            assert v["bug_family"] in BUG_FAMILIES and v["fails_on"] in FAILS_ON
            assert v["target"] in TARGETS, v["target"]  # where the label holds
            assert v["failure_class"] in FAILURE_CLASSES and v["diagnosis"].strip()
            assert v["fix"].startswith(f"--- variants/{path.name}"), "the fix is a diff"
            # A reader sees why it fails without reading tests: the file says so up top.
            assert ast.get_docstring(ast.parse(path.read_text())), path


def test_the_cheat_corpus_covers_every_rule_twice():
    from nearmiss.engine.integrity.gate import RULES

    rules = Counter(case.rule for case in integrity_cases())
    assert all(rules[rule] >= 2 for rule in RULES), rules
    assert rules[None] >= 4  # honest kernels with glue outside the kernel
    for case in integrity_cases():
        assert case.path.is_file() and case.spec.is_file()


def test_the_human_listing_totals_the_corpus():
    result = run_cli("corpus")
    assert result.returncode == 0
    total = len(listing())
    assert f"{total} operators" in result.stdout.splitlines()[-1]


def test_the_demo_samples_every_category_and_some_cheats():
    from nearmiss.cli.demo import SAMPLE_CHEATS, _jobs
    from pallas_ops.catalog import operators

    sample = _jobs(everything=False)
    by_name = {op.name: op.category for op in operators()}
    covered = {by_name[name] for name, _, kernel, _ in sample if kernel.name == "golden.py"}
    assert covered == set(by_name.values())
    assert sum(kernel.stem in SAMPLE_CHEATS for _, _, kernel, _ in sample) == len(SAMPLE_CHEATS)
    assert len(_jobs(everything=True)) > len(sample)
