"""The fixer protocol: one request in (spec, source, evidence), one result out.

A fixer never validates its own edit — the engine does, like any other edit. Errors that a retry
could cure (rate limits, 5xx, timeouts) raise ``FixerError(retryable=True)``; the activity turns
them into Temporal retries. Anything else about an answer (a malformed or non-applying edit) is a
``FixResult`` without a source and with a reason: a failed round, never a crash.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from temporalio.exceptions import ApplicationError

from workflows.models import FixerKind, FixRequest, FixResult


class FixerError(Exception):
    def __init__(self, message: str, *, retryable: bool, retry_after_s: float | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


def to_activity_error(exc: FixerError) -> ApplicationError:
    """A fixer failure as Temporal sees it: retried (after Retry-After) or fatal for the round."""
    if not exc.retryable:
        return ApplicationError(str(exc), type="FixerFatal", non_retryable=True)
    delay = timedelta(seconds=exc.retry_after_s) if exc.retry_after_s else None
    return ApplicationError(str(exc), type="FixerRetry", next_retry_delay=delay)


class Fixer(Protocol):
    kind: FixerKind  # what it is (workflows.models.FIXER_KINDS), which the workflows go by

    async def propose(self, request: FixRequest) -> FixResult: ...
