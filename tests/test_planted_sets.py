"""What every planted set (``test_playbook_shipped.py`` and the held-out sets after it) stands
on, checked once for all of them: each installed module certifies unplanted on its spec with its
entry point (so a case's failure is its planted text, nothing else), each planted text occurs
exactly once in the installed source (a jax upgrade that moves one fails here, loudly), each
set has its size and spread and pins expectations only of its own cases, and no two sets plant
the same site or name two cases alike."""

from __future__ import annotations

import pytest
import test_playbook_families
import test_playbook_fresh
import test_playbook_holdout3
import test_playbook_holdout4
import test_playbook_holdout5
import test_playbook_holdout6
import test_playbook_holdout7
import test_playbook_holdout8
import test_playbook_holdout9
import test_playbook_holdout10
import test_playbook_holdout11
import test_playbook_holdout12
import test_playbook_holdout13
import test_playbook_holdout14
import test_playbook_unseen
from test_playbook_shipped import HELD_OUT, SEED, SUITE, PlantedSet, lead_kind
from test_shipped_kernels import SPECS, installed_source

from nearmiss.engine.check import check

# The held-out sets after the first, each as its file pins it (the first, ``shipped``, pins
# the playbook's repairs its own way).
PLANTED: dict[str, PlantedSet] = {
    "unseen": test_playbook_unseen.SET,
    "fresh": test_playbook_fresh.SET,
    "holdout3": test_playbook_holdout3.SET,
    "holdout4": test_playbook_holdout4.SET,
    "holdout5": test_playbook_holdout5.SET,
    "holdout6": test_playbook_holdout6.SET,
    "holdout7": test_playbook_holdout7.SET,
    "holdout8": test_playbook_holdout8.SET,
    "holdout9": test_playbook_holdout9.SET,
    "holdout10": test_playbook_holdout10.SET,
    "holdout11": test_playbook_holdout11.SET,
    "holdout12": test_playbook_holdout12.SET,
    "holdout13": test_playbook_holdout13.SET,
    "holdout14": test_playbook_holdout14.SET,
    "families": test_playbook_families.SET,
}
SETS = {"shipped": HELD_OUT} | {group: planted.cases for group, planted in PLANTED.items()}
CASES = {f"{group}/{name}": case for group, cases in SETS.items() for name, case in cases.items()}


@pytest.mark.parametrize("group", sorted(PLANTED))
def test_each_set_is_varied_and_its_expectations_are_about_its_own_cases(group):
    """A set's own shape: its size, spread over modules, a class pinned for every case, and
    certified cases and leads only of its own."""
    planted = PLANTED[group]
    assert len(planted.cases) == planted.size
    assert len({c.module for c in planted.cases.values()}) >= planted.min_modules
    assert set(planted.expected_class) == set(planted.cases)
    assert set(planted.cases) >= planted.expected_certified
    assert set(planted.expected_lead) <= set(planted.cases)


@pytest.mark.parametrize("group", sorted(PLANTED))
def test_the_suite_runs_a_case_of_each_class_and_kind_of_lead_of_a_set(group):
    """The suite's cases of a set (``PlantedSet.in_the_suite``; the benchmark runs them all):
    every class its diagnoses give, every kind of lead it pins, a repair where it has any."""
    planted = PLANTED[group]
    chosen = planted.in_the_suite()
    assert {planted.expected_class[n] for n in chosen} == set(planted.expected_class.values())
    kinds = {lead_kind(lead) for lead in planted.expected_lead.values()}
    assert {
        lead_kind(planted.expected_lead[n]) for n in chosen if n in planted.expected_lead
    } == kinds
    assert bool(set(chosen) & planted.expected_certified) == bool(planted.expected_certified)
    assert len(chosen) < len(planted.cases) or len(kinds) + 1 >= len(planted.cases)


def test_no_two_sets_plant_the_same_site_or_share_a_name():
    sites = [(case.module, case.old) for case in CASES.values()]
    assert len(sites) == len(set(sites))
    names = [name for cases in SETS.values() for name in cases]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_planted_text_occurs_once_in_the_installed_source(name):
    case = CASES[name]
    assert case.old != case.new
    assert installed_source(case.module).count(case.old) == 1, f"{name}: the planted text moved"


@pytest.mark.parametrize(
    "pair", sorted({(c.module, c.spec, c.entry) for c in CASES.values()}), ids=str
)
def test_each_installed_module_certifies_on_its_spec_unplanted(tmp_path, pair):
    module, spec, entry = pair
    candidate = tmp_path / "kernel.py"
    candidate.write_text(installed_source(module) + "\n\n" + entry)
    report = check(SPECS / f"{spec}_spec.py", candidate, SUITE, SEED)
    assert report.certified, report.diagnosis
