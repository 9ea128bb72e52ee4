"""The ``search`` fixer: a bounded, screened search over the playbook's recipes and the kernel's
single-site mutants.

It asks the engine instead of guessing: it screens, in order, the edits of the recipes for the
evidence's failure class, then those of the other recipes whose pattern is present, then the
kernel's single-site mutants (``mutants``), each with a sandboxed check of the failing suite
(``screen``), and answers with the first that passes that suite and the engine's hidden cases
— else the one that got furthest, when it got further than the kernel itself. A recipe of the
class is answered unscreened only where screening cannot run (the gate refuses the kernel, its
baseline fails, it passes the screening suite). Zero tokens, always; a bounded number of checks
per round (``Budget``). Where several edits pass, the hidden cases choose among the first few
and the answer names those it could not tell apart. The loop then checks the answer on the
full suite like any other edit: screening only decides what to propose, never what certifies.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from activities.fixers.playbook import RECIPES, addressed_recipes, recipe_order
from activities.fixers.playbook import propose as playbook_propose
from activities.fixers.search.leads import Localised, evidence_lines
from activities.fixers.search.mutants import Mutant, mutants
from activities.fixers.search.screen import Budget, Screen, screen
from nearmiss.engine.forensics.classify import CONSTANT_FACTOR_LEAD, ROW_FACTOR_LEAD
from nearmiss.engine.integrity.gate import changed_lines
from workflows.models import FIXER_KINDS, FixRequest, FixResult, TokenUsage

MODEL = "search"


@dataclass(frozen=True)
class Edit:
    """A screened candidate edit: its name in the session's ``tried`` list, and its source."""

    name: str
    source: str


class OutOfTime(Exception):
    """A round under a deadline (``SearchFixer.within``) spent its time with edits left to
    screen and none to propose: the deadline, not the search, ended it."""


class SearchFixer:
    """Recipes of the evidence's class first; else a screened search; zero tokens."""

    kind = FIXER_KINDS[MODEL]

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget()

    def within(self, seconds: float) -> SearchFixer:
        """This fixer for a round that must end ``seconds`` from now (its session's deadline,
        ``Budget.within``); such a round that runs out of time with no edit raises OutOfTime."""
        return SearchFixer(self.budget.within(seconds))

    async def propose(self, request: FixRequest) -> FixResult:
        def playbook() -> FixResult:
            return playbook_propose(request).model_copy(update={"model": MODEL})

        if not request.evidence.failure_class:  # nothing numeric to search for
            return playbook()

        # A recipe of the class is screened with the rest: one that leaves the score as it
        # was would cost a round, and the loop would build on it. Its answer unscreened is
        # asked for only where nothing could be screened.
        def unscreened() -> FixResult | None:
            result = playbook()
            return result if result.source is not None and not result.reason else None

        return await asyncio.to_thread(search, request, self.budget, unscreened)


def candidate_edits(request: FixRequest) -> Iterator[Edit]:
    """What the search screens, in order, each distinct source once: each recipe's edit not yet
    tried (those for the evidence's classes first, as the playbook tries them), then the
    single-site mutants. Lazy: a large module has thousands of mutants, a round screens few."""
    return (edit for _, edit in _numbered(request))


def _numbered(request: FixRequest) -> Iterator[tuple[int, Edit]]:
    """``candidate_edits`` with each edit's position among all of the source's distinct edits,
    the tried ones counted: a round that resumes a source (``FixRequest.skip``) after an edit
    of it was tried in between (the unedited kernel's own rounds, ``workflows.loop``) finds
    every unscreened edit where it was."""
    addressed = set(addressed_recipes(request.evidence))
    ours: list[Edit] = []  # the recipes for the evidence's classes
    others: list[Edit] = []  # those whose pattern is merely present
    for name in recipe_order(request.evidence):
        try:
            edited = RECIPES[name].apply(request.source, request.evidence)
        except Exception:  # a recipe's bug costs its candidate, not the search
            continue
        if edited is not None and edited != request.source:
            (ours if name in addressed else others).append(Edit(name, edited))
    seen: set[str] = set()
    tried = set(request.tried)
    for edit in itertools.chain(ours, _led(request, others)):
        if edit.source in seen:
            continue
        seen.add(edit.source)
        if edit.name not in tried:
            yield len(seen) - 1, edit


