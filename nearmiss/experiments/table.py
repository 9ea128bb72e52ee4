"""The experiment's table, computed only from recorded events (no I/O here).

Inputs are event payloads: the experiment's ExperimentStarted / ExperimentFinished, and the
RepairFinished or RegenerateFinished of every session those list. So every number can be traced
to the sessions behind it, and ``nearmiss experiment show`` recomputes the same table later.

Definitions (per arm; a near-miss is the paper's "operator"):
- Pass@1: the mean over near-misses of the share of their trials that certified.
- Pass@k: the share of near-misses certified in at least one of their k trials.
- tokens per operator: the mean over near-misses of the tokens of one trial (input + output);
  uncached: input not served from a cache, plus output (``TokenUsage.uncached``).
- tokens per success: all the arm's tokens divided by its certified trials.
A session that never finished counts as failed trials with the tokens it did not report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from nearmiss.events import (
    ExperimentFinished,
    ExperimentStarted,
    RegenerateFinished,
    RepairFinished,
)
from nearmiss.experiments.config import ARMS
from workflows.models import TokenUsage

# How a session of an experiment finished: a repair's or a regenerate session's last event.
Finish = RepairFinished | RegenerateFinished


@dataclass
class Trial:
    session_id: str
    trial: int
    certified: bool
    tokens: TokenUsage
    finished: bool = True


@dataclass
class Cell:
    """One arm on one near-miss."""

    trials: list[Trial] = field(default_factory=list)

    @property
    def successes(self) -> int:
        return sum(t.certified for t in self.trials)

    @property
    def tokens(self) -> TokenUsage:
        return sum((t.tokens for t in self.trials), TokenUsage())


@dataclass
class ArmRow:
    arm: str
    near_misses: int
    attempts: int
    successes: int
    recovered: int  # near-misses certified in some trial
    pass_at_1: float
    pass_at_k: float
    tokens_per_operator: float
    uncached_per_operator: float
    tokens_per_success: float | None
    tokens: dict
    unfinished: int


@dataclass
class Audit:
    """The experiment's re-checks of one arm's successes: how many the stricter check rejects."""

    arm: str
    check: str  # what the re-check enforces
    audited: int
    rejected: int
    rejected_sessions: list[str]
    verdicts: list[dict]


@dataclass
class Table:
    experiment_id: str
    model: str
    trials: int
    near_misses: list[str]
    rows: list[ArmRow]
    cells: dict[str, dict[str, Cell]]  # arm -> near-miss -> cell
    only_debug: list[str] | None  # None when debug or regenerate was not run
    audits: list[Audit]

    def to_json(self) -> dict:
        return {
            "experiment_id": self.experiment_id,
            "model": self.model,
            "trials": self.trials,
            "near_misses": self.near_misses,
            "arms": [asdict(row) for row in self.rows],
            "only_debug_recovered": self.only_debug,
            "audits": [asdict(a) for a in self.audits],
            "cells": {
                arm: {
                    nm: {
                        "successes": cell.successes,
                        "trials": [
                            {**asdict(t), "tokens": t.tokens.model_dump()} for t in cell.trials
                        ],
                    }
                    for nm, cell in cells.items()
                }
                for arm, cells in self.cells.items()
            },
        }


def trials_of(
    kind: str, sessions: list[str], finishes: dict[str, Finish | None], k: int
) -> list[Trial]:
    """The trials behind one cell, from its sessions' finishing events (None: never finished)."""
    trials = []
    if kind == "regenerate":
        for sid in sessions:
            finish = finishes.get(sid)
            if not isinstance(finish, RegenerateFinished):
                trials += [Trial(sid, t, False, TokenUsage(), False) for t in range(1, k + 1)]
                continue
            for t in finish.trials:
                tokens = TokenUsage(**t["tokens"])
                trials.append(Trial(sid, t["trial"], t["certified"], tokens))
        return trials
    for number, sid in enumerate(sessions, 1):
        finish = finishes.get(sid)
        if not isinstance(finish, RepairFinished):
            trials.append(Trial(sid, number, False, TokenUsage(), False))
        else:
            tokens = TokenUsage(**finish.tokens)
            trials.append(Trial(sid, number, finish.certified, tokens))
    return trials


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def arm_row(arm: str, cells: dict[str, Cell]) -> ArmRow:
    used = [c for c in cells.values() if c.trials]
    attempts = sum(len(c.trials) for c in used)
    successes = sum(c.successes for c in used)
    tokens = sum((c.tokens for c in used), TokenUsage())
    return ArmRow(
        arm=arm,
        near_misses=len(used),
        attempts=attempts,
        successes=successes,
        recovered=sum(c.successes > 0 for c in used),
        pass_at_1=_mean([c.successes / len(c.trials) for c in used]),
        pass_at_k=_mean([float(c.successes > 0) for c in used]),
        tokens_per_operator=_mean([c.tokens.total / len(c.trials) for c in used]),
        uncached_per_operator=_mean([c.tokens.uncached / len(c.trials) for c in used]),
        tokens_per_success=tokens.total / successes if successes else None,
        tokens=tokens.model_dump(),
        unfinished=sum(not t.finished for c in used for t in c.trials),
    )


def compute_table(
    started: ExperimentStarted, finished: ExperimentFinished, finishes: dict[str, Finish | None]
) -> Table:
    """The table of one experiment from its two events and its sessions' finishing events."""
    config = started.config
    arms, near_misses, k = config["arms"], config["near_misses"], config["trials"]
    recorded = finished.arms
    cells: dict[str, dict[str, Cell]] = {}
    for arm in arms:
        kind = ARMS[arm].kind
        cells[arm] = {
            nm: Cell(trials_of(kind, recorded[arm][nm]["sessions"], finishes, k))
            for nm in near_misses
        }
    only_debug = None
    if "debug" in cells and "regenerate" in cells:
        only_debug = [
            nm
            for nm in near_misses
            if cells["debug"][nm].successes > 0 and cells["regenerate"][nm].successes == 0
        ]
    audits = []
    for arm in ARMS.values():
        if arm.recheck is None or arm.name not in recorded:
            continue
        verdicts = [v for nm in near_misses for v in recorded[arm.name][nm].get("audits", [])]
        rejected = [v["session_id"] for v in verdicts if v["rejected"]]
        audits.append(
            Audit(arm.name, arm.recheck.enforces, len(verdicts), len(rejected), rejected, verdicts)
        )
    return Table(
        experiment_id=finished.experiment_id,
        model=config["model"],
        trials=k,
        near_misses=near_misses,
        rows=[arm_row(arm, cells[arm]) for arm in arms],
        cells=cells,
        only_debug=only_debug,
        audits=audits,
    )
