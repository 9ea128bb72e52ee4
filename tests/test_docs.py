"""The documentation stays true to the code: README.md and the MkDocs site under docs/.

The site builds with ``mkdocs build --strict`` (a broken link or anchor, a page left out of the
navigation, fails it); every ``nearmiss`` command the pages show names a real subcommand and
options its parser accepts, and the runnable ones parse whole; every Python import they show
imports; the API page names every public name and the CLI page every subcommand; the README
stays short; and no page talks about how the project is made rather than how it is used. No JAX
work: the parser and the public names load without JAX.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import nearmiss
from nearmiss.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]

FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
SPAN = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")
# `nearmiss SUB ...` as a command: after the start, a path's slash or a prompt, never `x.nearmiss`,
# `--nearmiss-seed` or `from nearmiss import`.
COMMAND = re.compile(r"(?<![\w.\-])nearmiss[ \t]+([a-z][a-z0-9-]*)([^\n]*)")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_.]*$")
SYNOPSIS = re.compile(r"[\[\]|]|\.\.\.|…")
COMMENT = re.compile(r"(^|\s)#.*$")

# Words about how the project is developed, never how it is used. "session" alone is a product
# term (a repair session), so only phrases are banned.
BANNED = [
    r"\b(a|the|another|each) helpers? (who|that|planted|wrote)\b",
    r"\bborrowed\b",
    r"\bbudget_left",
    r"\bissue \d+",
    r"\bdevice (budget|minutes|time)\b",
    r"\b(give_back|files_at|files_fetch|can_start_another)\b",
    r"\bthis session\b",
    r"\b(session|task)s? (is |was |that is )?lent\b",
    r"\blent (a|the) [\w ]*machine\b",
    r"\bthe device machine\b",
    r"\bKINDS\.md\b",
    r"\.\./shared/",
    r"\bthe brief\b",
    r"\bcarry: \[",
]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text)]


def block_lines(body: str) -> list[str]:
    """A block's lines with continuations joined: a trailing backslash, or a line indented past
    a command's start that goes on with more options (a synopsis wrapped over lines)."""
    lines: list[str] = []
    for raw in body.splitlines():
        raw = COMMENT.sub("", raw)  # a shell or YAML comment is prose
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + raw.strip()
        elif lines and COMMAND.search(lines[-1]) and raw[:1].isspace() and raw.strip():
            lines[-1] += " " + raw.strip()
        else:
            lines.append(raw)
    return lines


def commands() -> list[tuple[str, str, bool]]:
    """(page, command text after `nearmiss`, runnable) for every command the pages show: in
    fenced blocks (runnable: meant to be typed as is) and in inline code spans (mentions)."""
    found: list[tuple[str, str, bool]] = []
    for page in PAGES:
        text = page.read_text()
        for language, body in fenced_blocks(text):
            if language in ("python", "json"):
                continue
            for line in block_lines(body):
                for m in COMMAND.finditer(line):
                    found.append((page.name, m.group(1) + m.group(2), True))
        prose = FENCE.sub("", text)
        for span in SPAN.finditer(prose):
            for m in COMMAND.finditer(span.group(1).replace("\n", " ")):
                found.append((page.name, m.group(1) + m.group(2), False))
    return [(page, cmd, runnable) for page, cmd, runnable in found if not cmd.startswith("import")]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def positional_choices(parser: argparse.ArgumentParser) -> set[str]:
    return {
        str(choice)
        for action in parser._actions
        if not action.option_strings and action.choices
        for choice in action.choices
    }


def tokens(command: str) -> list[str]:
    try:
        return shlex.split(command, comments=True)
    except ValueError:  # an unbalanced quote in a shortened mention
        return command.split()


@functools.cache
def the_parser() -> argparse.ArgumentParser:
    return build_parser()


