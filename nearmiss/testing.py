"""Certify kernels inside a kernel team's own pytest run.

``assert_certified(spec, candidate)`` runs the same check as ``nearmiss check`` (sandboxed,
the full suite with the engine's hidden cases, the integrity gate enforced) and raises an
``AssertionError`` whose message is the check's diagnosis where the kernel is not certified;
it returns the report where it is. Installed with nearmiss, the pytest plugin
(``nearmiss.pytest_plugin``) adds a ``nearmiss`` fixture that does the same with the run's
defaults, a ``@pytest.mark.nearmiss(targets=..., suite=..., seed=...)`` marker that sets them for
one test, and ``--nearmiss-targets`` / ``--nearmiss-seed`` for the whole run.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nearmiss.engine.check import check
from nearmiss.engine.models import CheckReport


class NotCertified(AssertionError):
    """A kernel the check did not certify; ``report`` is the check's."""

    def __init__(self, message: str, report: CheckReport) -> None:
        super().__init__(message)
        self.report = report


def check_kernel(
    spec: str | Path,
    candidate: str | Path,
    *,
    targets: Iterable[str] | None = None,
    suite: str = "all",
    seed: int | None = None,
) -> CheckReport:
    """The check of ``candidate`` against ``spec``, certified or not. ``targets``: where the
    kernel must be right (default: the spec's, else interpret); ``seed``: the inputs (default:
    fresh ones, as every certifying check)."""
    return check(Path(spec), Path(candidate), suite, seed, targets=tuple(targets or ()) or None)


def assert_certified(
    spec: str | Path,
    candidate: str | Path,
    *,
    targets: Iterable[str] | None = None,
    suite: str = "all",
    seed: int | None = None,
) -> CheckReport:
    """``check_kernel``'s report where it certifies; else raises ``NotCertified`` (an
    AssertionError: the diagnosis, the failing targets, the seed that reproduces it)."""
    report = check_kernel(spec, candidate, targets=targets, suite=suite, seed=seed)
    if report.certified:
        return report
    failing = [name for name, result in report.targets.items() if not result.ok]
    lines = [
        f"{Path(candidate).name} is not certified against {Path(spec).name}: "
        f"{report.failure_class or 'not certified'}",
        report.diagnosis or "(no diagnosis)",
    ]
    if failing:
        lines.append(f"targets that refuse it: {', '.join(failing)}")
    lines.append(f"reproduce with: nearmiss check {spec} {candidate} --seed {report.seed}")
    raise NotCertified("\n".join(lines), report)


__all__ = ["NotCertified", "assert_certified", "check_kernel"]
