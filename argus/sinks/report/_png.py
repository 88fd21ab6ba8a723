"""Numpy grids → colour-mapped PNG bytes, with no imaging library (zlib and struct only)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

__all__ = ["MISSING_RGB", "colormap", "encode_png", "grid_png"]

# Anchors of matplotlib's "inferno" (perceptually uniform, dark → bright), interpolated.
_INFERNO = np.array(
    [
        (0, 0, 4),
        (40, 11, 84),
        (101, 21, 110),
        (159, 42, 99),
        (212, 72, 66),
        (245, 125, 21),
        (250, 193, 39),
        (252, 255, 164),
    ],
    dtype=np.float64,
)
MISSING_RGB = (208, 208, 208)
"""Cells without data."""


def colormap(unit: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (NaN = missing) → uint8 RGB of the same shape plus a last axis of 3."""
    u = np.clip(np.nan_to_num(unit, nan=0.0), 0.0, 1.0) * (len(_INFERNO) - 1)
    lo = np.minimum(np.floor(u).astype(np.int64), len(_INFERNO) - 2)
    frac = (u - lo)[..., None]
    rgb = _INFERNO[lo] * (1 - frac) + _INFERNO[lo + 1] * frac
    rgb[np.isnan(unit)] = MISSING_RGB
    out: np.ndarray = np.rint(rgb).astype(np.uint8)
    return out


def encode_png(rgb: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of an (h, w, 3) uint8 array."""
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
        raise ValueError("encode_png wants an (h, w, 3) uint8 array")
    h, w, _ = rgb.shape
    raw = np.concatenate([np.zeros((h, 1), np.uint8), rgb.reshape(h, w * 3)], axis=1).tobytes()

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def grid_png(
    grid: np.ndarray, vmin: float, vmax: float, *, min_width: int = 900, min_height: int = 300
) -> bytes:
    """A (rows, cols) float grid as a PNG, each cell an integer block of pixels (crisp when scaled)."""
    rows, cols = grid.shape
    unit = (grid - vmin) / (vmax - vmin) if vmax > vmin else np.where(np.isnan(grid), np.nan, 0.5)
    rgb = colormap(unit)
    fx = max(1, -(-min_width // max(cols, 1)))
    fy = max(1, -(-min_height // max(rows, 1)))
    return encode_png(np.repeat(np.repeat(rgb, fy, axis=0), fx, axis=1))
