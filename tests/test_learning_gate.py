"""Learning's quality gate and its candidate -> confirmed -> promoted steps, on the in-memory
event log (kb.memory): learning reads and writes nothing but the log, so these need no database.
The knowledge projection's view of the same steps is tested on PostgreSQL in test_learning."""

from __future__ import annotations

import uuid

import pytest
from test_learning import BUGGY, session

from kb.learning import learn_from_session
from kb.memory import MemoryEventStore


def fixed(source: str) -> str:
    return source.replace("1.0 / d", "1.0 / math.sqrt(d)")


@pytest.mark.parametrize(
    ("faults", "why"),
    [
        ({"integrity": True}, "integrity violation"),
        ({"uncertified": True}, "did not certify"),
        ({"suite": "compact"}, "not certified on the full suite"),
        ({"uncertified_final": True}, "not certified on the full suite"),
    ],
)
async def test_the_gate_refuses_to_learn_from_a_doubtful_success(faults, why):
    log = MemoryEventStore()
    original = BUGGY + f"# {uuid.uuid4()}\n"
    sid = await session(log, original, fixed(original), **faults)
    outcome = await learn_from_session(log, sid)
    assert outcome.startswith("nothing learned") and why in outcome
    assert not [e for e in log.events if e.stream_id.startswith("kb-")]


async def test_a_fix_is_a_candidate_confirmed_by_an_independent_kernel_and_then_promoted():
    log = MemoryEventStore()
    first = await learn_from_session(log, await session(log, BUGGY, fixed(BUGGY)))
    assert first.startswith("learned learned-") and first.endswith("(candidate)")
    entry_id = first.split()[1]
    sid = await session(log, BUGGY, fixed(BUGGY))
    assert await learn_from_session(log, sid) == f"confirmed {entry_id}"  # same kernel
    assert await learn_from_session(log, sid) == f"already learned {entry_id} from this session"
    other = "import math\n\n\n" + BUGGY
    promoted = await learn_from_session(log, await session(log, other, fixed(other)))
    assert promoted == f"confirmed {entry_id} and promoted it"
    stream = [e.type for e in await log.read_stream(f"kb-{entry_id}")]
    assert stream == [
        "KnowledgeAdded",
        "KnowledgeConfirmed",
        "KnowledgeConfirmed",
        "KnowledgePromoted",
    ]


async def test_a_comment_a_rename_or_a_reformat_does_not_make_an_independent_session():
    log = MemoryEventStore()
    first = await learn_from_session(log, await session(log, BUGGY, fixed(BUGGY)))
    entry_id = first.split()[1]
    # The same kernel, commented, documented, renamed and re-spaced: the same diff learned from
    # it confirms the entry but cannot promote it, however many times it is sent again.
    disguised = (
        '"""A body."""\n'
        + BUGGY.replace("o_ref", "out_ref").replace("x_ref", "in_ref").replace(" * ", "*")
        + "# reviewed\n"
    )
    for _ in range(3):
        said = await learn_from_session(log, await session(log, disguised, fixed(disguised)))
        assert said == f"confirmed {entry_id}", said
    # A kernel that differs in what it does is independent, and promotes it.
    other = "import math\n\n\n" + BUGGY
    promoted = await learn_from_session(log, await session(log, other, fixed(other)))
    assert promoted == f"confirmed {entry_id} and promoted it"
