"""Whose fault is an error: the infrastructure's (the database, Temporal, the machine), or not.

The one place that says so. An infrastructure error is worth waiting out — PostgreSQL
restarting, Temporal restarting, a connection reset, a pool that cannot connect — and activities
are retried with backoff for minutes on it (``workflows.retries``). Anything else an activity
raises unexpectedly is a bug of the engine: retrying cannot cure it, so it fails at once, with
its type. (A candidate's own failures are neither: they are data in a result, never raised.)
"""

from __future__ import annotations

import asyncio
import errno

import asyncpg

# OS errors of a connection or of a machine short of resources for a moment.
_TRANSIENT_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EADDRNOTAVAIL,
    errno.EAGAIN,
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOMEM,
    errno.ENOSPC,
}
# PostgreSQL's own "not now": connection failures (class 08), the server shutting down or
# starting (57P01-57P03), too many connections and the like (class 53).
_POSTGRES_UNAVAILABLE = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.InsufficientResourcesError,
)
INFRASTRUCTURE = "InfrastructureError"  # the ApplicationError type of a retryable infra error
# Temporal RPC status codes that mean "the server is not there (yet)".
_RPC_UNAVAILABLE = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "UNKNOWN"}


def _is_rpc_unavailable(exc: BaseException) -> bool:
    from temporalio.service import RPCError  # the Temporal SDK is there wherever this runs

    return isinstance(exc, RPCError) and exc.status.name in _RPC_UNAVAILABLE


def _one(exc: BaseException) -> bool:
    if isinstance(exc, _POSTGRES_UNAVAILABLE):
        return True
    # The connection went away under a query, or a closed pool connection was used.
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
        return "connection" in str(exc).lower() or "closed" in str(exc).lower()
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError | MemoryError):
        return True
    if isinstance(exc, OSError):
        return exc.errno in _TRANSIENT_ERRNOS or "connect call failed" in str(exc).lower()
    # The Temporal client could not reach the server (the SDK says so in a RuntimeError).
    if isinstance(exc, RuntimeError) and str(exc).startswith("Failed client connect"):
        return True
    return _is_rpc_unavailable(exc)


def is_infrastructure_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is the infrastructure failing."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _one(current):
            return True
        if current.__cause__ is not None or current.__suppress_context__:
            current = current.__cause__
        else:
            current = current.__context__
    return False


def retry_line(failure: Exception, attempt: int) -> str | None:
    """How a worker says, in one line, that an activity's retryable failure is retried (or given
    up): ``model endpoint answered 429: ...; retrying in 2 s (attempt 2/6)``; None for a
    failure it does not say (a bug's, a candidate's, Temporal's own)."""
    from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

    from workflows.retries import OTHER_ATTEMPTS, wait_after

    if not isinstance(failure, ApplicationError) or failure.type == INFRASTRUCTURE:
        return None
    if failure.category != ApplicationErrorCategory.BENIGN:
        return None
    if failure.non_retryable:
        return failure.message
    delay = failure.next_retry_delay
    seconds = delay.total_seconds() if delay else wait_after(attempt)
    return f"{failure.message}; retrying in {seconds:g} s (attempt {attempt + 1}/{OTHER_ATTEMPTS})"


def describe(exc: BaseException) -> str:
    """One line for an error: its type and message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def as_activity_error(exc: Exception, attempt: int) -> Exception:
    """What an activity that raised ``exc`` on its ``attempt``-th try should fail with.

    The infrastructure's errors become a retryable ``InfrastructureError`` (the retry policy
    waits them out); an ``ApplicationError`` the activity chose stays as it is, except that a
    retryable one stops being retried after ``OTHER_ATTEMPTS``; Temporal's own errors (a
    cancellation) pass; anything else is a bug of the engine: non-retryable, with its type.
    """
    from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, TemporalError

    from workflows.retries import OTHER_ATTEMPTS

    if isinstance(exc, ApplicationError):
        if exc.non_retryable or exc.type == INFRASTRUCTURE:
            return exc
        if attempt < OTHER_ATTEMPTS:
            # Retried: benign, so the SDK logs no traceback (the worker says it in one line).
            return ApplicationError(
                exc.message,
                *exc.details,
                type=exc.type,
                next_retry_delay=exc.next_retry_delay,
                category=ApplicationErrorCategory.BENIGN,
            )
        return ApplicationError(
            f"{exc.message} (gave up after {attempt} attempts)",
            *exc.details,
            type=exc.type,
            non_retryable=True,
            category=ApplicationErrorCategory.BENIGN,
        )
    if isinstance(exc, TemporalError):
        return exc
    if is_infrastructure_error(exc):
        # Benign: expected now and then, retried; the SDK logs it without a traceback.
        return ApplicationError(
            describe(exc), type=INFRASTRUCTURE, category=ApplicationErrorCategory.BENIGN
        )
    return ApplicationError(describe(exc), type=type(exc).__name__, non_retryable=True)


_QUERY_FAILURES_SAID: set[tuple[str, str]] = set()


async def progress_or_none(handle, query):
    """What ``query`` of the workflow ``handle`` answers, or None when it cannot answer now.

    A progress line is a display: it never makes a command fail. The server may be away for a
    moment (an ``RPCError``), or the worker may fail the query (``WorkflowQueryFailedError``,
    e.g. a history it cannot replay): that is said once per session and reason, on stderr,
    and the command goes on waiting for the session's result.
    """
    import sys

    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError

    try:
        return await handle.query(query)
    except RPCError:
        return None
    except WorkflowQueryFailedError as exc:
        said = (handle.id, str(exc))
        if said not in _QUERY_FAILURES_SAID:
            _QUERY_FAILURES_SAID.add(said)
            print(f"  (no progress from {handle.id}: {describe(exc)})", file=sys.stderr)
        return None
