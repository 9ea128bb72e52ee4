"""The models a repair passes between client, workflow and activities (pydantic, no I/O).

Sources travel by content hash (``sha256:...``) in workflow history; the activities keep the
text in the event store's blob table, so history stays far below Temporal's payload limits.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from nearmiss.engine.models import Evidence


class FixerKind(BaseModel, frozen=True):
    """What a fixer is, which is what the workflows decide by: never from its name.

    A ``--model`` names a kind, with an argument where the kind takes one (``openai:MODEL``,
    ``replay:SESSION``); ``fixer_kind`` resolves it. The activities build each kind's fixer
    (``activities.fixers.registry``); workflows cannot import them, so the table is here.
    """

    name: str
    takes_argument: bool = False
    # Never calls a model: no tokens, and asking again gives the same answer.
    zero_token: bool = False
    # Asking again gives the same answer (the zero-token fixers, a recording replayed).
    deterministic: bool = False
    # A chat endpoint: writes whole kernels (regenerate, experiments) and runs tool rounds.
    chat: bool = False
    # The recorded answers of a past session (``nearmiss replay``), not a fixer at all.
    replay: bool = False
    # Screens a kernel's candidate edits, going on where it stopped when asked again
    # (``FixRequest.skip``): the loop keeps the unedited kernel in its beam (workflows.loop).
    screens: bool = False


FIXER_KINDS = {
    kind.name: kind
    for kind in (
        # The playbook's recipes, and the playbook followed by a screened mutation search.
        FixerKind(name="playbook", zero_token=True, deterministic=True),
        FixerKind(name="search", zero_token=True, deterministic=True, screens=True),
        FixerKind(name="openai", takes_argument=True, chat=True),
        FixerKind(name="replay", takes_argument=True, deterministic=True, replay=True),
    )
}


def unknown_model(model: str) -> str:
    """What a ``--model`` no fixer answers to is told (a recording is not one to choose)."""
    return f"unknown model {model!r}: expected playbook, search or openai:MODEL"


def fixer_kind(model: str) -> FixerKind:
    """The kind a ``--model`` names; ValueError for a name no fixer has."""
    name, colon, argument = model.partition(":")
    kind = FIXER_KINDS.get(name)
    if kind is None or kind.takes_argument != bool(argument) or bool(colon) != bool(argument):
        raise ValueError(unknown_model(model))
    return kind


def is_kind(model: str, **wanted: bool) -> bool:
    """Whether ``model`` names a fixer with these properties (False for no fixer at all)."""
    try:
        kind = fixer_kind(model)
    except ValueError:
        return False
    return all(getattr(kind, key) == value for key, value in wanted.items())


def model_argument(model: str) -> str:
    """What a ``--model`` gives its kind: the chat model's name, the recorded session's id."""
    return model.partition(":")[2]


def replay_model(session_id: str) -> str:
    return f"replay:{session_id}"


class TokenUsage(BaseModel):
    """Tokens of model calls; ``cached_input`` is the part of ``input`` served from a cache."""

    input: int = 0
    cached_input: int = 0
    output: int = 0

    @property
    def uncached_input(self) -> int:
        return self.input - self.cached_input

    @property
    def uncached(self) -> int:
        """Tokens actually processed: input not served from cache, plus output."""
        return self.input - self.cached_input + self.output

    @property
    def total(self) -> int:
        return self.input + self.output

    def __add__(self, other: TokenUsage) -> TokenUsage:
        return TokenUsage(
            input=self.input + other.input,
            cached_input=self.cached_input + other.cached_input,
            output=self.output + other.output,
        )


class RoundStats(BaseModel):
    """What one fix round spent besides tokens: model requests and experiments, and their time.

    ``model_s``/``tool_s`` are measured by the activities (the wall time of the requests and of
    the tool runs), so a replayed workflow reports what the live one did."""

    round: int
    model_requests: int = 0  # chat requests sent, a refused one included
    model_s: float = 0.0
    tool_calls: int = 0  # experiments run (calls answered "not run" are not counted)
    tool_s: float = 0.0


class RepairResult(BaseModel):
    session_id: str
    certified: bool
    rounds: int
    stop_reason: str
    stop_detail: str
    tokens: TokenUsage
    original_hash: str
    final_hash: str  # the certified candidate, else the best one seen
    failure_class: str | None = None
    # The targets of the last check, each with whether it accepted the kernel: what a
    # certificate covers ({"interpret": true, "tpu-v5e": true}).
    targets: dict[str, bool] = Field(default_factory=dict)
    # Per fix round, in order: model requests, experiments, and their time.
    round_stats: list[RoundStats] = Field(default_factory=list)


class FixRequest(BaseModel):
    """Everything a fixer may see: the spec, the current source, the evidence, what was tried."""

    spec_path: str
    spec_source: str
    source: str
    candidate_name: str
    evidence: Evidence
    round: int
    # Names of the edits proposed earlier in this session (playbook recipes, model summaries),
    # so a fixer does not offer the same thing twice.
    tried: list[str] = Field(default_factory=list)
    knowledge: list[str] = Field(default_factory=list)
    # How many of its candidate edits of this source a search screened in earlier rounds
    # without finding one (``FixResult.resume_at``): this round goes on from there.
    skip: int = 0
    # Tokens (input + output) left of the repair's budget when this round starts; None: no
    # budget. A model's answer is bounded by it (``max_tokens``).
    tokens_left: int | None = None

    @classmethod
    def of(cls, fix: FixInput, spec_source: str, source: str) -> FixRequest:
        """What a fixer sees of a fix activity's input, the texts loaded from the blob store."""
        return cls(
            spec_path="spec.py",
            spec_source=spec_source,
            source=source,
            candidate_name=fix.candidate_name,
            evidence=fix.evidence,
            round=fix.round,
            tried=fix.tried,
            knowledge=fix.knowledge,
            skip=fix.skip,
            tokens_left=fix.tokens_left,
        )