def _led(request: FixRequest, others: list[Edit]) -> Iterator[Edit]:
    """The mutants, the lines the evidence's leads point at first (``suspicion``), with the
    other classes' recipes after those where the diagnosis names an input (the lines it
    reaches are the stronger lead: a recipe merely matching the source is a guess), else
    before every mutant."""
    reached = localised(request)
    ranked = suspicion(request, reached)
    if not reached:
        yield from others
        others = []
    for mutant in mutants(request.source, suspicion=ranked):
        if others and ranked is not None and not ranked(mutant.line):
            yield from others
            others = []
        yield Edit(mutant_name(mutant), mutant.source)
    yield from others


# Where a NaN or an Inf is born: an exponential or a logarithm, a root, a power, a division, an
# infinity or a dtype's extreme (exp overflowing, inf - inf, 0 * inf, 0 / 0, sqrt of a negative).
_NAN_SOURCE = re.compile(
    r"\b(exp2?|expm1|log2?|log1p|logsumexp|sqrt|rsqrt|power|inf|nan|finfo)\b|/|\*\*"
)


# Where a wrong factor is made: a product or a quotient (a reciprocal dropped, a scale applied
# the wrong way), a reduction that normalises (a sum, a mean, a max, a count), a root, an
# exponential (softmax's numerators and rescales).
_FACTOR_SOURCE = re.compile(r"\*|/|\b(sum|mean|max|min|count|sqrt|rsqrt|reciprocal|exp2?)\b")


def suspected_lines(failure_class: str | None, diagnosis: str = "") -> Callable[[str], bool] | None:
    """Which source lines the evidence points the search at first, or None for no preference:
    for NaN/Inf where the reference is finite, the lines that can make one (in JAX's decode
    attention the reversed rescale exponent moves from the 492nd mutant to the 32nd); for
    outputs that are the reference times a wrong factor, by row or for all, the lines that
    scale or normalise."""
    if failure_class == "nan_inf":
        pattern = _NAN_SOURCE
    elif failure_class == "wrong_values" and (
        ROW_FACTOR_LEAD in diagnosis or CONSTANT_FACTOR_LEAD in diagnosis
    ):
        pattern = _FACTOR_SOURCE
    else:
        return None
    return lambda line: pattern.search(line.split("#")[0]) is not None


def localised(request: FixRequest) -> Localised:
    """The lines the inputs the evidence names reach (``leads``)."""
    evidence = request.evidence
    return evidence_lines(request.source, request.spec_source, evidence.diagnosis)


def suspicion(request: FixRequest, reached: Localised) -> Callable[[int], int] | None:
    """How many of the evidence's leads point at a line of the kernel (by its number): the
    kind of line the failure class suspects (``suspected_lines``), and the lines the inputs
    it names reach (``reached``, ``localised``); None where neither says anything."""
    evidence = request.evidence
    kind = suspected_lines(evidence.failure_class, evidence.diagnosis)
    if kind is None and not reached:
        return None
    lines = request.source.split("\n")  # as ast numbers them

    def leads_at(n: int) -> int:
        return (n in reached.lines) + bool(kind and 0 < n <= len(lines) and kind(lines[n - 1]))

    return leads_at


