"""`nearmiss report SESSION... [--out DIR] [--title TEXT]`: write a session's report.

One session: ``<session>.html`` and ``<session>.md`` (with PNGs). Several: a fleet report,
``index.html`` and ``index.md``. Reads ``NEARMISS_DATABASE_URL``, or the embedded PostgreSQL
(started for the command when it is not running, and stopped again).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nearmiss.client.settings import Settings

EXIT_USAGE = 2


def add_parser(commands) -> None:
    report_cmd = commands.add_parser(
        "report",
        help="write an HTML + Markdown report of a repair session (or several: a fleet report)",
        description="Exit 0 when written, 2 when a session is unknown.",
    )
    report_cmd.add_argument("sessions", nargs="+", metavar="SESSION", help="repair session id")
    report_cmd.add_argument(
        "--out", type=Path, help="directory to write to (default: reports/ in the state dir)"
    )
    report_cmd.add_argument("--title", default="nearmiss fleet report", help="of a fleet report")


def default_out(settings: Settings) -> Path:
    return settings.stack.home / "reports"


async def run(args: argparse.Namespace, store) -> int:
    """Write the report with ``store`` (an EventStore); print where it went."""
    # Imported here: `nearmiss check` builds this parser and should not pay for numpy/asyncpg.
    from nearmiss.reports import UnknownSession, write_fleet_report, write_session_report

    out = args.out or default_out(Settings.from_env())
    try:
        if len(args.sessions) == 1:
            path = await write_session_report(store, args.sessions[0], out)
        else:
            # A fleet with no known session at all is a typo, not a report.
            known = await store.heads(args.sessions)
            if not known:
                raise UnknownSession(f"none of the {len(args.sessions)} sessions is in the store")
            path = await write_fleet_report(store, args.title, args.sessions, out)
    except UnknownSession as exc:
        print(f"nearmiss: error: {exc.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    print(path)
    print(path.with_suffix(".md"))
    return 0


async def main(args: argparse.Namespace) -> int:
    """``run`` on the store the settings name: what ``nearmiss report`` calls."""
    from nearmiss.cli.kb import open_event_store

    async with open_event_store(Settings.from_env()) as store:
        return await run(args, store)
