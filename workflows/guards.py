"""A repair's guards: the limits that stop its loop (rounds, tokens, time, tool calls).

Apart from the loop (``workflows.loop``, which re-exports them) so that a command line can show
their defaults without importing the loop and the event models.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

# How long a check waits for a worker of its target by default (workflows.routing).
WORKER_WAIT_S = 600.0


class Guards(BaseModel):
    max_rounds: int = Field(default=6, ge=0)
    token_budget: int | None = Field(default=500_000, ge=0)  # input + output
    uncached_token_budget: int | None = Field(default=None, ge=0)
    no_progress_rounds: int = Field(default=3, ge=1)
    deadline_s: float = Field(default=3600.0, gt=0)
    # The tool-using agent's experiments (run_case, probe, ...): per round, and per repair.
    max_tool_calls_per_round: int = Field(default=8, ge=0)
    max_tool_calls: int = Field(default=40, ge=0)
    # How long a check waits for a worker that serves the session's target (workflows.routing)
    # before the session stops with no_worker.
    worker_wait_s: float = Field(default=WORKER_WAIT_S, gt=0)
