"""The pure repair loop: every path and every guard, without a server."""

from __future__ import annotations

from nearmiss.engine.models import Evidence
from workflows.loop import Guards, LoopState, RepairLoop
from workflows.models import FixOutcome, RetrieveResult, TokenUsage


def ev(hash_: str, score: float, signature: str = "wrong_values|x|", **kw) -> Evidence:
    return Evidence(
        candidate_hash=hash_,
        suite=kw.pop("suite", "compact"),
        certified=kw.pop("certified", False),
        failure_class=kw.pop("failure_class", "wrong_values"),
        score=score,
        signature=signature,
        compact_passed=kw.pop("compact_passed", False),
        **kw,
    )


def fix(hash_: str | None, tokens: int = 0, **kw) -> FixOutcome:
    return FixOutcome(
        candidate_hash=hash_,
        summary=kw.pop("summary", f"edit->{hash_}"),
        tokens=TokenUsage(input=tokens, cached_input=kw.pop("cached", 0), output=0),
        **kw,
    )


def start(**guards) -> tuple[RepairLoop, object]:
    loop = RepairLoop(LoopState(guards=Guards(**guards)))
    step = loop.begin("h0", now=0.0)
    assert step.action.kind == "forensics" and step.action.suite == "compact"
    return loop, step


def test_two_rounds_to_certification_with_the_events_of_each_step():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    assert step.action.kind == "fix" and step.action.candidate_hash == "h0"
    step = loop.on_fix(fix("h1", 100), 2)
    assert step.action.kind == "validate" and step.action.candidate_hash == "h1"
    step = loop.on_evidence(step.action, ev("h1", 0.5, "b"), 3)
    assert step.action.kind == "fix" and step.action.candidate_hash == "h1"
    step = loop.on_fix(fix("h2", 50), 4)
    step = loop.on_evidence(step.action, ev("h2", 1.0, "ok", compact_passed=True), 5)
    assert step.action.kind == "certify" and step.action.suite == "all"
    events = [e.type for e in step.events]
    assert events == ["EvidenceCollected", "CandidateValidated"]
    step = loop.on_evidence(step.action, ev("h2", 1.0, "ok", certified=True, suite="all"), 6)
    assert step.action.kind == "stop" and step.action.reason == "certified"
    state = loop.state
    assert state.certified and state.best_hash == "h2" and state.tokens.input == 150
    assert [r.outcome for r in state.rounds] == ["improved", "certified"]


def test_an_original_that_already_passes_is_certified_without_a_fix():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 1.0, compact_passed=True), 1)
    assert step.action.kind == "certify"
    step = loop.on_evidence(step.action, ev("h0", 1.0, certified=True, suite="all"), 2)
    assert step.action.reason == "certified" and loop.state.rounds == []


def test_compact_passing_but_extended_failing_feeds_the_full_evidence_to_the_next_fix():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 1.0, compact_passed=True), 1)
    full = ev("h0", 0.6, "boundary|extended/ragged|", suite="all", failure_class="boundary")
    step = loop.on_evidence(step.action, full, 2)
    assert step.action.kind == "fix"
    assert loop.state.current_evidence.failure_class == "boundary"


def test_a_regression_is_reverted_and_the_next_fix_starts_from_the_best():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 0.5, "a"), 1)
    step = loop.on_fix(fix("h1"), 2)
    step = loop.on_evidence(step.action, ev("h1", 0.1, "b"), 3)
    assert step.action.kind == "fix" and step.action.candidate_hash == "h0"
    assert loop.state.rounds[-1].outcome == "regression_reverted"
    assert step.events[-1].payload["best_hash"] == "h0"


def test_max_rounds_stops_with_its_reason():
    loop, step = start(max_rounds=2)
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    for n in (1, 2):
        step = loop.on_fix(fix(f"h{n}"), 2)
        step = loop.on_evidence(step.action, ev(f"h{n}", 0.2 + n / 10, f"s{n}"), 3)
    assert step.action.reason == "max_rounds" and "2 rounds" in step.action.detail
    assert step.events[-1].type == "GuardTripped"


