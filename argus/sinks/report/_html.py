"""ReportData → one self-contained HTML page (inline CSS and SVG, no scripts, no network)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from . import _svg
from ._data import ReportData, Suspect, Table
from ._svg import PHASE_COLORS, esc

__all__ = ["render"]

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#222;margin:0;background:#f6f6f4}
main{max-width:1260px;margin:0 auto;padding:18px 28px 40px}
h1{font-size:24px;margin:6px 0 2px}h2{font-size:19px;margin:30px 0 6px;border-bottom:2px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#666;font-size:13px}.note{color:#666;font-size:13px;margin:4px 0 10px;max-width:980px}
.verdict{background:#fff;border-left:5px solid #d6451b;padding:10px 14px;margin:14px 0;font-size:15px}
.verdict.ok{border-left-color:#59a14f}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:12px 0}
.card{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:8px 14px;min-width:110px}
.card b{display:block;font-size:20px}.card span{color:#666;font-size:12px}
.panel{background:#fff;border:1px solid #e2e2e2;border-radius:6px;padding:12px;overflow-x:auto}
table{border-collapse:collapse;font-size:12.5px;background:#fff;margin:6px 0}
th,td{border-bottom:1px solid #eee;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#fafafa;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px;background:#f0f0ee;padding:1px 4px;border-radius:3px}
.chips{display:flex;flex-wrap:wrap;gap:4px;max-width:560px}
.chip{background:#f3f0ea;border-radius:3px;padding:1px 5px;font-size:11.5px;font-family:ui-monospace,monospace}
footer{color:#888;font-size:12px;margin-top:36px}
"""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e6 else f"{v:,.0f}"
    if isinstance(v, datetime):
        return v.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    return str(v)


