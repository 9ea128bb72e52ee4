"""The repair loop as a pure state machine: evidence and fixes in, the next action out.

No I/O, no clock, no randomness: the Temporal workflow feeds it activity results and
``workflow.now()``, and it answers with the next action and the events to record. That keeps the
loop deterministic under replay and testable without any server.

    begin ─► forensics (compact) ─► compact passes? ─► certify (all suites) ─► certified: stop
                                         │ no                  │ fails
                                         ▼                     ▼
              guards ok? ─► [retrieve] ─► fix ─► new candidate? ─► validate (compact) ─► ...

    stop ─► finish: RepairFinished ─► [learn]

The loop decides every step the workflow carries out: a check and its suite, whether to
retrieve from the knowledge base before a fix, whether the fix is a tool-using round (the
fixer's experiments first) or a single answer, and whether the knowledge base learns from the
session once it has ended.

Guards, checked before every fix: the wall-clock deadline, max rounds, the token budgets (total
and uncached), no progress (the same failure signature ``no_progress_rounds`` rounds running).
After a fix: a candidate seen before is a cycle. Validation keeps the best candidate so far; a
regression is reverted (the next fix starts from the best). Every stop has a reason.

The unedited kernel stays in the beam while a search has edits of it left: an edit that only
"gets further" may be a step aside (``.sum`` for ``.mean`` where a reciprocal was dropped), and a
session that built only on it would never screen the kernel's own one-site fix. So with a
search (``FixerKind.screens``), once the best candidate is an edit, the unedited kernel's
remaining edits come first (its search going on where it stopped, ``FixOutcome.resume_at``),
then fixes alternate between the two until the unedited kernel has none left. Every other
fixer builds on the best.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from nearmiss.engine.models import Evidence
from nearmiss.events import (
    CandidateValidated,
    Event,
    EvidenceCollected,
    FixProposed,
    GuardTripped,
    IntegrityViolated,
    KnowledgeRetrieved,
    RepairFinished,
    parse,
)

# Re-exported: their home is workflows.guards (a light module the command line imports).
from workflows.guards import WORKER_WAIT_S as WORKER_WAIT_S
from workflows.guards import Guards
from workflows.models import FixOutcome, RepairResult, RetrieveResult, RoundStats, TokenUsage

StopReason = Literal[
    "certified",
    "max_rounds",
    "token_budget",
    "uncached_token_budget",
    "no_progress",
    "cycle",
    "deadline",
    "no_fix",
    "integrity",
    "fixer_error",
    "no_worker",
]

# Stops that are guards tripping (recorded as GuardTripped); the others end the loop naturally.
GUARDS = ("max_rounds", "token_budget", "uncached_token_budget", "no_progress", "cycle", "deadline")


class Action(BaseModel):
    kind: Literal["forensics", "certify", "validate", "retrieve", "fix", "stop", "learn"]
    candidate_hash: str = ""
    suite: str = ""
    reason: str = ""  # for stop: a StopReason
    detail: str = ""  # for stop: what tripped, in words
    # For fix: a tool-using round (the fixer runs experiments, then edits) or a single answer,
    # and what retrieval found for it (prompt lines; learned diffs, tried first at zero tokens).
    tool_round: bool = False
    knowledge: list[str] = Field(default_factory=list)
    patches: list[dict] = Field(default_factory=list)


class PlannedEvent(BaseModel):
    """An event the workflow will record: checked against its type's model (nearmiss.events)
    when planned, so a wrong payload fails the workflow task that wrote it."""

    type: str
    payload: dict

    @model_validator(mode="after")
    def _fits_its_model(self) -> PlannedEvent:
        parse(self.type, self.payload)
        return self

    @classmethod
    def of(cls, event: Event) -> PlannedEvent:
        # Built from a model, the payload already fits it: no second validation.
        return cls.model_construct(type=event.TYPE, payload=event.payload())


class Step(BaseModel):
    action: Action
    events: list[PlannedEvent] = Field(default_factory=list)


class Round(BaseModel):
    number: int
    summary: str = ""
    # The failure the fix was aimed at: failure class and category of the evidence it started from.
    aimed_at: str = ""
    base_hash: str = ""  # the candidate the fix was applied to
    candidate_hash: str | None = None
    outcome: str = ""  # improved, same, regression_reverted, no_edit, cycle, certified, ...
    failure_class: str | None = None
    score: float | None = None
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    # Model requests, experiments, and their time (RepairResult.round_stats).
    stats: RoundStats | None = None


class LoopState(BaseModel):
    guards: Guards
    deterministic_fixer: bool = False  # asking it again gives the same answer (the playbook)
    # Where certification runs: "all" (compact + extended), or "compact" for the ablation
    # without full-coverage evaluation.
    certify_suite: Literal["all", "compact"] = "all"
    use_kb: bool = False  # retrieve from the knowledge base before each fix
    tool_rounds: bool = False  # each fix is a tool-using round (a chat model with tools allowed)
    learn: bool = False  # the knowledge base learns from the session once it has ended
    # The fixer screens (a search): the unedited kernel stays in the beam beside the best.
    keep_unedited: bool = False
    started_at: float = 0.0
    original_hash: str = ""
    original_evidence: Evidence | None = None  # its first check's: what a fix of it starts from
    current_hash: str = ""
    current_evidence: Evidence | None = None
    fixing: str = ""  # the candidate the fix under way edits: the current one, or the original
    best_hash: str = ""
    best_rank: tuple[float, float] = (-1.0, -1.0)
    seen: list[str] = Field(default_factory=list)
    signatures: list[str] = Field(default_factory=list)  # the failure signature after each round
    rounds: list[Round] = Field(default_factory=list)
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    tool_calls: int = 0  # the fixer's experiments, all rounds
    tried: list[str] = Field(default_factory=list)
    # Per candidate (hash): how far through its candidate edits a search has got
    # (``FixResult.resume_at``); the next round's search of it goes on from there.
    searched: dict[str, int] = Field(default_factory=dict)
    exhausted: list[str] = Field(default_factory=list)  # candidates a search has no edit left of
    pending_rank: float = 0.0  # compact score of the candidate being certified
    stop_reason: str | None = None
    stop_detail: str = ""
    certified: bool = False


def evidence_collected(
    evidence: Evidence, phase: str, trial: int | None = None
) -> EvidenceCollected:
    """The EvidenceCollected event of a check (repair and regenerate sessions alike; ``trial``
    in a regenerate session's); where the check ran and its control experiments and what they
    isolate, where it ran any (absent otherwise, as in events written before them)."""
    more: dict = {} if trial is None else {"trial": trial}
    if evidence.worker:
        more["worker"] = dict(evidence.worker)
    if evidence.controls:
        more["controls"] = [c.model_dump() for c in evidence.controls]
        more["triggers"] = dict(evidence.triggers)
    if evidence.trimmed_from:
        more["trimmed_from"], more["trimmed"] = evidence.trimmed_from, list(evidence.trimmed)
    return EvidenceCollected(
        phase=phase,
        candidate_hash=evidence.candidate_hash,
        suite=evidence.suite,
        certified=evidence.certified,
        failure_class=evidence.failure_class,
        failure_classes=evidence.failure_classes,
        score=evidence.score,
        signature=evidence.signature,
        report_hash=evidence.report_hash,
        op=evidence.op,
        category=evidence.category,
        platform=evidence.platform,
        **more,
    )


class RepairLoop:
    """Drive with ``begin``, then ``on_evidence`` / ``on_retrieved`` / ``on_fix`` as the
    actions complete; once it stops, ``result`` and ``finish``."""

    def __init__(self, state: LoopState) -> None:
        self.state = state

    # --- entry points -------------------------------------------------------------------

    def begin(self, candidate_hash: str, now: float) -> Step:
        s = self.state
        s.started_at, s.original_hash = now, candidate_hash
        s.current_hash = s.best_hash = candidate_hash
        s.seen.append(candidate_hash)
        return Step(action=Action(kind="forensics", candidate_hash=candidate_hash, suite="compact"))

    def on_evidence(self, action: Action, evidence: Evidence, now: float) -> Step:
        """The result of a forensics, validate or certify action."""
        s = self.state
        events = [PlannedEvent.of(evidence_collected(evidence, action.kind))]
        if evidence.violations:
            violated = IntegrityViolated(
                candidate_hash=evidence.candidate_hash,
                violations=[v.model_dump() for v in evidence.violations],
            )
            events.append(PlannedEvent.of(violated))
        if action.kind == "certify":
            return self._after_certify(evidence, now, events)
        if action.kind == "validate":
            events.append(self._judge_validation(evidence))
        else:
            s.current_evidence = s.original_evidence = evidence
            s.best_rank = (evidence.score, -1.0)
        if evidence.compact_passed and evidence.integrity_ok:
            s.pending_rank = evidence.score
            return Step(
                action=Action(
                    kind="certify", candidate_hash=evidence.candidate_hash, suite=s.certify_suite
                ),
                events=events,
            )
        return self._next_fix(now, events)

    def on_retrieved(self, retrieved: RetrieveResult | None) -> Step:
        """What the knowledge base offers for the next fix; None where the session predates
        retrieval (its replay skips it)."""
        if retrieved is None:
            return Step(action=self._fix_action())
        event = KnowledgeRetrieved(
            round=len(self.state.rounds) + 1,
            entry_ids=retrieved.entry_ids,
            patches=[p["entry_id"] for p in retrieved.patches],
        )
        return Step(
            action=self._fix_action(retrieved.lines, retrieved.patches),
            events=[PlannedEvent.of(event)],
        )

    def on_no_worker(self, reason: str) -> Step:
        """A check no worker of the session's target took in time: stop, saying which target."""
        return self._stop("no_worker", reason, [])

    def on_deadline(self, now: float, during: str, spent: TokenUsage | None = None) -> Step:
        """The session's deadline came while ``during`` (a check, a fix) ran: Temporal ended
        it at the deadline, and the session stops. ``spent``: the tokens of the model turns
        the cut-short fix had already taken (an agent round's), counted in the session's."""
        s, g = self.state, self.state.guards
        if spent is not None:
            s.tokens = s.tokens + spent
        elapsed = now - s.started_at
        detail = f"{elapsed:.0f} s elapsed, deadline {g.deadline_s:.0f} s (it ended {during})"
        return self._stop("deadline", detail, [])

    def on_fix(self, outcome: FixOutcome, now: float) -> Step:
        s = self.state
        s.tokens = s.tokens + outcome.tokens
        s.tool_calls += outcome.tool_calls
        number = len(s.rounds) + 1
        base = s.fixing or s.current_hash
        further = outcome.resume_at > s.searched.get(base, 0)  # a search with edits of it left
        if further:
            s.searched[base] = outcome.resume_at
        if outcome.summary:
            s.tried.append(outcome.summary)
        proposed = FixProposed(
            round=number,
            model=outcome.model,
            summary=outcome.summary,
            reason=outcome.reason,
            base_hash=base,
            candidate_hash=outcome.candidate_hash,
            prompt_hash=outcome.prompt_hash,
            response_hash=outcome.response_hash,
            tokens=outcome.tokens.model_dump(),
            tool_calls=outcome.tool_calls,
            # A search to go on in the next round: where (kept off every other fix, whose
            # events read as they always have).
            **({"resume_at": outcome.resume_at} if outcome.resume_at else {}),
        )
        events = [PlannedEvent.of(proposed)]
        aimed = self.evidence_of(base)
        aimed_at = f"{aimed.failure_class}|{aimed.category}" if aimed else ""
        round_ = Round(
            number=number,
            summary=outcome.summary,
            tokens=outcome.tokens,
            aimed_at=aimed_at,
            base_hash=base,
            stats=RoundStats(
                round=number,
                model_requests=outcome.model_requests,
                model_s=outcome.model_s,
                tool_calls=outcome.tool_calls,
                tool_s=outcome.tool_s,
            ),
        )
        s.rounds.append(round_)
        if outcome.fatal:
            return self._stop("fixer_error", outcome.reason, events)
        if outcome.candidate_hash is None:
            round_.outcome = "no_edit"
            s.signatures.append(self._signature())
            if further:
                # A search that ran out of budget, not of edits: the next round goes on (and
                # asks again even of a deterministic fixer, which now answers differently).
                return self._next_fix(now, events)
            if self._in_beam():
                # No edit left of one of the beam's two: the other goes on alone, if it has any.
                s.exhausted.append(base)
                if base == s.current_hash or s.current_hash not in s.exhausted:
                    return self._next_fix(now, events)
            if s.deterministic_fixer:
                # Right numbers, refused by the integrity gate: say so, not just "no fix".
                blocked = aimed is not None and not aimed.integrity_ok and not aimed.failure_class
                return self._stop("integrity" if blocked else "no_fix", outcome.reason, events)
            return self._next_fix(now, events)
        round_.candidate_hash = outcome.candidate_hash
        if outcome.candidate_hash in s.seen:
            round_.outcome = "cycle"
            return self._stop("cycle", f"round {number} proposed a candidate seen before", events)
        s.seen.append(outcome.candidate_hash)
        return Step(
            action=Action(kind="validate", candidate_hash=outcome.candidate_hash, suite="compact"),
            events=events,
        )

    def evidence_of(self, candidate_hash: str) -> Evidence | None:
        """The evidence a fix of ``candidate_hash`` (the current candidate's, or the unedited
        kernel's) starts from."""
        s = self.state
        if candidate_hash == s.current_hash:
            return s.current_evidence
        return s.original_evidence if candidate_hash == s.original_hash else None

    def result(self, session_id: str) -> RepairResult:
        """What the session came to, once the loop has stopped."""
        s = self.state
        evidence = s.current_evidence
        return RepairResult(
            session_id=session_id,
            certified=s.certified,
            rounds=len(s.rounds),
            stop_reason=s.stop_reason or "",
            stop_detail=s.stop_detail,
            tokens=s.tokens,
            original_hash=s.original_hash,
            final_hash=s.best_hash,
            failure_class=None if s.certified or evidence is None else evidence.failure_class,
            targets=dict(evidence.targets) if evidence is not None else {},
            round_stats=[r.stats for r in s.rounds if r.stats is not None],
        )

    def finish(self, result: RepairResult) -> Step:
        """The session's last event, then learning from its log where the session learns."""
        finished = PlannedEvent.of(RepairFinished.model_validate(result.model_dump(mode="json")))
        then = Action(kind="learn") if self.state.learn else Action(kind="stop")
        return Step(action=then, events=[finished])

    # --- internals ----------------------------------------------------------------------

    def _fix_action(self, knowledge: list[str] | None = None, patches: list | None = None):
        s = self.state
        s.fixing = self._next_base()
        return Action(
            kind="fix",
            candidate_hash=s.fixing,
            tool_round=s.tool_rounds,
            knowledge=knowledge or [],
            patches=patches or [],
        )

    def _in_beam(self) -> bool:
        """Whether the unedited kernel is in the beam beside the best candidate: the fixer is a
        search, the best is an edit, and the search has edits of the unedited kernel left."""
        s = self.state
        return (
            s.keep_unedited
            and s.current_hash != s.original_hash
            and s.original_hash not in s.exhausted
        )

    def _next_base(self) -> str:
        """What the next fix edits: the best candidate, or, while the beam holds both, the
        unedited kernel first (its remaining edits are screened before anything is built on an
        edit of it that only got further), then the two in turn."""
        s = self.state
        if not self._in_beam():
            return s.current_hash
        last = s.rounds[-1]
        had_its_turn = last.base_hash == s.original_hash and last.candidate_hash != s.current_hash
        if had_its_turn and s.current_hash not in s.exhausted:
            return s.current_hash
        return s.original_hash

    def _signature(self) -> str:
        evidence = self.state.current_evidence
        return evidence.signature if evidence else ""

    def _judge_validation(self, evidence: Evidence) -> PlannedEvent:
        """Keep the best candidate; revert a regression so the next fix starts from the best."""
        s = self.state
        round_ = s.rounds[-1]
        round_.failure_class, round_.score = evidence.failure_class, evidence.score
        s.signatures.append(evidence.signature)
        if evidence.compact_passed and evidence.integrity_ok:
            round_.outcome = "compact_passed"  # judged when its certification comes back
        else:
            self._keep_if_not_worse(round_, (evidence.score, -1.0), evidence)
        validated = CandidateValidated(
            round=round_.number,
            candidate_hash=evidence.candidate_hash,
            outcome=round_.outcome,
            score=evidence.score,
            best_hash=s.best_hash,
            summary=round_.summary,
            aimed_at=round_.aimed_at,
            base_hash=round_.base_hash,
        )
        return PlannedEvent.of(validated)

    def _after_certify(self, evidence: Evidence, now: float, events: list) -> Step:
        s = self.state
        if evidence.certified:
            s.certified = True
            s.best_hash = s.current_hash = evidence.candidate_hash
            s.current_evidence = evidence
            if s.rounds:
                s.rounds[-1].outcome = "certified"
            return self._stop("certified", "certified on all suites with integrity", events)
        # Compact passed, the full suite did not: that is the evidence the next fix needs.
        if s.signatures:
            s.signatures[-1] = evidence.signature
        round_ = s.rounds[-1] if s.rounds else Round(number=0)
        round_.failure_class = evidence.failure_class
        self._keep_if_not_worse(round_, (s.pending_rank, evidence.score), evidence)
        return self._next_fix(now, events)

    def _keep_if_not_worse(self, round_: Round, rank: tuple[float, float], evidence: Evidence):
        """Ranks compare compact score first, then the full-suite score when there is one."""
        s = self.state
        if rank < s.best_rank:
            round_.outcome = "regression_reverted"
            return
        round_.outcome = "improved" if rank > s.best_rank else "same"
        if rank == s.best_rank and round_.base_hash != s.current_hash:
            return  # an edit of the unedited kernel no better than the best: the best stays
        s.best_rank, s.best_hash = rank, evidence.candidate_hash
        s.current_hash, s.current_evidence = evidence.candidate_hash, evidence

    def _next_fix(self, now: float, events: list) -> Step:
        s, g = self.state, self.state.guards
        elapsed = now - s.started_at
        if elapsed >= g.deadline_s:
            detail = f"{elapsed:.0f} s elapsed, deadline {g.deadline_s:.0f} s"
            return self._stop("deadline", detail, events)
        if len(s.rounds) >= g.max_rounds:
            detail = f"{len(s.rounds)} rounds run, max {g.max_rounds}"
            return self._stop("max_rounds", detail, events)
        if g.token_budget is not None and s.tokens.total >= g.token_budget:
            return self._stop(
                "token_budget", f"{s.tokens.total} tokens used, budget {g.token_budget}", events
            )
        if g.uncached_token_budget is not None and s.tokens.uncached >= g.uncached_token_budget:
            return self._stop(
                "uncached_token_budget",
                f"{s.tokens.uncached} uncached tokens used, budget {g.uncached_token_budget}",
                events,
            )
        k = g.no_progress_rounds
        recent = s.signatures[-k:]
        if len(recent) == k and len(set(recent)) == 1:
            return self._stop(
                "no_progress", f"the same failure ({recent[0]}) {k} rounds running", events
            )
        if s.use_kb:
            retrieve = Action(kind="retrieve", candidate_hash=s.current_hash)
            return Step(action=retrieve, events=events)
        return Step(action=self._fix_action(), events=events)

    def _stop(self, reason: str, detail: str, events: list) -> Step:
        s = self.state
        s.stop_reason, s.stop_detail = reason, detail
        if reason in GUARDS:
            events.append(PlannedEvent.of(GuardTripped(guard=reason, detail=detail)))
        return Step(action=Action(kind="stop", reason=reason, detail=detail), events=events)
