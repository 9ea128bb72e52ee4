"""The input that tells two kernels apart, as a case to add to their spec.

A repair can end with distinct kernels that all pass a spec, hidden cases included ("the spec
cannot tell these apart"): at most one of them is the author's function, and the spec does not
say which. Both are checked on suite ``all`` at seeds 1, 2, ... (each seed draws its own hidden
cases from what the spec allows: sizes past and between the listed ones, values scaled); the
first case that one passes and the other fails tells them apart, and is written as a ``Case``
to paste into the spec (or, for values scaled past the spec's profiles, as the profile to add).
Both checks of a seed draw the same cases (``hidden.draw`` depends on the spec and the seed
alone), so cases are paired by suite and name. None where no seed tried finds one: on what the
spec allows, as far as drawn, the kernels agree (both right or both wrong on each case).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nearmiss.engine.check import check
from nearmiss.engine.models import CaseResult
from nearmiss.engine.runner.sandbox import Limits

# A hidden ``values-xN`` case's profile: the listed case's own, scaled (``hidden``).
_SCALED = re.compile(r"^(?P<profile>.+)-x(?P<scale>\d+)$")


@dataclass(frozen=True)
class Distinction:
    """``case`` (as the kernel ``fails`` met it) is passed by ``passes``: found at ``seed``."""

    seed: int
    case: CaseResult
    passes: str
    fails: str

    def case_line(self) -> str:
        """The case to add to the spec, as Python (or, for scaled values, what to add)."""
        dims = ", ".join(f'"{k}": {v}' for k, v in self.case.dims.items())
        scaled = _SCALED.match(self.case.profile)
        if self.case.suite == "hidden" and scaled:
            return (
                f"a profile whose values reach {scaled['scale']} times those of profile "
                f'"{scaled["profile"]}", and a case using it with dims={{{dims}}}, '
                f'dtype="{self.case.dtype}"'
            )
        if self.case.suite != "hidden":
            return f"the spec's own case {self.case.suite}/{self.case.name} (already listed)"
        return (
            f'Case("tells_apart", dims={{{dims}}}, dtype="{self.case.dtype}", '
            f'profile="{self.case.profile}")'
        )

    def describe(self) -> str:
        failed = f"{self.case.failure_class or 'fails'}"
        what = self.case.diagnosis.splitlines()[0][:160] if self.case.diagnosis else ""
        return (
            f"{self.case.suite}/{self.case.name} (seed {self.seed}, "
            + " ".join(f"{k}={v}" for k, v in self.case.dims.items())
            + f", {self.case.dtype}, {self.case.profile}) tells them apart: "
            f"{Path(self.passes).name} passes, {Path(self.fails).name} fails ({failed})"
            + (f": {what}" if what else "")
        )


def tell_apart(
    spec: str | Path,
    first: str | Path,
    second: str | Path,
    seeds: int = 4,
    limits: Limits | None = None,
    progress: Callable[[str], None] | None = None,
) -> Distinction | None:
    """The first case, over seeds 1..``seeds``, that one of ``first`` and ``second`` passes and
    the other does not; None where none does. Raises UsageError for unusable input, as
    ``check`` does."""
    for seed in range(1, seeds + 1):
        if progress:
            progress(f"seed {seed}/{seeds}: checking both kernels on suite all")
        one = check(spec, first, "all", seed, limits, controls=False)
        other = check(spec, second, "all", seed, limits, controls=False)
        verdicts = {(c.suite, c.name): c for c in other.cases}
        for case in one.cases:
            twin = verdicts.get((case.suite, case.name))
            if twin is None or twin.passed == case.passed:
                continue
            if case.passed:
                return Distinction(seed, twin, str(first), str(second))
            return Distinction(seed, case, str(second), str(first))
    return None


__all__ = ["Distinction", "tell_apart"]
