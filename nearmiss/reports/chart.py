"""Tokens per round as an inline SVG bar chart: cached input, uncached input and output stacked,
so the cost that matters (uncached) stands apart from what a prompt cache served."""

from __future__ import annotations

from html import escape

from nearmiss.reports.session import RoundTokens

BAR, GAP, LEFT, TOP, PLOT_H = 28, 14, 64, 28, 160
LEGEND_W = 420  # the legend's three labels fit in this many pixels
# (label, colour, value of a round): bottom to top.
SERIES = (
    ("input, cached", "#9ecae1", lambda r: r.cached_input),
    ("input, uncached", "#3182bd", lambda r: r.uncached_input),
    ("output", "#e6550d", lambda r: r.output),
)


def _legend() -> list[str]:
    items, x = [], LEFT
    for label, colour, _ in SERIES:
        items.append(f'<rect x="{x}" y="6" width="12" height="12" fill="{colour}"/>')
        items.append(f'<text x="{x + 16}" y="16">{escape(label)}</text>')
        x += 24 + 7 * len(label)
    return items


def _bars(rounds: list[RoundTokens], scale: float) -> list[str]:
    parts = []
    for i, r in enumerate(rounds):
        x, y = LEFT + GAP + i * (BAR + GAP), TOP + PLOT_H
        for label, colour, value in SERIES:
            height = value(r) * scale
            if height <= 0:
                continue
            y -= height
            tip = f"round {r.round}: {value(r)} tokens {label}"
            parts.append(
                f'<rect x="{x}" y="{y:.1f}" width="{BAR}" height="{height:.1f}" fill="{colour}">'
                f"<title>{escape(tip)}</title></rect>"
            )
        total = r.total
        parts.append(f'<text x="{x + BAR / 2}" y="{y - 4:.1f}" class="mid">{total}</text>')
        parts.append(
            f'<text x="{x + BAR / 2}" y="{TOP + PLOT_H + 16}" class="mid">{r.round}</text>'
        )
    return parts


def token_chart_svg(rounds: list[RoundTokens]) -> str:
    """The chart, or a sentence when no round spent a token (playbook and learned patches)."""
    peak = max((r.total for r in rounds), default=0)
    if peak == 0:
        return "<p>No model tokens were spent: every round was a zero-token fix.</p>"
    plot_right = LEFT + GAP + len(rounds) * (BAR + GAP)
    width = max(plot_right + 20, LEGEND_W)
    height = TOP + PLOT_H + 40
    axis_y = TOP + PLOT_H
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="tokens per round" font-family="sans-serif" font-size="11">',
        "<style>.mid{text-anchor:middle}.end{text-anchor:end}</style>",
        *_legend(),
        f'<line x1="{LEFT}" y1="{axis_y}" x2="{plot_right}" y2="{axis_y}" stroke="#333"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{axis_y}" stroke="#333"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 4}" class="end">{peak}</text>',
        f'<text x="{LEFT - 6}" y="{axis_y + 4}" class="end">0</text>',
        f'<text x="{LEFT - 6}" y="{axis_y + 30}" class="end">round</text>',
        *_bars(rounds, PLOT_H / peak),
        "</svg>",
    ]
    return "\n".join(parts)
