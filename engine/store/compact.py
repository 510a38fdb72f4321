"""How a run's batch rows and event bodies are kept small in the history, and read back as
they were written.

NOTE [ A history's rows, kept small ]

    A history of 1,000 runs and 4.85 million batch rows was 719 MiB, 148 MiB a million rows:
    a watched job at 20 batches a second adds 1.7 million rows a day. Two things took it:

    - Batch rows (``batch_rows``): each time was an 8-byte float and each row also had an
      entry in a (run_id, seq) index, ~70 bytes a row. Times are now whole microseconds
      (STORED_SCALE: SQLite keeps a small integer in 1-6 bytes; the loop's own timings are
      not finer than that, and a wait's histogram bucket is ~9% wide), and the table is
      keyed by (run_id, seq) WITHOUT ROWID, the key being the index: 39 bytes a row with 8
      jobs writing at once (bench/history_scale.py). Rows come back in seconds and
      milliseconds as before, divided in the query. A history from before keeps its
      ``batches`` table, read beside the new one, until its rows are moved into it (at open
      where few, else by ``runs --prune``, as NOTE [ Indexes a history gains later ]).
    - Event bodies: a run's sampled stacks (``Profiled``, every half second from every
      process, each frame's file path spelled out) were ~100 bytes a batch row of a watched
      job. A body of COMPRESS_FROM bytes or more is kept zlib-compressed (a BLOB: 8-9x
      smaller), a shorter one as its JSON text, which an older history's bodies all are. So
      is a run's saved result (``runs.summary_json``: ~30 KB of JSON a watched run, 60% of
      it the stacks for a flame graph; 5x smaller, and read by every page that lists runs).
"""

from __future__ import annotations

import json
import zlib
from typing import Any, Sequence

from dataloader_tuner.record.rows import (BATCH_COLUMNS, INT_BATCH_COLUMNS,
                                          OPTIONAL_INT_COLUMNS)

# What a stored value is a count of, per column kept as an integer: seconds as microseconds,
# milliseconds as microseconds (the rest are integers already)
STORED_SCALE = {**dict.fromkeys(("t_request", "wait_s", "step_s", "fetch_start", "fetch_s",
                                 "collate_s", "fetch_cpu_s"), 1_000_000),
                **dict.fromkeys(("h2d_ms", "h2d_other_ms", "gpu_gap_ms"), 1_000)}
BATCH_ROWS_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS batch_rows (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    {", ".join(f"{c} INTEGER" + (" NOT NULL" if c == "seq" else "") for c in BATCH_COLUMNS)},
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
"""
INTEGER_BATCH_COLUMNS = INT_BATCH_COLUMNS | OPTIONAL_INT_COLUMNS
# Where a run's batches are: the compact table, and the one histories had before it
BATCH_TABLES = ("batch_rows", "batches")
_SCALED = [(i, STORED_SCALE[c]) for i, c in enumerate(BATCH_COLUMNS) if c in STORED_SCALE]


def stored_batch(row: Sequence[Any]) -> list[Any]:
    """A BatchRecord's values as ``batch_rows`` keeps them (times as whole microseconds)."""
    values = list(row)
    for i, scale in _SCALED:
        values[i] = _whole(values[i], scale)
    return values


def stored_timing(value: float | None, column: str) -> int | None:
    """A late timing (``column``'s unit) as ``batch_rows`` keeps it."""
    return _whole(value, STORED_SCALE[column])


def _whole(value: float | None, scale: int) -> int | None:
    """``value`` in ``scale``-ths, rounded; None where it is none or no number (NaN, an
    infinity: SQLite kept a NaN as NULL, and one must not fail a flush of rows)."""
    if value is None:
        return None
    try:
        return round(value * scale)
    except (ValueError, OverflowError):
        return None


def batch_select(table: str) -> str:
    """The columns of BATCH_COLUMNS as ``table`` gives them back, in their own units (an
    older table's integers as integers: its columns were all REAL)."""
    if table == "batches":
        return ", ".join(f"CAST({c} AS INTEGER) AS {c}" if c in INTEGER_BATCH_COLUMNS else c
                         for c in BATCH_COLUMNS)
    return ", ".join(f"{c} / {STORED_SCALE[c]}.0 AS {c}" if c in STORED_SCALE else c
                     for c in BATCH_COLUMNS)


def stored_select() -> str:
    """The columns of BATCH_COLUMNS of an older ``batches`` table, as ``batch_rows`` keeps
    them."""
    return ", ".join(f"ROUND({c} * {STORED_SCALE[c]})" if c in STORED_SCALE else c
                     for c in BATCH_COLUMNS)


COMPRESS_FROM = 512  # bytes of JSON from which a body is kept compressed


def stored_body(doc: Any) -> str | bytes:
    """An event's body as ``run_events`` keeps it: its JSON, compressed where long."""
    text = json.dumps(doc, default=str)
    if len(text) < COMPRESS_FROM:
        return text
    return zlib.compress(text.encode(), 6)


def body_json(stored: str | bytes) -> Any:
    """A body as ``stored_body`` kept it (or as an older history did: its JSON text), read."""
    return json.loads(zlib.decompress(stored) if isinstance(stored, bytes) else stored)