class FixResult(BaseModel):
    """A fixer's answer. ``source`` is the whole edited file, or None when it has no edit (then
    ``reason`` says why: no recipe applies, the model's edit did not apply, ...)."""

    source: str | None = None
    summary: str = ""  # what the edit does, e.g. the playbook recipe's name
    reason: str = ""
    model: str = ""
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    prompt: str = ""
    response: str = ""
    # More to try: a search that spent its round's budget before its candidate edits ran out
    # says how far through them it got (with earlier rounds), so asking again with
    # ``FixRequest.skip`` set to it goes on where it stopped; 0: nothing left. With no edit,
    # the next round goes on; with one, the loop comes back to it from the unedited kernel.
    resume_at: int = 0
    model_requests: int = 0  # chat requests this answer took (0: no model asked)
    model_s: float = 0.0  # their wall time


class FixOutcome(BaseModel):
    """A fix as the workflow sees it: texts replaced by their blob hashes."""

    candidate_hash: str | None = None  # the edited source, None when there is no edit
    summary: str = ""
    reason: str = ""
    model: str = ""
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    prompt_hash: str = ""
    response_hash: str = ""
    fatal: bool = False  # the fixer cannot go on (a non-retryable model error)
    tool_calls: int = 0  # experiments the agent ran in this round
    resume_at: int = 0  # FixResult.resume_at
    model_requests: int = 0  # chat requests of this round (RoundStats)
    model_s: float = 0.0
    tool_s: float = 0.0  # wall time of the experiments it ran


class CheckInput(BaseModel):
    spec_hash: str
    candidate_hash: str
    candidate_name: str
    suite: str
    seed: int
    # The integrity gate's mode (nearmiss.engine.integrity.gate.MODES); "report" is the
    # no-anti-cheat
    # ablation: violations are listed but neither block certification nor the loop.
    integrity: str = "enforce"
    targets: list[str] = Field(default_factory=list)  # empty: the spec's, else interpret
    candidate_folder: str = ""  # RepairRequest.candidate_folder
    # The session's original: a certified candidate is handed back with every change it did
    # not need put back as this had it (``activities.trim``). Empty: no trimming.
    trim_against: str = ""


class FixInput(BaseModel):
    spec_hash: str
    candidate_hash: str
    candidate_name: str
    evidence: Evidence
    round: int
    model: str
    tried: list[str] = Field(default_factory=list)
    knowledge: list[str] = Field(default_factory=list)  # prompt lines of retrieved entries
    # Learned diffs for this signature, tried first at zero tokens: {"entry_id", "diff"}.
    patches: list[dict] = Field(default_factory=list)
    skip: int = 0  # FixRequest.skip
    tokens_left: int | None = None  # FixRequest.tokens_left


class RetrieveInput(BaseModel):
    evidence: Evidence
    budget_chars: int
    # The held-out knowledge split (RepairRequest.knowledge): the session's original, whose own
    # fix no entry may hand over (``kb.knowledge.Entry.hands_over``). Empty: every entry.
    hold_out_for: str = ""


class RetrieveResult(BaseModel):
    entry_ids: list[str] = Field(default_factory=list)
    lines: list[str] = Field(default_factory=list)
    patches: list[dict] = Field(default_factory=list)


class RecordInput(BaseModel):
    stream_id: str
    expected_version: int
    events: list[dict]  # {"type": ..., "payload": ...}


# --- the tool-using fix agent ----------------------------------------------------------------


class ToolCall(BaseModel):
    """A tool call as the model made it; ``arguments`` is its raw JSON text (maybe malformed)."""

    id: str
    name: str
    arguments: str = "{}"


class ToolAnswer(BaseModel):
    """The answer the model gets to one call, and what the session records of it."""

    call_id: str
    tool: str
    arguments: str = "{}"
    ok: bool = False
    content: str = ""  # compact text for the model
    data_hash: str = ""  # the full structured result in the blob store, when there is one
    seconds: float = 0.0  # how long the tool ran (0 for a call answered without running)

    @classmethod
    def to(cls, call: ToolCall, content: str, ok: bool = False) -> ToolAnswer:
        return cls(
            call_id=call.id, tool=call.name, arguments=call.arguments, ok=ok, content=content
        )


class AgentStepInput(BaseModel):
    fix: FixInput
    conversation_hash: str = ""  # "" for the first step of a round
    answers: list[ToolAnswer] = Field(default_factory=list)  # to the previous step's calls
    tools_allowed: bool = True  # False: the round's tool budget is spent, edit now
    tool_budget: int = 0  # tool calls this round, as the first prompt states it
    note: str = ""  # said to the model with the answers, e.g. how many calls are left
    # Tokens left of the repair's budget before this step (None: no budget): bounds the
    # answer's length (max_tokens).
    tokens_left: int | None = None


class AgentStep(BaseModel):
    """One model turn of a round: tool calls to run, or the round's outcome."""

    conversation_hash: str
    tokens: TokenUsage = Field(default_factory=TokenUsage)
    calls: list[ToolCall] = Field(default_factory=list)  # for run_tool
    # Calls the step answered itself (malformed arguments, unknown tools, an edit that did not
    # apply): recorded like the others, never run.
    answered: list[ToolAnswer] = Field(default_factory=list)
    outcome: FixOutcome | None = None  # set when the round ends
    model_requests: int = 0  # chat requests this step sent (a refused one included)
    model_s: float = 0.0  # their wall time


class ToolInput(BaseModel):
    spec_hash: str
    candidate_hash: str
    candidate_name: str
    call: ToolCall
    evidence: Evidence | None = None  # for kb_search's default query
