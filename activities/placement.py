"""Where check-like activities run: the targets this worker serves, what it says about itself
in every check it runs, and its refusal of a check for a target it does not serve.

The queues are ``workflows.routing``'s; the targets a machine can serve,
``nearmiss.engine.targets``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from temporalio import activity
from temporalio.exceptions import ApplicationError

from workflows.routing import NOT_SERVED


@dataclass(frozen=True)
class Placement:
    identity: str  # the worker's Temporal identity (pid@host)
    targets: tuple[str, ...]  # the targets it serves (its check queues)
    device: str  # what runs the checks, in words ("cpu; libtpu 0.0.42 compile-only")

    def admit(self, targets: Sequence[str]) -> None:
        """Refuse (non-retryable ``TargetNotServed``) a check with a target not served here: the
        check came by the queue of its most demanding target, and needs all of them."""
        missing = [t for t in targets if t not in self.targets]
        if missing:
            raise ApplicationError(
                f"worker {self.identity} serves {', '.join(self.targets)}, not "
                f"{', '.join(missing)}: start a worker with `nearmiss worker --targets "
                f"{','.join(targets)}`",
                type=NOT_SERVED,
                non_retryable=True,
            )

    def record(self) -> dict[str, str]:
        """This worker and the queue the running activity came from, for the check's event."""
        return {
            "identity": self.identity,
            "queue": activity.info().task_queue,
            "targets": ",".join(self.targets),
            "device": self.device,
        }