def test_token_budgets_total_and_uncached():
    loop, step = start(token_budget=1000)
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    step = loop.on_fix(fix("h1", 1200), 2)
    step = loop.on_evidence(step.action, ev("h1", 0.3, "b"), 3)
    assert step.action.reason == "token_budget"

    loop, step = start(token_budget=None, uncached_token_budget=500)
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    step = loop.on_fix(fix("h1", 1200, cached=1000), 2)  # 200 uncached: under budget
    step = loop.on_evidence(step.action, ev("h1", 0.3, "b"), 3)
    assert step.action.kind == "fix"
    step = loop.on_fix(fix("h2", 1200, cached=800), 4)  # 200 + 400 uncached
    step = loop.on_evidence(step.action, ev("h2", 0.4, "c"), 5)
    assert step.action.reason == "uncached_token_budget"


def test_no_progress_stops_after_k_rounds_of_the_same_failure():
    loop, step = start(no_progress_rounds=2)
    step = loop.on_evidence(step.action, ev("h0", 0.2, "same"), 1)
    step = loop.on_fix(fix("h1"), 2)
    step = loop.on_evidence(step.action, ev("h1", 0.2, "same"), 3)
    assert step.action.kind == "fix"
    step = loop.on_fix(fix(None, reason="the edit did not apply"), 4)  # a failed round
    assert step.action.reason == "no_progress" and "same" in step.action.detail


def test_a_candidate_seen_before_is_a_cycle():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 0.2), 1)
    step = loop.on_fix(fix("h0"), 2)
    assert step.action.reason == "cycle"


def test_right_numbers_refused_by_the_integrity_gate_stop_as_integrity_not_no_fix():
    from activities.fixers.playbook import propose
    from nearmiss.engine.models import Finding
    from workflows.models import FixRequest

    loop = RepairLoop(LoopState(guards=Guards(), deterministic_fixer=True))
    step = loop.begin("h0", 0)
    blocked = ev(
        "h0",
        0.0,
        failure_class=None,
        compact_passed=True,
        integrity_ok=False,
        violations=[Finding(rule="wrapper_compute", detail="XLA does 100% at k.py:9")],
    )
    step = loop.on_evidence(step.action, blocked, 1)
    assert step.action.kind == "fix"
    request = FixRequest(
        spec_path="s.py",
        spec_source="",
        source="",
        candidate_name="k.py",
        evidence=blocked,
        round=1,
        tried=[],
    )
    answer = propose(request)  # the playbook names what blocks certification
    assert answer.source is None
    assert answer.reason.startswith("the integrity gate blocks certification (wrapper_compute)")
    assert "k.py:9" in answer.reason
    step = loop.on_fix(fix(None, summary="", reason=answer.reason), 2)
    assert step.action.reason == "integrity" and "wrapper_compute" in step.action.detail


def test_the_deadline_is_checked_before_each_fix():
    loop, step = start(deadline_s=60)
    step = loop.on_evidence(step.action, ev("h0", 0.2), 61)
    assert step.action.reason == "deadline"


def test_a_deterministic_fixer_without_an_edit_stops_plainly_and_a_fatal_error_stops_cleanly():
    loop = RepairLoop(LoopState(guards=Guards(), deterministic_fixer=True))
    step = loop.begin("h0", 0)
    step = loop.on_evidence(step.action, ev("h0", 0.2), 1)
    step = loop.on_fix(fix(None, summary="", reason="no playbook recipe applies to x"), 2)
    assert step.action.reason == "no_fix" and "no playbook recipe" in step.action.detail

    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 0.2), 1)
    step = loop.on_fix(fix(None, fatal=True, reason="401 unauthorised"), 2)
    assert step.action.reason == "fixer_error" and loop.state.stop_detail == "401 unauthorised"


def test_a_search_that_spent_its_round_goes_on_in_the_next_until_nothing_is_left():
    """A deterministic fixer asked again gives the same answer, except a search that ran out of
    budget before edits: it says where it stopped and the next round goes on from there (the
    workflow passes that on as the request's ``skip``); once it stops moving, the loop stops."""
    loop = RepairLoop(LoopState(guards=Guards(), deterministic_fixer=True))
    step = loop.begin("h0", 0)
    step = loop.on_evidence(step.action, ev("h0", 0.2), 1)
    spent = "search: screened 40 edits in 150 s (more were left); none got further"
    step = loop.on_fix(fix(None, summary="", reason=spent, resume_at=40), 2)
    assert step.action.kind == "fix" and loop.state.searched == {"h0": 40}
    step = loop.on_fix(fix(None, summary="", reason=spent, resume_at=80), 3)
    assert step.action.kind == "fix" and loop.state.searched == {"h0": 80}
    # No further than before (or nothing left: 0): the answer would repeat, so the loop stops.
    step = loop.on_fix(fix(None, summary="", reason="search: none was left", resume_at=80), 4)
    assert step.action.reason == "no_fix" and len(loop.state.rounds) == 3
    # The rounds guards still bound a search that always has more.
    loop = RepairLoop(LoopState(guards=Guards(max_rounds=2, no_progress_rounds=5)))
    step = loop.on_evidence(loop.begin("h0", 0).action, ev("h0", 0.2), 1)
    for at in (10, 20):
        step = loop.on_fix(fix(None, summary="", resume_at=at), 2)
    assert step.action.reason == "max_rounds"


