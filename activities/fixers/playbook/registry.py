"""The recipe registry: ``RECIPES`` in the order they are tried, filled by ``@recipe``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from activities.fixers.playbook.source import (
    _apply,
    _Edit,
    _Module,
    _module,
)
from nearmiss.engine.models import Evidence

# ----------------------------------------------------------------------------------------------
# The recipes, in the order they are tried.


@dataclass(frozen=True)
class Recipe:
    """A general bug pattern and its fix: ``apply`` returns the edited source, or None when the
    pattern is not in the source (pure: no I/O, no state)."""

    name: str
    classes: tuple[str, ...]
    description: str
    apply: Callable[[str, Evidence], str | None]


RECIPES: dict[str, Recipe] = {}


def _recipe(name: str, classes: tuple[str, ...], description: str):
    def register(fn: Callable[[_Module, Evidence], list[_Edit]]):
        def apply(source: str, evidence: Evidence) -> str | None:
            mod = _module(source)
            if mod is None or mod.np is None or mod.pl is None:
                return None
            return _apply(source, fn(mod, evidence))

        apply.__doc__ = fn.__doc__
        RECIPES[name] = Recipe(name, classes, description, apply)
        return fn

    return register
