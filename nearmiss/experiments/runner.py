"""Running an experiment: every arm on every near-miss, ``trials`` times, then the audits.

Debug arms run one ``RepairWorkflow`` per trial (with the arm's ablation switches); the
regenerate arm one ``RegenerateWorkflow`` holding all k trials. At most ``concurrency`` sessions
are in flight. The experiment's own stream records ExperimentStarted (the configuration) and
ExperimentFinished (per arm and near-miss: the sessions, their successes and tokens, the audit
verdicts) — the table is then computed from those events and the sessions' own.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client, WorkflowFailureError

from kb.events import EventStore, NewEvent
from nearmiss.engine.inputs import read_source
from nearmiss.events import ExperimentFinished, ExperimentStarted
from nearmiss.experiments.audit import AuditTarget, run_audits
from nearmiss.experiments.config import ARMS, Arm, ExperimentConfig, NearMiss
from workflows.models import RepairResult, TokenUsage
from workflows.regenerate import RegenerateRequest, RegenerateResult, RegenerateWorkflow
from workflows.repair import TASK_QUEUE, RepairRequest, RepairWorkflow

Say = Callable[[str], None]


def say_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Job:
    arm: Arm
    near_miss: NearMiss
    trial: int | None  # None: a regenerate session, which runs all trials itself
    session_id: str
    result: RepairResult | RegenerateResult | None = None  # once finished without an error
    error: str = ""
    spec_hash: str = ""
    candidate_hash: str = ""  # debug sessions only: regenerate starts from the spec


def plan(config: ExperimentConfig, near_misses: list[NearMiss]) -> list[Job]:
    """Trial by trial, so an interrupted experiment has covered every arm evenly."""
    jobs = []
    for trial in range(1, config.trials + 1):
        for nm in near_misses:
            for name in config.arms:
                arm = ARMS[name]
                sid = f"exp-{config.experiment_id}-{name}-{nm.id.replace('/', '-')}"
                if arm.kind == "regenerate":
                    if trial == 1:
                        jobs.append(Job(arm, nm, None, sid))
                else:
                    jobs.append(Job(arm, nm, trial, f"{sid}-t{trial}"))
    return jobs


async def upload(store: EventStore, jobs: list[Job]) -> None:
    """Store each spec and candidate the jobs need once, by hash, and give the jobs the hashes."""
    hashes: dict[Path, str] = {}

    async def put(role: str, path: Path) -> str:
        if path not in hashes:  # the text read_source admits, never raw bytes of a path
            hashes[path] = await store.put_blob(read_source(role, path).encode())
        return hashes[path]

    for job in jobs:
        job.spec_hash = await put("spec", job.near_miss.spec)
        if job.arm.kind == "debug":
            job.candidate_hash = await put("candidate", job.near_miss.candidate)


def _request(config: ExperimentConfig, job: Job):
    nm, arm = job.near_miss, job.arm
    if arm.kind == "regenerate":
        return RegenerateWorkflow.run, RegenerateRequest(
            spec_hash=job.spec_hash,
            kernel=nm.op,
            candidate_name=f"{nm.op}.py",
            model=config.model,
            trials=config.trials,
            seed=config.seed,
            temperature=config.temperature,
            targets=config.targets,
        )
    assert job.trial is not None  # plan gives every debug job its trial
    return RepairWorkflow.run, RepairRequest(
        spec_hash=job.spec_hash,
        candidate_hash=job.candidate_hash,
        candidate_name=nm.candidate.name,
        kernel=nm.op,
        model=config.model,
        guards=config.guards,
        seed=config.seed + job.trial,
        use_kb=arm.use_kb,
        knowledge=arm.knowledge,
        integrity=arm.integrity,
        certify_suite=arm.certify_suite,
        learn=config.learn,
        targets=config.targets,
    )


def _outcome(job: Job) -> str:
    if job.error:
        return f"FAILED: {job.error}"
    r = job.result
    if isinstance(r, RegenerateResult):  # the regenerate arm's; the debug arms' RepairResult
        certified = sum(t.certified for t in r.trials)
        return f"{certified}/{len(r.trials)} trials certified · {r.tokens.total:,} tokens"
    assert r is not None  # run_sessions gives every job a result or an error
    verdict = "certified" if r.certified else f"not certified ({r.stop_reason})"
    return f"{verdict} · {r.rounds} round(s) · {r.tokens.total:,} tokens"


async def run_sessions(
    client: Client, store: EventStore, config: ExperimentConfig, jobs: list[Job], say: Say
) -> None:
    gate = asyncio.Semaphore(config.concurrency)
    done = 0
    await upload(store, jobs)

    async def one(job: Job) -> None:
        nonlocal done
        async with gate:
            run, request = _request(config, job)
            handle = await client.start_workflow(
                run, request, id=job.session_id, task_queue=TASK_QUEUE
            )
            try:
                job.result = await handle.result()
            except WorkflowFailureError as exc:  # recorded, counted as failed trials
                job.error = str(exc.cause or exc)
        done += 1
        trial = "all trials" if job.arm.kind == "regenerate" else f"trial {job.trial}"
        say(f"[{done}/{len(jobs)}] {job.arm.name} {job.near_miss.id} {trial}: {_outcome(job)}")

    await asyncio.gather(*(one(job) for job in jobs))


def audit_targets(jobs: list[Job], targets: list[str]) -> list[AuditTarget]:
    """The successes of the ablations whose success the experiment must re-check."""
    return [
        AuditTarget(
            job.arm.name,
            job.near_miss.id,
            job.session_id,
            job.spec_hash,
            job.result.final_hash,
            job.near_miss.candidate.name,
            tuple(targets),
        )
        for job in jobs
        # (The audited ablations are debug arms, so their results are RepairResults.)
        if job.arm.recheck is not None
        and isinstance(job.result, RepairResult)
        and job.result.certified
    ]


def finished_event(
    config: ExperimentConfig, jobs: list[Job], audits: list, wall_s: float
) -> ExperimentFinished:
    arms: dict = {a: {} for a in config.arms}
    for job in jobs:
        cell = arms[job.arm.name].setdefault(
            job.near_miss.id,
            {"sessions": [], "successes": 0, "tokens": TokenUsage(), "errors": [], "audits": []},
        )
        cell["sessions"].append(job.session_id)
        if job.error:
            cell["errors"].append({"session_id": job.session_id, "error": job.error})
        elif isinstance(job.result, RegenerateResult):  # the regenerate arm's
            cell["successes"] += sum(t.certified for t in job.result.trials)
            cell["tokens"] += job.result.tokens
        else:
            assert job.result is not None  # run_sessions gives every job a result or an error
            cell["successes"] += int(job.result.certified)
            cell["tokens"] += job.result.tokens
    for target, verdict in audits:
        arms[target.arm][target.near_miss]["audits"].append(verdict)
    for cells in arms.values():
        for cell in cells.values():
            cell["tokens"] = cell["tokens"].model_dump()
    return ExperimentFinished(
        experiment_id=config.experiment_id, wall_s=round(wall_s, 1), arms=arms
    )


async def run_experiment(
    client: Client,
    store: EventStore,
    config: ExperimentConfig,
    say: Say = say_stderr,
    near_misses: list[NearMiss] | None = None,
) -> str:
    """Run everything, record the experiment's two events; returns the experiment's id.

    ``near_misses``: what ``config.resolve()`` returned, when the caller has checked the input
    already; otherwise it is checked here.
    """
    if near_misses is None:
        near_misses = config.resolve()
    started = ExperimentStarted(
        experiment_id=config.experiment_id,
        config=config.model_dump(mode="json"),
        near_misses=[nm.describe() for nm in near_misses],
        arms={name: ARMS[name].describe() for name in config.arms},
    )
    await store.append(config.stream_id, 0, [NewEvent.of(started)])
    jobs = plan(config, near_misses)
    say(
        f"experiment {config.experiment_id}: {len(near_misses)} near-miss(es) × "
        f"{len(config.arms)} arm(s) × {config.trials} trial(s) = {len(jobs)} session(s), "
        f"{config.concurrency} at a time, model {config.model}"
    )
    clock = time.monotonic()
    await run_sessions(client, store, config, jobs, say)
    audits = await run_audits(
        store, audit_targets(jobs, config.targets), min(config.concurrency, 2), say
    )
    finished = finished_event(config, jobs, audits, time.monotonic() - clock)
    await store.append(config.stream_id, 1, [NewEvent.of(finished)])
    return config.experiment_id
