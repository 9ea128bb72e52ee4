"""Learning from the log: the quality gate, promotion, learned patches — and, end to end, a bug
the model fixed once is fixed in another kernel with zero model calls."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from event_payloads import filled_event
from fake_openai import FakeOpenAI, answer
from sessions import run_session

from conftest import OPS
from kb.knowledge import KnowledgeProjection, retrieve, stats
from kb.learning import learn_from_session
from kb.patches import apply_patch, make_diff
from nearmiss.engine.models import Evidence

BUGGY = "def body(x_ref, o_ref):\n    scale = 1.0 / d\n    o_ref[...] = x_ref[...] * scale\n"
FIXED = BUGGY.replace("1.0 / d", "1.0 / math.sqrt(d)")


def test_a_learned_patch_applies_across_indentation_and_changed_context():
    diff = make_diff(BUGGY, FIXED)
    other = "class K:\n    def other(a_ref, b_ref):\n        scale = 1.0 / d\n        return 1\n"
    patched = apply_patch(diff, other)
    assert patched == other.replace("scale = 1.0 / d", "scale = 1.0 / math.sqrt(d)")


def test_a_patch_that_does_not_match_exactly_once_does_not_apply():
    diff = make_diff(BUGGY, FIXED)
    assert apply_patch(diff, "x = 1\n") is None
    twice = "scale = 1.0 / d\ny = 2\nscale = 1.0 / d\n"
    assert apply_patch(diff, twice) is None
    assert apply_patch("not a diff", BUGGY) is None


async def session(store, original: str, final: str, **faults) -> str:
    """The events a repair session leaves, written by hand so each gate condition can fail."""
    sid = f"repair-hand-{uuid.uuid4().hex[:8]}"
    before = await store.put_blob(original.encode())
    after = await store.put_blob(final.encode())
    report = await store.put_blob(json.dumps({"diagnosis": "wrong_values: scale 0.18"}).encode())
    evidence = {"failure_class": "wrong_values", "category": "attention", "platform": "cpu"}
    events = [
        filled_event("RepairStarted", {"candidate_hash": before}),
        filled_event(
            "EvidenceCollected",
            {
                "phase": "forensics",
                "candidate_hash": before,
                "certified": False,
                "suite": "compact",
                "report_hash": report,
                **evidence,
            },
        ),
        filled_event("FixProposed", {"summary": "scale by 1/sqrt(d)", "candidate_hash": after}),
        filled_event(
            "EvidenceCollected",
            {
                "phase": "certify",
                "candidate_hash": after,
                "certified": not faults.get("uncertified_final"),
                "suite": faults.get("suite", "all"),
                **evidence,
            },
        ),
    ]
    if faults.get("integrity"):
        violation = {"rule": "wrapper_compute", "detail": "80%"}
        events.append(
            filled_event("IntegrityViolated", {"candidate_hash": after, "violations": [violation]})
        )
    events.append(
        filled_event(
            "RepairFinished",
            {"certified": not faults.get("uncertified"), "final_hash": after},
        )
    )
    await store.append(sid, 0, events)
    return sid


async def test_a_clean_success_is_learned_as_a_candidate_and_promoted_by_an_independent_one(store):
    marker = uuid.uuid4().hex
    original = BUGGY.replace("scale", f"scale_{marker}")
    final = original.replace("1.0 / d", "1.0 / math.sqrt(d)")
    first = await learn_from_session(store, await session(store, original, final))
    assert first.startswith("learned learned-") and first.endswith("(candidate)")
    entry_id = first.split()[1]
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    entry = await projection.entry(entry_id)
    assert entry.status == "candidate" and entry.source == "learned"
    assert entry.failure_class == "wrong_values" and entry.category == "attention"
    # The same kernel again is not independent; another kernel with the same bug is.
    again = await learn_from_session(store, await session(store, original, final))
    assert again == f"confirmed {entry_id}"
    other = "import math\n\n\n" + original
    second = await learn_from_session(
        store, await session(store, other, other.replace("1.0 / d", "1.0 / math.sqrt(d)"))
    )
    assert second == f"confirmed {entry_id} and promoted it"
    await projection.catch_up()
    assert (await projection.entry(entry_id)).status == "promoted"
    # `kb stats` says what was learned from which sessions.
    learned = {e["id"]: e for e in (await stats(store))["learned"]}
    assert len(learned[entry_id]["learned_from"]) == 3


async def test_a_bug_fixed_once_by_the_model_is_fixed_again_elsewhere_with_zero_model_calls(
    seeded_store, client, tmp_path
):
    store = seeded_store
    attention = OPS / "attention" / "variants" / "scale_one_over_d.py"
    causal = tmp_path / "causal_scale.py"
    causal.write_text(
        (OPS / "causal_attention" / "golden.py")
        .read_text()
        .replace("scale = 1.0 / math.sqrt(q.shape[-1])", "scale = 1.0 / q.shape[-1]")
    )
    fix = (
        "Scale the logits by 1/sqrt(D).\n<<<<<<< SEARCH\n    scale = 1.0 / q.shape[-1]\n"
        "=======\n    scale = 1.0 / q.shape[-1] ** 0.5\n>>>>>>> REPLACE\n"
    )

    async def run(fake, kernel: str, path):
        result, events, *_ = await run_session(client, store, fake, OPS / kernel / "spec.py", path)
        return result, events

    with FakeOpenAI() as fake:
        fake.script(answer(fix, prompt_tokens=800, completion_tokens=60))
        first, _ = await run(fake, "attention", attention)
        assert first.certified and len(fake.requests) == 1
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    learned = [
        e
        for e in await projection.entries()
        if e.source == "learned" and "q.shape[-1] ** 0.5" in e.body["diff"]
    ]
    assert [(e.status, e.failure_class, e.category) for e in learned] == [
        ("candidate", "wrong_values", "attention")
    ]
    with FakeOpenAI() as fake:  # nothing scripted: any model call would fail the repair
        second, events = await run(fake, "causal_attention", causal)
        assert fake.requests == []
    assert second.certified and second.tokens.total == 0
    fixes = [e.payload for e in events if e.type == "FixProposed"]
    assert fixes[0]["summary"].startswith("patch:learned-")
    assert fixes[0]["model"] == "learned-patch"


async def test_a_proposal_with_a_change_the_fix_does_not_need_is_handed_back_and_learned_without_it(
    seeded_store, client
):
    # The model's answer fixes the scale and hides a change that fires only on grids the spec
    # never draws (more than 64 query blocks): both certify, so the change is put back.
    store = seeded_store
    attention = OPS / "attention" / "variants" / "scale_one_over_d.py"
    normalise = "    p = p / jnp.sum(p, axis=-1, keepdims=True)\n"
    hidden = normalise.replace("\n", " * jnp.where(pl.num_programs(1) > 64, 0.5, 1.0)\n")
    fix = (
        "Scale the logits by 1/sqrt(D).\n<<<<<<< SEARCH\n    scale = 1.0 / q.shape[-1]\n"
        "=======\n    scale = q.shape[-1] ** -0.5\n>>>>>>> REPLACE\n"
        f"<<<<<<< SEARCH\n{normalise}=======\n{hidden}>>>>>>> REPLACE\n"
    )
    with FakeOpenAI() as fake:
        fake.script(answer(fix, prompt_tokens=800, completion_tokens=90))
        result, events, *_ = await run_session(
            client, store, fake, OPS / "attention" / "spec.py", attention
        )
    assert result.certified
    final = (await store.get_blob(result.final_hash)).decode()
    assert "q.shape[-1] ** -0.5" in final and "num_programs(1) > 64" not in final
    certify = [e.payload for e in events if e.type == "EvidenceCollected"][-1]
    assert certify["phase"] == "certify" and certify["candidate_hash"] == result.final_hash
    proposed = (await store.get_blob(certify["trimmed_from"])).decode()
    assert "num_programs(1) > 64" in proposed
    assert len(certify["trimmed"]) == 1 and "num_programs(1) > 64" in certify["trimmed"][0]
    projection = KnowledgeProjection(store)
    await projection.catch_up()
    learned = [
        e.body["diff"]
        for e in await projection.entries()
        if e.source == "learned" and "q.shape[-1] ** -0.5" in e.body["diff"]
    ]
    assert learned and all("num_programs" not in diff for diff in learned)


TRANSFER = Path(__file__).parent / "transfer"


async def test_a_patch_learned_in_an_elementwise_kernel_fixes_the_same_line_in_a_matmul(
    seeded_store, client, tmp_path
):
    """The issue's case: a bug the model fixed once in an activation (``lecun_act.py``,
    elementwise) is fixed with zero model calls where the same line sits in a matmul's epilogue
    (``matmul_lecun.py``): another category, a deeper indentation, other neighbours."""
    store = seeded_store
    marker = uuid.uuid4().hex[:8]  # a line no earlier test taught: this run's patch is the one
    wrong = f"y = 1.7159 * jnp.tanh(1.5 * x)  # {marker}"
    right = f"y = 1.7159 * jnp.tanh(x * 2.0 / 3.0)  # {marker}"
    kernels = {}
    for name in ("lecun_act", "matmul_lecun"):
        kernels[name] = tmp_path / f"{name}.py"
        source = (TRANSFER / f"{name}.py").read_text()
        kernels[name].write_text(source.replace("y = 1.7159 * jnp.tanh(1.5 * x)", wrong))
    fix = f"Slope 2/3.\n<<<<<<< SEARCH\n    {wrong}\n=======\n    {right}\n>>>>>>> REPLACE\n"
    with FakeOpenAI() as fake:
        fake.script(answer(fix, prompt_tokens=500, completion_tokens=40))
        first, *_ = await run_session(
            client, store, fake, TRANSFER / "lecun_spec.py", kernels["lecun_act"]
        )
        assert first.certified and len(fake.requests) == 1
    with FakeOpenAI() as fake:  # nothing scripted: any model call would fail the repair
        second, events, *_ = await run_session(
            client, store, fake, TRANSFER / "matmul_lecun_spec.py", kernels["matmul_lecun"]
        )
        assert fake.requests == []
    assert second.certified and second.tokens.total == 0
    fixes = [e.payload for e in events if e.type == "FixProposed"]
    assert [f["model"] for f in fixes] == ["learned-patch"]
    final = (await store.get_blob(second.final_hash)).decode()
    assert f"        {right}" in final  # at the epilogue's own indentation


async def test_a_patch_that_made_a_kernel_worse_is_not_retrieved_for_that_kernel_again(store):
    """Negative knowledge per kernel: the projection records a learned patch whose round was
    reverted as a regression, and retrieval leaves it out for that kernel only."""
    marker = uuid.uuid4().hex
    original = BUGGY.replace("scale", f"scale_{marker}")
    learned = await learn_from_session(
        store, await session(store, original, original.replace("1.0 / d", "1.0 / math.sqrt(d)"))
    )
    patch = f"patch:{learned.split()[1]}"
    harmed, spared = f"sha256:harmed-{marker}", f"sha256:spared-{marker}"
    await store.append(
        f"repair-test-{marker}",
        0,
        [
            filled_event(
                "CandidateValidated",
                {
                    "round": 1,
                    "outcome": "regression_reverted",
                    "summary": patch,
                    "aimed_at": "wrong_values|attention",
                    "base_hash": harmed,
                },
            )
        ],
    )

    async def patches_for(kernel_hash: str) -> list[str]:
        ev = Evidence(
            candidate_hash=kernel_hash,
            suite="compact",
            certified=False,
            failure_class="wrong_values",
            category="attention",
            platform="cpu",
        )
        return [f"patch:{p.id}" for p in (await retrieve(store, ev, 2000))[1]]

    assert patch not in await patches_for(harmed)
    assert patch in await patches_for(spared)
