"""Mismatch maps (forensics) and their pictures (reports): the downsampled mask, the PNG
encoder read back byte by byte, tile lines, and the caption."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from nearmiss.engine.forensics.localise import localise, mismatch_map
from nearmiss.engine.models import MismatchMap
from nearmiss.reports.heatmap import (
    LINE,
    WHITE,
    column_edges,
    describe_heatmap,
    image_size,
    render_heatmap_png,
    row_edges,
)
from nearmiss.reports.png import encode_png


def decode_png(data: bytes) -> np.ndarray:
    """Read back an 8-bit RGB, unfiltered PNG, checking signature, chunk CRCs and IEND."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, []
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks.append((kind, body))
        offset += 12 + length
    assert [k for k, _ in chunks][0] == b"IHDR" and chunks[-1] == (b"IEND", b"")
    width, height, depth, colour, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour) == (8, 2)
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert not rows[:, 0].any()  # filter type 0 on every scanline
    return rows[:, 1:].reshape(height, width, 3)


# --- the map --------------------------------------------------------------------------------


def test_one_bad_tile_lights_exactly_its_cells():
    bad = np.zeros((128, 128), dtype=bool)
    bad[64:, :64] = True  # tile (1, 0) of 64 × 64 tiles
    heatmap = mismatch_map(bad, [64, 64])
    cells = np.array(heatmap.cells)
    assert (heatmap.rows, heatmap.cols, heatmap.cell_rows, heatmap.cell_cols) == (128, 128, 2, 2)
    assert cells.shape == (64, 64)
    assert (cells[32:, :32] == 255).all() and cells.sum() == 255 * 32 * 32
    assert (heatmap.tile_rows, heatmap.tile_cols, heatmap.collapsed_axes) == (64, 64, 0)


def test_all_good_is_all_zero_and_one_bad_element_is_never_rounded_away():
    bad = np.zeros((4096, 300), dtype=bool)
    assert not np.array(mismatch_map(bad, None).cells).any()
    bad[1234, 17] = True  # 1 of 64 × 5 elements in its cell
    cells = np.array(mismatch_map(bad, None).cells)
    assert cells[1234 // 64, 17 // 5] == 1 and cells.sum() == 1


def test_a_big_mask_is_capped_at_64_by_64_cells_and_edge_cells_count_their_own_elements():
    bad = np.zeros((1000, 130), dtype=bool)
    bad[:, 128:] = True  # the last 2 columns: a ragged edge cell of 2 columns, all bad
    heatmap = mismatch_map(bad, [8, 128])
    cells = np.array(heatmap.cells)
    assert (heatmap.cell_rows, heatmap.cell_cols) == (16, 3) and cells.shape == (63, 44)
    assert (cells[:, -1] == 255).all()  # 2 of 2 columns bad, not 2 of 3
    assert (cells[:, -2] == 85).all()  # columns 126-128: one of three bad
    assert not cells[:, :-2].any()


def test_leading_axes_collapse_into_rows_and_small_ranks_are_handled():
    bad = np.zeros((3, 10, 7), dtype=bool)
    bad[1, 2, 3] = True
    heatmap = mismatch_map(bad, [1, 5, 7])
    assert (heatmap.rows, heatmap.cols, heatmap.collapsed_axes, heatmap.slab_rows) == (30, 7, 1, 10)
    assert np.argwhere(np.array(heatmap.cells)).tolist() == [[12, 3]]
    assert (heatmap.tile_rows, heatmap.tile_cols) == (5, 7)
    line = mismatch_map(np.array([False, True, False]), [2])
    assert (line.rows, line.cells, line.tile_rows, line.tile_cols) == (1, [[0, 255, 0]], 1, 2)
    assert mismatch_map(np.array(True), None) is None


def test_localise_carries_the_map_with_the_kernels_block():
    bad = np.zeros((64, 256), dtype=bool)
    bad[:, 192:] = True
    geometry = [{"outputs": [{"array_shape": [64, 256], "block_shape": [16, 128]}], "grid": [4, 2]}]
    loc = localise("out", bad, geometry)
    assert loc.heatmap is not None and (loc.heatmap.tile_rows, loc.heatmap.tile_cols) == (16, 128)
    assert loc.tiles.block_shape == [16, 128]


# --- the PNG and the picture ----------------------------------------------------------------


def test_png_round_trips_pixels():
    pixels = np.random.default_rng(0).integers(0, 256, (7, 13, 3), dtype=np.uint8)
    assert np.array_equal(decode_png(encode_png(pixels)), pixels)
    with pytest.raises(ValueError):
        encode_png(pixels.astype(np.float32))


def _map(cells, **kw) -> MismatchMap:
    rows, cols = len(cells) * kw.get("cell_rows", 1), len(cells[0]) * kw.get("cell_cols", 1)
    return MismatchMap(
        **{"rows": rows, "cols": cols, "cell_rows": 1, "cell_cols": 1, **kw}, cells=cells
    )


def test_picture_has_the_promised_size_colours_and_tile_lines():
    bad = np.zeros((128, 128), dtype=bool)
    bad[64:, :64] = True
    heatmap = mismatch_map(bad, [64, 64])
    pixels = decode_png(render_heatmap_png(heatmap))
    assert pixels.shape[:2] == (512, 512) and image_size(heatmap) == (512, 512)
    # Tile edges at element 64 = cell 32 = pixel 256, across the whole image.
    assert (pixels[256, :] == LINE).all() and (pixels[:, 256] == LINE).all()
    assert (pixels[10, 10] == WHITE).all()  # a matching tile
    red = pixels[400, 100]
    assert red[0] > 150 and red[1] < 20 and red[2] < 20  # the bad tile, fully red
    assert column_edges(heatmap) == [64] and row_edges(heatmap) == [64]


def test_pale_but_visible_for_a_trace_of_mismatch_and_thin_maps_stay_visible():
    pixels = decode_png(render_heatmap_png(_map([[0, 1, 255]])))
    assert pixels.shape == (170, 510, 3)
    assert (pixels[0, 0] == WHITE).all() and not (pixels[0, 200] == WHITE).all()
    strip = _map([[0] * 64], tile_rows=1, tile_cols=8)
    assert image_size(strip) == (512, 24)


def test_row_edges_restart_in_every_slab_of_collapsed_axes():
    heatmap = mismatch_map(np.ones((2, 12, 4), dtype=bool), [1, 8, 4])
    assert row_edges(heatmap) == [8, 12, 20]  # 8 in slab 0, then slab 1 starts at 12, + 8
    assert "restarting every 12 rows" in describe_heatmap(heatmap)


def test_caption_says_when_tiles_are_smaller_than_cells_or_unknown():
    small = mismatch_map(np.ones((1024, 1024), dtype=bool), [8, 128])
    assert (small.cell_rows, small.cell_cols) == (16, 16)
    assert row_edges(small) == [] and column_edges(small) == list(range(128, 1024, 128))
    assert "Not drawn along rows: a tile is smaller than a cell." in describe_heatmap(small)
    unknown = mismatch_map(np.ones((4, 4), dtype=bool), None)
    assert "output block shape is not known" in describe_heatmap(unknown)
