"""Valid event payloads for tests that write logs by hand: the fields a test cares about, the
rest of what the type's model requires (nearmiss.events) filled with blanks, since every append
is checked against the model."""

from __future__ import annotations

import types
import typing
from typing import Any

from kb.events import NewEvent
from nearmiss.events import EVENTS, parse


def _blank(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if type(None) in args:
        return None
    origin = typing.get_origin(annotation) or annotation
    if isinstance(annotation, types.UnionType):
        origin = args[0]
    for kind, blank in ((dict, {}), (list, []), (bool, False), (int, 0), (float, 0.0)):
        if origin is kind:
            return blank
    return ""


def payload(event_type: str, **fields: Any) -> dict[str, Any]:
    """``fields`` plus blanks for the model's other required fields, checked by the model."""
    model = EVENTS[event_type]
    blanks = {
        name: _blank(field.annotation)
        for name, field in model.model_fields.items()
        if field.is_required() and name not in fields
    }
    return parse(event_type, blanks | fields).payload()


def new_event(event_type: str, **fields: Any) -> NewEvent:
    """A NewEvent of ``payload(event_type, **fields)``."""
    return NewEvent(event_type, payload(event_type, **fields))


def filled_event(event_type: str, fields: dict[str, Any] | None = None) -> NewEvent:
    """``NewEvent(event_type, fields)`` with the model's other required fields blank."""
    return new_event(event_type, **(fields or {}))
