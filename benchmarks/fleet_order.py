"""Does a fleet's outcome depend on the order its members run in?

Runs the demo's fleet (the corpus's interpret-labelled near-misses, ``nearmiss.cli.demo``) twice
with the zero-token playbook, forwards and then backwards, each on its own fresh embedded stack
(its own Temporal and PostgreSQL, an empty knowledge base), so what one run learns cannot reach
the other. Members learn from each other within a run, as in any fleet. Prints each run's
certified count and the members certified in one order only (none, when learning never makes a
member that certifies on its own end uncertified).

    .venv/bin/python benchmarks/fleet_order.py [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

from throwaway import embedded_stack_home


async def certified_set(members, concurrency: int) -> set[str]:
    from nearmiss.client.fleet import fleet_summary, follow, start_fleet
    from nearmiss.client.service import services
    from nearmiss.client.settings import Settings
    from workflows.loop import Guards

    async with services(Settings.from_env(), quiet=True) as (client, store):
        handle = await start_fleet(
            client, store, members, model="playbook", guards=Guards(), concurrency=concurrency
        )
        await follow(client, handle, quiet=True)
        summary = await fleet_summary(store, handle.id)
    return {r["name"] for r in summary["results"] if r["verdict"] == "certified"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    for name in ("TEMPORAL_ADDRESS", "NEARMISS_DATABASE_URL"):
        os.environ.pop(name, None)  # each order gets its own embedded stack

    from nearmiss.cli.demo import fleet_members

    members = fleet_members()
    found = {}
    for order, listed in (("forwards", members), ("backwards", members[::-1])):
        started = time.perf_counter()
        with embedded_stack_home("nearmiss-fleet-order-"):
            found[order] = asyncio.run(certified_set(listed, args.concurrency))
        seconds = time.perf_counter() - started
        print(f"{order:>9}: {len(found[order])} of {len(members)} certified ({seconds:.0f} s)")
    only = sorted(found["forwards"] ^ found["backwards"])
    print(f"certified in one order only: {', '.join(only) or 'none'}")
    print(f"same certified set: {'yes' if not only else 'NO'}")


if __name__ == "__main__":
    main()
