"""Writing a repair's or a fleet's report: HTML and Markdown files with their images."""

from __future__ import annotations

from pathlib import Path

from kb.events import EventLog
from nearmiss.reports.pages import (
    render_fleet_html,
    render_fleet_markdown,
    render_session_html,
    render_session_markdown,
    slug,
)
from nearmiss.reports.session import FleetRow, UnknownSession, fleet_row, load_session


async def write_session_report(store: EventLog, session_id: str, out_dir: Path) -> Path:
    """Write ``<session>.html`` and ``<session>.md`` (with its PNGs) to ``out_dir``; returns the
    HTML path. Raises UnknownSession when the store has no such repair."""
    view = await load_session(store, session_id)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path = out_dir / f"{slug(session_id)}.html"
    html_path.write_text(render_session_html(view), encoding="utf-8")
    markdown = render_session_markdown(view, out_dir)
    (out_dir / f"{slug(session_id)}.md").write_text(markdown, encoding="utf-8")
    return html_path


def _missing_row(session_id: str) -> FleetRow:
    return FleetRow(session_id, "?", "?", "no record", 0, "-", 0, 0)


async def write_fleet_report(
    store: EventLog, title: str, session_ids: list[str], out_dir: Path
) -> Path:
    """Write ``index.html`` and ``index.md`` for these sessions to ``out_dir``; returns the HTML
    path. A session with no record still gets a table row, so a fleet's gaps stay visible."""
    views, rows = [], []
    for session_id in session_ids:
        try:
            view = await load_session(store, session_id)
        except UnknownSession:
            rows.append(_missing_row(session_id))
            continue
        views.append(view)
        rows.append(fleet_row(view))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html_path = out_dir / "index.html"
    html_path.write_text(render_fleet_html(title, rows, views), encoding="utf-8")
    markdown = render_fleet_markdown(title, rows, views, out_dir)
    (out_dir / "index.md").write_text(markdown, encoding="utf-8")
    return html_path
