"""`nearmiss kb list|show|search|stats [--json]`: read the knowledge base.

Uses ``NEARMISS_DATABASE_URL``, or the embedded PostgreSQL (started for the command when it is
not running, and stopped again). Seed knowledge is loaded and the projection caught up first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import TYPE_CHECKING

from nearmiss.reports.text import table

if TYPE_CHECKING:
    from nearmiss.client.settings import Settings

# The event log's client, the embedded PostgreSQL and the knowledge base are imported when a
# kb command runs: every command builds this parser, and `nearmiss check` needs none of them.


def add_parser(commands) -> None:
    kb_cmd = commands.add_parser("kb", help="the knowledge base: list, show, search, stats")
    actions = kb_cmd.add_subparsers(dest="kb_action", required=True)
    listing = actions.add_parser("list", help="every entry")
    listing.add_argument("--status", help="only entries with this status")
    listing.add_argument("--json", action="store_true")
    counts = actions.add_parser("stats", help="counts, and use by which sessions")
    counts.add_argument("--json", action="store_true")
    show = actions.add_parser("show", help="one entry, whole")
    show.add_argument("entry_id")
    show.add_argument("--json", action="store_true")
    find = actions.add_parser("search", help="entries matching words of an error or diagnosis")
    find.add_argument("text")
    find.add_argument("--class", dest="failure_class")
    find.add_argument("--category")
    find.add_argument("--json", action="store_true")


@contextlib.asynccontextmanager
async def open_event_store(settings: Settings):
    """The event store alone, for commands that only read it (no Temporal, no worker).

    The configured database, else the embedded PostgreSQL, started for the command when it is
    not running and stopped again after. Connecting migrates the schema, so reading needs no more.
    """
    from infra.devstack import PostgresService
    from kb.events import EventStore

    postgres = PostgresService(settings.stack) if settings.embedded_database else None
    started = postgres.start() if postgres else False
    store = await EventStore.connect(settings.database_url)
    try:
        yield store
    finally:
        await store.close()
        if started:
            assert postgres is not None  # started only when there is one to start
            postgres.stop()


@contextlib.asynccontextmanager
async def open_store(settings: Settings):
    """``open_event_store`` with the seed knowledge loaded and the projection caught up."""
    from kb.knowledge import KnowledgeProjection, load_seed

    async with open_event_store(settings) as store:
        await load_seed(store)
        await KnowledgeProjection(store).catch_up()
        yield store


def _rows(entries) -> list[list[str]]:
    return [
        [
            e.id,
            e.status,
            e.failure_class,
            e.category,
            e.platform,
            f"{e.successes}/{e.uses}",
            e.title[:60],
        ]
        for e in entries
    ]


HEADERS = ["id", "status", "class", "category", "platform", "ok/uses", "title"]


async def run(args: argparse.Namespace) -> int:
    from kb.knowledge import KnowledgeProjection, search, stats
    from nearmiss.client.settings import Settings

    settings = Settings.from_env()
    async with open_store(settings) as store:
        projection = KnowledgeProjection(store)
        if args.kb_action == "list":
            entries = await projection.entries(status=args.status)
            if args.json:
                print(json.dumps([e.summary() for e in entries], indent=2))
            else:
                print(table(HEADERS, _rows(entries)))
                print(f"\n{len(entries)} entries")
        elif args.kb_action == "show":
            entry = await projection.entry(args.entry_id)
            if entry is None:
                print(f"nearmiss: error: no entry {args.entry_id!r}", file=sys.stderr)
                return 2
            if args.json:
                print(json.dumps({**entry.summary(), "body": entry.body}, indent=2))
            else:
                print(f"{entry.id} ({entry.status}, {entry.source}): {entry.title}")
                print(json.dumps(entry.summary()["signature"]))
                print(f"uses {entry.uses}, successes {entry.successes}, failures {entry.failures}")
                print(entry.line())
        elif args.kb_action == "search":
            hits = search(await projection.entries(), args.text, args.failure_class, args.category)
            if args.json:
                print(json.dumps([e.summary() for e in hits], indent=2))
            else:
                print(table(HEADERS, _rows(hits)) if hits else "no matching entry")
        else:
            summary = await stats(store)
            if args.json:
                print(json.dumps(summary, indent=2))
            else:
                print(
                    f"{summary['entries']} entries: {summary['by_status']}, {summary['by_source']}"
                )
                print(f"by failure class: {summary['by_failure_class']}")
                print(
                    f"uses {summary['uses']} (successes {summary['successes']}, "
                    f"failures {summary['failures']}) · log read to position "
                    f"{summary['checkpoint']}"
                )
                for entry in summary["learned"]:
                    sessions = ", ".join(entry["learned_from"])
                    print(f"  learned {entry['id']} ({entry['status']}) from {sessions}")
                for used in summary["used_entries"]:
                    record = f"{used['successes']}/{used['uses']}"
                    print(f"  {used['id']}: {record} in {', '.join(used['sessions'])}")
    return 0
