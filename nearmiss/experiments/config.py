"""What an experiment runs: its arms, its near-misses, its configuration.

An *arm* is one way of attempting a near-miss: the debug loop (with its ablations) or
regeneration from the spec. A *near-miss* is one labelled variant of the corpus, named
``op/variant``; the paper's "operator" is such a near-miss, and so are the table's rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from nearmiss.engine.errors import UsageError
from pallas_ops.catalog import operators
from workflows.guards import Guards
from workflows.models import is_kind, unknown_model


@dataclass(frozen=True)
class Recheck:
    """How the experiment re-checks an ablation's successes: with what the ablation switched off.

    Every re-check runs the full suite with the integrity gate enforced (``audit``); ``rejects``
    reads the part of that CheckReport the ablation had switched off.
    """

    enforces: str  # what the re-check enforces, as the table says
    label: str  # what the table calls the successes the re-check takes back
    rejects: Callable[..., bool]  # CheckReport -> whether the success is taken back


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str  # "debug": RepairWorkflow sessions; "regenerate": one RegenerateWorkflow
    use_kb: bool = True
    # "held_out": no knowledge entry written from the near-miss's own code (RepairRequest's)
    knowledge: Literal["all", "held_out"] = "all"
    integrity: Literal["enforce", "report", "off"] = "enforce"  # as RepairRequest takes them
    certify_suite: Literal["all", "compact"] = "all"
    what: str = ""
    recheck: Recheck | None = None  # an ablation whose successes the experiment audits

    @property
    def knowledge_split(self) -> str:
        """Which knowledge the arm's sessions could see, as the table says it."""
        if self.kind != "debug" or not self.use_kb:
            return "none"
        return "held out (own entries hidden)" if self.knowledge == "held_out" else "all"

    def describe(self) -> dict:
        """The arm as ExperimentStarted records it (the re-check is recorded with its verdicts)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "recheck"}


ARMS = {
    arm.name: arm
    for arm in (
        Arm("debug", "debug", what="the engine-orchestrated repair loop"),
        Arm("regenerate", "regenerate", what="the model writes the kernel from the spec"),
        Arm("debug-no-kb", "debug", use_kb=False, what="no knowledge retrieved"),
        Arm(
            "debug-held-out-kb",
            "debug",
            knowledge="held_out",
            what="no knowledge entry written from the near-miss's own code",
        ),
        Arm(
            "debug-no-integrity",
            "debug",
            integrity="report",
            what="the integrity gate reports but never blocks",
            recheck=Recheck(
                "integrity gate enforced",
                'integrity-rejected "successes"',
                lambda report: not report.integrity.ok,
            ),
        ),
        Arm(
            "debug-compact-only",
            "debug",
            certify_suite="compact",
            what="certified on the compact suite alone",
            recheck=Recheck(
                "extended suite",
                "successes failing the extended suite",
                lambda report: report.extended_passed is False,
            ),
        ),
    )
}


@dataclass(frozen=True)
class NearMiss:
    id: str  # op/variant
    op: str
    category: str
    spec: Path
    candidate: Path
    bug_family: str
    failure_class: str
    fails_on: str

    def describe(self) -> dict:
        return {
            "id": self.id,
            "op": self.op,
            "category": self.category,
            "bug_family": self.bug_family,
            "failure_class": self.failure_class,
            "fails_on": self.fails_on,
        }


def corpus(targets: Iterable[str] = ()) -> dict[str, NearMiss]:
    """Every near-miss of the bundled corpus by id, in corpus order, whose label holds where the
    experiment checks: those labelled for the interpret target, and those labelled for one of
    ``targets``. A variant labelled for a TPU generation or the GPU is right in interpret mode:
    in an experiment that does not check its target it would count as a success before any
    round."""
    found = {}
    for op in operators():
        for v in op.variants:
            if v.targets and v.target not in targets:
                continue
            nm = NearMiss(
                f"{op.name}/{v.path.stem}",
                op.name,
                op.category,
                op.spec,
                v.path,
                v.bug_family,
                v.failure_class,
                v.fails_on,
            )
            found[nm.id] = nm
    return found


def default_sample(everything: dict[str, NearMiss]) -> list[NearMiss]:
    """One near-miss per op category: the first variant of the category's first operator.

    Chosen mechanically (not by how well any arm does on it) so the sample cannot flatter one.
    """
    firsts: dict[str, NearMiss] = {}
    for nm in everything.values():
        firsts.setdefault(nm.category, nm)
    return [firsts[c] for c in sorted(firsts)]


def select(names: list[str], targets: Iterable[str] = ()) -> list[NearMiss]:
    """Near-misses from operator names (all their variants) or ``op/variant`` ids, among those
    ``corpus(targets)`` holds."""
    everything = corpus(targets)
    if not names:
        return default_sample(everything)
    chosen: dict[str, NearMiss] = {}
    for name in names:
        if "/" in name:
            matches = [everything[name]] if name in everything else []
        else:
            matches = [nm for nm in everything.values() if nm.op == name]
        if not matches:
            raise UsageError(
                f"no near-miss {name!r} in the corpus: give an operator name or op/variant "
                "(`nearmiss corpus` lists them)"
            )
        chosen.update((nm.id, nm) for nm in matches)
    return list(chosen.values())


class ExperimentConfig(BaseModel):
    experiment_id: str = Field(default_factory=lambda: uuid.uuid4().hex[:10])
    # op/variant ids (or operator names, expanded at the start), in table order; none: a sample
    near_misses: list[str] = Field(default_factory=list)
    model: str
    arms: list[str] = Field(default_factory=lambda: list(ARMS))
    trials: int = Field(default=3, ge=1)
    seed: int = 0
    concurrency: int = Field(default=2, ge=1)  # sessions in flight at once
    # Off by default: a patch learned in trial 1 would answer trial 2 of the same near-miss.
    learn: bool = False
    guards: Guards = Field(default_factory=Guards)
    temperature: float = 0.7  # of the regenerate trials; fixes run at temperature 0
    targets: list[str] = Field(default_factory=list)  # every check's (nearmiss.engine.targets)

    @property
    def stream_id(self) -> str:
        return f"experiment-{self.experiment_id}"

    def resolve(self) -> list[NearMiss]:
        """Check the input (a usage error before anything starts), then expand
        ``near_misses`` to op/variant ids; returns those near-misses."""
        self.validate_usage()
        chosen = select(self.near_misses, self.targets)
        self.near_misses = [nm.id for nm in chosen]
        return chosen

    def validate_usage(self) -> None:
        """Bad input is a usage error before anything starts."""
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or not self.arms:
            raise UsageError(
                f"unknown arm(s) {', '.join(unknown) or '(none given)'}; "
                f"expected some of {', '.join(ARMS)}"
            )
        if "regenerate" in self.arms and not is_kind(self.model, chat=True):
            raise UsageError(
                f"the regenerate arm needs --model openai:MODEL: {self.model!r} edits kernels, "
                "it cannot write one (or leave regenerate out of --arms)"
            )
        # A recording (replay:SESSION) answers only the session it was recorded in.
        if not is_kind(self.model, replay=False):
            raise UsageError(unknown_model(self.model))
