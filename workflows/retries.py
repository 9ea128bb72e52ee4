"""How long activities wait out the infrastructure: the retry policy every activity shares.

An activity is retried when its worker dies (heartbeat or start-to-close timeout) or when it
fails on the infrastructure (``nearmiss.client.faults``: the database or Temporal unreachable, a
connection reset): with exponential backoff from 1 s, at most 30 s apart, for about ten minutes — a
PostgreSQL or Temporal restart of a few minutes costs a session nothing. What a retry cannot
cure fails at once: the engine's own bugs and unusable input are raised non-retryable (the
worker's interceptor sees to it, ``nearmiss.client.service``), and a failing candidate is never an
error at all. Errors a retry may cure that are not the infrastructure's (a model endpoint's
rate limit, say) get ``OTHER_ATTEMPTS`` attempts, counted by the same interceptor.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

INFRA_WAIT = timedelta(minutes=10)
FIRST_RETRY = timedelta(seconds=1)
BACKOFF = 2.0
LONGEST_RETRY = timedelta(seconds=30)
OTHER_ATTEMPTS = 6  # e.g. a model endpoint answering 429 or 503
# The error type of an activity that starts after its session's deadline: it refuses at once,
# never retried, and the session stops with ``deadline`` (workflows.repair).
DEADLINE_REACHED = "DeadlineReached"


def wait_after(attempt: int) -> float:
    """Seconds the backoff above waits after the ``attempt``-th try (1-based) fails."""
    return min(
        FIRST_RETRY.total_seconds() * BACKOFF ** (attempt - 1), LONGEST_RETRY.total_seconds()
    )


def attempts_within(wait: timedelta) -> int:
    """How many attempts the backoff above spreads over ``wait``."""
    attempts, waited = 1, 0.0
    while waited < wait.total_seconds():
        waited += wait_after(attempts)
        attempts += 1
    return attempts


INFRA_ATTEMPTS = attempts_within(INFRA_WAIT)  # 25: 1+2+4+8+16 s, then every 30 s


def infra_retry(*non_retryable: str) -> RetryPolicy:
    """The shared policy; ``non_retryable``: error types that must never be retried."""
    return RetryPolicy(
        initial_interval=FIRST_RETRY,
        backoff_coefficient=BACKOFF,
        maximum_interval=LONGEST_RETRY,
        maximum_attempts=INFRA_ATTEMPTS,
        non_retryable_error_types=list(non_retryable) or None,
    )
