"""Batch rows packed for the pipe from the engine's child process to its parent.

Events travel as JSON lines, but batch rows are many: tiny in-memory batches come at ~8,000 a
second. JSON-encoding a quarter second of them took the child ~12 ms, on a helper thread that
holds the GIL the measuring loop needs (a ~5 % throughput cost, seen in bench/overhead.py).
Packed column by column as binary arrays in base64 they cost ~1 ms, and the parent unpacks
them with C-speed ``array`` and ``zip``.
"""

from __future__ import annotations

import base64
import math
from array import array

from .metrics import BATCH_COLUMNS, INT_BATCH_COLUMNS, OPTIONAL_INT_COLUMNS

# None without a GPU; or, for the CPU clock and bytes, on batches they were not read for.
OPTIONAL_COLUMNS = frozenset({"h2d_ms", "h2d_other_ms", "gpu_gap_ms", "fetch_cpu_s"}
                             ) | OPTIONAL_INT_COLUMNS


def pack_rows(rows: list[tuple]) -> dict:
    """``{"n": rows, "cols": {column: base64 or None}}``; None: the column is all None."""
    cols: dict[str, str | None] = {}
    columns = list(zip(*rows)) if rows else [()] * len(BATCH_COLUMNS)  # C-speed transpose
    for name, values in zip(BATCH_COLUMNS, columns):
        if name in OPTIONAL_COLUMNS:
            if values.count(None) == len(values):
                cols[name] = None
                continue
            values = [math.nan if v is None else v for v in values]
        code = "q" if name in INT_BATCH_COLUMNS else "d"
        cols[name] = base64.b64encode(array(code, values).tobytes()).decode("ascii")
    return {"n": len(rows), "cols": cols}


def unpack_rows(packed: dict) -> list[tuple]:
    """The rows ``pack_rows`` was given (NaN in an optional column reads back as None)."""
    n = packed["n"]
    columns = []
    for name in BATCH_COLUMNS:
        text = packed["cols"].get(name)
        if text is None:
            columns.append([None] * n)
            continue
        values = array("q" if name in INT_BATCH_COLUMNS else "d")
        values.frombytes(base64.b64decode(text))
        values = values.tolist()
        if name in OPTIONAL_INT_COLUMNS:
            values = [None if v != v else int(v) for v in values]
        elif name in OPTIONAL_COLUMNS:
            values = [None if v != v else v for v in values]  # NaN != NaN
        columns.append(values)
    return list(zip(*columns))
