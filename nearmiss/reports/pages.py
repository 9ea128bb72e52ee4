"""Session and fleet reports as self-contained HTML (inline CSS, images as data URIs, SVG chart,
no JavaScript) and as Markdown with the images written next to it.

Every text from a session (summaries, reasons, diffs, names) is escaped: a model's answer is
untrusted input and must never become markup in a reader's browser.
"""

from __future__ import annotations

import base64
import re
from html import escape
from pathlib import Path

from nearmiss.reports.chart import token_chart_svg
from nearmiss.reports.heatmap import describe_heatmap, image_size
from nearmiss.reports.session import FleetRow, SessionView, fleet_summary
from nearmiss.reports.terminal import printable
from nearmiss.reports.timeline import describe_tokens

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.num{text-align:right}
.certified{color:#1a7f37;font-weight:bold}.not-certified,.unfinished{color:#b42318;font-weight:bold}
figure{display:inline-block;margin:0 1.5em 1.5em 0;max-width:520px}figure img{border:1px solid #999;
image-rendering:pixelated}figcaption{font-size:12px;color:#444}
pre.diff{background:#f7f7f7;padding:.6em;overflow-x:auto;border:1px solid #ddd}
.add{background:#e6ffec;color:#1a7f37}.del{background:#ffebe9;color:#b42318}.hunk{color:#6e40c9}
section.session{border-top:2px solid #ddd;margin-top:2em}code{font-size:12px}
"""
# The fleet table's columns; "uncached" is what a prompt cache did not serve (the real cost).
FLEET_COLUMNS = (
    "kernel",
    "candidate",
    "verdict",
    "rounds",
    "stop",
    "tokens",
    "uncached",
    "session",
)


def slug(session_id: str) -> str:
    """A file and anchor name safe for any session id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", session_id).lstrip(".") or "session"


def _facts(view: SessionView) -> list[tuple[str, str]]:
    return [
        ("verdict", view.verdict),
        ("kernel", view.kernel),
        ("candidate", view.candidate_name),
        ("model", view.model),
        ("original failure", view.failure_class or "-"),
        ("rounds", str(view.rounds)),
        ("stop", f"{view.stop_reason or '-'}: {view.stop_detail}" if view.finished else "-"),
        ("tokens", describe_tokens(view.tokens)),
        ("session", view.session_id),
        ("original → final", f"{view.original_hash} → {view.final_hash or '-'}"),
    ]


# --- HTML ---------------------------------------------------------------------------------


def _verdict_html(verdict: str) -> str:
    return f'<span class="{verdict.replace(" ", "-")}">{escape(verdict)}</span>'


def _diff_html(diff: str) -> str:
    if not diff:
        return "<p>No change: the final candidate is the original.</p>"
    lines = []
    for line in diff.splitlines():
        kind = ""
        if line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+") and not line.startswith("+++"):
            kind = "add"
        elif line.startswith("-") and not line.startswith("---"):
            kind = "del"
        text = escape(line)
        lines.append(f'<span class="{kind}">{text}</span>' if kind else text)
    return '<pre class="diff">' + "\n".join(lines) + "</pre>"


def _figures_html(view: SessionView) -> str:
    if not view.heatmaps:
        return "<p>No failing case with a mismatch map (no numeric mismatch was checked).</p>"
    figures = []
    for figure in view.heatmaps:
        data = base64.b64encode(figure.png).decode("ascii")
        width, height = image_size(figure.heatmap)
        figures.append(
            f'<figure><img src="data:image/png;base64,{data}" width="{width}" height="{height}" '
            f'alt="{escape("mismatch map, " + figure.label)}"><figcaption><b>'
            f"{escape(figure.label)}</b><br>{escape(figure.diagnosis)}<br>"
            f"{escape(describe_heatmap(figure.heatmap))}</figcaption></figure>"
        )
    return "\n".join(figures)


def _timeline_html(view: SessionView) -> str:
    rows = "\n".join(
        f'<tr><td class="num">{row.offset_s:.1f}</td><td class="num">{row.round}</td>'
        f"<td>{escape(row.kind)}</td><td>{escape(row.text)}</td></tr>"
        for row in view.timeline
    )
    head = "<tr><th>t (s)</th><th>round</th><th>event</th><th>what happened</th></tr>"
    return f"<table>{head}\n{rows}</table>"


def session_body_html(view: SessionView, level: int = 1) -> str:
    """A session's report without the page around it; headings start at ``h{level}``."""
    h, sub = f"h{level}", f"h{level + 1}"
    facts = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in _facts(view))
    return "\n".join(
        [
            f"<{h}>Repair of {escape(view.kernel)} ({escape(view.candidate_name)}): "
            f"{_verdict_html(view.verdict)}</{h}>",
            f"<table>{facts}</table>",
            f"<{sub}>Timeline</{sub}>",
            _timeline_html(view),
            f"<{sub}>Mismatch maps</{sub}>",
            _figures_html(view),
            f"<{sub}>Tokens per round</{sub}>",
            token_chart_svg(view.round_tokens),
            f"<{sub}>Change, original → final</{sub}>",
            _diff_html(view.diff),
        ]
    )


def _page(title: str, body: str) -> str:
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def render_session_html(view: SessionView) -> str:
    return _page(f"nearmiss: repair of {view.kernel} ({view.verdict})", session_body_html(view))


def render_fleet_html(fleet_title: str, rows: list[FleetRow], views: list[SessionView]) -> str:
    """A summary line (``fleet_summary``), a table (one row per session, linked to its
    section) and every session whole."""
    reported = {view.session_id for view in views}
    head = "".join(f"<th>{h}</th>" for h in FLEET_COLUMNS)
    body = [
        f"<h1>{escape(fleet_title)}</h1>",
        f'<p class="summary">{escape(fleet_summary(rows))}</p>',
        f"<table><tr>{head}</tr>",
    ]
    for r in rows:
        sid = escape(r.session_id)
        link = f'<a href="#s-{slug(r.session_id)}">{sid}</a>' if r.session_id in reported else sid
        body.append(
            f"<tr><td>{escape(r.kernel)}</td><td>{escape(r.candidate)}</td>"
            f"<td>{_verdict_html(r.verdict)}</td><td class='num'>{r.rounds}</td>"
            f"<td>{escape(r.stop)}</td><td class='num'>{r.tokens}</td>"
            f"<td class='num'>{r.uncached_tokens}</td><td><code>{link}</code></td></tr>"
        )
    body.append("</table>")
    for view in views:
        body.append(f'<section class="session" id="s-{slug(view.session_id)}">')
        body.append(session_body_html(view, level=2))
        body.append("</section>")
    return _page(fleet_title, "\n".join(body))


# --- Markdown -----------------------------------------------------------------------------


def md_text(text: str) -> str:
    """Text safe in a Markdown table cell: no raw HTML, no column breaks, one line. A lone
    carriage return ends a line in Markdown as a newline does: a model's fix summary carrying
    them closed the timeline's table and wrote a "Verdict: CERTIFIED" heading, links and a
    tracking image after it (attack review, 2026-12-05). Brackets are escaped too: in a cell,
    ``![x](url)`` is still an image the reader's viewer fetches."""
    one_line = printable(re.sub(r"[\r\n]", " ", text))
    escaped = escape(one_line, quote=False).replace("|", "\\|")
    return escaped.replace("[", "\\[").replace("]", "\\]")


def _fence(text: str) -> str:
    """A code fence longer than any run of backticks inside, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def session_body_markdown(view: SessionView, image_dir: Path, level: int = 1) -> str:
    """A session's report in Markdown; its PNGs are written to ``image_dir`` (where the .md
    goes) and linked by file name."""
    h, sub = "#" * level, "#" * (level + 1)
    lines = [
        f"{h} Repair of {md_text(view.kernel)} ({md_text(view.candidate_name)}): "
        f"{md_text(view.verdict)}",
        "",
        "| | |",
        "|---|---|",
        *(f"| {md_text(k)} | {md_text(v)} |" for k, v in _facts(view)),
        "",
        f"{sub} Timeline",
        "",
        "| t (s) | round | event | what happened |",
        "|---:|---:|---|---|",
        *(
            f"| {r.offset_s:.1f} | {r.round} | {md_text(r.kind)} | {md_text(r.text)} |"
            for r in view.timeline
        ),
        "",
        f"{sub} Mismatch maps",
        "",
    ]
    if not view.heatmaps:
        lines += ["No failing case with a mismatch map.", ""]
    for number, figure in enumerate(view.heatmaps, start=1):
        name = f"{slug(view.session_id)}-map-{number}.png"
        (image_dir / name).write_bytes(figure.png)
        alt = md_text(figure.label).replace("[", "(").replace("]", ")")
        lines += [f"![{alt}]({name})", ""]
        lines += [f"**{md_text(figure.label)}**: {md_text(figure.diagnosis)}", ""]
        lines += [md_text(describe_heatmap(figure.heatmap)), ""]
    lines += [f"{sub} Tokens per round", ""]
    if view.round_tokens:
        lines += ["| round | input cached | input uncached | output |", "|---:|---:|---:|---:|"]
        lines += [
            f"| {r.round} | {r.cached_input} | {r.uncached_input} | {r.output} |"
            for r in view.round_tokens
        ]
    else:
        lines.append("No fix was proposed.")
    lines += ["", f"{sub} Change, original → final", ""]
    if view.diff:
        fence = _fence(view.diff)
        lines += [f"{fence}diff", view.diff.rstrip("\n"), fence]
    else:
        lines.append("No change: the final candidate is the original.")
    return "\n".join(lines) + "\n"


def render_session_markdown(view: SessionView, image_dir: Path) -> str:
    return session_body_markdown(view, image_dir)


def render_fleet_markdown(
    fleet_title: str, rows: list[FleetRow], views: list[SessionView], image_dir: Path
) -> str:
    reported = {view.session_id for view in views}
    lines = [
        f"# {md_text(fleet_title)}",
        "",
        md_text(fleet_summary(rows)),
        "",
        "| kernel | candidate | verdict | rounds | stop | tokens | uncached | session |",
        "|---|---|---|---:|---|---:|---:|---|",
    ]
    for r in rows:
        sid = md_text(r.session_id)
        link = f"[{sid}](#s-{slug(r.session_id)})" if r.session_id in reported else sid
        lines.append(
            f"| {md_text(r.kernel)} | {md_text(r.candidate)} | {md_text(r.verdict)} | "
            f"{r.rounds} | {md_text(r.stop)} | {r.tokens} | {r.uncached_tokens} | {link} |"
        )
    for view in views:
        # An explicit anchor: renderers derive heading ids differently, the table must not care.
        lines += ["", f'<a id="s-{slug(view.session_id)}"></a>', ""]
        lines.append(session_body_markdown(view, image_dir, level=2))
    return "\n".join(lines) + "\n"
