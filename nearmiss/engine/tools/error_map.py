"""``error_map``: where on the output the errors of one case sit — per kernel tile, per axis.

Tiles are the candidate's own output blocks (its BlockSpec, as traced in the sandbox), so "tile
row 5 is bad" names a grid step the agent can reason about; without a known block the output is
split into an even grid of cells instead. The picture is at most 32 × 32 characters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np

from nearmiss.engine.check import case_evidence
from nearmiss.engine.forensics.localise import (
    MAX_TILES_LISTED,
    bad_indices_per_axis,
    cell_sums,
    index_ranges,
)
from nearmiss.engine.runner.session import Limits
from nearmiss.engine.tools.experiment import CaseRequest, Refused, case_ref, refusal, run_candidate
from nearmiss.engine.tools.models import ErrorMapResult, TileCount, TileMap
from nearmiss.engine.tools.run_case import case_grid_line, verdict_lines
from nearmiss.engine.tools.text import capped, case_line, clip, finish

MAP_SIDE = 32  # characters per side of the picture, at most


def _rows(counts: np.ndarray) -> np.ndarray:
    """The array as 2-D: leading axes folded into rows (a 1-D array is one row)."""
    return counts.reshape(1, -1) if counts.ndim == 1 else counts.reshape(-1, counts.shape[-1])


def tile_counts(bad: np.ndarray, blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(mismatched, total) elements per tile, each an array of the tile grid's shape."""
    grid = [-(-n // b) for n, b in zip(bad.shape, blocks, strict=True)]
    padding = [(0, g * b - n) for g, b, n in zip(grid, blocks, bad.shape, strict=True)]
    split = [size for g, b in zip(grid, blocks, strict=True) for size in (g, b)]
    within = tuple(range(1, 2 * bad.ndim, 2))

    def per_tile(mask: np.ndarray) -> np.ndarray:
        return np.pad(mask, padding).reshape(split).sum(axis=within, dtype=np.int64)

    return per_tile(bad), per_tile(np.ones(bad.shape, dtype=bool))


def picture(bad: np.ndarray, total: np.ndarray) -> tuple[list[str], list[int]]:
    """One character per group of tiles ('#' ≥ half bad, '+' some, '.' none), each row led by
    its first tile row; and how many tiles (rows, columns) one character covers."""
    bad, total = _rows(bad), _rows(total)
    per_row, per_col = -(-bad.shape[0] // MAP_SIDE), -(-bad.shape[1] // MAP_SIDE)
    bad, total = cell_sums(bad, per_row, per_col), cell_sums(total, per_row, per_col)
    chars = np.where(bad * 2 >= np.maximum(total, 1), "#", np.where(bad > 0, "+", "."))
    width = len(str((chars.shape[0] - 1) * per_row))
    lines = [f"{index * per_row:>{width}} {''.join(row)}" for index, row in enumerate(chars)]
    return lines, [per_row, per_col]


def tile_map(bad: np.ndarray, blocks: list[int] | None) -> TileMap | None:
    if bad.ndim == 0:
        return None
    unit: Literal["tile", "cell"] = "tile"
    if blocks is None:  # no BlockSpec of this shape: an even grid of cells over the 2-D view
        unit, bad = "cell", _rows(bad)
        blocks = [-(-bad.shape[0] // MAP_SIDE), -(-bad.shape[1] // MAP_SIDE)]
    counts, totals = tile_counts(bad, blocks)
    coords = np.argwhere(counts > 0)
    lines, cell = picture(counts, totals)
    return TileMap(
        unit=unit,
        block_shape=list(blocks),
        grid_shape=list(counts.shape),
        total=int(counts.size),
        bad=len(coords),
        bad_ranges=[index_ranges(along) for along in bad_indices_per_axis(counts > 0)],
        listed=[
            TileCount(
                tile=[int(i) for i in c], bad=int(counts[tuple(c)]), total=int(totals[tuple(c)])
            )
            for c in coords[:MAX_TILES_LISTED]
        ],
        more=max(0, len(coords) - MAX_TILES_LISTED),
        cell_tiles=cell,
        picture=lines,
    )


def _map_lines(result: ErrorMapResult, grid: str | None = None) -> list[str]:
    lines = [
        f"{result.leaf} {result.dtype}{result.shape}: {result.mismatched}/{result.total} "
        f"mismatched [{result.failure_class}]"
    ]
    lines += [
        clip(f"axis {a.axis}: {a.bad_count}/{a.size} indices bad: {a.bad_ranges or 'none'}")
        for a in result.axes
    ]
    if result.tail_axes:
        lines.append(f"all mismatches lie in the ragged tail along axis {result.tail_axes}")
    tiles = result.tiles
    if tiles is None:
        return lines + ([grid] if grid else [])
    # (The grid itself is the grid line's, shown as run_case shows it.)
    what = "tiles" if tiles.unit == "tile" else f"cells of {tiles.block_shape}"
    lines.append(
        f"{what}: {tiles.bad}/{tiles.total} bad; bad along each axis: "
        + "; ".join(f"axis {i}: {r or 'none'}" for i, r in enumerate(tiles.bad_ranges))
    )
    if grid:
        lines.append(grid)
    listed = [f"  {tiles.unit} {t.tile}: {t.bad}/{t.total} bad" for t in tiles.listed]
    lines += listed + ([f"  … {tiles.more} more bad {tiles.unit}s"] if tiles.more else [])
    group = (
        "" if tiles.cell_tiles == [1, 1] else f" per {tiles.cell_tiles[0]}×{tiles.cell_tiles[1]}"
    )
    rows = "rows: the leading axes' " if len(tiles.grid_shape) > 2 else "rows: axis-0 "
    lines.append(
        f"map, one character{group} {tiles.unit}s ('#' half or more bad, '+' some, '.' none); "
        f"{rows}{tiles.unit}s (first index shown), columns: the last axis' {tiles.unit}s"
    )
    return lines + tiles.picture


def error_map(
    spec_path: str | Path,
    candidate_path: str | Path,
    *,
    case: str | None = None,
    dims: dict[str, int] | None = None,
    dtype: str | None = None,
    profile: str | None = None,
    seed: int = 0,
    limits: Limits | None = None,
) -> ErrorMapResult:
    """Map the mismatches of one case (chosen as in run_case) over the output's tiles and axes."""
    try:
        request = CaseRequest(case, dims, dtype, profile)
        _, _, raw = run_candidate(spec_path, candidate_path, request, seed, limits)
    except Refused as exc:
        return refusal(ErrorMapResult, str(exc), seed=seed)
    verdict, worst = case_evidence(raw, Path(candidate_path).name)
    result = ErrorMapResult(
        case=case_ref(raw),
        seed=seed,
        passed=verdict.passed,
        failure_class=verdict.failure_class,
        run_error=verdict.error,
        structure=verdict.structure,
    )
    assert result.case is not None  # set just above
    head = case_line(result.case)
    if verdict.passed or verdict.localisation is None or worst is None:
        why = "nothing to map: " + (
            "the case passes" if verdict.passed else "the case gave no comparable outputs"
        )
        result.summary = finish([head, why, *capped(verdict_lines(verdict), 12)])
        return result
    loc = verdict.localisation
    result.leaf, result.dtype, result.shape = (
        worst.stats.path,
        worst.stats.dtype,
        worst.stats.shape,
    )
    result.mismatched, result.total = worst.stats.mismatched, worst.stats.total
    result.axes, result.tail_axes, result.heatmap = loc.axes, loc.tail_axes, loc.heatmap
    # The localisation's tiles are the output's BlockSpec blocks, when it has one.
    result.tiles = tile_map(worst.bad, loc.tiles.block_shape if loc.tiles else None)
    others = [
        f"{leaf.path} ({leaf.mismatched})"
        for leaf in verdict.leaves
        if leaf.path != worst.stats.path
    ]
    others = [text for text in others if not text.endswith("(0)")]
    if others:
        head += "\nother outputs mismatched: " + ", ".join(capped(others, 6))
    result.summary = finish([head, *_map_lines(result, case_grid_line(verdict))])
    return result
