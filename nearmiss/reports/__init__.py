"""Repair and fleet reports from the event log: self-contained HTML and Markdown with images.

``write_session_report`` for one session, ``write_fleet_report`` for many under one title.

The names are loaded when first used (PEP 562): ``nearmiss check`` renders its verdict with
``nearmiss.reports.text`` and should not pay for the event log's client and the charts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nearmiss.reports.files import write_fleet_report, write_session_report
    from nearmiss.reports.session import FleetRow, SessionView, UnknownSession, load_session

_HOMES = {
    "FleetRow": "nearmiss.reports.session",
    "SessionView": "nearmiss.reports.session",
    "UnknownSession": "nearmiss.reports.session",
    "load_session": "nearmiss.reports.session",
    "write_fleet_report": "nearmiss.reports.files",
    "write_session_report": "nearmiss.reports.files",
}

__all__ = [
    "FleetRow",
    "SessionView",
    "UnknownSession",
    "load_session",
    "write_fleet_report",
    "write_session_report",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
