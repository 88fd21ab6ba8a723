"""Hand-written SVG charts for the report: small, dependency-free and readable offline.

Every string that reaches the SVG goes through :func:`esc`; numbers are formatted here.
Each chart function takes plain lists or numpy arrays and returns one ``<svg>`` element.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from html import escape

import numpy as np

from ._png import grid_png

__all__ = [
    "PHASE_COLORS",
    "bars",
    "esc",
    "flame",
    "heatmap",
    "kernel_shift",
    "lines",
    "stacked_bars",
    "ticks",
]

FONT = "font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif"
INK, GRID, MUTED, ACCENT = "#222", "#e4e4e4", "#777", "#d6451b"
PHASE_COLORS = {
    "forward": "#4e79a7",
    "backward": "#76b7b2",
    "optimizer": "#59a14f",
    "dataloader": "#edc948",
    "h2d": "#b07aa1",
    "gc": "#ff9da7",
    "compile": "#9c755f",
    "checkpoint": "#bab0ac",
    "collective": "#e15759",
    "other": "#d4d4d4",
}
SERIES_COLORS = ("#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1")


def esc(value: object) -> str:
    """Text for HTML or SVG: every markup character escaped, quotes included."""
    return escape(str(value), quote=True)


def ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [round(v, 10) for v in np.arange(first, hi + step * 1e-9, step)]


def _num(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def color_range(grid: np.ndarray) -> tuple[float, float]:
    """A colour scale for a rank × step grid that shows a slow row, not one slow column.

    The top is the largest row median (a rank slow for most of the window is at full
    brightness; a one-off spike such as a compile step saturates instead of darkening
    everything else); the bottom is the 1st percentile, at most 80 % of the top.
    """
    finite = grid[np.isfinite(grid)]
    if not finite.size:
        return 0.0, 1.0
    with np.errstate(all="ignore"):
        rows = np.nanmedian(np.where(np.isfinite(grid), grid, np.nan), axis=1)
    top = float(np.nanmax(rows))
    bottom = min(float(np.percentile(finite, 1)), 0.8 * top)
    return bottom, max(top, bottom + 1e-9)


class _Svg:
    def __init__(self, width: int, height: int, label: str) -> None:
        self.width, self.height = width, height
        self.parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{esc(label)}" style="{FONT};font-size:12px">'
        ]

    def text(
        self,
        x: float,
        y: float,
        s: object,
        *,
        anchor: str = "start",
        size: int = 12,
        fill: str = INK,
        weight: str = "normal",
    ) -> None:
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}" fill="{fill}" '
            f'font-weight="{weight}">{esc(s)}</text>'
        )

    def rect(
        self, x: float, y: float, w: float, h: float, fill: str, title: str = "", extra: str = ""
    ) -> None:
        tip = f"<title>{esc(title)}</title>" if title else ""
        self.parts.append(
            f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(w, 0):.2f}" height="{max(h, 0):.2f}" fill="{fill}" {extra}>'
            f"{tip}</rect>"
        )

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = GRID, width: float = 1) -> None:
        self.parts.append(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
            f'stroke-width="{width}"/>'
        )

    def finish(self) -> str:
        return "".join([*self.parts, "</svg>"])


def _empty(message: str, width: int = 600) -> str:
    svg = _Svg(width, 40, message)
    svg.text(8, 24, message, fill=MUTED)
    return svg.finish()


def _axis_index(values: Sequence[int]) -> tuple[int, int, int]:
    """(first, stride, count) of a regular integer axis through ``values``."""
    u = np.unique(np.asarray(values, dtype=np.int64))
    stride = int(np.diff(u).min()) if len(u) > 1 else 1
    return int(u[0]), max(stride, 1), int((u[-1] - u[0]) // max(stride, 1)) + 1


def heatmap(
    steps: Sequence[int],
    ranks: Sequence[int],
    values: Sequence[float],
    *,
    marks: Mapping[int, str] | None = None,
    windows: Sequence[tuple[int, int, str]] = (),
    unit: str = "ms",
) -> str:
    """A rank × step heatmap from long-format cells, suspects marked, anomaly windows below."""
    if not len(values):
        return _empty("no step records in this range")
    s0, s_stride, ns = _axis_index(steps)
    r0, r_stride, nr = _axis_index(ranks)
    grid = np.full((nr, ns), np.nan)
    si = (np.asarray(steps, np.int64) - s0) // s_stride
    ri = (np.asarray(ranks, np.int64) - r0) // r_stride
    grid[ri, si] = np.asarray(values, dtype=np.float64)
    vmin, vmax = color_range(grid)
    left, top, pw = 80, 12, 960
    ph = int(min(max(nr * 6, 240), 520))
    height = top + ph + 130 + (14 * len(windows))
    svg = _Svg(left + pw + 150, height, "rank by step heatmap")
    png = base64.b64encode(grid_png(grid, vmin, vmax)).decode()
    svg.parts.append(
        f'<image x="{left}" y="{top}" width="{pw}" height="{ph}" preserveAspectRatio="none" '
        f'href="data:image/png;base64,{png}"/>'
    )
    svg.rect(left, top, pw, ph, "none", extra=f'stroke="{MUTED}"')
    row_h, col_w = ph / nr, pw / ns
    for r in ticks(r0, r0 + (nr - 1) * r_stride, 8):
        y = top + ((r - r0) / r_stride + 0.5) * row_h
        svg.text(left - 6, y + 4, f"{r:g}", anchor="end", size=11, fill=MUTED)
    svg.text(14, top + ph / 2, "rank", anchor="middle", fill=MUTED)
    last_step = s0 + (ns - 1) * s_stride
    for s in ticks(s0, last_step, 10):
        x = left + ((s - s0) / s_stride + 0.5) * col_w
        svg.line(x, top + ph, x, top + ph + 4, MUTED)
        svg.text(x, top + ph + 17, f"{s:g}", anchor="middle", size=11, fill=MUTED)
    svg.text(left + pw / 2, top + ph + 34, "step", anchor="middle", fill=MUTED)
    for rank, label in (marks or {}).items():
        if r0 <= rank <= r0 + (nr - 1) * r_stride:
            y = top + ((rank - r0) // r_stride + 0.5) * row_h
            svg.parts.append(
                f'<path d="M{left + pw + 4},{y:.1f} l9,-6 v12 z" fill="{ACCENT}"><title>{esc(label)}</title></path>'
            )
            svg.text(left + pw + 16, y + 4, label, size=12, fill=ACCENT, weight="bold")
    y = top + ph + 50
    for start, end, label in windows:
        x1 = left + (max(start, s0) - s0) / s_stride * col_w
        x2 = left + (min(end, last_step) - s0 + s_stride) / s_stride * col_w
        svg.rect(x1, y, x2 - x1, 8, ACCENT, title=label, extra='rx="2"')
        if x2 + 8 + 6.5 * len(label) < left + pw + 150:
            svg.text(x2 + 6, y + 8, label, size=11, fill=ACCENT)
        else:
            svg.text(x1 - 6, y + 8, label, anchor="end", size=11, fill=ACCENT)
        y += 14
    y += 14
    bar = np.linspace(0, 1, 256)[None, :]
    cbar = base64.b64encode(grid_png(bar, 0, 1, min_width=256, min_height=1)).decode()
    svg.parts.append(
        f'<image x="{left}" y="{y}" width="300" height="12" preserveAspectRatio="none" '
        f'href="data:image/png;base64,{cbar}"/>'
    )
    svg.text(left, y + 27, f"≤ {_num(vmin)} {unit}", size=11, fill=MUTED)
    svg.text(left + 300, y + 27, f"≥ {_num(vmax)} {unit}", anchor="end", size=11, fill=MUTED)
    svg.text(
        left + 312,
        y + 11,
        f"busy time (step − collective wait); grey: no data; peak {_num(float(np.nanmax(grid)))} {unit}",
        size=11,
        fill=MUTED,
    )
    return svg.finish()


def stacked_bars(rows: Sequence[tuple[str, Mapping[str, float]]], *, unit: str = "ms") -> str:
    """Horizontal stacked bars, one per row label, segments in PHASE_COLORS order."""
    if not rows:
        return _empty("no step records")
    left, top, pw, bar_h, gap = 190, 34, 820, 22, 10
    total = max(sum(max(v, 0.0) for v in parts.values()) for _, parts in rows) or 1.0
    svg = _Svg(left + pw + 90, top + len(rows) * (bar_h + gap) + 40, "phase breakdown")
    x: float = left
    for name, color in PHASE_COLORS.items():
        svg.rect(x, 8, 11, 11, color)
        svg.text(x + 15, 18, name, size=11)
        x += 22 + 7 * len(name)
    scale = pw / total
    for i, (label, parts) in enumerate(rows):
        y = top + i * (bar_h + gap)
        svg.text(left - 8, y + bar_h / 2 + 4, label, anchor="end")
        x = left
        for name, color in PHASE_COLORS.items():
            v = max(float(parts.get(name, 0.0)), 0.0)
            svg.rect(x, y, v * scale, bar_h, color, title=f"{label} · {name}: {_num(v)} {unit}")
            if v * scale > 44:
                svg.text(x + v * scale / 2, y + bar_h / 2 + 4, _num(v), anchor="middle", size=10, fill="#fff")
            x += v * scale
        svg.text(
            x + 6, y + bar_h / 2 + 4, f"{_num(sum(max(v, 0.0) for v in parts.values()))} {unit}", size=11
        )
    y_axis = top + len(rows) * (bar_h + gap)
    for t in ticks(0, total, 8):
        svg.line(left + t * scale, y_axis - 4, left + t * scale, y_axis, MUTED)
        svg.text(left + t * scale, y_axis + 14, _num(t), anchor="middle", size=10, fill=MUTED)
    svg.text(left + pw, y_axis + 30, f"mean {unit} per step", anchor="end", size=11, fill=MUTED)
    return svg.finish()


def bars(labels: Sequence[str], values: Sequence[float], *, unit: str) -> str:
    """Horizontal bars with their value at the end (e.g. GPU-hours lost per anomaly)."""
    if not labels:
        return _empty("nothing to show")
    left, pw, bar_h, gap = 330, 600, 18, 6
    top = 6
    vmax = max(max(values), 1e-12)
    svg = _Svg(left + pw + 130, top + len(labels) * (bar_h + gap) + 6, f"bars of {unit}")
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = top + i * (bar_h + gap)
        svg.text(left - 8, y + bar_h - 5, _clip(label, 52), anchor="end", size=11)
        svg.rect(left, y, pw * max(v, 0) / vmax, bar_h, ACCENT, title=f"{label}: {v:.4g} {unit}")
        svg.text(left + pw * max(v, 0) / vmax + 6, y + bar_h - 5, f"{v:.3g} {unit}", size=11)
    return svg.finish()


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def kernel_shift(rows: Sequence[Mapping[str, float | str]]) -> str:
    """Per kernel: peers' p50→p99 (grey) against the suspect's (orange), log time axis."""
    rows = [r for r in rows if float(r["p99_us"] or 0) > 0]
    if not rows:
        return _empty("no kernel statistics for this rank (kernel sketches not collected)")
    left, top, pw, row_h = 300, 26, 640, 26
    vals = [float(r[k] or 0) for r in rows for k in ("p50_us", "p99_us", "peers_p50_us", "peers_p99_us")]
    lo = math.log10(max(min(v for v in vals if v > 0) / 1.5, 1e-3))
    hi = math.log10(max(vals) * 1.5)

    def x(v: float) -> float:
        return left + (math.log10(max(v, 10**lo)) - lo) / (hi - lo or 1) * pw

    svg = _Svg(left + pw + 150, top + len(rows) * row_h + 40, "kernel distribution shift")
    svg.rect(left, 6, 18, 4, MUTED)
    svg.text(left + 24, 12, "peers (median rank): p50 → p99", size=11)
    svg.rect(left + 230, 6, 18, 4, ACCENT)
    svg.text(left + 254, 12, "suspect: p50 → p99", size=11)
    svg.text(left + pw + 10, 12, "p99 vs peers", size=11, fill=MUTED)
    for d in range(math.ceil(lo), math.floor(hi) + 1):
        svg.line(x(10**d), top - 4, x(10**d), top + len(rows) * row_h, GRID)
        svg.text(x(10**d), top + len(rows) * row_h + 14, _num(10.0**d), anchor="middle", size=10, fill=MUTED)
    svg.text(
        left + pw,
        top + len(rows) * row_h + 30,
        "kernel duration, µs (log)",
        anchor="end",
        size=11,
        fill=MUTED,
    )
    for i, r in enumerate(rows):
        y = top + i * row_h
        name = str(r["name"])
        svg.text(left - 8, y + 14, _clip(name, 44), anchor="end", size=11)
        for (a, b), dy, color in (
            (("peers_p50_us", "peers_p99_us"), 7, MUTED),
            (("p50_us", "p99_us"), 15, ACCENT),
        ):
            p50, p99 = float(r[a] or 0), float(r[b] or 0)
            if p99 <= 0:
                continue
            svg.line(x(p50), y + dy, x(p99), y + dy, color, 4)
            svg.parts.append(f'<circle cx="{x(p50):.1f}" cy="{y + dy}" r="3.5" fill="{color}"/>')
            svg.parts.append(
                f'<circle cx="{x(p99):.1f}" cy="{y + dy}" r="3.5" fill="{color}">'
                f"<title>{esc(name)} {b}: {p99:.4g} µs</title></circle>"
            )
        peer = float(r["peers_p99_us"] or 0)
        ratio = float(r["p99_us"]) / peer if peer > 0 else float("nan")
        label = f"×{ratio:.2f}" if math.isfinite(ratio) else "no peers"
        svg.text(
            left + pw + 10,
            y + 15,
            label,
            size=12,
            weight="bold" if ratio >= 1.2 else "normal",
            fill=ACCENT if ratio >= 1.2 else INK,
        )
    return svg.finish()


def _warm(label: str) -> str:
    h = zlib.crc32(label.encode())
    return f"rgb({205 + h % 50},{(h >> 8) % 200 + 20},{(h >> 16) % 55})"


def flame(levels: Sequence[int], values: Sequence[float], labels: Sequence[str], *, width: int = 1180) -> str:
    """An icicle flame graph from nested-set rows in depth-first order (callers above callees)."""
    if not levels:
        return _empty("no call-stack samples for this rank")
    total = float(values[0]) or 1.0
    row_h, top = 18, 4
    svg = _Svg(width, top + (max(levels) + 1) * row_h + 8, "flame graph")
    cursor: dict[int, float] = {}
    scale = (width - 2) / total
    for level, value, label in zip(levels, values, labels, strict=True):
        x0 = cursor.get(level - 1, 0.0) if level else 0.0
        cursor[level - 1] = x0 + float(value)
        cursor[level] = x0
        w = float(value) * scale
        if w < 0.4:
            continue
        y = top + level * row_h
        tip = f"{label} — {int(value):,} samples ({100 * float(value) / total:.1f} %)"
        svg.rect(1 + x0 * scale, y, w - 0.6, row_h - 1, _warm(str(label)), title=tip, extra='rx="1.5"')
        if w > 28:
            svg.text(4 + x0 * scale, y + 13, _clip(str(label), int((w - 6) / 6.6)), size=11)
    return svg.finish()


def _epoch(t: datetime | float) -> float:
    return t.timestamp() if isinstance(t, datetime) else float(t)


def lines(times: Sequence[datetime | float], series: Mapping[str, Sequence[float]], *, unit: str) -> str:
    """A small time-series chart (one line per series); times are datetimes or epoch seconds."""
    if len(times) < 2:
        return _empty("too few points for a time series")
    secs = [_epoch(t) for t in times]
    left, top, pw, ph = 70, 24, 960, 200
    t0 = secs[0]
    span = (secs[-1] - t0) or 1.0
    allv = [float(v) for vs in series.values() for v in vs if v is not None]
    peak = max(allv) if allv else 1.0
    vmax = min(peak, 3 * float(np.median(allv))) * 1.08 if allv else 1.0
    svg = _Svg(left + pw + 50, top + ph + 40, "time series")
    for t in ticks(0, vmax, 5):
        y = top + ph - t / vmax * ph
        svg.line(left, y, left + pw, y)
        svg.text(left - 6, y + 4, _num(t), anchor="end", size=10, fill=MUTED)
    svg.text(left - 6, top - 10, unit, anchor="end", size=11, fill=MUTED)
    for k in range(6):
        t = secs[round(k * (len(secs) - 1) / 5)]
        x = left + (t - t0) / span * pw
        label = datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")
        svg.text(x, top + ph + 16, label, anchor="middle", size=10, fill=MUTED)
    lx = left
    for (name, vs), color in zip(series.items(), SERIES_COLORS, strict=False):
        pts = " ".join(
            f"{left + (t - t0) / span * pw:.1f},{top + ph - min(float(v), vmax) / vmax * ph:.1f}"
            for t, v in zip(secs, vs, strict=True)
            if v is not None
        )
        svg.parts.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        svg.rect(lx, 6, 14, 3, color)
        svg.text(lx + 18, 11, name, size=11)
        lx += 30 + 7 * len(name)
    if peak > vmax:
        svg.text(
            left + pw,
            11,
            f"off scale (clipped at the top): peak {_num(peak)} {unit}",
            anchor="end",
            size=11,
            fill=ACCENT,
        )
    svg.text(left + pw, top + ph + 32, "time (UTC)", anchor="end", size=11, fill=MUTED)
    return svg.finish()
