"""What does running repairs as a fleet cost over running their checks bare?

Runs the first MEMBERS members of the demo's fleet (the corpus's interpret near-misses) as one
playbook fleet, LANES at a time, on a fresh embedded stack (its own Temporal and PostgreSQL, an
empty knowledge base, an in-process worker), then runs exactly the checks that fleet ran (the
same spec, candidate, suite and seed, read back from its event log) with ``check`` in LANES
parallel lanes and no Temporal, no database, no fixer. The ratio of the two wall times is what
the durable machinery costs: scheduling, recording, the playbook's fixes, workflow turns.

The fleet's worker keeps spare children (``runner.spares``), as every worker does. The bare
checks run twice: one-shot, as ``nearmiss check`` runs them (no spares), then with spares kept
as the fleet had them; each ratio is printed.

This machine's check times drift by ±15 % from one minute to the next, more than the fleet's
own cost, so one run's ratio is a noisy sample. ``--repeat N`` runs the whole comparison N times,
each on a fresh stack, and prints each run's ratios and their medians.

``--profile`` also prints where the fleet's time went, read from its members' Temporal
histories: the checks' own run time, their wait for a worker slot, every other activity, and
the time a member spent in none (workflow turns and the server's dispatch); then how much of
the lanes' time no check ran in, and why. ``--fleet-only`` skips the bare runs.

    .venv/bin/python benchmarks/fleet_overhead.py [--members 10] [--lanes 2] [--repeat 1]
        [--profile] [--fleet-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

from throwaway import embedded_stack_home


def member_timeline(history) -> tuple[float, float, list[tuple[str, float, float, float]]]:
    """A member's (start, close, activities) from its Temporal history, in epoch seconds; each
    activity as (name, scheduled, started, completed)."""
    from temporalio.api.enums.v1 import EventType

    def at(event) -> float:
        return event.event_time.ToMicroseconds() / 1e6

    scheduled: dict[int, tuple[str, float]] = {}
    started: dict[int, float] = {}
    activities = []
    for event in history.events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = (name, at(event))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started[event.activity_task_started_event_attributes.scheduled_event_id] = at(event)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            key = event.activity_task_completed_event_attributes.scheduled_event_id
            name, queued = scheduled[key]
            activities.append((name, queued, started[key], at(event)))
    return at(history.events[0]), at(history.events[-1]), activities


def print_profile(fleet, timelines, lanes: int, fleet_s: float) -> None:
    """Where the fleet's time went, summed over its members (see the module's docstring);
    ``fleet``: the fleet workflow's own timeline."""
    totals: dict[str, list[float]] = {}
    outside = 0.0
    runs = []
    for start, close, activities in timelines:
        busy = 0.0
        for name, queued, began, done in activities:
            label = "check (running)" if name == "check_candidate" else name
            totals.setdefault(label, []).append(done - began)
            if name == "check_candidate":
                totals.setdefault("check (waiting for a slot)", []).append(began - queued)
                runs.append((began, done))
            else:
                totals.setdefault(f"{name} (dispatch)", []).append(began - queued)
            busy += done - queued
        outside += (close - start) - busy
    print("member time by activity (count, total s, mean ms):")
    for label, seconds in sorted(totals.items(), key=lambda kv: -sum(kv[1])):
        mean_ms = 1000 * sum(seconds) / len(seconds)
        print(f"  {label:34s} {len(seconds):4d} {sum(seconds):8.1f} {mean_ms:8.0f}")
    print(f"  {'in no activity (workflow turns)':34s} {'':4s} {outside:8.1f}")
    first = min(start for start, _, _ in timelines)
    last = max(close for _, close, _ in timelines)
    fleet_start, fleet_close, _ = fleet
    print(
        f"the fleet's workflow: {first - fleet_start:.1f} s before its first member started, "
        f"{fleet_close - last:.1f} s after its last closed"
    )
    running = sum(done - began for began, done in runs)
    print(
        f"lanes: {lanes} x {last - first:.1f} s of members (fleet wall {fleet_s:.1f} s); "
        f"checks ran {running:.1f} lane-s, none ran in {lanes * (last - first) - running:.1f}"
    )
    # The tail: lane-seconds after the last check began in which fewer than ``lanes`` ran.
    edges = sorted([(t, 1) for t, _ in runs] + [(t, -1) for _, t in runs])
    idle_tail, level, previous = 0.0, 0, first
    last_start = max(began for began, _ in runs)
    for moment, step in edges:
        if previous >= last_start:
            idle_tail += (lanes - level) * (moment - previous)
        level, previous = level + step, moment
    idle_tail += lanes * (last - previous)
    print(f"  of which after the last check began (the fleet's tail): {idle_tail:.1f} lane-s")