def where_it_points(request: FixRequest, screened: list[Edit], pick: int) -> str:
    """Whether the edit answered changes a line the evidence's named inputs reach, and where
    it does not, why it is answered anyway: no edit there was found first (those edits are
    screened before the others). Empty where the evidence names no input it can follow."""
    reached = localised(request)
    if not reached:
        return ""
    original = request.source.split("\n")
    there = [
        i
        for i, edit in enumerate(screened)
        if reached.touched_by(changed_lines(original, edit.source.split("\n")))
    ]
    if pick in there:
        return f"; it edits where the evidence points ({reached.describe()})"
    tried = (
        f"none of the {len(there)} edits of those lines screened before it did as well"
        if there
        else "no edit of those lines was screened"
    )
    return (
        f"; it is not where the evidence points ({reached.describe()}): {tried} (a fault "
        "every input shares, a mask or a loop bound, is on no one input's path)"
    )


def mutant_name(mutant: Mutant) -> str:
    return f"mutant:{mutant.operator}:{mutant.description}"


def search(
    request: FixRequest, budget: Budget, unscreened: Callable[[], FixResult | None] | None = None
) -> FixResult:
    """One round of the search: the candidate edits screened in order from ``request.skip``
    (those an earlier round screened without finding one) until one passes or the budget is
    spent. With no edit to propose and more left, ``resume_at`` says where the next round
    goes on. ``unscreened`` is asked for the recipe of the class only where nothing could be
    screened, and its answer given then."""
    edits: list[Edit] = []
    pending = itertools.dropwhile(lambda numbered: numbered[0] < request.skip, _numbered(request))
    resume_at = request.skip  # the position after the last edit taken

    def sources() -> Iterator[str]:  # lazy: a large module's mutants are made as screened
        nonlocal resume_at
        for position, edit in pending:
            edits.append(edit)
            resume_at = position + 1
            yield edit.source

    found: Screen = screen(request, sources(), budget)
    more = next(pending, None) is not None
    unreached = f"{found.unreached} skipped as editing code the suite never ran; "
    after = f"after {request.skip} in earlier rounds; " if request.skip else ""
    done = (
        f"screened {found.screened} edits in {found.seconds:.0f} s "
        f"({after}{unreached if found.unreached else ''}"
        f"{'more were left' if more else 'none was left'})"
    )
    if found.best is None:
        recipe = unscreened() if found.screened == 0 and found.why and unscreened else None
        if recipe is not None:
            why = f"search: nothing screened ({found.why}); the recipe for the class, unscreened"
            return recipe.model_copy(update={"reason": why})
        if budget.hard and more and found.seconds > budget.seconds:
            raise OutOfTime(done)
        why = found.why or "none got further than the kernel on the failing suite"
        # Only a round that got through some edits can be resumed: one that screened none (the
        # gate refused the kernel, its baseline failed) would stop at the same place again.
        reason = f"search: {done}; {why}"
        resume = resume_at if more and edits else 0
        return FixResult(model=MODEL, reason=reason, tokens=TokenUsage(), resume_at=resume)
    edit = edits[found.best]
    verdict = "passes the screening suite" if found.passed else "gets further than the kernel"
    if found.told_apart:
        refused = ", ".join(edits[i].name for i in found.told_apart)
        verdict += f"; passed the suite but not the hidden cases: {refused}"
    if found.alike:
        alike = "; ".join(edits[i].name for i in found.alike)
        verdict += (
            f", hidden cases included, and so do {len(found.alike)} other edit(s): the spec "
            f"cannot tell these apart: {alike} (with each as a file, `nearmiss spec check "
            f"{Path(request.spec_path).name} --tell-apart A.py B.py` looks for a case that can)"
        )
    verdict += where_it_points(request, edits, found.best)
    return FixResult(
        source=edit.source,
        summary=edit.name,
        reason=f"search: {done}; {edit.name} {verdict}",
        model=MODEL,
        tokens=TokenUsage(),
        # Where a search of this kernel goes on if the loop comes back to it: an edit that gets
        # further may be a step aside, not towards the fix (workflows.loop keeps the unedited
        # kernel in its beam).
        resume_at=resume_at if more else 0,
    )


__all__ = ["MODEL", "Budget", "OutOfTime", "SearchFixer", "candidate_edits", "search"]
