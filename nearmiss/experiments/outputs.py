"""The experiment's table as Markdown, CSV, JSON and two SVG bar charts (hand-written SVG)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from xml.sax.saxutils import escape

from nearmiss.experiments.config import ARMS
from nearmiss.experiments.table import Table


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _count(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _knowledge(arm: str) -> str:
    """The knowledge split an arm's sessions saw; an arm this code no longer has: unknown."""
    return ARMS[arm].knowledge_split if arm in ARMS else "?"


def markdown(table: Table) -> str:
    lines = [
        f"# Experiment {table.experiment_id}: debug vs regenerate",
        "",
        f"model `{table.model}` · {len(table.near_misses)} near-miss operators · "
        f"{table.trials} trial(s) per arm and operator",
        "",
        "| arm | knowledge | Pass@1 | Pass@k | tokens / operator | tokens / success | "
        "uncached tokens / operator |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table.rows:
        lines.append(
            f"| {row.arm} | {_knowledge(row.arm)} "
            f"| {_pct(row.pass_at_1)} ({row.successes}/{row.attempts}) "
            f"| {_pct(row.pass_at_k)} ({row.recovered}/{row.near_misses}) "
            f"| {_count(row.tokens_per_operator)} | {_count(row.tokens_per_success)} "
            f"| {_count(row.uncached_per_operator)} |"
        )
    lines.append("")
    if table.only_debug is not None:
        names = ", ".join(table.only_debug) or "none"
        lines.append(
            f"- Operators only debug recovered (debug certified in some trial, regenerate in "
            f"none): {len(table.only_debug)} ({names})"
        )
    for audit in table.audits:
        recheck = ARMS[audit.arm].recheck
        assert recheck is not None  # compute_table audits only the arms with a re-check
        what = recheck.label
        lines.append(
            f"- {audit.arm}: {what} (re-checked: {audit.check}): "
            f"{audit.rejected} of {audit.audited}"
        )
    unfinished = sum(row.unfinished for row in table.rows)
    if unfinished:
        lines.append(f"- Trials whose session never finished (counted as failed): {unfinished}")
    lines += [
        "",
        "Pass@1: certified trials / trials (mean over operators); Pass@k: operators certified "
        "in some trial. Tokens (input + output) per operator are those of one trial; uncached: "
        "input not served from a cache, plus output. Sessions, per-trial results and audit "
        "reports (by hash) are in results.json; `nearmiss experiment show "
        f"{table.experiment_id}` recomputes this table from the event log.",
    ]
    lines += ["", "## Per operator: certified trials / trials", ""]
    arms = [row.arm for row in table.rows]
    lines.append("| near-miss | " + " | ".join(arms) + " |")
    lines.append("|---" * (len(arms) + 1) + "|")
    for nm in table.near_misses:
        counts = [f"{table.cells[a][nm].successes}/{len(table.cells[a][nm].trials)}" for a in arms]
        lines.append(f"| {nm} | " + " | ".join(counts) + " |")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = [
    "arm",
    "near_misses",
    "attempts",
    "successes",
    "pass_at_1",
    "pass_at_k",
    "tokens_per_operator",
    "tokens_per_success",
    "uncached_tokens_per_operator",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "unfinished",
]


def csv_text(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in table.rows:
        writer.writerow(
            [
                r.arm,
                r.near_misses,
                r.attempts,
                r.successes,
                f"{r.pass_at_1:.4f}",
                f"{r.pass_at_k:.4f}",
                f"{r.tokens_per_operator:.1f}",
                "" if r.tokens_per_success is None else f"{r.tokens_per_success:.1f}",
                f"{r.uncached_per_operator:.1f}",
                r.tokens["input"],
                r.tokens["cached_input"],
                r.tokens["output"],
                r.unfinished,
            ]
        )
    return out.getvalue()


def bar_chart(
    title: str,
    categories: list[str],
    series: list[tuple[str, list[float | None], str]],
    fmt,
    y_max: float | None = None,
) -> str:
    """Grouped vertical bars: one group per category, one bar per series (None: no bar).

    The y axis runs from 0 to ``y_max``, by default the highest value.
    """
    width, height, left, top, bottom = 120 + 110 * len(categories), 380, 70, 60, 100
    plot_h = height - top - bottom
    drawn = [v for _, vs, _ in series for v in vs if v is not None]
    peak = y_max or max(drawn + [0]) or 1.0
    group = (width - left - 20) / max(len(categories), 1)
    bar = group * 0.7 / max(len(series), 1)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="11">',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 20}" y2="{top + plot_h}" '
        'stroke="#333"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>',
    ]
    for tick in range(5):  # gridlines at quarters of the highest value
        level = peak * tick / 4
        y = top + plot_h - plot_h * tick / 4
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#ddd"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(fmt(level))}</text>'
        )
    for i, category in enumerate(categories):
        x0 = left + group * i + group * 0.15
        for j, (_, values, color) in enumerate(series):
            value = values[i]
            x = x0 + bar * j
            if value is None:
                out.append(
                    f'<text x="{x + bar / 2:.1f}" y="{top + plot_h - 4}" '
                    f'text-anchor="middle">n/a</text>'
                )
                continue
            h = plot_h * value / peak
            y = top + plot_h - h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{color}"/><text x="{x + bar / 2:.1f}" y="{y - 3:.1f}" '
                f'text-anchor="middle">{escape(fmt(value))}</text>'
            )
        # Slanted, so long arm names never run into each other.
        x, y = left + group * (i + 0.5), top + plot_h + 14
        out.append(
            f'<text x="{x:.1f}" y="{y}" text-anchor="end" '
            f'transform="rotate(-25 {x:.1f} {y})">{escape(category)}</text>'
        )
    for j, (name, _, color) in enumerate(series):  # legend, under the title
        y = 42
        x = left + 130 * j
        out.append(
            f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14}" y="{y}">{escape(name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def pass_rates_svg(table: Table) -> str:
    arms = [r.arm for r in table.rows]
    return bar_chart(
        f"Pass@1 and Pass@{table.trials} per arm",
        arms,
        [
            ("Pass@1", [100 * r.pass_at_1 for r in table.rows], "#4878a8"),
            (f"Pass@{table.trials}", [100 * r.pass_at_k for r in table.rows], "#e39d4a"),
        ],
        lambda v: f"{v:.0f} %",
        y_max=100,
    )


def tokens_svg(table: Table) -> str:
    return bar_chart(
        "Tokens per success per arm",
        [r.arm for r in table.rows],
        [("tokens / success", [r.tokens_per_success for r in table.rows], "#6a9f58")],
        lambda v: f"{v:,.0f}",
    )


def write_outputs(table: Table, out: Path) -> list[Path]:
    """table.md, table.csv, results.json and the two plots into ``out``; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "table.md": markdown(table),
        "table.csv": csv_text(table),
        "results.json": json.dumps(table.to_json(), indent=2) + "\n",
        "pass_rates.svg": pass_rates_svg(table),
        "tokens_per_success.svg": tokens_svg(table),
    }
    for name, text in files.items():
        (out / name).write_text(text)
    return [out / name for name in files]
