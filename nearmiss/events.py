"""Every event type of the log, one pydantic model each: the schema of what a session records.

The log (``kb.events``) stores a type name and a JSON payload; this module says, for each type,
which keys the payload holds and of what type. Every append is checked against it — the
PostgreSQL store, the in-memory one, and the workflows' planned events alike — so a writer that
renames or drops a field fails where it writes, not in a reader weeks later. ``parse`` gives a
reader the typed event.

The payloads' JSON is the contract with logs already written and with Temporal histories (a
replayed session records the same events again): the models describe it and never reshape it.
So fields are named as the payloads always were, fields added over time have defaults (an older
event still parses), and a model forbids keys it does not declare, so a misspelt one is an error.
Nested structures that belong to a higher layer (a fleet's guards, an experiment's config, a
knowledge entry) are typed as plain JSON objects here; their own models live with their owners.

Pure pydantic: importable by the workflows (deterministic code), the knowledge base and readers.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar, Protocol, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError

JSON = dict[str, Any]


class Event(BaseModel):
    """One event's payload. ``TYPE`` is the name the log stores (the class's name)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    TYPE: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.TYPE = cls.__name__

    def payload(self) -> JSON:
        """The JSON the log stores: the fields the writer set, as it set them."""
        return self.model_dump(mode="json", exclude_unset=True)


# --- a repair session (workflows.repair, its loop and the agent's rounds) ---------------------


class RepairStarted(Event):
    """The session's request (``workflows.repair.RepairRequest``), as it was given."""

    spec_hash: str
    candidate_hash: str
    candidate_name: str
    kernel: str
    model: str = "playbook"
    guards: JSON = {}
    seed: int = 0
    use_kb: bool = True
    knowledge: str = "all"  # "held_out": no entry written from this kernel's own code
    knowledge_budget_chars: int = 4000
    integrity: str = "enforce"
    certify_suite: str = "all"
    learn: bool = True
    targets: list[str] = []
    candidate_folder: str = ""  # where its checks showed the candidate (empty: /home/user)


class EvidenceCollected(Event):
    """One check of one candidate (``workflows.loop.evidence_collected``); ``trial`` in a
    regenerate session."""

    phase: str  # forensics, validate, certify, regenerate
    candidate_hash: str
    suite: str
    certified: bool
    failure_class: str | None = None
    failure_classes: list[str] = []
    score: float = 0.0
    signature: str = ""
    report_hash: str = ""
    op: str = ""
    category: str = ""
    platform: str = ""
    worker: dict[str, str] = {}  # where the check ran (workflows.routing)
    controls: list[JSON] = []  # the failing cases' control experiments
    triggers: dict[str, str] = {}
    trial: int | None = None
    # A certify check that put back changes the candidate did not need (``activities.trim``):
    # the candidate proposed, and what was put back; ``candidate_hash`` is the trimmed one.
    trimmed_from: str = ""
    trimmed: list[str] = []


class IntegrityViolated(Event):
    candidate_hash: str
    violations: list[dict[str, str]]  # {"rule", "detail"}


class KnowledgeRetrieved(Event):
    round: int
    entry_ids: list[str]
    patches: list[str]  # the entries whose learned diffs were offered


class FixProposed(Event):
    round: int
    model: str
    summary: str
    reason: str
    base_hash: str
    candidate_hash: str | None  # None: the fixer made no edit
    prompt_hash: str = ""
    response_hash: str = ""
    tokens: JSON = {}
    tool_calls: int = 0
    resume_at: int = 0  # where a search of base_hash goes on; absent on every other fix


class CandidateValidated(Event):
    round: int
    candidate_hash: str
    outcome: str  # improved, same, regression_reverted, compact_passed, ...
    score: float
    best_hash: str
    summary: str = ""
    aimed_at: str = ""
    base_hash: str = ""


class GuardTripped(Event):
    guard: str
    detail: str


class ToolCalled(Event):
    """A tool the fix agent called in a round (``workflows.agent_round``)."""

    round: int
    call_id: str
    tool: str
    arguments: str
    ran: bool
    ok: bool
    summary: str
    data_hash: str = ""


