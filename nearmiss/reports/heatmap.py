"""A MismatchMap drawn as a PNG: white where the output matches, red where it does not, with the
kernel's tile edges as thin dark lines, plus a caption that says what the picture shows."""

from __future__ import annotations

import numpy as np

from nearmiss.engine.models import MismatchMap
from nearmiss.reports.png import encode_png

LONG_SIDE_PX = 512  # the image's long side lands between 256 and 512 px for up to 64 cells
SHORT_SIDE_MIN_PX = 24  # so a one-row map (a 1-D output) is a strip one can still see
WHITE = np.array([255, 255, 255])
# Any mismatch is at least pale pink, so one bad element in a big cell never looks clean.
PALEST = np.array([255, 225, 225])
DEEPEST = np.array([190, 0, 0])
LINE = np.array([40, 40, 40], dtype=np.uint8)


def _scales(n_rows: int, n_cols: int) -> tuple[int, int]:
    """Pixels per cell (vertical, horizontal): square cells, stretched only for a thin strip."""
    scale = max(1, LONG_SIDE_PX // max(n_rows, n_cols))
    return max(scale, -(-SHORT_SIDE_MIN_PX // n_rows)), max(scale, -(-SHORT_SIDE_MIN_PX // n_cols))


def _colours(cells: np.ndarray) -> np.ndarray:
    share = (cells[..., None] - 1).clip(0) / 254.0
    rgb = PALEST + (DEEPEST - PALEST) * share
    return np.where(cells[..., None] > 0, rgb, WHITE).round().astype(np.uint8)


def column_edges(heatmap: MismatchMap) -> list[int]:
    """Element columns where a tile starts (not 0), or [] when tiles are unknown or too small."""
    tile = heatmap.tile_cols
    if not tile or tile < heatmap.cell_cols:
        return []
    return list(range(tile, heatmap.cols, tile))


def row_edges(heatmap: MismatchMap) -> list[int]:
    """Element rows where a tile starts: k·tile_rows inside each slab, and each slab's start."""
    tile, slab = heatmap.tile_rows, heatmap.slab_rows
    if not tile or tile < heatmap.cell_rows or slab < heatmap.cell_rows:
        return []
    edges: set[int] = set()
    for start in range(0, heatmap.rows, slab):
        edges.update(range(start, min(start + slab, heatmap.rows), tile))
    edges.discard(0)
    return sorted(edges)


def render_heatmap_png(heatmap: MismatchMap) -> bytes:
    """The map as PNG bytes, each cell a block of pixels, tile edges drawn over it."""
    cells = np.asarray(heatmap.cells, dtype=np.int64)
    n_rows, n_cols = cells.shape
    sy, sx = _scales(n_rows, n_cols)
    pixels = np.repeat(np.repeat(_colours(cells), sy, axis=0), sx, axis=1)
    height, width = pixels.shape[:2]
    # An edge at element e sits e / cell_size cells in, wherever that falls inside a cell.
    for edge in column_edges(heatmap):
        x = round(edge * sx / heatmap.cell_cols)
        if 0 < x < width:
            pixels[:, x] = LINE
    for edge in row_edges(heatmap):
        y = round(edge * sy / heatmap.cell_rows)
        if 0 < y < height:
            pixels[y, :] = LINE
    return encode_png(pixels)


def image_size(heatmap: MismatchMap) -> tuple[int, int]:
    """(width, height) in pixels of ``render_heatmap_png(heatmap)``."""
    n_rows, n_cols = len(heatmap.cells), len(heatmap.cells[0])
    sy, sx = _scales(n_rows, n_cols)
    return n_cols * sx, n_rows * sy


def describe_heatmap(heatmap: MismatchMap) -> str:
    """A caption: what the rows, cells, colours and lines of the picture mean."""
    view = f"Output seen as {heatmap.rows} × {heatmap.cols}"
    if heatmap.collapsed_axes:
        view += f" ({heatmap.collapsed_axes} leading axes folded into rows)"
    parts = [
        view + f"; each cell is {heatmap.cell_rows} × {heatmap.cell_cols} elements, "
        "white when all match, redder as more of it mismatches."
    ]
    if heatmap.tile_cols is None:
        parts.append("No tile edges: the kernel's output block shape is not known.")
        return " ".join(parts)
    # localise sets both tile sizes from the kernel's block, or neither.
    assert heatmap.tile_rows is not None
    block = f"{heatmap.tile_rows} × {heatmap.tile_cols}"
    parts.append(f"Dark lines: edges of the kernel's {block} output tiles")
    if heatmap.collapsed_axes:
        parts[-1] += f", restarting every {heatmap.slab_rows} rows"
    parts[-1] += "."
    too_small = [
        name
        for name, tile, cell in (
            ("rows", min(heatmap.tile_rows, heatmap.slab_rows), heatmap.cell_rows),
            ("columns", heatmap.tile_cols, heatmap.cell_cols),
        )
        if tile < cell
    ]
    if too_small:
        parts.append(f"Not drawn along {' and '.join(too_small)}: a tile is smaller than a cell.")
    return " ".join(parts)
