"""Where on an output the mismatches sit: along each axis, per kernel tile, in a ragged tail.

Tiles come from the candidate's own output BlockSpec when its pallas_call writes an array of the
output's shape; otherwise the ragged-tail test falls back to the power-of-two block sizes that
kernels commonly use.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nearmiss.engine.models import AxisProfile, Localisation, MismatchMap, TileProfile

FALLBACK_BLOCKS = (8, 16, 32, 64, 128, 256, 512)
MAX_RANGES = 6
MAX_TILES_LISTED = 8
MAP_CELLS = 64  # per side of a mismatch map: 64 × 64 small ints stay cheap in JSON


def index_ranges(indices: np.ndarray, most: int = MAX_RANGES) -> str:
    """'3, 40-44, 63' for sorted unique indices, cut after ``most`` ranges."""
    if indices.size == 0:
        return ""
    breaks = np.nonzero(np.diff(indices) != 1)[0]
    starts = np.concatenate([[indices[0]], indices[breaks + 1]])
    ends = np.concatenate([indices[breaks], [indices[-1]]])
    parts = [str(s) if s == e else f"{s}-{e}" for s, e in zip(starts, ends, strict=True)]
    if len(parts) > most:
        parts = parts[:most] + [f"… ({len(parts) - most} more ranges)"]
    return ", ".join(parts)


def output_blocks(geometry: list[dict[str, Any]], shape: tuple[int, ...]) -> list[int] | None:
    """The block shape of the (last) pallas_call output that has exactly this array shape."""
    for call in reversed(geometry):
        for output in call["outputs"]:
            if tuple(output["array_shape"]) == tuple(shape) and len(output["block_shape"]) == len(
                shape
            ):
                return [max(1, b) for b in output["block_shape"]]
    return None


def _tile_profile(bad: np.ndarray, blocks: list[int]) -> TileProfile:
    shape = bad.shape
    grid = [-(-n // b) for n, b in zip(shape, blocks, strict=True)]
    coords = np.argwhere(bad) // np.asarray(blocks)
    tiles = np.zeros((0, len(shape)), dtype=int)
    if coords.size:  # the bad tiles in row-major order: marked on the grid, not sorted rows
        hit = np.zeros(grid, dtype=bool)
        hit[tuple(coords.T)] = True
        tiles = np.argwhere(hit)
    partial_axes = (
        [(t + 1) * b > n for t, b, n in zip(tiles.T, blocks, shape, strict=True)]
        if len(tiles)
        else []
    )
    is_partial = np.any(np.stack(partial_axes), axis=0) if partial_axes else np.zeros(0, bool)
    return TileProfile(
        block_shape=blocks,
        grid_shape=grid,
        tiles_total=int(np.prod(grid)),
        tiles_bad=len(tiles),
        bad_tiles=[[int(i) for i in t] for t in tiles[:MAX_TILES_LISTED]],
        partial_tiles_bad=int(is_partial.sum()),
        only_partial_tiles=bool(len(tiles) and is_partial.all()),
    )


def bad_indices_per_axis(bad: np.ndarray) -> list[np.ndarray]:
    """For each axis, the sorted indices whose slice holds at least one mismatch."""
    return [
        np.nonzero(bad.any(axis=tuple(a for a in range(bad.ndim) if a != axis)))[0]
        for axis in range(bad.ndim)
    ]


def _tail_axes(
    along_axes: list[np.ndarray], shape: tuple[int, ...], blocks: list[int] | None
) -> list[int]:
    """Axes along which every mismatch lies past the last whole block."""
    axes = []
    for axis, (along, size) in enumerate(zip(along_axes, shape, strict=True)):
        if along.size == 0:
            continue
        candidates = [blocks[axis]] if blocks else [b for b in FALLBACK_BLOCKS if b < size]
        for block in candidates:
            whole = (size // block) * block
            if size % block and along.min() >= whole:
                axes.append(axis)
                break
    return axes


def _spread(bad: np.ndarray) -> bool:
    """Whether mismatches hit rows and columns as often as randomly scattered ones would."""
    if bad.ndim == 0 or bad.size < 4:
        return False
    if bad.ndim == 1:
        width = int(np.ceil(np.sqrt(bad.size)))
        padded = np.zeros(width * width, dtype=bool)
        padded[: bad.size] = bad
        grid = padded.reshape(width, width)
    else:
        grid = bad.reshape(-1, bad.shape[-1])
    p = grid.mean()
    if p == 0:
        return False
    rows, cols = grid.shape
    expected_rows = 1 - (1 - p) ** cols
    expected_cols = 1 - (1 - p) ** rows
    return bool(
        grid.any(axis=1).mean() >= 0.5 * expected_rows
        and grid.any(axis=0).mean() >= 0.5 * expected_cols
    )


def cell_sums(values: np.ndarray, cell_rows: int, cell_cols: int) -> np.ndarray:
    """Sums over cell_rows × cell_cols blocks of a 2-D array, zero-padding the ragged edge."""
    rows, cols = values.shape
    n_rows, n_cols = -(-rows // cell_rows), -(-cols // cell_cols)
    padded = np.zeros((n_rows * cell_rows, n_cols * cell_cols), dtype=values.dtype)
    padded[:rows, :cols] = values
    blocks = padded.reshape(n_rows, cell_rows, n_cols, cell_cols)
    return blocks.sum(axis=(1, 3), dtype=np.int64)


def mismatch_map(bad: np.ndarray, blocks: list[int] | None) -> MismatchMap | None:
    """The mask as at most MAP_CELLS × MAP_CELLS cells of mismatched share (0..255)."""
    if bad.ndim == 0 or bad.size == 0:
        return None
    view = bad.reshape(-1, bad.shape[-1])
    rows, cols = view.shape
    cell_rows, cell_cols = -(-rows // MAP_CELLS), -(-cols // MAP_CELLS)
    mismatched = cell_sums(view, cell_rows, cell_cols)
    # Elements per cell, smaller along the ragged edge, so an edge cell's share is its own.
    row_counts = np.minimum(cell_rows, rows - np.arange(mismatched.shape[0]) * cell_rows)
    col_counts = np.minimum(cell_cols, cols - np.arange(mismatched.shape[1]) * cell_cols)
    counts = np.outer(row_counts, col_counts)
    # Integer ceiling: one bad element in a huge cell still reads 1, never rounds to 0.
    cells = (mismatched * 255 + counts - 1) // counts
    return MismatchMap(
        rows=rows,
        cols=cols,
        cell_rows=cell_rows,
        cell_cols=cell_cols,
        cells=cells.astype(int).tolist(),
        tile_rows=(blocks[-2] if bad.ndim >= 2 else 1) if blocks else None,
        tile_cols=blocks[-1] if blocks else None,
        slab_rows=bad.shape[-2] if bad.ndim >= 2 else 1,
        collapsed_axes=max(0, bad.ndim - 2),
    )


def localise(name: str, bad: np.ndarray, geometry: list[dict[str, Any]]) -> Localisation:
    along_axes = bad_indices_per_axis(bad)
    axes = [
        AxisProfile(axis=axis, size=size, bad_count=int(along.size), bad_ranges=index_ranges(along))
        for axis, (size, along) in enumerate(zip(bad.shape, along_axes, strict=True))
    ]
    blocks = output_blocks(geometry, bad.shape)
    tail_axes = _tail_axes(along_axes, bad.shape, blocks)
    concentrated = [a for a in axes if 0 < a.bad_count < a.size]
    suspected = min(concentrated, key=lambda a: a.bad_count / a.size).axis if concentrated else None
    return Localisation(
        leaf=name,
        axes=axes,
        tiles=_tile_profile(bad, blocks) if blocks else None,
        tail_only=bool(tail_axes),
        tail_axes=tail_axes,
        suspected_axis=suspected,
        spread=_spread(bad),
        heatmap=mismatch_map(bad, blocks),
    )