class RepairFinished(Event):
    """The session's result (``workflows.models.RepairResult``)."""

    session_id: str
    certified: bool
    rounds: int
    stop_reason: str
    stop_detail: str
    tokens: JSON
    original_hash: str
    final_hash: str
    failure_class: str | None = None
    targets: dict[str, bool] = {}
    # Per fix round: model requests, experiments and their time (workflows.models.RoundStats);
    # absent in events written before them.
    round_stats: list[JSON] = []


# --- the knowledge base (kb.knowledge, kb.learning) -------------------------------------------


class KnowledgeAdded(Event):
    entry: JSON
    source: str  # seed or learned
    status: str  # candidate or promoted
    session_id: str = ""  # a learned entry's session
    original_hash: str = ""
    original_shape: str = ""  # kb.learning.source_shape of the original (empty before shapes)


class KnowledgeRevised(Event):
    entry: JSON
    source: str
    status: str


class KnowledgeConfirmed(Event):
    session_id: str
    original_hash: str
    original_shape: str = ""  # kb.learning.source_shape of the original (empty before shapes)


class KnowledgePromoted(Event):
    confirmations: int


# --- a regenerate-baseline session (workflows.regenerate) -------------------------------------


class RegenerateStarted(Event):
    spec_hash: str
    kernel: str
    candidate_name: str
    model: str
    trials: int = 3
    seed: int = 0
    temperature: float = 0.7
    targets: list[str] = []


class KernelGenerated(Event):
    trial: int
    candidate_hash: str | None = None
    reason: str = ""
    model: str = ""
    tokens: JSON = {}
    prompt_hash: str = ""
    response_hash: str = ""


class RegenerateFinished(Event):
    session_id: str
    kernel: str
    trials: list[JSON]
    pass_at_1: float
    pass_at_k: bool
    tokens: JSON


# --- a fleet (workflows.fleet) ----------------------------------------------------------------


class FleetStarted(Event):
    members: int
    names: list[str]
    model: str
    guards: JSON
    use_kb: bool
    concurrency: int


class FleetMemberFinished(Event):
    index: int
    name: str
    session_id: str
    verdict: str  # "certified", the stop reason, "error" or "cancelled"
    certified: bool = False
    rounds: int = 0
    tokens: JSON = {}
    detail: str = ""
    targets: dict[str, bool] = {}


class FleetFinished(Event):
    total: int
    finished: int
    certified: int
    cancelled: bool
    tokens: JSON


# --- an experiment (nearmiss.experiments) -----------------------------------------------------


class ExperimentStarted(Event):
    experiment_id: str
    config: JSON
    near_misses: list[JSON]
    arms: JSON


class ExperimentFinished(Event):
    experiment_id: str
    wall_s: float
    arms: JSON  # arm → near-miss → {sessions, successes, tokens, errors, audits}


EVENTS: dict[str, type[Event]] = {
    model.TYPE: model
    for model in (
        RepairStarted,
        EvidenceCollected,
        KnowledgeRetrieved,
        FixProposed,
        CandidateValidated,
        IntegrityViolated,
        GuardTripped,
        RepairFinished,
        KnowledgeAdded,
        KnowledgeRevised,
        KnowledgeConfirmed,
        KnowledgePromoted,
        RegenerateStarted,
        KernelGenerated,
        RegenerateFinished,
        FleetStarted,
        FleetMemberFinished,
        FleetFinished,
        ExperimentStarted,
        ExperimentFinished,
        ToolCalled,
    )
}


class InvalidEvent(ValueError):
    """A payload its type's model does not accept, or a type the log does not know."""


def parse(event_type: str, payload: JSON) -> Event:
    """The typed event; InvalidEvent (naming the type and the fields) when it does not fit."""
    model = EVENTS.get(event_type)
    if model is None:
        raise InvalidEvent(f"unknown event type {event_type!r}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or '(payload)'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidEvent(f"{event_type} payload does not fit its model: {problems}") from None


class Recorded(Protocol):
    """An event as the log gives it back (``kb.events.StoredEvent``): its type and payload."""

    @property
    def type(self) -> str: ...

    @property
    def payload(self) -> JSON: ...


E = TypeVar("E", bound=Event)


def of_type(events: Iterable[Recorded], model: type[E]) -> list[E]:
    """The events of ``model``'s type among ``events``, typed, in their order."""
    return [cast(E, parse(e.type, e.payload)) for e in events if e.type == model.TYPE]
