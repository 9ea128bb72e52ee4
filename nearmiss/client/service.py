"""Client and worker wiring: `nearmiss repair` and `nearmiss worker`.

The workflow, the activities and the pydantic data converter are the same on both sides. Without
configured services, `repair` starts the embedded dev stack for the duration of the command (and
says so) and runs its own worker, so one command works on a fresh machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import functools
import gc
import importlib.metadata
import json
import logging
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from temporalio import activity
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
    Worker,
)

from activities.fixers.registry import make_fixer
from activities.fixers.search.leads import where_the_fix_is
from activities.placement import Placement
from activities.regenerate import RegenerateActivities
from activities.repair import RepairActivities
from infra.devstack import SEARCH_ATTRIBUTES, DevStack, port_open
from kb.events import EventStore
from kb.knowledge import load_seed
from nearmiss.client.faults import (
    INFRASTRUCTURE,
    as_activity_error,
    describe,
    is_infrastructure_error,
    progress_or_none,
    retry_line,
)
from nearmiss.client.settings import Settings
from nearmiss.engine.check import require_file
from nearmiss.engine.errors import Stopped, UsageError
from nearmiss.engine.inputs import read_source
from nearmiss.engine.runner import spares
from nearmiss.engine.runner.scratch import stop_orphaned_children, sweep_orphans
from nearmiss.engine.targets.registry import (
    GPU,
    TARGETS,
    available_targets,
    parse_targets,
    target_status,
)
from nearmiss.reports.session import blob_text, evidence_report
from workflows.fleet import FleetWorkflow
from workflows.loop import Guards
from workflows.models import RepairResult
from workflows.regenerate import RegenerateWorkflow
from workflows.repair import TASK_QUEUE, Progress, RepairRequest, RepairWorkflow
from workflows.routing import GENERAL_QUEUE, queue_of

# Every workflow a worker runs: the replay of saved sessions needs the same list.
WORKFLOWS = [RepairWorkflow, FleetWorkflow, RegenerateWorkflow]
PROGRESS_POLL_S = 0.5
_log = logging.getLogger("nearmiss.worker")


@functools.cache
def quiet_runtime() -> Runtime:
    """The SDK runtime of interactive commands (one per process): the SDK core's own warnings
    (every retried poll while Temporal restarts) stay out of the terminal; the command says
    what matters itself."""
    errors_only = LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    return Runtime(telemetry=TelemetryConfig(logging=errors_only))


async def connect(settings: Settings, runtime: Runtime | None = None) -> Client:
    client = await Client.connect(
        settings.temporal_address,
        namespace=settings.namespace,
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )
    await _ensure_search_attributes(client, settings.namespace)
    return client


async def _ensure_search_attributes(client: Client, namespace: str) -> None:
    """Register the session's search attributes on a server that lacks them (idempotent)."""
    kinds = {
        "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
        "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    }
    request = AddSearchAttributesRequest(
        namespace=namespace,
        search_attributes={name: kinds[kind] for name, kind in SEARCH_ATTRIBUTES.items()},
    )
    with contextlib.suppress(RPCError):  # already registered (the dev stack does it at start)
        await client.operator_service.add_search_attributes(request)


class _ClassifiedFailures(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput):
        try:
            return await self.next.execute_activity(input)
        except asyncio.CancelledError:
            details = activity.cancellation_details()
            if details is None or not (details.not_found or details.worker_shutdown):
                raise  # cancelled by its workflow: Temporal records it as cancelled, quietly
            # No one waits for this activity any more (its workflow ended, e.g. at the session's
            # deadline) or this worker is stopping (the server tries it again elsewhere, as it
            # would after the cancellation). Temporal would log either as a failure, with a
            # traceback, on the user's terminal; benign, it says nothing of it.
            raise ApplicationError(
                "the activity was abandoned: "
                + ("its workflow ended" if details.not_found else "its worker stopped"),
                type="Abandoned",
                category=ApplicationErrorCategory.BENIGN,
            ) from None
        except Exception as exc:
            info = activity.info()
            failure = as_activity_error(exc, info.attempt)
            if failure is exc:
                raise
            if isinstance(failure, ApplicationError) and failure.type == INFRASTRUCTURE:
                _log.warning(
                    "%s of %s, attempt %d: %s; Temporal tries it again",
                    info.activity_type,
                    info.workflow_id,
                    info.attempt,
                    failure.message,
                )
            said = retry_line(failure, info.attempt)
            if said is not None:
                _log.warning("%s of %s: %s", info.activity_type, info.workflow_id, said)
            raise failure from exc


class ClassifiedFailures(Interceptor):
    """Every activity's failures sorted at one boundary (``nearmiss.client.faults``): the
    infrastructure's are retried for minutes, the engine's own bugs fail at once, chosen errors
    pass as they are."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ClassifiedFailures(next)


class WorkerGroup:
    """The Temporal workers of one ``nearmiss worker``: one on the general queue (the workflows,
    model calls, recording, retrieval, learning) unless it serves checks only, and one per
    served target on that target's check queue (``workflows.routing``). They share the
    activities, so the checks of all targets share one limit on parallel checks. Used like one
    ``Worker``: ``run()``, ``shutdown()``, or ``async with``."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    async def run(self) -> None:
        """Run all until shut down; when one fails, the others are shut down and it is raised."""
        tasks = [asyncio.ensure_future(w.run()) for w in self.workers]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
        if failed:
            await asyncio.gather(*(w.shutdown() for w in self.workers), return_exceptions=True)
            await asyncio.gather(*pending, return_exceptions=True)
            raise failed[0]
        await asyncio.gather(*pending)

    async def shutdown(self) -> None:
        """Shut every worker down, also one still starting (its run would go on otherwise);
        safe to call more than once."""
        await asyncio.gather(*(w.shutdown() for w in self.workers))

    async def __aenter__(self) -> WorkerGroup:
        for worker in self.workers:
            await worker.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        for worker in reversed(self.workers):
            await worker.__aexit__(*exc)


def served_targets(requested: str | None = None) -> tuple[str, ...]:
    """The targets a worker serves: ``requested`` ("interpret,tpu-v5e"), each verified here,
    else every target this machine can serve (``nearmiss.engine.targets.available_targets``).
    ``gpu`` without a GPU is served only when asked for: its checks then judge grid semantics
    only, as their reports say. UsageError (one line) for a target this machine cannot serve."""
    if requested is None:
        return available_targets()
    names = parse_targets(requested)
    status = target_status()
    for name in names:
        if status[name] is not None and name != GPU:
            raise UsageError(f"this machine cannot serve target {name}: {status[name]}")
    return names


def describe_device(targets: tuple[str, ...]) -> str:
    """What runs this worker's checks, in words, for the events."""
    parts = ["cpu (interpret mode)"]
    tpus = [t for t in targets if TARGETS[t].is_tpu]
    if tpus:
        parts.append(f"libtpu {importlib.metadata.version('libtpu')} compile-only")
    if GPU in targets:
        parts.append("gpu" if target_status()[GPU] is None else "gpu grid semantics only (no GPU)")
    return "; ".join(parts)


def build_worker(
    client: Client,
    store: EventStore,
    fixer_factory: Callable = make_fixer,
    *,
    fail_workflows_on_error: bool = False,
    targets: tuple[str, ...] | None = None,
    general: bool = True,
    identity: str | None = None,
) -> WorkerGroup:
    """A worker group serving ``targets`` (default: what this machine can serve), and the
    general queue when ``general``; it polls as ``identity`` (default: the client's)."""
    targets = available_targets() if targets is None else targets
    identity = identity or client.identity
    placement = Placement(identity, targets, describe_device(targets))
    repair = RepairActivities(store, fixer_factory, placement=placement)
    interceptors = [ClassifiedFailures()]
    checks = repair.check_like()
    workers = [
        Worker(
            client,
            task_queue=queue_of(t),
            activities=checks,
            interceptors=interceptors,
            identity=identity,
        )
        for t in targets
    ]
    if general:
        general_worker = Worker(
            client,
            task_queue=GENERAL_QUEUE,
            workflows=WORKFLOWS,
            activities=repair.general() + RegenerateActivities(store).all(),
            interceptors=interceptors,
            identity=identity,
            # In tests a workflow bug should fail the run, not retry its task forever.
            workflow_failure_exception_types=[Exception] if fail_workflows_on_error else [],
        )
        workers.insert(0, general_worker)
    return WorkerGroup(workers)


def sweep_scratch() -> None:
    """Stop what workers that died left running, and remove their scratch directories (a worker
    is starting)."""
    stopped = stop_orphaned_children()
    if stopped:
        _say(f"stopped {stopped} sandbox process{'' if stopped == 1 else 'es'} of dead workers")
    removed = sweep_orphans()
    if removed:
        _say(f"removed {removed} scratch director{'y' if removed == 1 else 'ies'} of dead workers")


def session_id(kernel: str, candidate_hash: str) -> str:
    return f"repair-{kernel}-{candidate_hash.split(':')[-1][:12]}-{uuid.uuid4().hex[:8]}"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def progress_line(progress: Progress) -> str:
    """A session's progress in one line: round, phase, what the fixer proposed, the verdict of
    the last check, tokens."""
    return (
        f"round {progress.round} · {progress.phase}"
        + (f" · fix {progress.last_fix}" if progress.last_fix else "")
        + (f" · {progress.failure_class}" if progress.failure_class else "")
        + (f" · score {progress.score:.2f}" if progress.score is not None else "")
        + f" · tokens {progress.tokens.total}"
    )


async def _follow(handle: WorkflowHandle, quiet: bool = False) -> RepairResult:
    """Print a line on stderr whenever the session moves on (unless ``quiet``); return its
    result. Stderr, so that a command's stdout holds its result alone (``--json``)."""
    result_task = asyncio.ensure_future(handle.result())
    last = None
    try:
        while not result_task.done():
            progress: Progress | None = await progress_or_none(handle, RepairWorkflow.progress)
            if progress is not None:
                line = progress_line(progress)
                if line != last and not quiet:
                    _say(f"  {line}")
                last = line
            await asyncio.wait({result_task}, timeout=PROGRESS_POLL_S)
    finally:
        result_task.cancel()  # (done by now, unless the command is being stopped)
    return result_task.result()


# The setting that moves each embedded service to another port (infra.devstack.StackConfig).
PORT_SETTINGS = {"temporal": "NEARMISS_TEMPORAL_PORT", "postgres": "NEARMISS_POSTGRES_PORT"}


def busy_ports(stack: DevStack) -> str | None:
    """Why the embedded stack cannot start, in one line, when a port it needs is taken by
    another process (one of its own services already running there is fine); else None."""
    for service in stack.services:
        variable = PORT_SETTINGS[service.name]
        if service.pid() is None and port_open(service.port):
            return (
                f"port {service.port} is in use (the embedded {service.name} needs it): set "
                f"{variable} to a free port, or TEMPORAL_ADDRESS and NEARMISS_DATABASE_URL "
                "to use running services"
            )
    return None


@contextlib.asynccontextmanager
async def services(settings: Settings, quiet: bool = False):
    """(client, store) with a worker running; the embedded stack when nothing is configured.
    Waits for each service (up to ``settings.reconnect_s``); the worker rides out a Temporal
    restart."""
    stack: DevStack | contextlib.nullcontext = contextlib.nullcontext()
    if settings.embedded:
        stack = DevStack(settings.stack)
        busy = busy_ports(stack)
        if busy is not None:
            raise UsageError(busy)
    if settings.embedded and not quiet:
        _say(f"starting the embedded dev stack (Temporal + PostgreSQL) under {settings.stack.home}")
    with stack:
        sweep_scratch()
        store = await _open_store(settings)
        try:
            await load_seed(store)
            client = await _when_up(
                "Temporal",
                settings.temporal_address,
                settings,
                lambda: connect(settings, quiet_runtime()),
            )
            # The command's own worker. On its own embedded stack nobody else can serve a GPU
            # target, so it serves that too where no GPU is (grid semantics, as reports say);
            # on shared services it leaves GPU checks to workers that have one.
            targets = available_targets()
            if settings.embedded and GPU not in targets:
                targets += (GPU,)
            # Spares as `nearmiss worker` keeps them: a repair's next round, a fleet's next
            # member, starts its children while the fix step or the workflow runs.
            with spares.kept():
                async with serving(client, store, settings, targets):
                    yield client, store
        finally:
            await store.close()
            gc.collect()  # the SDK's client crashes at interpreter exit now and then otherwise


async def start_session(
    client: Client,
    store: EventStore,
    spec: Path,
    candidate: Path,
    model: str,
    guards: Guards,
    seed: int = 0,
    use_kb: bool = True,
    targets: list[str] | None = None,
) -> WorkflowHandle:
    """Store the spec and candidate by hash and start a RepairWorkflow on them."""
    from nearmiss.engine.runner.session import describe_spec

    described = await asyncio.to_thread(describe_spec, spec)
    op = described["name"]
    request = RepairRequest(
        # What is stored is the text read_source admits, never raw bytes of a path.
        spec_hash=await store.put_blob(read_source("spec", spec).encode()),
        candidate_hash=await store.put_blob(read_source("candidate", candidate).encode()),
        candidate_name=candidate.name,
        kernel=op,
        model=model,
        guards=guards,
        seed=seed,
        use_kb=use_kb,
        # Named here, not left to the check, so the workflow sends checks to their queue.
        targets=list(targets or described.get("targets") or []),
        candidate_folder=str(candidate.resolve().parent),
    )
    sid = session_id(op, request.candidate_hash)
    return await client.start_workflow(RepairWorkflow.run, request, id=sid, task_queue=TASK_QUEUE)


@contextlib.asynccontextmanager
async def stop_on_signals(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)):
    """SIGINT (Ctrl-C) and SIGTERM cancel the task running the block, so that everything it
    started is stopped on the way out, as when it ends (the worker, the embedded stack's
    Temporal and PostgreSQL, by their pids), and the block raises ``Stopped``. A second signal
    while that happens is ignored: stopping the services takes seconds, and a process killed
    half-way would leave them running."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # (a coroutine's code runs in a task)
    caught: list[int] = []

    def on_signal(signum: int) -> None:
        if caught:
            _say(f"nearmiss: still stopping ({signal.Signals(signum).name} ignored)")
            return
        caught.append(signum)
        _say(f"nearmiss: {signal.Signals(signum).name}: stopping what this command started")
        task.cancel()

    installed = []
    for signum in signals:
        try:
            loop.add_signal_handler(signum, on_signal, signum)
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread's loop
            continue
        installed.append(signum)
    try:
        yield
    except asyncio.CancelledError:
        if not caught:
            raise
        task.uncancel()
        raise Stopped(caught[0]) from None
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def repair(
    spec: Path,
    candidate: Path,
    *,
    model: str,
    guards: Guards,
    out: Path | None,
    as_json: bool,
    settings: Settings,
    seed: int = 0,
    use_kb: bool = True,
    targets: list[str] | None = None,
) -> int:
    """Repair ``candidate`` in a session; the exit status (0 certified, 1 not; SIGINT or
    SIGTERM raise ``Stopped`` once what it started is stopped). Progress goes to stderr as the
    session moves on, with ``as_json`` too: stdout then holds the one JSON object alone."""
    require_file("spec", spec)
    require_file("candidate", candidate)
    make_fixer(model)  # a bad --model is a usage error before anything starts
    async with stop_on_signals(), services(settings) as (client, store):
        handle = await start_session(
            client, store, spec, candidate, model, guards, seed, use_kb, targets
        )
        _say(f"repair session {handle.id} ({model}) on {candidate}")
        result = await _follow(handle)
        final = (await store.get_blob(result.final_hash)).decode()
        # The text the session repaired, as stored: the file may have changed since.
        original = (await store.get_blob(result.original_hash)).decode()
        pointed = await _where_the_fix_is(store, result, original, final)
    return _report(result, candidate, original, final, out, as_json, pointed)


async def _where_the_fix_is(store, result: RepairResult, original: str, final: str) -> str:
    """For a certified fix, whether it edits where the session's first evidence pointed
    (``search.leads.where_the_fix_is``), from the session's log; empty where it cannot say."""
    if not result.certified or final == original:
        return ""
    events = await store.read_stream(result.session_id)
    started = next((e for e in events if e.type == "RepairStarted"), None)
    first = next(
        (e for e in events if e.type == "EvidenceCollected" and e.payload["phase"] == "forensics"),
        None,
    )
    if started is None or first is None:
        return ""
    spec = await blob_text(store, started.payload["spec_hash"])
    report = await evidence_report(store, first)
    if spec is None or report is None:  # pruned, or from an older schema: nothing to say
        return ""
    return where_the_fix_is(original, final, spec, report.diagnosis)


