"""Read per-rank values from a log CSV (for ``argus diagnose --steps-csv``)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

__all__ = ["CsvError", "read_series"]

MAX_ROWS = 50_000_000


class CsvError(ValueError):
    """The CSV cannot be read as rank, time (or step) and value columns."""


def read_series(
    path: Path, rank_col: str, t_col: str, value_col: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three columns as numbers; other columns ignored, rows with a blank value skipped.

    Raises :class:`CsvError` naming the file (and line) for anything it cannot use: a
    missing column, a non-number, a negative rank, NaN or infinity, no data rows.
    """
    ranks: list[int] = []
    ts: list[float] = []
    vs: list[float] = []
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in (rank_col, t_col, value_col) if c not in header]
            if missing:
                raise CsvError(
                    f"{path}: missing column(s) {', '.join(missing)}; the header has {', '.join(header) or 'nothing'}"
                )
            for line, row in enumerate(reader, start=2):
                raw = (row.get(rank_col), row.get(t_col), row.get(value_col))
                if any(v is None or v.strip() == "" for v in raw):
                    continue
                try:
                    r, t, v = float(raw[0] or ""), float(raw[1] or ""), float(raw[2] or "")
                except ValueError:
                    raise CsvError(
                        f"{path}:{line}: not a number in {rank_col}/{t_col}/{value_col}: {raw!r}"
                    ) from None
                if not all(math.isfinite(x) for x in (r, t, v)):
                    raise CsvError(f"{path}:{line}: NaN or infinity in {rank_col}/{t_col}/{value_col}")
                if r < 0 or r != int(r) or r >= 1 << 31:
                    raise CsvError(f"{path}:{line}: {rank_col} must be a rank (0, 1, 2, ...), got {raw[0]!r}")
                ranks.append(int(r))
                ts.append(t)
                vs.append(v)
                if len(vs) > MAX_ROWS:
                    raise CsvError(f"{path}: more than {MAX_ROWS:,} rows")
    except OSError as exc:
        raise CsvError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise CsvError(f"{path} is not a readable CSV: {exc}") from None
    if not vs:
        raise CsvError(f"{path}: no data rows")
    return np.array(ranks, np.int64), np.array(ts), np.array(vs)
