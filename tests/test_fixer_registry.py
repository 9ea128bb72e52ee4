"""Fixers are known by what they are (``workflows.models.FIXER_KINDS``), not by string checks
of a model's name; every kind but a recording has a builder, and each fixer says its kind."""

from __future__ import annotations

import pytest

from activities.fixers.registry import BUILDERS, make_fixer
from workflows.models import FIXER_KINDS, fixer_kind, is_kind, model_argument


@pytest.mark.parametrize(
    "model, name",
    [("playbook", "playbook"), ("search", "search"), ("openai:gpt-x", "openai")],
)
def test_each_fixer_is_built_from_its_kind_and_says_what_it_is(model, name, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")  # the client is made, never called
    fixer = make_fixer(model)
    assert fixer.kind is FIXER_KINDS[name] is fixer_kind(model)


def test_every_kind_but_a_recording_has_a_builder():
    assert set(BUILDERS) == {name for name, kind in FIXER_KINDS.items() if not kind.replay}


def test_what_the_workflows_decide_by():
    assert is_kind("playbook", zero_token=True, deterministic=True, chat=False)
    assert is_kind("search", zero_token=True, deterministic=True)
    assert is_kind("openai:gpt-x", chat=True, zero_token=False, deterministic=False)
    assert is_kind("replay:repair-1", replay=True, deterministic=True, chat=False)
    assert model_argument("openai:org/model:v2") == "org/model:v2"
    assert model_argument("replay:repair-1") == "repair-1"
    assert not is_kind("scripted", deterministic=True)  # a test's own fixer: no properties


@pytest.mark.parametrize(
    "model", ["", "openai:", "openai", "playbook:x", "playbook:", "gpt-4", "replay:"]
)
def test_a_name_no_fixer_has_is_refused(model):
    with pytest.raises(ValueError, match="unknown model"):
        fixer_kind(model)
    with pytest.raises(ValueError, match="unknown model"):
        make_fixer(model)
    assert not is_kind(model)


def test_a_recording_is_not_a_fixer_to_build():
    with pytest.raises(ValueError, match="unknown model"):
        make_fixer("replay:repair-1")