def problems_with(command: str, runnable: bool) -> list[str]:
    """What the parser refuses in ``command`` (the words after ``nearmiss``)."""
    parser = the_parser()
    words = tokens(command)
    subs = subparsers(parser)
    if words[0] not in subs:
        return [f"no subcommand {words[0]!r}"]
    sub = subs[words[0]]
    allowed = options(sub)
    nested = subparsers(sub)
    problems = []
    if len(words) > 1 and re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", words[1]):
        choices = set(nested) | positional_choices(sub)
        if choices:
            for word in words[1].split("|"):
                if word not in choices:
                    problems.append(f"{words[0]} has no {word!r}")
                elif word in nested:
                    allowed |= options(nested[word])
    for word in words[1:]:
        for flag in re.findall(r"(?<![\w-])(--?[a-z][a-z0-9-]*)", word):
            if flag not in allowed:
                problems.append(f"{words[0]} has no option {flag}")
    concrete = not SYNOPSIS.search(command) and not any(PLACEHOLDER.match(w) for w in words)
    if runnable and concrete and not problems:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parser.parse_args(words)
        except SystemExit:
            problems.append(f"does not parse: {stderr.getvalue().strip().splitlines()[-1]}")
    return problems


def test_the_site_builds_strict_with_the_generated_parts(tmp_path):
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    cli = (site / "cli" / "index.html").read_text()
    for words in ("check", "fleet", "kb search", "spec new", "experiment show"):
        assert f"usage: nearmiss {words}" in cli, words
    api = (site / "api" / "index.html").read_text()
    assert "failure_class" in api and "nearmiss:check-report-schema" not in api
    assert "nearmiss:cli-help" not in cli
    assert not (site / "hooks.py").exists()


def test_every_python_import_the_pages_show_imports():
    statements = []
    for page in PAGES:
        for language, body in fenced_blocks(page.read_text()):
            if language != "python":
                continue
            for node in ast.walk(ast.parse(body)):
                if isinstance(node, ast.ImportFrom):
                    modules = [node.module or ""]
                elif isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                else:
                    continue
                if any(module.split(".")[0] == "nearmiss" for module in modules):
                    statements.append((page.name, ast.unparse(node)))
    assert len(statements) >= 4, statements  # the README, specs, API and CI pages show some
    script = (
        "import json, sys\n"
        "failed = []\n"
        "for page, statement in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        exec(statement, {})\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{page}: {statement}: {exc!r}')\n"
        "print(json.dumps(failed))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, json.dumps(statements)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_every_command_the_pages_show_is_one_the_parser_accepts():
    found = commands()
    assert any(runnable for _, _, runnable in found)
    assert len({cmd.split()[0] for _, cmd, _ in found}) >= 10, found  # most subcommands shown
    problems = [
        f"{page}: nearmiss {cmd.strip()}: {problem}"
        for page, cmd, runnable in found
        for problem in problems_with(cmd, runnable)
    ]
    assert problems == []


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("chek spec.py kernel.py", "no subcommand"),
        ("check spec.py kernel.py --sead 3", "no option --sead"),
        ("kb list|shw ID", "has no 'shw'"),
        ("fleet pallas_ops --concurrency many", "does not parse"),
    ],
)
def test_the_command_check_refuses_what_the_parser_refuses(command, problem):
    assert any(problem in p for p in problems_with(command, runnable=True))


def test_the_api_page_names_every_public_name():
    api = (DOCS / "api.md").read_text()
    missing = [name for name in nearmiss.__all__ if f"`{name}`" not in api]
    assert missing == []


def test_the_cli_page_names_every_subcommand():
    cli = (DOCS / "cli.md").read_text()
    subs = subparsers(the_parser())
    missing = [name for name in subs if f"`nearmiss {name}" not in cli]
    nested = [
        f"{name} {action}"
        for name, sub in subs.items()
        for action in subparsers(sub)
        if f"`{action}`" not in cli and f"nearmiss {name} {action}" not in cli
    ]
    assert missing == [] and nested == []


def test_the_readme_stays_short():
    assert len(README.read_text().splitlines()) <= 220


def test_no_page_talks_about_how_the_project_is_made():
    pattern = re.compile("|".join(f"(?:{p})" for p in BANNED), re.I)
    hits = [
        f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
        for page in [*PAGES, ROOT / "mkdocs.yml"]
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []
