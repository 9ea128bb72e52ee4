"""`nearmiss fleet DIR|MANIFEST` (run one) and `nearmiss fleets [FLEET]` (list, show, follow,
cancel, report). The logic lives in ``nearmiss.client.fleet``; this module parses and prints, and
imports the Temporal machinery only when a fleet command runs (every command builds its parser).
Exit 0: the fleet ran to its end; 1: it did not (cancelled); 2: bad input; 3: Temporal or the
database stayed out of reach longer than NEARMISS_RECONNECT_S — the fleet goes on, and one line
says how to follow it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nearmiss.cli.options import add_session_options, guards_from, positive, targets_from
from nearmiss.client.settings import Settings
from nearmiss.engine.errors import UsageError
from nearmiss.reports.text import table

EXIT_DONE, EXIT_NOT_DONE, EXIT_USAGE = 0, 1, 2
EXIT_LOST = 3  # Temporal or the database stayed out of reach; the fleet itself goes on


def add_parsers(commands) -> None:
    fleet = commands.add_parser(
        "fleet",
        help="repair many kernels (a directory or a JSON manifest) as one durable fleet",
        description="A directory: every .py below a folder with a spec.py (not golden.py) is a "
        'member. A manifest: [{"spec": PATH, "candidate": PATH, "name": optional}, ...]. '
        "Ctrl-C cancels the fleet and keeps what finished. Exit 0 when the fleet ran to its end.",
    )
    fleet.add_argument("target", type=Path, help="a directory or a manifest (JSON)")
    add_session_options(fleet)
    fleet.add_argument(
        "--concurrency", type=positive(int), default=4, help="sessions at once (default 4)"
    )
    fleet.add_argument("--report", type=Path, help="report folder (default NEARMISS_HOME/reports)")
    fleet.add_argument("--json", action="store_true", help="print the results as one JSON object")
    fleets = commands.add_parser(
        "fleets", help="list fleets, or show / follow / cancel / report one"
    )
    fleets.add_argument("fleet_id", nargs="?", help="one fleet (default: list them all)")
    action = fleets.add_mutually_exclusive_group()
    action.add_argument(
        "--follow", action="store_true", help="serve the fleet from here until it ends"
    )
    action.add_argument("--cancel", action="store_true", help="cancel a running fleet")
    fleets.add_argument("--report", type=Path, help="write the fleet's report to this folder")
    fleets.add_argument("--json", action="store_true")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _report_dir(settings: Settings, fleet_id: str, chosen: Path | None) -> Path:
    return chosen or settings.stack.home / "reports" / fleet_id


async def _write_report(store, summary: dict, out_dir: Path) -> Path:
    from nearmiss.reports import write_fleet_report

    sessions = [r["session_id"] for r in summary["results"]]
    return await write_fleet_report(store, f"fleet {summary['fleet_id']}", sessions, out_dir)


def _print_summary(summary: dict, report: Path | None, as_json: bool) -> None:
    from nearmiss.client.fleet import results_table, verdict_counts

    if as_json:
        print(json.dumps({**summary, "report": str(report) if report else None}, indent=2))
        return
    print(results_table(summary["results"]))
    print(
        f"\n{summary['fleet_id']}: {summary['state']} · {summary['finished']}/{summary['total']}"
        f" finished · {summary['certified']} certified · {summary['tokens']} tokens"
    )
    if summary["results"]:
        print(f"verdicts: {verdict_counts(summary['results'])}")
    if report:
        print(f"report: {report}")


async def _out_of_reach(work, fleet: list[str]) -> int:
    """``await work``; when Temporal or the database stays out of reach, one line (how to follow
    the fleet, once ``fleet`` names it) and EXIT_LOST instead of a traceback."""
    from nearmiss.client.faults import describe, is_infrastructure_error
    from nearmiss.client.fleet import TemporalLost

    try:
        return await work
    except TemporalLost as exc:
        _say(f"nearmiss: {exc}")
    except Exception as exc:
        if not is_infrastructure_error(exc):
            raise
        how = f"; fleet {fleet[0]} goes on: follow it with `nearmiss fleets {fleet[0]} --follow`"
        _say(f"nearmiss: services out of reach ({describe(exc)}){how if fleet else ''}")
    return EXIT_LOST


async def run_fleet(args: argparse.Namespace) -> int:
    from activities.fixers.registry import make_fixer
    from nearmiss.client.fleet import discover

    files = discover(args.target)
    make_fixer(args.model)  # a bad --model is a usage error before anything starts
    started: list[str] = []  # the fleet's id, once it runs
    return await _out_of_reach(_run_fleet(args, files, Settings.from_env(), started), started)


async def _run_fleet(args, files, settings: Settings, started: list[str]) -> int:
    from nearmiss.client.fleet import cancelled_before_start, fleet_summary, follow, start_fleet
    from nearmiss.client.service import services

    async with services(settings, quiet=args.json) as (client, store):
        handle = await start_fleet(
            client,
            store,
            files,
            model=args.model,
            guards=guards_from(args),
            concurrency=args.concurrency,
            use_kb=not args.no_kb,
            targets=targets_from(args),
        )
        started.append(handle.id)
        _say(f"fleet {handle.id}: {len(files)} kernels, {args.model}, {args.concurrency} at a time")
        await follow(client, handle, quiet=args.json, reconnect_s=settings.reconnect_s)
        summary = await fleet_summary(store, handle.id)
        if summary is None:  # cancelled before its first act, recording its start
            summary = cancelled_before_start(handle.id, args.model, len(files))
            report = None
        else:
            out = _report_dir(settings, handle.id, args.report)
            report = await _write_report(store, summary, out)
    _print_summary(summary, report, args.json)
    return EXIT_DONE if summary["state"] == "finished" else EXIT_NOT_DONE


async def run_fleets(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if args.fleet_id is None:
        return await _list(settings, args.json)
    if args.follow or args.cancel:
        return await _out_of_reach(_follow_fleet(args, settings), [args.fleet_id])
    from nearmiss.cli.kb import open_event_store
    from nearmiss.client.fleet import fleet_summary

    async with open_event_store(settings) as store:
        summary = await fleet_summary(store, args.fleet_id)
        if summary is None:
            raise UsageError(f"no fleet {args.fleet_id}")
        report = await _write_report(store, summary, args.report) if args.report else None
    _print_summary(summary, report, args.json)
    return EXIT_DONE


async def _follow_fleet(args: argparse.Namespace, settings: Settings) -> int:
    from nearmiss.client.fleet import fleet_summary, follow
    from nearmiss.client.service import services

    async with services(settings, quiet=args.json) as (client, store):
        if await fleet_summary(store, args.fleet_id) is None:
            raise UsageError(f"no fleet {args.fleet_id}")
        handle = client.get_workflow_handle(args.fleet_id)
        if args.cancel:
            await handle.cancel()
        quiet = args.json or args.cancel
        await follow(client, handle, quiet=quiet, reconnect_s=settings.reconnect_s)
        summary = await fleet_summary(store, args.fleet_id)
        assert summary is not None  # (it was there before it was followed)
        out = _report_dir(settings, args.fleet_id, args.report)
        report = await _write_report(store, summary, out)
    _print_summary(summary, report, args.json)
    return EXIT_DONE if summary["state"] == "finished" else EXIT_NOT_DONE


async def _list(settings: Settings, as_json: bool) -> int:
    from nearmiss.cli.kb import open_event_store
    from nearmiss.client.fleet import list_fleets

    async with open_event_store(settings) as store:
        fleets = await list_fleets(store)
    if as_json:
        print(json.dumps([{k: v for k, v in f.items() if k != "results"} for f in fleets]))
        return EXIT_DONE
    rows = [
        [
            f["fleet_id"],
            f["started_at"],
            f["model"],
            f["state"],
            f"{f['finished']}/{f['total']}",
            str(f["certified"]),
            str(f["tokens"]),
        ]
        for f in fleets
    ]
    headers = ["fleet", "started", "model", "state", "finished", "certified", "tokens"]
    print(table(headers, rows) if rows else "no fleets yet")
    return EXIT_DONE