def write_replacing(path: Path, text: str) -> None:
    """Write ``text`` as a new file at ``path``, replacing whatever has the name (a link
    included) and never writing through it: the fixed kernel's default place is next to the
    candidate, in a folder its author may control, where a link named ``k.fixed.py`` had the
    repair overwrite any file the user can write with the certified text."""
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(text)
        os.chmod(name, 0o644)
        os.replace(name, path)  # renames over the link itself, never into its target
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(name)
        raise


UNCERTIFIED_HEADER = "uncertified attempt (not a fix)"


def verdict_line(result: RepairResult) -> str:
    verdict = "CERTIFIED" if result.certified else "NOT CERTIFIED"
    return f"{verdict} after {result.rounds} round(s): {result.stop_reason}: {result.stop_detail}"


def _report(
    result: RepairResult,
    candidate: Path,
    original: str,
    final: str,
    out,
    as_json: bool,
    pointed: str = "",
) -> int:
    """Print the session's result: text, or one JSON object on stdout (the verdict line then
    goes to stderr). A session that did not certify hands back its best candidate's diff,
    labelled an uncertified attempt: it is no fix, and nothing is written."""
    certified = result.certified
    diff = "".join(
        difflib.unified_diff(
            original.splitlines(keepends=True),
            final.splitlines(keepends=True),
            fromfile=str(candidate),
            tofile=f"{candidate.stem}.{'fixed' if certified else 'uncertified'}.py",
        )
    )
    written = None
    if certified and diff:
        written = out or candidate.with_name(f"{candidate.stem}.fixed.py")
        write_replacing(written, final)
    if as_json:
        print(
            json.dumps(
                {
                    **result.model_dump(mode="json"),
                    "tokens": result.tokens.model_dump(),
                    "fixed_path": str(written) if written else None,
                    "diff": diff,
                    # The diff is a certified fix only when this is true; else the session's
                    # best attempt, which did not certify.
                    "diff_certified": bool(diff) and certified,
                    # Whether the fix edits where the first evidence pointed ("" where the
                    # evidence named no input it can follow).
                    "evidence_pointed": pointed,
                },
                indent=2,
            )
        )
        _say(verdict_line(result))
    else:
        print(verdict_line(result))
        if result.targets:
            judged = (f"{name} {'ok' if ok else 'FAIL'}" for name, ok in result.targets.items())
            print(f"targets: {', '.join(judged)}")
        t = result.tokens
        print(f"tokens: {t.input} input ({t.cached_input} cached), {t.output} output")
        if pointed:
            print(pointed)
        if diff and not certified:
            print(
                f"{UNCERTIFIED_HEADER}: the best candidate the session reached, which did not "
                "certify; nothing was written"
            )
        if diff:
            print(diff, end="" if diff.endswith("\n") else "\n")
        if written:
            print(f"fixed kernel written to {written}")
    return 0 if certified else 1


