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

    .venv/bin/python benchmarks/fleet_overhead.py [--members 10] [--lanes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from throwaway import embedded_stack_home


async def fleet_then_bare(members, lanes: int) -> tuple[float, dict[str, float], int, int]:
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
                await asyncio.to_thread(check, paths[0], paths[1], suite, seed)

        bare_s = {}
        for how in ("one-shot", "with spares"):
            if how == "one-shot":
                spares.disable()
            else:
                spares.enable()
            began = time.perf_counter()
            await asyncio.gather(*(run(*c) for c in checks))
            bare_s[how] = time.perf_counter() - began
    return fleet_s, bare_s, len(checks), result.certified


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--lanes", type=int, default=2)
    args = parser.parse_args()
    for name in ("TEMPORAL_ADDRESS", "NEARMISS_DATABASE_URL"):
        os.environ.pop(name, None)  # a stack of its own, so nothing learned before helps

    from nearmiss.cli.demo import fleet_members

    members = fleet_members()[: args.members]
    with embedded_stack_home("nearmiss-fleet-overhead-"):
        fleet_s, bare_s, checks, certified = asyncio.run(fleet_then_bare(members, args.lanes))
    print(f"{len(members)} members ({certified} certified), {checks} checks, {args.lanes} lanes")
    print(f"fleet: {fleet_s:.1f} s")
    for how, seconds in bare_s.items():
        ratio = fleet_s / seconds
        print(f"the same checks bare, {how}: {seconds:.1f} s   fleet / bare: {ratio:.2f}x")


if __name__ == "__main__":
    main()
