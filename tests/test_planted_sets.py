"""What every planted set (``test_playbook_shipped.py`` and the held-out sets after it) stands
on, checked once for all of them: each installed module certifies unplanted on its spec with its
entry point (so a case's failure is its planted text, nothing else), each planted text occurs
exactly once in the installed source (a jax upgrade that moves one fails here, loudly), and no
two sets plant the same site or name two cases alike."""

from __future__ import annotations

import pytest
from test_playbook_families import FAMILIES
from test_playbook_fresh import FRESH
from test_playbook_holdout3 import HOLDOUT3
from test_playbook_holdout4 import HOLDOUT4
from test_playbook_holdout5 import HOLDOUT5
from test_playbook_holdout6 import HOLDOUT6
from test_playbook_holdout7 import HOLDOUT7
from test_playbook_holdout8 import HOLDOUT8
from test_playbook_holdout9 import HOLDOUT9
from test_playbook_holdout10 import HOLDOUT10
from test_playbook_shipped import HELD_OUT, SEED, SUITE
from test_playbook_unseen import UNSEEN
from test_shipped_kernels import SPECS, installed_source

from nearmiss.check import check

SETS = {
    "shipped": HELD_OUT,
    "unseen": UNSEEN,
    "fresh": FRESH,
    "holdout3": HOLDOUT3,
    "holdout4": HOLDOUT4,
    "holdout5": HOLDOUT5,
    "holdout6": HOLDOUT6,
    "holdout7": HOLDOUT7,
    "holdout8": HOLDOUT8,
    "holdout9": HOLDOUT9,
    "holdout10": HOLDOUT10,
    "families": FAMILIES,
}
CASES = {f"{group}/{name}": case for group, cases in SETS.items() for name, case in cases.items()}


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
