"""`nearmiss replay SESSION`: the determinism check, the re-run and the timeline of a past
session (the logic is ``nearmiss.client.replay``; Temporal is imported only when the command
runs)."""

from __future__ import annotations

import json
import sys


def add_parser(commands) -> None:
    replay = commands.add_parser(
        "replay",
        help="replay a past session: determinism check, re-run without tokens, timeline",
        description="Exit 0 when the history replays and the re-run behaves as recorded, "
        "1 when either differs, 2 when there is no such session.",
    )
    replay.add_argument("session", help="a repair session id (see nearmiss fleets / kb stats)")
    replay.add_argument(
        "--no-rerun", action="store_true", help="only the determinism check and the timeline"
    )
    replay.add_argument("--json", action="store_true", help="print one JSON object")


async def run(args) -> int:
    from nearmiss.client.replay import check_determinism, compare, recorded_request, rerun
    from nearmiss.client.service import services, stop_on_signals
    from nearmiss.client.settings import Settings
    from nearmiss.reports import load_session

    async with (
        stop_on_signals(),
        services(Settings.from_env(), quiet=args.json) as (client, store),
    ):
        await recorded_request(store, args.session)  # a clear error before anything runs
        view = await load_session(store, args.session)
        determinism = await check_determinism(client, args.session)
        comparison = None
        if not args.no_rerun:
            if not args.json:
                print(f"re-running {args.session} with its recorded answers...", file=sys.stderr)
            handle = await rerun(client, store, args.session)
            await handle.result()
            comparison = await compare(store, args.session, handle.id)
    if args.json:
        print(json.dumps(_as_json(view, determinism, comparison), indent=2, default=str))
    else:
        _print(view, determinism, comparison)
    ok = determinism.ok and (comparison is None or comparison.same_behaviour)
    return 0 if ok else 1


def _as_json(view, determinism, comparison) -> dict:
    from nearmiss.client.replay import outcome

    out = {
        "session_id": view.session_id,
        "determinism": {"ok": determinism.ok, "detail": determinism.detail},
        "timeline": [
            {"offset_s": r.offset_s, "round": r.round, "event": r.kind, "text": r.text}
            for r in view.timeline
        ],
    }
    if comparison is not None:
        out["rerun"] = {
            "session_id": comparison.rerun_id,
            "same_behaviour": comparison.same_behaviour,
            "changes": comparison.changes,
            "tokens": comparison.rerun.tokens.model_dump(),
            "recorded": outcome(comparison.original),
            "now": outcome(comparison.rerun),
        }
    return out


def _print(view, determinism, comparison) -> None:
    from nearmiss.client.replay import outcome, verdict
    from nearmiss.reports.text import table

    print(f"session {view.session_id}: {view.kernel} / {view.candidate_name} · {view.model}")
    print("\ntimeline")
    rows = [[f"{r.offset_s:7.1f}s", str(r.round), r.kind, r.text] for r in view.timeline]
    print(table(["time", "round", "event", "what happened"], rows))
    mark = "ok" if determinism.ok else "FAILED"
    print(f"\ndeterminism check: {mark} — {determinism.detail}")
    if comparison is None:
        return
    rows = []
    for number, (old, new) in enumerate(comparison.steps, start=1):
        rows.append(
            [
                str(number),
                (old or new).phase,
                f"{verdict(old)} {old.score:.2f}" if old else "-",
                f"{verdict(new)} {new.score:.2f}" if new else "-",
                new.jax_version if new else "-",
            ]
        )
    print(f"\nre-run {comparison.rerun_id} (recorded answers, 0 tokens)")
    print(table(["check", "phase", "recorded", "re-run", "jax now"], rows))
    if comparison.same_behaviour:
        print(f"same behaviour: {outcome(comparison.rerun)}, as recorded")
    else:
        print("behaviour changed:")
        for change in comparison.changes:
            print(f"  - {change}")
