"""One sandboxed experiment on one case: the runner every tool shares.

The tools run nothing themselves: the spec runs in its sandbox child, the candidate (or a
probe, or a lowering) in the untrusted one, exactly as in `nearmiss check`; the integrity audit
is off because an experiment never certifies. What the agent may not do becomes ``Refused``,
which each tool turns into an ``ok=False`` result with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from nearmiss.engine.check import admit
from nearmiss.engine.runner.session import (
    KERNEL,
    Entry,
    Limits,
    RawCase,
    RawRun,
    UsageError,
    run_sandboxed,
)
from nearmiss.engine.tools.models import CaseRef, Outcome
from nearmiss.engine.tools.text import clip

Result = TypeVar("Result", bound=Outcome)


class Refused(Exception):
    """The tool cannot do what was asked; the message says why and what would be accepted."""


@dataclass(frozen=True)
class CaseRequest:
    """A suite case by name, or a custom case varied from one (see runner.selection)."""

    case: str | None = None
    dims: dict[str, int] | None = None
    dtype: str | None = None
    profile: str | None = None

    def select(self) -> dict[str, Any]:
        return {"case": self.case, "dims": self.dims, "dtype": self.dtype, "profile": self.profile}


def admit_candidate(spec: str | Path, candidate: str | Path) -> str:
    """The candidate's source, if it may run on the spec: admitted as by `nearmiss check`
    (``check.admit``), under the enforcing gate — a candidate the gate would not execute is not
    executed by a tool either."""
    try:
        source, static, execute = admit(spec, candidate, "enforce", label=Path(candidate).name)
    except UsageError as exc:
        raise Refused(str(exc)) from exc
    if not execute:
        details = "; ".join(f"{v.rule}: {v.detail}" for v in static[:3])
        raise Refused(f"the candidate is not executed: it breaks the integrity rules ({details})")
    return source


def run_candidate(
    spec: str | Path,
    candidate: str | Path,
    request: CaseRequest,
    seed: int,
    limits: Limits | None,
    entry: Entry = KERNEL,
) -> tuple[str, RawRun, RawCase]:
    """(source, run, case) of ``entry`` run on the admitted candidate, on the requested case."""
    source = admit_candidate(spec, candidate)
    run, raw = run_one(spec, candidate, request, seed, limits, entry)
    return source, run, raw


def run_one(
    spec: str | Path,
    file: str | Path,
    request: CaseRequest,
    seed: int,
    limits: Limits | None,
    entry: Entry = KERNEL,
) -> tuple[RawRun, RawCase]:
    """Run ``entry`` of ``file`` on the one requested case; Refused for an unusable request.

    The spec must be a file already (``admit_candidate`` sees to it, or the caller).
    """
    try:
        run = run_sandboxed(
            Path(spec),
            Path(file),
            "all",
            seed,
            limits or Limits(),
            audit=False,
            select=request.select(),
            entry=entry,
        )
    except UsageError as exc:
        raise Refused(str(exc)) from exc
    if len(run.cases) != 1:
        raise Refused(f"expected one case, the spec gave {len(run.cases)}")
    return run, run.cases[0]


def case_ref(raw: RawCase) -> CaseRef:
    info = raw.info
    return CaseRef(
        suite=info.suite,
        name=info.name,
        dims=info.dims,
        dtype=info.dtype,
        profile=info.profile,
        inputs=raw.inputs,
        atol=info.atol,
        rtol=info.rtol,
    )


def refusal(model: type[Result], message: str, **fields: Any) -> Result:
    """A result saying the tool could not do what was asked."""
    message = clip(message, 1500)
    return model(ok=False, error=message, summary=f"error: {message}", **fields)
