"""`nearmiss experiment`: the debug-vs-regenerate table and its ablations, on your endpoint.

    nearmiss experiment [--ops OP[,OP/VARIANT...]] --model openai:MODEL [--arms A,B,...]
                        [--trials K] [--out DIR] [--concurrency N] [--seed N] [--learn]
    nearmiss experiment show EXPERIMENT_ID [--out DIR] [--json]
    nearmiss experiment list [--json]

Services as for `nearmiss repair`: the configured ones, else the embedded dev stack.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nearmiss.cli.options import (
    add_guard_options,
    add_target_option,
    guards_from,
    positive,
    targets_from,
)
from nearmiss.client.settings import Settings
from nearmiss.experiments.config import ARMS
from nearmiss.reports.text import table as text_table


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def add_parser(commands) -> None:
    cmd = commands.add_parser(
        "experiment",
        help="debug vs regenerate and the ablations on corpus near-misses (the paper's table)",
        description="Runs every arm on every near-miss --trials times, audits the ablations' "
        "successes, records it all and writes table.md, table.csv, results.json and SVG plots.",
    )
    cmd.add_argument(
        "--ops",
        type=_names,
        default=[],
        help="operator names (all their near-misses) or op/variant ids, comma-separated "
        "(default: one near-miss per op category)",
    )
    cmd.add_argument("--model", default="playbook", help="openai:MODEL (regenerate needs one)")
    cmd.add_argument(
        "--arms", type=_names, default=list(ARMS), help=f"some of {','.join(ARMS)} (default all)"
    )
    cmd.add_argument("--trials", type=positive(int), default=3, help="per arm and near-miss")
    cmd.add_argument("--out", type=Path, help="output folder (default experiment-ID)")
    cmd.add_argument("--concurrency", type=positive(int), default=2, help="sessions at once")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument(
        "--learn",
        action="store_true",
        help="let the knowledge base learn from the sessions (trials are then not independent)",
    )
    add_guard_options(cmd)  # per session, as for `nearmiss repair`
    add_target_option(cmd)
    actions = cmd.add_subparsers(dest="experiment_action")
    show = actions.add_parser("show", help="recompute an experiment's table from the event log")
    show.add_argument("experiment_id")
    show.add_argument("--out", type=Path, help="also write the table files here")
    show.add_argument("--json", action="store_true", help="print results.json instead")
    listing = actions.add_parser("list", help="the experiments in the event log, newest first")
    listing.add_argument("--json", action="store_true")


def _listing(found: list[dict]) -> str:
    rows = [
        [
            e["experiment_id"],
            e["started_at"],
            e["model"],
            str(e["near_misses"]),
            str(len(e["arms"])),
            str(e["trials"]),
            "finished" if e["finished"] else "running or interrupted",
        ]
        for e in found
    ]
    headers = ["experiment", "started", "model", "near-misses", "arms", "trials", "state"]
    return text_table(headers, rows) if rows else "no experiments yet"


async def _show(args: argparse.Namespace, settings: Settings) -> int:
    from nearmiss.cli.kb import open_event_store
    from nearmiss.experiments.outputs import markdown, write_outputs
    from nearmiss.experiments.records import list_experiments, load_table

    async with open_event_store(settings) as store:
        if args.experiment_action == "list":
            found = await list_experiments(store)
            print(json.dumps(found, indent=2) if args.json else _listing(found))
            return 0
        table = await load_table(store, args.experiment_id)
    if args.out:
        from nearmiss.experiments.runner import say_stderr

        for path in write_outputs(table, args.out):
            say_stderr(f"wrote {path}")
    print(json.dumps(table.to_json(), indent=2) if args.json else markdown(table), end="")
    return 0


async def run(args: argparse.Namespace) -> int:
    """The command; bad input raises UsageError/ValueError (the CLI makes that exit 2)."""
    settings = Settings.from_env()
    if getattr(args, "experiment_action", None):
        return await _show(args, settings)
    from nearmiss.client.service import services, stop_on_signals
    from nearmiss.experiments.config import ExperimentConfig
    from nearmiss.experiments.outputs import markdown, write_outputs
    from nearmiss.experiments.records import load_table
    from nearmiss.experiments.runner import run_experiment, say_stderr

    config = ExperimentConfig(
        near_misses=args.ops,
        model=args.model,
        arms=args.arms,
        trials=args.trials,
        seed=args.seed,
        concurrency=args.concurrency,
        learn=args.learn,
        guards=guards_from(args),
        targets=targets_from(args),
    )
    near_misses = config.resolve()  # bad input is a usage error before anything starts
    out = args.out or Path(f"experiment-{config.experiment_id}")
    async with stop_on_signals(), services(settings) as (client, store):
        await run_experiment(client, store, config, say_stderr, near_misses)
        table = await load_table(store, config.experiment_id)
    for path in write_outputs(table, out):
        say_stderr(f"wrote {path}")
    print(markdown(table), end="")
    return 0
