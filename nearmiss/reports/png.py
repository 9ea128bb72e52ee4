"""A minimal PNG encoder: 8-bit RGB, one IDAT, no filtering — enough for report images.

Written here so reports need no imaging library; the format is the PNG spec's simplest case.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

SIGNATURE = b"\x89PNG\r\n\x1a\n"
COLOUR_TYPE_RGB = 2


def _chunk(kind: bytes, data: bytes) -> bytes:
    """Length, type, data, and the CRC-32 of type + data (as the spec defines it)."""
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)


def encode_png(pixels: np.ndarray) -> bytes:
    """PNG bytes of an (height, width, 3) uint8 RGB array."""
    if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
        raise ValueError(f"expected (h, w, 3) uint8 pixels, got {pixels.dtype}{list(pixels.shape)}")
    height, width = pixels.shape[:2]
    if height == 0 or width == 0:
        raise ValueError("a PNG needs at least one pixel")
    header = struct.pack(">IIBBBBB", width, height, 8, COLOUR_TYPE_RGB, 0, 0, 0)
    # Each scanline starts with its filter type; 0 (none) keeps the encoder trivial, and zlib
    # still compresses the flat colour blocks of a heatmap very well.
    scanlines = np.zeros((height, 1 + 3 * width), dtype=np.uint8)
    scanlines[:, 1:] = np.ascontiguousarray(pixels).reshape(height, 3 * width)
    return (
        SIGNATURE
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(scanlines.tobytes(), 9))
        + _chunk(b"IEND", b"")
    )