async def fleet_then_bare(
    members, lanes: int, profile: bool, bare: bool
) -> tuple[float, dict[str, float], int, int]:
    """(fleet seconds, bare seconds by how they ran, checks, certified members)."""
    from nearmiss.client.fleet import start_fleet
    from nearmiss.client.service import services
    from nearmiss.client.settings import Settings
    from nearmiss.engine.check import check
    from nearmiss.engine.runner import spares
    from workflows.loop import Guards

    async with services(Settings.from_env(), quiet=True) as (client, store):
        began = time.perf_counter()
        handle = await start_fleet(
            client, store, members, model="playbook", guards=Guards(), concurrency=lanes
        )
        result = await handle.result()
        fleet_s = time.perf_counter() - began
        if profile:
            histories = [
                await client.get_workflow_handle(m.session_id).fetch_history()
                for m in result.results
            ]
            fleet = member_timeline(await handle.fetch_history())
            print_profile(fleet, [member_timeline(h) for h in histories], lanes, fleet_s)
        checks = []
        for member in result.results:
            events = await store.read_stream(member.session_id)
            started = next(e.payload for e in events if e.type == "RepairStarted")
            for event in events:
                if event.type == "EvidenceCollected":
                    report = json.loads(await store.get_blob(event.payload["report_hash"]))
                    checks.append(
                        (
                            started["spec_hash"],
                            event.payload["candidate_hash"],
                            started["candidate_name"],
                            report["suite"],
                            report["seed"],
                        )
                    )
        lane = asyncio.Semaphore(lanes)

        async def run(spec_hash, candidate_hash, name, suite, seed) -> None:
            async with lane, store.checkout(spec_hash, candidate_hash, name, "bench") as paths:
                began = time.perf_counter()
                await asyncio.to_thread(check, paths[0], paths[1], suite, seed)
                one_check.append(time.perf_counter() - began)

        bare_s = {}
        one_check: list[float] = []
        for how in ("one-shot", "with spares") if bare else ():
            if how == "one-shot":
                spares.disable()
            else:
                spares.enable()
            began = time.perf_counter()
            await asyncio.gather(*(run(*c) for c in checks))
            bare_s[how] = time.perf_counter() - began
            if profile:
                mean = sum(one_check) / len(one_check)
                print(f"bare, {how}: {mean:.2f} s a check")
                one_check.clear()
    return fleet_s, bare_s, len(checks), result.certified


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="where the fleet's time went")
    parser.add_argument("--fleet-only", action="store_true", help="skip the bare checks")
    parser.add_argument("--repeat", type=int, default=1, help="runs, each on a fresh stack")
    args = parser.parse_args()
    for name in ("TEMPORAL_ADDRESS", "NEARMISS_DATABASE_URL"):
        os.environ.pop(name, None)  # a stack of its own, so nothing learned before helps

    from nearmiss.cli.demo import fleet_members

    members = fleet_members()[: args.members]
    ratios: dict[str, list[float]] = {}
    for run in range(1, args.repeat + 1):
        if args.repeat > 1:
            print(f"run {run} of {args.repeat}:")
        with embedded_stack_home("nearmiss-fleet-overhead-"):
            fleet_s, bare_s, checks, certified = asyncio.run(
                fleet_then_bare(members, args.lanes, args.profile, not args.fleet_only)
            )
        print(
            f"{len(members)} members ({certified} certified), {checks} checks, {args.lanes} lanes"
        )
        print(f"fleet: {fleet_s:.1f} s")
        for how, seconds in bare_s.items():
            ratio = fleet_s / seconds
            ratios.setdefault(how, []).append(ratio)
            print(f"the same checks bare, {how}: {seconds:.1f} s   fleet / bare: {ratio:.2f}x")
    if args.repeat > 1:
        for how, values in ratios.items():
            each = ", ".join(f"{r:.2f}" for r in values)
            print(
                f"fleet / bare {how}, median of {len(values)}: {statistics.median(values):.2f}x "
                f"({each})"
            )


if __name__ == "__main__":
    main()
