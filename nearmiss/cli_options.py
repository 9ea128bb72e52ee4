"""Command-line options shared by the commands that start repair sessions (repair, fleet,
experiment)."""

from __future__ import annotations

import argparse

from workflows.loop import Guards


def positive(kind):
    def parse(text: str):
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="playbook", help="playbook (zero tokens, default) or openai:MODEL"
    )
    add_guard_options(parser)
    parser.add_argument("--no-kb", action="store_true", help="retrieve no knowledge (the ablation)")


def add_guard_options(parser: argparse.ArgumentParser) -> None:
    """The per-session guards, read back by ``guards_from``."""
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
        help="seconds per session (default %(default)s)",
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
        max_tool_calls_per_round=args.tool_calls_per_round,
    )