def test_a_search_keeps_the_unedited_kernel_in_its_beam_beside_an_edit_that_got_further():
    """An edit that only gets further may be a step aside: fixes then alternate between it and
    the unedited kernel, whose search goes on where it stopped, from its own evidence; the
    events name the kernel each fix edited. Once the unedited kernel has no edit left, the
    best goes on alone; with neither left, a deterministic fixer stops."""
    guards = Guards(max_rounds=12, no_progress_rounds=5)
    state = LoopState(guards=guards, deterministic_fixer=True, keep_unedited=True)
    loop = RepairLoop(state)
    step = loop.begin("h0", 0)
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    step = loop.on_fix(fix("h1", resume_at=40), 2)  # got further, 40 of h0's edits screened
    step = loop.on_evidence(step.action, ev("h1", 0.5, "b"), 3)
    assert step.action.kind == "fix" and step.action.candidate_hash == "h0"
    assert loop.evidence_of("h0").signature == "a" and loop.state.searched == {"h0": 40}
    step = loop.on_fix(fix(None, summary="", resume_at=80), 4)  # none in h0's next 40
    assert step.action.candidate_hash == "h1" and loop.state.searched == {"h0": 80}
    assert step.events[0].payload["base_hash"] == "h0"
    step = loop.on_fix(fix("h2"), 5)  # from h1: worse, reverted; h0's turn again
    step = loop.on_evidence(step.action, ev("h2", 0.3, "c"), 6)
    assert step.action.candidate_hash == "h0"
    step = loop.on_fix(fix("h4", resume_at=100), 7)  # from h0: as good as h1, which stays
    step = loop.on_evidence(step.action, ev("h4", 0.5, "e"), 8)
    assert loop.state.rounds[-1].outcome == "same" and loop.state.best_hash == "h1"
    assert step.action.candidate_hash == "h1"
    step = loop.on_fix(fix(None, summary="", resume_at=0), 9)  # h1 has none left: h0's turn
    assert step.action.candidate_hash == "h0"
    step = loop.on_fix(fix("h3", resume_at=120), 7)  # from h0: better than h1, the new best
    assert step.events[0].payload["base_hash"] == "h0"
    step = loop.on_evidence(step.action, ev("h3", 0.7, "d"), 8)
    assert step.action.candidate_hash == "h0" and loop.state.best_hash == "h3"
    assert [r.base_hash for r in loop.state.rounds] == ["h0", "h0", "h1", "h0", "h1", "h0"]
    step = loop.on_fix(fix(None, summary="", resume_at=0), 9)  # h0 has none left
    assert step.action.candidate_hash == "h3"
    step = loop.on_fix(fix(None, summary="", resume_at=0), 10)  # nor has h3
    assert step.action.reason == "no_fix"


def test_only_a_search_keeps_the_unedited_kernel_and_each_of_the_two_goes_on_alone():
    """Another fixer (a model, the playbook) builds on the best, as before. With a search, an
    answer that says nothing of where it stopped (a recipe's) still brings the unedited kernel
    back, its search from the start; once the best has no edit left, the other goes on alone."""
    for keep in (False, True):
        loop = RepairLoop(LoopState(guards=Guards(), keep_unedited=keep))
        step = loop.on_evidence(loop.begin("h0", 0).action, ev("h0", 0.2, "a"), 1)
        step = loop.on_fix(fix("h1"), 2)
        step = loop.on_evidence(step.action, ev("h1", 0.2, "a"), 3)  # the same: kept
        assert step.action.candidate_hash == ("h0" if keep else "h1")
        assert loop.state.searched == {}
    guards = Guards(no_progress_rounds=5)  # rounds without an edit keep h1's failure
    loop = RepairLoop(LoopState(guards=guards, deterministic_fixer=True, keep_unedited=True))
    step = loop.on_evidence(loop.begin("h0", 0).action, ev("h0", 0.2, "a"), 1)
    step = loop.on_fix(fix("h1", resume_at=40), 2)
    step = loop.on_evidence(step.action, ev("h1", 0.5, "b"), 3)
    step = loop.on_fix(fix(None, summary="", resume_at=60), 4)  # h0's turn: 20 more, none
    step = loop.on_fix(fix(None, summary="", resume_at=0), 5)  # h1's: none left at all
    assert step.action.candidate_hash == "h0" and "h1" in loop.state.exhausted
    step = loop.on_fix(fix(None, summary="", resume_at=90), 6)
    assert step.action.candidate_hash == "h0"  # h1 has nothing left: h0 goes on alone


