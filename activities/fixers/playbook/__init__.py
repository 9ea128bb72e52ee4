"""The ``playbook`` fixer: zero-token repair recipes keyed by failure class.

A recipe is a general pattern of a near-miss bug with its textbook fix. It reads the candidate's
syntax tree (and, where the bug is a compile error or a wrong output structure, the evidence's
own words), and edits only the spans its pattern names: never a rewrite of the kernel, never a
look at golden kernels or corpus labels. The engine validates every edit like any other.

``PlaybookFixer.propose`` tries the recipes that address the evidence's failure classes (the
primary class first), in the fixed order of ``RECIPES``, skipping those already tried in the
session, and returns the first that changes the source — zero tokens, always. When none of
those applies, the recipes of other classes whose pattern is in the source come next.
"""

from __future__ import annotations

# Importing the recipe modules registers their recipes, in this order: the newer modules after
# the older, so a kernel the older recipes already repair meets the same recipes first.
# isort: off
from activities.fixers.playbook import (  # noqa: F401
    recipes_compile,
    recipes_state,
    recipes_target,
    recipes_values,
    recipes_padding,
    recipes_numerics,
)

# isort: on
from activities.fixers.playbook.registry import RECIPES, Recipe
from nearmiss.engine.models import Evidence
from workflows.models import FIXER_KINDS, FixRequest, FixResult, TokenUsage

# ----------------------------------------------------------------------------------------------
# The fixer.


class PlaybookFixer:
    """Tries the recipes that address the evidence's failure classes; zero tokens."""

    kind = FIXER_KINDS["playbook"]

    async def propose(self, request: FixRequest) -> FixResult:
        return propose(request)


def addressed_recipes(evidence: Evidence) -> list[str]:
    """The recipes for the evidence's failure classes, the primary class's first."""
    classes = _classes(evidence)
    return list(dict.fromkeys(r.name for c in classes for r in RECIPES.values() if c in r.classes))


def recipe_order(evidence: Evidence) -> list[str]:
    """Every recipe, in the order the playbook tries them: those for the evidence's classes
    (``addressed_recipes``), then the others whose pattern is in the source. A bug shows up as
    whichever class its numbers give (a mask one lane too wide is nan_inf where the extra lane
    is uninitialised, wrong_values where it is zero), and a recipe outside the class costs zero
    tokens too, is validated by the engine like any edit, and is reverted by the loop if it
    makes things worse."""
    addressed = addressed_recipes(evidence)
    return addressed + [name for name in RECIPES if name not in addressed]


def _classes(evidence: Evidence) -> list[str]:
    ordered = [evidence.failure_class, *evidence.failure_classes]
    return [c for i, c in enumerate(ordered) if c and c not in ordered[:i]]


def _unaddressed(evidence: Evidence) -> str:
    """Why there is no failure class to address: what blocks certification, in words."""
    if not evidence.integrity_ok:
        rules = ", ".join(sorted({v.rule for v in evidence.violations})) or "unspecified"
        first = f": {evidence.violations[0].detail}" if evidence.violations else ""
        return (
            f"the integrity gate blocks certification ({rules}){first}; no playbook recipe "
            "rewrites a kernel to meet the integrity rules"
        )
    refused = [name for name, ok in evidence.targets.items() if not ok]
    if refused:
        return (
            f"target {', '.join(refused)} does not accept the kernel, with no failure class "
            "to address (what it could not verify is in the check's report)"
        )
    if evidence.certified:
        return "the kernel is certified: nothing to fix"
    return "no failure class to address: nothing the playbook can fix"


def propose(request: FixRequest) -> FixResult:
    """The first applicable recipe's edit, or no source and a plain reason."""
    classes = _classes(request.evidence)
    if not classes:
        return FixResult(model="playbook", reason=_unaddressed(request.evidence))
    target = ", ".join(classes)
    seen = set(addressed_recipes(request.evidence))
    tried, not_found, failed = [], [], []
    for name in recipe_order(request.evidence):
        recipe = RECIPES[name]
        if name in request.tried:
            tried += [name] if name in seen else []
            continue
        try:
            edited = recipe.apply(request.source, request.evidence)
        except Exception as exc:  # a recipe's bug is a failed round, never a crashed fixer
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
            continue
        if edited is not None and edited != request.source:
            outside = ""
            if name not in seen:
                outside = f"no recipe for {target} applies; {name} ({', '.join(recipe.classes)})"
            return FixResult(
                source=edited, summary=name, reason=outside, model="playbook", tokens=TokenUsage()
            )
        not_found += [name] if name in seen else []
    if not seen:
        reason = f"no playbook recipe addresses {target}"
    else:
        parts = [f"already tried: {', '.join(tried) or 'none'}"]
        parts.append(f"patterns not found: {', '.join(not_found) or 'none'}")
        if failed:
            parts.append(f"recipes that failed: {', '.join(failed)}")
        reason = f"no playbook recipe applies to {target}: " + "; ".join(parts)
    return FixResult(model="playbook", reason=reason, tokens=TokenUsage())


__all__ = ["RECIPES", "PlaybookFixer", "Recipe", "addressed_recipes", "propose", "recipe_order"]
