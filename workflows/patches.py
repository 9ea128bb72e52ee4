"""Which code a session runs: today's, or that of a change its history predates.

Each change to a workflow's commands came behind a Temporal patch, so that a session recorded
before it replays as it ran; the ids are listed here, oldest first. ``has(change)`` says whether
this session runs a change's code.

Why today's code is decided once, at the start of ``run``: the SDK answers ``patched(X)`` on a
replay from the markers of the workflow task being replayed, and keeps that answer for the run.
A local activity (``routing.run_here``) that finishes while its workflow task is being completed
has its marker in that task, but its result reaches the workflow's code only in the *next* task
when live, and already in the same task on a replay. Code after it then asks ``patched`` one task
early on the replay, is told False (the marker is in the next task), takes the old path, and the
replay fails: "Non-deprecated patch marker encountered for change check-queues". Under CPU load
11 of 24 one-command repairs failed their progress query so (a query of a finished session
replays its history), and a worker that lost a session from its cache could not continue it.
A call before the first ``await`` of ``run`` is in the first task both live and on a replay, so
every session started since records one marker there (``TODAYS_CODE``) and asks no patch after
it; a session recorded before still asks each change's own patch, where it asked it then.

A later change adds its id below and to the start: ``decide_at_start`` then asks both, and a
session recorded before it has the first marker but not the second.

No I/O: the workflows import this.
"""

from __future__ import annotations

import weakref

from temporalio import workflow

# Sessions recorded before knowledge retrieval replay without it.
RETRIEVE_KNOWLEDGE = "retrieve-knowledge"
# ... before learning from the finished session.
LEARN_FROM_SESSION = "learn-from-session"
# ... before the tool-using rounds of the agent.
AGENT_TOOLS = "agent-tools"
# ... before target queues: their checks ran on the general queue.
CHECK_QUEUES = "check-queues"
# ... before local activities: recording, retrieval and learning were scheduled on the general
# queue.
LOCAL_ACTIVITIES = "local-activities"
# Every change above, decided in the first workflow task.
TODAYS_CODE = "decided-at-start"
# Changes since, each with its own marker, recorded in the first workflow task as well
# (``decide_at_start``): a session recorded before one has TODAYS_CODE's marker but not its own.
# ... before an agent round ran no tool of a reply that spent the token budget.
TOOLS_WITHIN_BUDGET = "tools-within-budget"
# ... before a search session kept the unedited kernel beside an edit that only got further.
UNEDITED_IN_BEAM = "unedited-in-beam"
LATER_CHANGES = (TOOLS_WITHIN_BUDGET, UNEDITED_IN_BEAM)

# The runs that have decided (weakly held: the worker drops finished runs).
_decided: weakref.WeakSet = weakref.WeakSet()


def decide_at_start() -> None:
    """Settle whether this run runs today's code: the first statement of every workflow's
    ``run``, before any ``await`` (see above)."""
    workflow.patched(TODAYS_CODE)
    for change in LATER_CHANGES:
        workflow.patched(change)
    _decided.add(workflow.instance())


def has(change: str) -> bool:
    """Whether this session runs the code of ``change``: always when it started with today's
    code, otherwise what its history says, asked at the same place as then."""
    if workflow.instance() not in _decided:
        # Deciding here, after an await, would be the replay race above all over again.
        raise RuntimeError("a workflow asked for a change before deciding at its start")
    if change in LATER_CHANGES:  # asked at the start already: the SDK keeps that answer
        return workflow.patched(change)
    return workflow.patched(TODAYS_CODE) or workflow.patched(change)