def test_integrity_violations_are_their_own_event():
    loop, step = start()
    bad = ev("h0", 0.0, violations=[{"rule": "wrapper_compute", "detail": "80%"}])
    step = loop.on_evidence(step.action, bad, 1)
    assert [e.type for e in step.events] == ["EvidenceCollected", "IntegrityViolated"]


def test_a_check_no_worker_took_stops_the_loop_with_no_worker_and_keeps_the_best():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    step = loop.on_fix(fix("h1"), 2)
    assert step.action.kind == "validate"
    step = loop.on_no_worker("no worker serves target tpu-v5e")
    assert step.action.kind == "stop" and step.action.reason == "no_worker"
    assert step.events == []  # not a guard: nothing tripped
    assert loop.state.stop_detail == "no worker serves target tpu-v5e"
    assert loop.state.best_hash == "h0" and not loop.state.certified


def test_the_loop_decides_retrieval_the_kind_of_round_and_learning():
    """What the workflow carries out is the loop's to decide: retrieve before each fix where the
    session uses the knowledge base, a tool-using round where the fixer runs experiments, and
    learning once the session has ended."""
    state = LoopState(guards=Guards(), use_kb=True, tool_rounds=True, learn=True)
    loop = RepairLoop(state)
    step = loop.begin("h0", now=0.0)
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    assert step.action.kind == "retrieve" and step.action.candidate_hash == "h0"
    found = RetrieveResult(
        entry_ids=["k1", "k2"], lines=["- round the grid up"], patches=[{"entry_id": "p1"}]
    )
    step = loop.on_retrieved(found)
    assert [(e.type, e.payload) for e in step.events] == [
        ("KnowledgeRetrieved", {"round": 1, "entry_ids": ["k1", "k2"], "patches": ["p1"]})
    ]
    action = step.action
    assert (action.kind, action.candidate_hash, action.tool_round) == ("fix", "h0", True)
    assert action.knowledge == found.lines and action.patches == found.patches
    step = loop.on_fix(fix("h1", 10, tool_calls=3), 2)
    step = loop.on_evidence(step.action, ev("h1", 0.5, "b"), 3)
    assert step.action.kind == "retrieve" and step.action.candidate_hash == "h1"
    # A session from before retrieval existed (its replay): straight to the fix, nothing recorded.
    step = loop.on_retrieved(None)
    assert step.events == [] and step.action.kind == "fix" and step.action.knowledge == []
    step = loop.on_fix(fix("h2", 10, tool_calls=2), 4)
    assert loop.state.tool_calls == 5
    step = loop.on_evidence(step.action, ev("h2", 1.0, "ok", compact_passed=True), 5)
    step = loop.on_evidence(step.action, ev("h2", 1.0, "ok", certified=True, suite="all"), 6)
    assert step.action.kind == "stop"
    result = loop.result("repair-1")
    assert (result.certified, result.rounds, result.final_hash) == (True, 2, "h2")
    step = loop.finish(result)
    assert [(e.type, e.payload) for e in step.events] == [
        ("RepairFinished", result.model_dump(mode="json"))
    ]
    assert step.action.kind == "learn"


def test_without_the_knowledge_base_tools_or_learning_the_loop_asks_for_none():
    loop, step = start()
    step = loop.on_evidence(step.action, ev("h0", 0.2, "a"), 1)
    assert step.action.kind == "fix" and not step.action.tool_round
    step = loop.on_fix(fix(None, reason="nothing applies"), 2)
    step = loop.on_fix(fix(None), 3)
    while step.action.kind != "stop":
        step = loop.on_fix(fix(None), 4)
    result = loop.result("repair-2")
    assert not result.certified and result.final_hash == "h0" and result.stop_reason
    assert result.failure_class == "wrong_values"
    assert loop.finish(result).action.kind == "stop"
