"""Everything a report shows about one repair session, gathered from the event store.

The event stream is the whole truth of a session: what was checked, retrieved, proposed and
decided. The blobs it points at give the texts (original and final source) and the full check
reports (for the mismatch maps).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import cast

from pydantic import ValidationError

from kb.events import EventLog, StoredEvent
from nearmiss.engine.models import CheckReport, MismatchMap
from nearmiss.events import EvidenceCollected, FixProposed, RepairFinished, RepairStarted, parse
from nearmiss.reports.heatmap import render_heatmap_png
from nearmiss.reports.timeline import describe_event, short_hash
from workflows.models import TokenUsage


class UnknownSession(LookupError):
    """No repair session with that id in the event store."""


@dataclass
class TimelineRow:
    offset_s: float  # since the session's first event
    round: int  # 0: before the first fix
    kind: str  # the event type
    text: str


class RoundTokens(TokenUsage):
    """The tokens of one round's fix."""

    round: int


@dataclass
class HeatmapFigure:
    label: str  # round, candidate, case and output leaf, in words
    diagnosis: str
    heatmap: MismatchMap

    @cached_property
    def png(self) -> bytes:
        """The picture, encoded once for both the HTML and the Markdown report."""
        return render_heatmap_png(self.heatmap)


@dataclass
class SessionView:
    session_id: str
    kernel: str
    candidate_name: str
    model: str
    finished: bool
    certified: bool
    rounds: int
    stop_reason: str
    stop_detail: str
    tokens: TokenUsage  # over the whole session
    failure_class: str | None  # of the original candidate
    original_hash: str
    final_hash: str
    diff: str  # unified, original → final; "" when unchanged or unfinished
    timeline: list[TimelineRow] = field(default_factory=list)
    round_tokens: list[RoundTokens] = field(default_factory=list)
    heatmaps: list[HeatmapFigure] = field(default_factory=list)
    # When its first and last events were recorded; the targets of its last check ({name: ok}).
    started_at: datetime | None = None
    ended_at: datetime | None = None
    targets: dict[str, bool] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        if not self.finished:
            return "unfinished"
        return "certified" if self.certified else "not certified"


@dataclass
class FleetRow:
    """One session in a fleet's summary table."""

    session_id: str
    kernel: str
    candidate: str
    verdict: str
    rounds: int
    stop: str
    tokens: int  # input + output
    uncached_tokens: int
    started_at: datetime | None = None  # its first event
    ended_at: datetime | None = None  # its last event
    targets: dict[str, bool] = field(default_factory=dict)  # of its last check: {name: ok}


async def evidence_report(store: EventLog, event: StoredEvent) -> CheckReport | None:
    """The full check report behind an EvidenceCollected, when it can still be read."""
    digest = event.payload.get("report_hash")
    if not digest:
        return None
    try:
        return CheckReport.model_validate_json(await store.get_blob(digest))
    except (KeyError, ValidationError):  # pruned blob, or a report of an older schema
        return None


def _figure(report: CheckReport, round_: int, candidate: str) -> HeatmapFigure | None:
    for case in report.cases:
        loc = case.localisation
        if not case.passed and loc is not None and loc.heatmap is not None:
            label = (
                f"round {round_} · candidate {short_hash(candidate)} · "
                f"{case.suite}/{case.name} · output {loc.leaf}"
            )
            return HeatmapFigure(label=label, diagnosis=case.diagnosis, heatmap=loc.heatmap)
    return None


async def blob_text(store: EventLog, digest: str) -> str | None:
    """A stored text, when it can still be read."""
    try:
        return (await store.get_blob(digest)).decode("utf-8", errors="replace")
    except KeyError:
        return None


async def _diff(store: EventLog, name: str, original: str, final: str) -> str:
    before, after = await blob_text(store, original), await blob_text(store, final)
    if before is None or after is None or before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        fromfile=f"a/{name}",
        tofile=f"b/{name}",
    )
    # A last line without a newline would run into the next one in a <pre>.
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


