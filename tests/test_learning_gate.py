"""Learning's quality gate and its candidate -> confirmed -> promoted steps, on the in-memory
event log (kb.memory): learning reads and writes nothing but the log, so these need no database.
The knowledge projection's view of the same steps is tested on PostgreSQL in test_learning."""

from __future__ import annotations

import uuid

import pytest
from test_learning import BUGGY, session

from kb.events import NewEvent
from kb.learning import fleet_of, independent, learn_from_session
from kb.memory import MemoryEventStore
from nearmiss.events import KnowledgePromoted, of_type
from workflows.fleet import FleetMember, member_session_id


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


# --- fleets: one submission is one teacher ----------------------------------------------------


def member(fleet_id: str, index: int, kernel: str = "attention") -> str:
    """The session id a fleet gives its member (workflows.fleet)."""
    fields = {"name": kernel, "spec_hash": "s", "candidate_hash": "c", "candidate_name": "k.py"}
    return member_session_id(fleet_id, index, FleetMember(kernel=kernel, **fields))


async def session_as(log: MemoryEventStore, sid: str, original: str) -> str:
    """test_learning.session's certified repair of ``original``, recorded as session ``sid``."""
    scratch = MemoryEventStore()
    written = await session(scratch, original, fixed(original))
    for content in scratch.blobs.values():
        await log.put_blob(content)
    events = await scratch.read_stream(written)
    await log.append(sid, 0, [NewEvent(e.type, e.payload) for e in events])
    return sid


# Kernels that differ in what they do (each imports something else), so each is another shape.
KERNELS = [f"import {module}\n\n\n" + BUGGY for module in ("math", "os", "sys", "json", "re")]


async def test_members_of_one_fleet_are_one_teacher_however_different_their_kernels():
    log = MemoryEventStore()
    fleet = f"fleet-{uuid.uuid4().hex[:6]}"
    said = [
        await learn_from_session(log, await session_as(log, member(fleet, i), kernel))
        for i, kernel in enumerate(KERNELS[:3])
    ]
    entry_id = said[0].split()[1]
    assert said == [
        f"learned {entry_id} (candidate)",
        f"confirmed {entry_id}",
        f"confirmed {entry_id}",
    ]
    # A session of its own on a kernel none of them had promotes it.
    outside = await learn_from_session(log, await session(log, KERNELS[3], fixed(KERNELS[3])))
    assert outside == f"confirmed {entry_id} and promoted it"
    promoted = of_type(await log.read_stream(f"kb-{entry_id}"), KnowledgePromoted)
    assert [p.confirmations for p in promoted] == [2]


async def test_fleets_on_one_kernel_are_one_teacher_and_a_fleet_and_a_kernel_are_picked_apart():
    log = MemoryEventStore()
    # Three fleets, one kernel (renamed in one): the same teacher three times.
    renamed = KERNELS[0].replace("x_ref", "in_ref")
    said = [
        await learn_from_session(log, await session_as(log, member(f"fleet-{n}", 0), kernel))
        for n, kernel in enumerate([KERNELS[0], renamed, KERNELS[0]])
    ]
    entry_id = said[0].split()[1]
    assert said[1:] == [f"confirmed {entry_id}"] * 2
    # One more fleet on another kernel: fleet-0 for the first kernel, it for the second.
    last = await learn_from_session(log, await session_as(log, member("fleet-9", 0), KERNELS[1]))
    assert last == f"confirmed {entry_id} and promoted it"


async def test_a_fleet_on_two_kernels_and_another_session_on_one_of_them_are_two_teachers():
    log = MemoryEventStore()
    first = await learn_from_session(log, await session_as(log, member("fleet-a", 0), KERNELS[0]))
    entry_id = first.split()[1]
    again = await learn_from_session(log, await session_as(log, member("fleet-a", 1), KERNELS[1]))
    assert again == f"confirmed {entry_id}"
    # Alone on the first fleet's first kernel: the fleet is picked for its second kernel.
    alone = await learn_from_session(log, await session(log, KERNELS[0], fixed(KERNELS[0])))
    assert alone == f"confirmed {entry_id} and promoted it"


CHAIN = [
    *[(f"g{n:05d}", f"a{n + step:05d}") for n in range(3000) for step in (0, 1)],
    ("z", "a00000"),
]


@pytest.mark.parametrize(
    ("pairs", "count"),
    [
        ([], 0),
        ([("f", "a"), ("f", "a"), ("f", "b"), ("f", "c")], 1),  # one fleet
        ([("f", "a"), ("g", "a"), ("h", "a")], 1),  # one kernel
        ([("f", "a"), ("f", "b"), ("g", "a")], 2),
        # A greedy pick of (f, a) first would leave g nothing: the count moves f to b.
        ([("f", "a"), ("f", "b"), ("g", "a"), ("h", "b"), ("h", "c")], 3),
        ([("f", "a"), ("g", "a"), ("g", "b"), ("h", "b"), ("h", "c"), ("k", "c")], 3),
        ([(f"s{n}", f"k{n}") for n in range(2000)], 2000),
        # Fleet z, last, has only a0: to pick it, g0 moves to a1, g1 to a2, ... g2999 to a3000,
        # a path far deeper than Python's recursion limit.
        (CHAIN, 3001),
    ],
)
def test_independent_teachers_share_neither_a_fleet_nor_a_kernel(pairs, count):
    assert independent(pairs) == count
    assert independent(reversed(pairs)) == count


def test_a_fleet_members_session_id_names_its_fleet_and_a_lone_session_names_itself():
    fleet = "fleet-20250101-000000-abc123"
    assert {fleet_of(member(fleet, i)) for i in (0, 7, 123_456)} == {fleet}
    # A kernel whose name looks like a member mark does not split its fleet.
    assert fleet_of(member(fleet, 3, kernel="x.00001-y")) == fleet
    assert fleet_of(member("exp.7", 2)) == "exp.7"
    lone = "repair-attention-0123456789ab-deadbeef"
    assert fleet_of(lone) == lone
