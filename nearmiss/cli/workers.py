"""`nearmiss workers`: the workers polling each task queue (``nearmiss.client.workers``)."""

from __future__ import annotations

import asyncio
import gc
import sys

from nearmiss.client.workers import list_workers


def add_parser(commands) -> None:
    workers = commands.add_parser(
        "workers",
        help="list the workers polling each task queue (the general one, one per target)",
        description="Exit 0; 1 when Temporal cannot be reached.",
    )
    workers.add_argument("--json", action="store_true", help="print one JSON list")


async def run(args) -> int:
    import json

    from nearmiss.client.service import connect, quiet_runtime
    from nearmiss.client.settings import Settings
    from nearmiss.reports.text import table

    settings = Settings.from_env()
    try:
        client = await asyncio.wait_for(connect(settings, quiet_runtime()), timeout=30)
    except Exception as exc:  # unreachable: nothing to list, and the user should know why
        hint = "`nearmiss dev up`" if settings.embedded else "TEMPORAL_ADDRESS"
        print(
            f"nearmiss: error: Temporal is not reachable at {settings.temporal_address} ({exc}); "
            f"check {hint}",
            file=sys.stderr,
        )
        return 1
    try:
        rows = await list_workers(client)
    finally:
        del client
        gc.collect()  # the SDK's client crashes at interpreter exit now and then otherwise
    if args.json:
        print(json.dumps(rows))
        return 0
    shown = [
        [
            r["queue"],
            r["target"] or "(general)",
            r["worker"] or "none",
            "-" if r["last_poll_s"] is None else f"{r['last_poll_s']:g} s ago",
        ]
        for r in rows
    ]
    print(table(["task queue", "target", "worker", "last poll"], shown))
    return 0