async def load_session(store: EventLog, session_id: str) -> SessionView:
    """Read the session's stream and blobs; raises UnknownSession when there is no such repair."""
    events = await store.read_stream(session_id)
    if not events or events[0].type != "RepairStarted":
        raise UnknownSession(f"no repair session {session_id!r} in the event store")
    started = cast(RepairStarted, parse(events[0].type, events[0].payload))
    view = SessionView(
        session_id=session_id,
        kernel=started.kernel,
        candidate_name=started.candidate_name,
        model=started.model,
        finished=False,
        certified=False,
        rounds=0,
        stop_reason="",
        stop_detail="",
        tokens=TokenUsage(),
        failure_class=None,
        original_hash=started.candidate_hash,
        final_hash="",
        diff="",
    )
    t0, round_ = events[0].recorded_at, 0
    for event in events:
        p, report = event.payload, None
        typed = parse(event.type, p)
        if isinstance(typed, FixProposed):
            round_ = typed.round
            view.round_tokens.append(RoundTokens(round=round_, **typed.tokens))
        elif isinstance(typed, EvidenceCollected):
            report = await evidence_report(store, event)
            if view.failure_class is None and typed.phase == "forensics":
                view.failure_class = typed.failure_class
            figure = report and _figure(report, round_, typed.candidate_hash)
            if figure:
                view.heatmaps.append(figure)
        elif isinstance(typed, RepairFinished):
            view.finished, view.certified = True, typed.certified
            view.rounds = typed.rounds
            view.tokens = TokenUsage.model_validate(typed.tokens)
            view.stop_reason, view.stop_detail = typed.stop_reason, typed.stop_detail
            view.final_hash = typed.final_hash
            view.targets = dict(typed.targets)
        offset = (event.recorded_at - t0).total_seconds()
        text = describe_event(event.type, p, report)
        view.timeline.append(TimelineRow(offset, p.get("round", round_), event.type, text))
    view.started_at, view.ended_at = t0, events[-1].recorded_at
    if not view.finished:
        view.rounds = len(view.round_tokens)
    else:
        view.diff = await _diff(store, view.candidate_name, view.original_hash, view.final_hash)
    return view


def fleet_row(view: SessionView) -> FleetRow:
    return FleetRow(
        session_id=view.session_id,
        kernel=view.kernel,
        candidate=view.candidate_name,
        verdict=view.verdict,
        rounds=view.rounds,
        stop=view.stop_reason or "-",
        tokens=view.tokens.total,
        uncached_tokens=view.tokens.uncached,
        started_at=view.started_at,
        ended_at=view.ended_at,
        targets=dict(view.targets),
    )


def _duration(seconds: float) -> str:
    """'45 s', '3 min 05 s', '2 h 07 min'."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def fleet_summary(rows: list[FleetRow]) -> str:
    """The line above a fleet's table: 'certified 2/3 · tokens 12,300 (4,100 uncached) · wall
    time 3 min 05 s · targets: interpret 2/3 ok, tpu-v5e 1/1 ok'. Wall time is from the first
    session's first event to the last one's last; a target counts the sessions whose last check
    judged it, and how many of them it accepted."""
    certified = sum(r.verdict == "certified" for r in rows)
    tokens = sum(r.tokens for r in rows)
    uncached = sum(r.uncached_tokens for r in rows)
    starts = [r.started_at for r in rows if r.started_at is not None]
    ends = [r.ended_at for r in rows if r.ended_at is not None]
    wall = _duration((max(ends) - min(starts)).total_seconds()) if starts and ends else "-"
    judged: dict[str, list[bool]] = {}
    for r in rows:
        for name, ok in r.targets.items():
            judged.setdefault(name, []).append(ok)
    targets = ", ".join(f"{name} {sum(oks)}/{len(oks)} ok" for name, oks in sorted(judged.items()))
    return (
        f"certified {certified}/{len(rows)} · tokens {tokens:,} ({uncached:,} uncached) · "
        f"wall time {wall} · targets: {targets or 'none judged'}"
    )