async def _when_up(what: str, address: str, settings: Settings, attempt, stopping=None):
    """``await attempt()`` until the service answers, for up to ``settings.reconnect_s``,
    saying once that it waits; the last error if it never does. None once ``stopping`` is set."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.reconnect_s
    delay, said = 0.5, False
    while True:
        try:
            return await attempt()
        except Exception as exc:
            if not is_infrastructure_error(exc) or loop.time() + delay > deadline:
                raise
            if not said:
                _say(f"waiting for {what} at {address} ({describe(exc)})")
                said = True
        if stopping is None:
            await asyncio.sleep(delay)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            if stopping.is_set():
                return None
        delay = min(delay * 2, 10.0)


async def _open_store(settings: Settings) -> EventStore:
    where = "the embedded database" if settings.embedded_database else "the configured database"
    return await _when_up(
        "PostgreSQL", where, settings, lambda: EventStore.connect(settings.database_url)
    )


async def _serve(
    client: Client,
    store: EventStore,
    settings: Settings,
    stopping: asyncio.Event,
    current: list[WorkerGroup],
    targets: tuple[str, ...] | None = None,
    general: bool = True,
):
    """Run a worker until ``stopping`` is set; one that loses Temporal is started again."""
    while not stopping.is_set():
        current.append(build_worker(client, store, targets=targets, general=general))
        try:
            await current[-1].run()
        except Exception as exc:
            if stopping.is_set() or not is_infrastructure_error(exc):
                raise
            _say(f"the worker lost Temporal ({describe(exc)}); starting it again")
            health = client.service_client.check_health
            await _when_up("Temporal", settings.temporal_address, settings, health, stopping)


@contextlib.asynccontextmanager
async def serving(
    client: Client,
    store: EventStore,
    settings: Settings,
    targets: tuple[str, ...] | None = None,
):
    """A worker in the background for the duration of the block (``_serve``), serving
    ``targets`` (default: what this machine can serve); a worker that fails for a reason other
    than the infrastructure cancels the block and is raised."""
    stopping = asyncio.Event()
    current: list[WorkerGroup] = []
    body = asyncio.current_task()
    assert body is not None  # (a coroutine's code runs in a task)

    async def supervise() -> None:
        try:
            await _serve(client, store, settings, stopping, current, targets)
        except BaseException:
            if not stopping.is_set():
                body.cancel()
            raise

    task = asyncio.create_task(supervise())
    try:
        yield
    finally:
        stopping.set()
        if current:
            await current[-1].shutdown()
        await asyncio.wait({task}, timeout=5.0)
        task.cancel()  # (done by now, but for a worker that will not start again)
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_worker(settings: Settings, targets: tuple[str, ...], general: bool = True) -> int:
    """Serve repairs until interrupted (SIGINT/SIGTERM end it cleanly): the checks of
    ``targets`` (``served_targets``), and the general queue unless not ``general``. Waits for
    its services at start; rides out a Temporal restart. Keeps spare executors for its checks
    (``runner.spares``): started between checks, each used by one."""
    sweep_scratch()
    if targets:
        spares.enable()
    store = await _open_store(settings)
    stopping = asyncio.Event()
    current: list[WorkerGroup] = []

    def stop() -> None:
        stopping.set()
        if current:
            asyncio.ensure_future(current[-1].shutdown())

    try:
        await load_seed(store)
        client = await _when_up(
            "Temporal", settings.temporal_address, settings, lambda: connect(settings)
        )
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop)
        queues = [GENERAL_QUEUE] if general else []
        queues += [queue_of(t) for t in targets]
        _say(
            f"worker {client.identity} on {settings.temporal_address}: targets "
            f"{', '.join(targets)} ({describe_device(targets)}); task queues {', '.join(queues)}"
        )
        await _serve(client, store, settings, stopping, current, targets, general)
    finally:
        await store.close()
    return 0
