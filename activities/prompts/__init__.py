"""Prompt templates for the model fixers, kept as files (``*.md``) rather than code.

A template names its slots ``{like_this}``; ``render`` fills them in one pass, so braces in the
filled text (kernel code, dicts) are never read as slots, and other braces in a template stay
as they are. A slot without a value is an error, never a silently empty prompt.
"""

from __future__ import annotations

import re
from pathlib import Path

_DIR = Path(__file__).resolve().parent
_SLOT = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def load(name: str) -> str:
    """The raw text of template ``name`` (e.g. ``"fix.md"``)."""
    return (_DIR / name).read_text(encoding="utf-8")


def slots(name: str) -> set[str]:
    """The slot names template ``name`` uses."""
    return set(_SLOT.findall(load(name)))


def render(name: str, **values: object) -> str:
    """Template ``name`` with every ``{slot}`` replaced by ``str(values[slot])``."""
    template = load(name)
    missing = set(_SLOT.findall(template)) - values.keys()
    if missing:
        raise KeyError(f"prompt template {name} needs values for: {', '.join(sorted(missing))}")
    return _SLOT.sub(lambda m: str(values[m.group(1)]), template)
