"""The ``nearmiss`` command line."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import Counter
from pathlib import Path

from nearmiss.cli import experiment as experiment_cli
from nearmiss.cli import fleet as fleet_cli
from nearmiss.cli import kb as kb_cli
from nearmiss.cli import replay as replay_cli
from nearmiss.cli import report as report_cli
from nearmiss.cli import spec as spec_cli
from nearmiss.cli import workers
from nearmiss.cli.options import (
    add_sandbox_option,
    add_session_options,
    add_target_option,
    apply_sandbox_option,
    guards_from,
    positive,
    targets_from,
)
from nearmiss.engine.check import SUITES, check
from nearmiss.engine.errors import Stopped, UsageError
from nearmiss.engine.integrity.gate import MODES
from nearmiss.engine.runner.session import Limits
from nearmiss.engine.targets.libtpu_env import prepare_environment
from nearmiss.reports.terminal import PrintableStream
from nearmiss.reports.text import render_report, table

EXIT_CERTIFIED, EXIT_NOT_CERTIFIED, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nearmiss", description="Repair near-miss JAX/Pallas kernels by debugging them."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check_cmd = commands.add_parser(
        "check",
        help="certify or diagnose a candidate kernel against a spec",
        description="Exit 0 certified, 1 not certified, 2 unusable input.",
    )
    check_cmd.add_argument("spec", type=Path, help="spec file defining SPEC")
    check_cmd.add_argument("candidate", type=Path, help="candidate file defining kernel()")
    check_cmd.add_argument("--suite", choices=SUITES, default="all")
    check_cmd.add_argument("--json", action="store_true", help="print one JSON object")
    check_cmd.add_argument(
        "--no-controls",
        dest="controls",
        action="store_false",
        help="skip the control experiments that isolate a failing case's trigger",
    )
    check_cmd.add_argument("--seed", type=int, help="reproduce a run (default: a fresh seed)")
    check_cmd.add_argument(
        "--timeout",
        type=positive(float),
        default=Limits.case_timeout_s,
        help="seconds per case (default %(default)s); also bounds the candidate's import and "
        "the spec's work on each case, plus 30 s for starting Python and JAX",
    )
    check_cmd.add_argument(
        "--memory-mb",
        type=positive(int),
        default=Limits.memory_mb,
        help="memory limit of each child that runs candidate or spec code (default "
        "%(default)s); held by a cgroup per child where the engine can make them (root, or "
        "NEARMISS_CGROUP), else by an address-space limit, under which JAX needs about 2048",
    )
    add_target_option(check_cmd)
    check_cmd.add_argument(
        "--integrity",
        choices=MODES,
        default="enforce",
        help="anti-cheat gate: enforce (default), report (list violations; the numbers' "
        "verdict is `passed`, never a certificate), off",
    )
    corpus_cmd = commands.add_parser(
        "corpus", help="list the bundled operators and their labelled near-miss variants"
    )
    corpus_cmd.add_argument("--json", action="store_true", help="print one JSON list")
    repair_cmd = commands.add_parser(
        "repair",
        help="repair a near-miss kernel in a durable session (Temporal + PostgreSQL)",
        description="Exit 0 when the repaired kernel is certified, 1 when not, 2 on bad input, "
        "128+N when signal N stopped it (130 Ctrl-C, 143 SIGTERM: what it started is stopped "
        "first). Without TEMPORAL_ADDRESS and NEARMISS_DATABASE_URL the embedded dev stack is "
        "started for the command. Progress goes to stderr, also with --json.",
    )
    repair_cmd.add_argument("spec", type=Path, help="spec file defining SPEC")
    repair_cmd.add_argument("candidate", type=Path, help="candidate file defining kernel()")
    add_session_options(repair_cmd)
    repair_cmd.add_argument("--out", type=Path, help="where to write the fixed kernel")
    repair_cmd.add_argument(
        "--json", action="store_true", help="print one JSON object (progress stays on stderr)"
    )
    fleet_cli.add_parsers(commands)
    worker_cmd = commands.add_parser(
        "worker",
        help="run a repair worker against the configured services",
        description="Polls the general task queue (workflows, model calls, recording) and one "
        "check queue per target it serves; a session's checks go to its target's queue.",
    )
    worker_cmd.add_argument(
        "--targets",
        help="targets whose checks this worker runs, e.g. interpret,tpu-v5e (default: every "
        "target this machine can serve, verified at start)",
    )
    worker_cmd.add_argument(
        "--checks-only",
        action="store_true",
        help="poll only the targets' check queues, not the general queue",
    )
    workers.add_parser(commands)
    kb_cli.add_parser(commands)
    report_cli.add_parser(commands)
    experiment_cli.add_parser(commands)
    replay_cli.add_parser(commands)
    spec_cli.add_parser(commands)
    dev_cmd = commands.add_parser(
        "dev",
        help="the embedded dev stack: Temporal dev server + PostgreSQL on loopback",
        description="State under NEARMISS_HOME (default .nearmiss); ports from "
        "NEARMISS_TEMPORAL_PORT / NEARMISS_POSTGRES_PORT; NEARMISS_TEMPORAL_UI_PORT adds the UI.",
    )
    dev_cmd.add_argument("action", choices=("up", "down", "status"))
    demo_cmd = commands.add_parser("demo", help="check the bundled example kernels")
    demo_cmd.add_argument("--seed", type=int, default=0)
    demo_cmd.add_argument(
        "--all", action="store_true", help="the whole corpus, not one operator per category"
    )
    # Commands that run candidate code, or serve sessions that do (repair, fleet and experiment
    # have the option with their session guards).
    for command in (check_cmd, worker_cmd, commands.choices["fleets"], demo_cmd):
        add_sandbox_option(command)
    return parser


_NUMBER_LIST = re.compile(r"\[\s+(-?[\d.e+-]+(?:,\s+-?[\d.e+-]+)*)\s+\]")


def _indented_json(text: str) -> str:
    """Indented JSON with lists of numbers on one line (shapes, dims, heatmap rows): a 64×64
    mismatch map is 64 lines, not 4096."""
    return _NUMBER_LIST.sub(lambda m: "[" + re.sub(r",\s+", ", ", m.group(1)) + "]", text)


def run_check(args: argparse.Namespace) -> int:
    limits = Limits(case_timeout_s=args.timeout, memory_mb=args.memory_mb)
    try:
        report = check(
            args.spec,
            args.candidate,
            args.suite,
            args.seed,
            limits,
            integrity=args.integrity,
            targets=tuple(targets_from(args)) or None,
            controls=args.controls,
        )
    except UsageError as exc:
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(_indented_json(report.model_dump_json(indent=2)) if args.json else render_report(report))
    return EXIT_CERTIFIED if report.certified else EXIT_NOT_CERTIFIED


def run_corpus(args: argparse.Namespace) -> int:
    from pallas_ops.catalog import listing

    entries = listing()
    if args.json:
        print(json.dumps(entries, indent=2))
        return 0
    rows = [
        [
            e["name"],
            e["category"],
            str(len(e["variants"])),
            ", ".join(sorted({v["bug_family"] for v in e["variants"]})),
            ", ".join(
                f"{target} {count}"
                for target, count in sorted(Counter(v["target"] for v in e["variants"]).items())
            ),
        ]
        for e in entries
    ]
    print(table(["operator", "category", "variants", "bug families", "labels for"], rows))
    categories = Counter(e["category"] for e in entries)
    print(
        f"\n{len(entries)} operators, {sum(len(e['variants']) for e in entries)} variants; "
        + ", ".join(f"{name} {count}" for name, count in sorted(categories.items()))
    )
    return 0


def run_dev(args: argparse.Namespace) -> int:
    from infra.devstack import DevStack, StackError

    stack = DevStack()
    try:
        if args.action == "up":
            started = stack.up()
            print(f"started: {', '.join(started)}" if started else "already running")
        elif args.action == "down":
            stopped = stack.down()
            print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    except StackError as exc:
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return 1
    rows = [
        [s["service"], "up" if s["ready"] else "down", str(s["pid"] or "-"), s["address"], s["log"]]
        for s in stack.status()
    ]
    print(table(["service", "state", "pid", "address", "log"], rows))
    print(f"temporal: {stack.config.temporal_address}   postgres: {stack.config.dsn}")
    return 0


def run_repair(args: argparse.Namespace) -> int:
    import asyncio

    from nearmiss.client.service import repair
    from nearmiss.client.settings import Settings

    try:
        guards, targets = guards_from(args), targets_from(args)
        return asyncio.run(
            repair(
                args.spec,
                args.candidate,
                model=args.model,
                guards=guards,
                out=args.out,
                as_json=args.json,
                settings=Settings.from_env(),
                use_kb=not args.no_kb,
                targets=targets,
            )
        )
    except (UsageError, ValueError) as exc:
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Stopped as stopped:
        return _stopped(stopped)


def _stopped(stopped: Stopped) -> int:
    """A command a signal stopped (``client.service.stop_on_signals``): one line, and the exit
    status a shell gives a process the signal killed."""
    print(f"nearmiss: stopped by {stopped}; what it started is stopped", file=sys.stderr)
    return stopped.exit_status


def run_worker_command(args: argparse.Namespace) -> int:
    import asyncio

    from nearmiss.client.service import run_worker, served_targets
    from nearmiss.client.settings import Settings

    try:
        targets = served_targets(args.targets)
    except UsageError as exc:
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(run_worker(Settings.from_env(), targets, general=not args.checks_only))


def _run_async(command, args: argparse.Namespace) -> int:
    """Run an async command; bad input (UsageError, ValueError) is exit 2 with the reason, a
    signal that stopped it (Stopped) 128 + the signal."""
    import asyncio

    try:
        return asyncio.run(command(args))
    except (UsageError, ValueError) as exc:
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Stopped as stopped:
        return _stopped(stopped)


def main(argv: list[str] | None = None) -> int:
    # The engine computes on the CPU (children pick their own backend): with libtpu installed
    # for TPU targets, JAX would otherwise start it as a backend here, noisily and for nothing.
    prepare_environment()
    # Candidates' and models' text reaches what is printed: it shows, it never acts (terminal).
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    try:
        args = build_parser().parse_args(argv)
        apply_sandbox_option(args)
        return _dispatch(args)
    except BrokenPipeError:
        # The reader went away (`nearmiss dev up | head -1`): the work is done, the rest of the
        # output has nowhere to go. Point stdout at /dev/null so the exit flush cannot fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    finally:
        sys.stdout, sys.stderr = streams


def _dispatch(args) -> int:
    if args.command == "check":
        return run_check(args)
    if args.command == "corpus":
        return run_corpus(args)
    if args.command == "dev":
        return run_dev(args)
    if args.command == "repair":
        return run_repair(args)
    if args.command in ("fleet", "fleets"):
        return _run_async(
            fleet_cli.run_fleet if args.command == "fleet" else fleet_cli.run_fleets, args
        )
    if args.command == "experiment":
        return _run_async(experiment_cli.run, args)
    if args.command == "report":
        return _run_async(report_cli.main, args)
    if args.command == "replay":
        return _run_async(replay_cli.run, args)
    if args.command == "spec":
        return spec_cli.run(args)
    if args.command == "worker":
        return run_worker_command(args)
    if args.command == "workers":
        return _run_async(workers.run, args)
    if args.command == "kb":
        import asyncio

        return asyncio.run(kb_cli.run(args))
    from nearmiss.cli.demo import run_demo

    try:
        return run_demo(seed=args.seed, everything=args.all)
    except UsageError as exc:  # e.g. a port the embedded stack needs is in use
        print(f"nearmiss: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
