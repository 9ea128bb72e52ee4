"""`nearmiss fleet DIR|MANIFEST` and `nearmiss fleets [FLEET]`: many repairs as one durable job.

A directory is searched for ``spec.py`` files; every other ``.py`` file below a spec's folder
(its ``variants/``, say — not ``golden.py``, not a folder with a spec of its own) is a member. A
manifest is JSON: a list of ``{"spec": PATH, "candidate": PATH, "name": optional}`` (or
``{"members": [...]}``), paths relative to the manifest.

The fleet runs as a FleetWorkflow; this module starts it, draws a live table of the sessions in
flight, and ends with a summary and the HTML report. Ctrl-C cancels the fleet (what finished is
kept). A fleet whose command died resumes as soon as any worker runs: `nearmiss fleets FLEET
--follow` serves it from here and follows it to the end. A command that loses Temporal waits for
it (saying so in one line) for ``Settings.reconnect_s``; past that it gives up with
``TemporalLost``, whose message says how to follow the fleet, which goes on regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from kb.events import EventStore
from nearmiss.client.faults import describe, is_infrastructure_error, progress_or_none
from nearmiss.engine.errors import UsageError
from nearmiss.engine.inputs import read_source
from nearmiss.engine.runner import spares
from nearmiss.engine.runner.session import describe_spec
from nearmiss.engine.targets.registry import parse_targets
from nearmiss.events import FleetFinished, FleetMemberFinished, FleetStarted, of_type
from nearmiss.reports.terminal import write_control
from nearmiss.reports.text import table
from workflows.fleet import FleetMember, FleetProgress, FleetRequest, FleetResult, FleetWorkflow
from workflows.loop import Guards
from workflows.models import TokenUsage
from workflows.repair import TASK_QUEUE, Progress, RepairWorkflow

POLL_S = 1.0
RECONNECT_POLL_MAX_S = 10.0
NOT_MEMBERS = {"spec.py", "golden.py", "__init__.py"}


@dataclass(frozen=True)
class MemberFile:
    name: str
    spec: Path
    candidate: Path
    # The fleet's directory (or its manifest's): symlinks may point anywhere inside it.
    tree: Path | None = field(default=None, compare=False)
    # The member's own targets (a manifest's "targets"); empty: the fleet's --target, else the
    # spec's.
    targets: tuple[str, ...] = ()


def discover(target: Path) -> list[MemberFile]:
    """The members a directory or manifest names; UsageError with the reason otherwise."""
    if target.is_dir():
        members = _from_directory(target)
        if not members:
            raise UsageError(f"no spec.py with candidate kernels below {target}")
        return members
    if target.is_file():
        return _from_manifest(target)
    raise UsageError(f"fleet target not found: {target}")


def _from_directory(root: Path) -> list[MemberFile]:
    specs = sorted(root.rglob("spec.py"))
    spec_dirs = {s.parent for s in specs}
    members = []
    for spec in specs:
        for candidate in sorted(spec.parent.rglob("*.py")):
            owner = next(p for p in candidate.parents if p in spec_dirs)
            if owner != spec.parent or candidate.name in NOT_MEMBERS:
                continue
            if candidate.stem.endswith(".fixed"):  # a repair's output, not a near-miss
                continue
            label = spec.parent.relative_to(root).as_posix()
            label = label if label != "." else spec.parent.name
            members.append(MemberFile(f"{label}/{candidate.stem}", spec, candidate, root))
    return members


def _from_manifest(path: Path) -> list[MemberFile]:
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not a JSON manifest: {exc}") from exc
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    entries = data.get("members") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise UsageError(f'{path}: expected a non-empty list of {{"spec", "candidate"}} entries')
    return [_manifest_member(path, number, entry) for number, entry in enumerate(entries, 1)]


def _shown(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _manifest_member(path: Path, number: int, entry) -> MemberFile:
    """One manifest entry as a member; UsageError naming the entry when it is malformed."""
    where = f"{path}: entry {number}"
    if not isinstance(entry, dict) or not {"spec", "candidate"} <= entry.keys():
        raise UsageError(f'{where} needs "spec" and "candidate"')
    files = {}
    for role in ("spec", "candidate"):
        value = entry[role]
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise UsageError(f"{where}: {role} must be a file path (a string), not {_shown(value)}")
        file = path.parent / value
        try:
            read_source(role, file, tree=path.parent)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from exc
        except OSError as exc:
            raise UsageError(f"{where}: {role} {value!r}: {exc.strerror or exc}") from exc
        files[role] = file
    name = entry.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise UsageError(f"{where}: name must be a non-empty string, not {_shown(name)}")
    name = name or f"{files['spec'].parent.name}/{files['candidate'].stem}"
    targets = entry.get("targets")
    if targets is not None:
        if not isinstance(targets, str | list) or not all(
            isinstance(t, str) for t in (targets if isinstance(targets, list) else [targets])
        ):
            raise UsageError(
                f'{where}: targets must be "a,b" or a list of names, not {_shown(targets)}'
            )
        try:
            targets = parse_targets(targets)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}") from exc
    return MemberFile(name, files["spec"], files["candidate"], path.parent, targets or ())


async def describe_specs(specs: list[Path]) -> dict[Path, dict]:
    """Each spec's description (``describe_spec``), a core's worth at a time: each starts a
    sandboxed child that imports JAX, a second or so that the fleet would otherwise wait for
    once per spec before its first member starts. The first spec that does not load fails all
    (a UsageError naming it), as one at a time would."""
    cores = asyncio.Semaphore(spares.cores())

    async def one(spec: Path) -> dict:
        async with cores:
            return await asyncio.to_thread(describe_spec, spec)

    return dict(zip(specs, await asyncio.gather(*(one(s) for s in specs)), strict=True))


async def start_fleet(
    client: Client,
    store: EventStore,
    files: list[MemberFile],
    *,
    model: str,
    guards: Guards,
    concurrency: int,
    use_kb: bool = True,
    members_per_run: int = 200,
    fleet_id: str | None = None,
    targets: list[str] | None = None,
) -> WorkflowHandle:
    """Store every spec and candidate by hash and start the FleetWorkflow."""
    described = await describe_specs(sorted({f.spec for f in files}))
    members = []
    for f in files:
        spec = described[f.spec]
        members.append(
            FleetMember(
                name=f.name,
                kernel=spec["name"],
                # What is stored is the text read_source admits, never raw bytes of a path.
                spec_hash=await store.put_blob(read_source("spec", f.spec, tree=f.tree).encode()),
                candidate_hash=await store.put_blob(
                    read_source("candidate", f.candidate, tree=f.tree).encode()
                ),
                candidate_name=f.candidate.name,
                candidate_folder=str(f.candidate.resolve().parent),
                # The member's, else the fleet's, else its spec's: named here so that the
                # workflow sends its checks to their queue (workflows.routing).
                targets=list(f.targets or ([] if targets else spec.get("targets") or [])),
            )
        )
    request = FleetRequest(
        members=members,
        model=model,
        guards=guards,
        use_kb=use_kb,
        concurrency=concurrency,
        members_per_run=members_per_run,
        targets=targets or [],
    )
    fleet_id = fleet_id or f"fleet-{datetime.now(UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
    return await client.start_workflow(
        FleetWorkflow.run, request, id=fleet_id, task_queue=TASK_QUEUE
    )


# --- following a fleet ------------------------------------------------------------------------


class LiveView:
    """A table of the sessions in flight, redrawn in place on a terminal; plain lines otherwise."""

    def __init__(self, client: Client, stream: TextIO | None = None) -> None:
        self.client = client
        self.stream = stream or sys.stderr  # as it is now: the command line wraps it
        self.tty = self.stream.isatty()
        self.drawn_lines = 0
        self.reported: set[int] = set()

    async def update(self, progress: FleetProgress) -> None:
        if self.tty:
            await self._redraw(progress)
            return
        for r in progress.results:
            if r.index not in self.reported:
                self.reported.add(r.index)
                self._print(
                    f"  [{len(self.reported)}/{progress.total}] {r.name}: {r.verdict}"
                    f" · {r.rounds} round(s) · {r.tokens.total} tokens"
                )

    async def _redraw(self, progress: FleetProgress) -> None:
        rows = []
        for member in progress.running:
            line = ["-", "starting", "-", "-", "-"]
            handle = self.client.get_workflow_handle(member.session_id)
            p: Progress | None = await progress_or_none(handle, RepairWorkflow.progress)
            if p is not None:
                score = f"{p.score:.2f}" if p.score is not None else "-"
                line = [str(p.round), p.phase, p.failure_class or "-", score, str(p.tokens.total)]
            rows.append([member.name, *line])
        text = table(["in flight", "round", "phase", "class", "score", "tokens"], rows)
        text += f"\n{counts_line(progress)}"
        if self.drawn_lines:
            write_control(self.stream, f"\x1b[{self.drawn_lines}F\x1b[J")
        self._print(text)
        self.drawn_lines = text.count("\n") + 1

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)


def counts_line(progress: FleetProgress) -> str:
    return (
        f"{progress.finished}/{progress.total} finished · {progress.certified} certified · "
        f"{len(progress.running)} running · {progress.tokens.total} tokens"
    )


class TemporalLost(Exception):
    """Temporal stayed out of reach for longer than the command waits; the fleet goes on."""

    def __init__(self, fleet_id: str, address: str, waited_s: float) -> None:
        super().__init__(
            f"lost Temporal at {address} for {waited_s:.0f} s; fleet {fleet_id} goes on without "
            f"this command: follow it with `nearmiss fleets {fleet_id} --follow`"
        )


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def wait_for_temporal(client: Client, handle: WorkflowHandle, error, reconnect_s: float):
    """Temporal went away (``error``): say so once, then try again with backoff until it
    answers; TemporalLost after ``reconnect_s``."""
    address = client.service_client.config.target_host
    loop = asyncio.get_running_loop()
    started = loop.time()
    _say(
        f"lost Temporal at {address} ({describe(error)}); waiting up to {reconnect_s:.0f} s for "
        f"it — fleet {handle.id} goes on regardless (`nearmiss fleets {handle.id} --follow`)"
    )
    delay = 1.0
    while True:
        try:
            await handle.describe()
        except Exception as exc:
            if not is_infrastructure_error(exc):
                raise
        else:
            _say(f"Temporal is back after {loop.time() - started:.0f} s")
            return
        if loop.time() + delay - started > reconnect_s:
            raise TemporalLost(handle.id, address, loop.time() - started)
        await asyncio.sleep(delay)
        delay = min(delay * 2, RECONNECT_POLL_MAX_S)


async def follow(
    client: Client, handle: WorkflowHandle, quiet: bool = False, reconnect_s: float = 300.0
) -> FleetResult | None:
    """Show progress until the fleet ends; the first Ctrl-C or SIGTERM cancels it (the rest
    wait).
    None when the fleet did not finish (cancelled): its events hold what did. Rides out a
    Temporal restart of up to ``reconnect_s``; TemporalLost beyond."""
    view = LiveView(client)
    loop = asyncio.get_running_loop()
    cancelling = False

    async def cancel_fleet() -> None:
        try:
            await handle.cancel()
        except RPCError as exc:
            _say(f"could not cancel the fleet: {describe(exc)}")

    def cancel() -> None:
        nonlocal cancelling
        if not cancelling:
            cancelling = True
            print("\ncancelling the fleet (finished sessions are kept)...", file=sys.stderr)
            asyncio.ensure_future(cancel_fleet())

    # SIGTERM as Ctrl-C: the fleet is cancelled and the command ends as it does, stopping the
    # services it started, never killed with them left running.
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, cancel)
    try:
        while True:
            result_task = asyncio.ensure_future(handle.result())
            while not result_task.done():
                if not quiet:
                    progress = await progress_or_none(handle, FleetWorkflow.progress)
                    if progress is not None:
                        await view.update(progress)
                await asyncio.wait({result_task}, timeout=POLL_S)
            error = result_task.exception()
            if error is None:
                return result_task.result()
            if not is_infrastructure_error(error):
                return None  # the fleet failed or was cancelled
            await wait_for_temporal(client, handle, error, reconnect_s)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signum)


# --- reading fleets back from the event store ---------------------------------------------------


async def fleet_summary(store: EventStore, fleet_id: str) -> dict | None:
    """A fleet as its events tell it: config, member results, and whether it finished."""
    events = await store.read_stream(fleet_id)
    if not events or events[0].type != "FleetStarted":
        return None
    started = of_type(events[:1], FleetStarted)[0]
    results = sorted(of_type(events, FleetMemberFinished), key=lambda r: r.index)
    finished = of_type(events, FleetFinished)
    state = "finished" if finished else "running"
    if finished and finished[0].cancelled:
        state = "cancelled"
    return {
        "fleet_id": fleet_id,
        "started_at": events[0].recorded_at.isoformat(timespec="seconds"),
        "model": started.model,
        "total": started.members,
        "finished": len(results),
        "certified": sum(r.certified for r in results),
        "tokens": sum(TokenUsage.model_validate(r.tokens).total for r in results),
        "state": state,
        "results": [r.payload() for r in results],
    }


def cancelled_before_start(fleet_id: str, model: str, total: int) -> dict:
    """The summary of a fleet cancelled (Ctrl-C, SIGTERM) before its first act, recording its
    start: no event, no member ran."""
    return {
        "fleet_id": fleet_id,
        "started_at": None,
        "model": model,
        "total": total,
        "finished": 0,
        "certified": 0,
        "tokens": 0,
        "state": "cancelled",
        "results": [],
    }


async def list_fleets(store: EventStore, limit: int = 50) -> list[dict]:
    started = await store.recent_of_type("FleetStarted", limit)
    summaries = [await fleet_summary(store, e.stream_id) for e in started]
    return [s for s in summaries if s is not None]


def results_table(results: list[dict]) -> str:
    """One row per member; a targets column (each judged target: ok or FAIL) when any has one."""
    judged = [r.get("targets") or {} for r in results]
    shown = [" ".join(f"{t}:{'ok' if ok else 'FAIL'}" for t, ok in j.items()) for j in judged]
    rows = [
        [
            r["name"],
            r["verdict"],
            str(r["rounds"]),
            str(r["tokens"]["input"] + r["tokens"]["output"]),
            r["session_id"],
        ]
        + ([targets] if any(judged) else [])
        for r, targets in zip(results, shown, strict=True)
    ]
    header = ["member", "verdict", "rounds", "tokens", "session"]
    return table(header + (["targets"] if any(judged) else []), rows)


def verdict_counts(results: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return ", ".join(f"{v} {n}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
