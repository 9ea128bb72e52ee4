"""MkDocs hooks: the parts of these pages the code can write itself.

``<!-- nearmiss:cli-help -->`` becomes every subcommand's ``--help`` text, read from the real
parser (``nearmiss.cli.main.build_parser``); ``<!-- nearmiss:check-report-schema -->`` becomes
the JSON schema of ``nearmiss.CheckReport``. So the reference cannot drift from the code.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator
from typing import Any

CLI_HELP = "<!-- nearmiss:cli-help -->"
REPORT_SCHEMA = "<!-- nearmiss:check-report-schema -->"
WIDTH = "100"  # argparse wraps help at the terminal's width: the same text on every machine


def subcommands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (sub)command below ``parser``, depth first, with its words after ``nearmiss``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from subcommands(sub, (*path, name))


def cli_help() -> str:
    from nearmiss.cli.main import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        sections = []
        for words, sub in subcommands(build_parser()):
            heading = "###" if len(words) > 1 else "##"
            help_text = sub.format_help().rstrip()
            sections.append(f"{heading} nearmiss {' '.join(words)}\n\n```\n{help_text}\n```\n")
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(sections)


def report_schema() -> str:
    from nearmiss import CheckReport

    schema = json.dumps(CheckReport.model_json_schema(), indent=2)
    return f"```json\n{schema}\n```\n"


def on_page_markdown(markdown: str, **_: Any) -> str:
    if CLI_HELP in markdown:
        markdown = markdown.replace(CLI_HELP, cli_help())
    if REPORT_SCHEMA in markdown:
        markdown = markdown.replace(REPORT_SCHEMA, report_schema())
    return markdown