def _table(table: Table, columns: Sequence[str] | None = None, *, limit: int = 50) -> str:
    cols = [c for c in (columns or table.names) if c in table.names]
    if not table.rows:
        return '<p class="note">No rows.</p>'
    idx = [table.names.index(c) for c in cols]
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = []
    for row in table.rows[:limit]:
        cells = []
        for i in idx:
            v = row[i]
            cls = ' class="n"' if isinstance(v, int | float) and not isinstance(v, bool) else ""
            cells.append(f"<td{cls}>{esc(_fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _card(value: Any, label: str) -> str:
    return f'<div class="card"><b>{esc(_fmt(value))}</b><span>{esc(label)}</span></div>'


def _phase_rows(data: ReportData) -> list[tuple[str, dict[str, float]]]:
    per_rank = {int(r["rank"]): r for r in data.phases.dicts()}
    if not per_rank:
        return []
    named = [p for p in PHASE_COLORS if p != "other"]

    def parts(r: dict[str, Any]) -> dict[str, float]:
        out = {p: float(r[p] or 0.0) for p in named}
        out["other"] = max(float(r["step"] or 0.0) - sum(out.values()), 0.0)
        return out

    typical = {p: statistics.median(float(r[p] or 0.0) for r in per_rank.values()) for p in [*named, "step"]}
    rows = [(f"typical rank (median of {len(per_rank):,})", parts(typical))]
    suspects = list(dict.fromkeys(s.rank for s in data.suspects))
    busier = {  # the busiest ranks beside the suspects, if busier than the median at all
        int(r["rank"]): float(r["z"]) for r in data.slow_ranks.dicts()[:3] if float(r["z"] or 0.0) > 0
    }
    for rank in [*suspects, *(r for r in busier if r not in suspects)]:
        if rank in per_rank:
            tag = "suspect" if rank in suspects else f"busy-time z {busier[rank]:+.1f}"
            rows.append((f"rank {rank} ({tag})", parts(per_rank[rank])))
    return rows


def _evidence_chips(text: str) -> str:
    chips = "".join(f'<span class="chip">{esc(part)}</span>' for part in text.split(", ") if part)
    return f'<div class="chips">{chips}</div>'


def _anomalies(data: ReportData) -> str:
    rows = data.anomalies.dicts()
    if not rows:
        return '<p class="note">Argus found no anomaly in this job\'s time range.</p>'
    labels = [f"{r['cause']} @ {r['suspect']} (steps {r['start_step']}–{r['end_step']})" for r in rows[:15]]
    chart = _svg.bars(labels, [float(r["gpu_hours_lost"] or 0.0) for r in rows[:15]], unit="GPU-h")
    body = []
    for r in rows:
        body.append(
            "<tr>"
            f'<td>{esc(r["cause"])}<br><span class="sub">{esc(r["level"])}</span></td>'
            f"<td>{esc(r['suspect'])}</td>"
            f'<td class="n">{esc(r["start_step"])}–{esc(r["end_step"])}</td>'
            f'<td class="n">{esc(_fmt(r["score"]))}</td>'
            f'<td class="n">{esc(_fmt(r["step_ms_added"]))} ms</td>'
            f'<td class="n">{esc(_fmt(r["gpu_hours_lost"]))}</td>'
            f"<td>{esc(r['summary'])}{_evidence_chips(str(r['evidence']))}</td>"
            "</tr>"
        )
    head = "".join(
        f"<th>{h}</th>"
        for h in ("root cause", "suspect", "steps", "score", "adds per step", "GPU-hours lost", "evidence")
    )
    return (
        '<h3>Cost per anomaly (GPU-hours lost so far)</h3><div class="panel">' + chart + "</div>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _transients(data: ReportData) -> str:
    """Transients: ranks flagged in a step or two outside any anomaly (never a page)."""
    if not data.transients:
        return '<p class="note">No transients: no rank stood out outside its anomalies.</p>'
    total = sum(n for _, n in data.transients)
    rows = "".join(f'<tr><td class="n">{r}</td><td class="n">{n}</td></tr>' for r, n in data.transients[:20])
    return (
        f"<h3>Transients ({total} sighting(s) on {len(data.transients)} rank(s))</h3>"
        '<p class="note">One-step blips (a GC pause, a noisy neighbour): seen, counted, never an anomaly or a '
        "page. A rank that keeps coming back here deserves a look.</p>"
        f"<table><thead><tr><th>rank</th><th>steps flagged outside an anomaly</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def _suspect(s: Suspect) -> str:
    kernels = s.kernels.dicts()
    stacks = s.stacks
    samples = int(stacks.rows[0][stacks.names.index("value")]) if stacks.rows else 0
    return (
        f"<h2>Rank {s.rank}: {esc(s.reason)}</h2>"
        + (
            f'<p class="note">GPU-hours lost so far: <b>{s.gpu_hours_lost:.3g}</b>.</p>'
            if s.gpu_hours_lost
            else ""
        )
        + "<h3>Kernel distribution shift (this rank vs its peers)</h3>"
        '<p class="note">Per kernel, the median over steps of the per-step p50 and p99 duration; peers are the '
        "median of every other rank with kernel data. Sorted by this rank's total kernel time.</p>"
        f'<div class="panel">{_svg.kernel_shift(kernels)}</div>'
        + _table(
            s.kernels,
            ["name", "calls", "total_ms", "p50_us", "p99_us", "peers_p50_us", "peers_p99_us", "peers"],
        )
        + f"<h3>Call stacks ({samples:,} samples)</h3>"
        '<p class="note">Icicle flame graph: callers above callees, width = share of samples. Hover for counts.</p>'
        f'<div class="panel">{_svg.flame(stacks.column("level"), stacks.column("value"), stacks.column("label"))}'
        "</div>"
    )


def _range(data: ReportData) -> str:
    """The job's own steps' time range, and the queries' wider one when it differs."""
    queried = f"{esc(_fmt(data.start))} – {esc(_fmt(data.end))} UTC"
    if data.steps_span is None:
        return f"time range {queried}"
    first, last = data.steps_span
    return (
        f"steps from {esc(_fmt(first))} to {esc(_fmt(last))} UTC (queried {queried}: rows stamped on "
        "arrival, such as anomalies and kernels, come later than their steps)"
    )


def _verdict(data: ReportData) -> str:
    rows = data.anomalies.dicts()
    if not rows:
        return '<div class="verdict ok">No anomaly: every rank did its share of the work.</div>'
    top = max(rows, key=lambda r: float(r["gpu_hours_lost"] or 0.0))
    return (
        f'<div class="verdict"><b>{esc(top["suspect"])}</b> — <b>{esc(top["cause"])}</b>: adds '
        f"<b>{esc(_fmt(top['step_ms_added']))} ms</b> to each step of the job from step "
        f"{esc(top['start_step'])} to {esc(top['end_step'])}; "
        f"<b>{esc(_fmt(top['gpu_hours_lost']))} GPU-hours</b> lost. {esc(top['summary'])}</div>"
    )


def render(data: ReportData) -> str:
    """The report page for ``data``: every value escaped, every image inline."""
    summ = data.summary
    step_ms = data.phases.column("step")
    lost = sum(float(v or 0.0) for v in data.anomalies.column("gpu_hours_lost"))
    cards = "".join(
        [
            _card(summ.get("ranks", 0), "ranks"),
            _card(summ.get("hosts", 0), "hosts"),
            _card(f"{summ.get('first_step', 0)}–{summ.get('last_step', 0)}", "steps"),
            _card(statistics.median(step_ms) if step_ms else 0.0, "median step (ms)"),
            _card(len(data.anomalies), "anomalies"),
            _card(round(lost, 3), "GPU-hours lost"),
        ]
    )
    st = data.step_time
    series = {k: st.column(k) for k in ("median", "p99", "max")}
    marks = {s.rank: f"rank {s.rank}" for s in data.suspects}
    windows = [
        (int(r["start_step"]), int(r["end_step"]), f"{r['cause']} @ {r['suspect']}")
        for r in data.anomalies.dicts()[:8]
    ]
    hm = data.heatmap
    title = f"Argus report — job {data.job}"
    parts = [
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_CSS}</style></head>'
        f"<body><main><h1>{esc(title)}</h1>"
        f'<div class="sub">{_range(data)} · generated {esc(_fmt(data.generated))} UTC</div>',
        _verdict(data),
        f'<div class="cards">{cards}</div>',
        "<h2>Step time</h2>",
        f'<div class="panel">{_svg.lines(st.column("t"), series, unit="ms")}</div>',
        "<h2>Busy time per rank and step</h2>",
        '<p class="note">Busy time is step time minus the time spent waiting in collectives. In a synchronous '
        "job every rank's step takes as long as the slowest one, so the straggler is the bright row: it "
        "computes while its peers wait for it. Large jobs are shown in rank groups (the busiest rank of each "
        "group) and step groups.</p>",
        f'<div class="panel">{_svg.heatmap(hm.column("step_group"), hm.column("rank_group"), hm.column("busy_ms"), marks=marks, windows=windows)}</div>',
        "<h2>Phase breakdown</h2>",
        '<p class="note">Mean time per step in each phase: the typical rank against the suspects and the '
        "slowest ranks. Collective time is the wait in all-reduce, all-gather, reduce-scatter, all-to-all, "
        "broadcast and send/recv.</p>",
        f'<div class="panel">{_svg.stacked_bars(_phase_rows(data))}</div>',
        "<h3>Slowest ranks (robust z-score of busy time)</h3>",
        _table(data.slow_ranks),
        "<h2>Anomalies</h2>",
        _anomalies(data),
        _transients(data),
        *(_suspect(s) for s in data.suspects),
        "<footer>Generated by <code>argus report</code> from the same SQL as the Grafana dashboards "
        "(<code>sinks/grafana/queries.py</code>). Self-contained: no scripts, no network.</footer>",
        "</main></body></html>",
    ]
    return "\n".join(parts)
