"""Command-line options shared by the commands that start repair sessions (repair, fleet,
experiment), and the sandbox opt-out of every command that runs candidate code."""

from __future__ import annotations

import argparse
import os

from nearmiss.engine.runner.environment import UNSAFE_ENV, UNSAFE_FLAG
from workflows.guards import Guards


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="playbook",
        help="playbook (zero tokens, default), search (zero tokens: the playbook, then a "
        "screened search over single-site mutants; minutes per round) or openai:MODEL",
    )
    add_guard_options(parser)
    parser.add_argument("--no-kb", action="store_true", help="retrieve no knowledge (the ablation)")
    add_target_option(parser)


def add_target_option(parser: argparse.ArgumentParser) -> None:
    """``--target LIST``: where a kernel must be right (``nearmiss.engine.targets``)."""
    from nearmiss.engine.targets.registry import TARGETS

    parser.add_argument(
        "--target",
        dest="targets",  # `fleet` has a positional called target (its manifest)
        metavar="LIST",
        help="where the kernel must be right, a comma list of "
        + ", ".join(TARGETS)
        + " (default: the spec's targets, else interpret)",
    )


def targets_from(args: argparse.Namespace) -> list[str]:
    """The targets ``--target`` names, checked (UsageError for a bad one); [] when not given."""
    from nearmiss.engine.targets.registry import parse_targets

    text = getattr(args, "targets", None)
    return list(parse_targets(text)) if text is not None else []


def add_sandbox_option(parser: argparse.ArgumentParser) -> None:
    """``--unsafe-no-sandbox``, for commands that run candidate code (or a worker that does)."""
    parser.add_argument(
        UNSAFE_FLAG,
        action="store_true",
        dest="unsafe_no_sandbox",
        help="run candidate code WITHOUT the bubblewrap sandbox: it can then read and change "
        "anything you can. Only for machines where bwrap cannot run",
    )


def apply_sandbox_option(args: argparse.Namespace) -> None:
    """Pass ``--unsafe-no-sandbox`` on as NEARMISS_UNSAFE_NO_SANDBOX=1 in this process's
    environment, so the workers and children it starts inherit it (each unsandboxed candidate
    child then warns on stderr)."""
    if getattr(args, "unsafe_no_sandbox", False):
        os.environ[UNSAFE_ENV] = "1"


def add_guard_options(parser: argparse.ArgumentParser) -> None:
    """The per-session guards, read back by ``guards_from``, and the sandbox opt-out."""
    add_sandbox_option(parser)
    parser.add_argument("--max-rounds", type=positive(int), default=Guards().max_rounds)
    parser.add_argument(
        "--token-budget",
        type=positive(int),
        default=Guards().token_budget,
        help="input + output tokens per session (default %(default)s)",
    )
    parser.add_argument(
        "--deadline",
        type=positive(float),
        default=Guards().deadline_s,
        help="seconds per session (default %(default)s): a check or fix still running then is "
        "ended, and the session stops with `deadline`",
    )
    parser.add_argument(
        "--worker-wait",
        type=positive(float),
        default=Guards().worker_wait_s,
        help="seconds a check waits for a worker that serves its target before the session "
        "stops with no_worker (default %(default)s)",
    )
    parser.add_argument(
        "--tool-calls-per-round",
        type=non_negative,
        default=Guards().max_tool_calls_per_round,
        help="experiments a chat model may run before each edit (default %(default)s; 0: none)",
    )


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def guards_from(args: argparse.Namespace) -> Guards:
    """The guards that ``add_guard_options`` parsed."""
    return Guards(
        max_rounds=args.max_rounds,
        token_budget=args.token_budget,
        deadline_s=args.deadline,
        worker_wait_s=args.worker_wait,
        max_tool_calls_per_round=args.tool_calls_per_round,
    )
