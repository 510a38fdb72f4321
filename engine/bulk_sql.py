"""Many rows to SQLite in a few statements (store.py's writes of batches, windows, samples).

NOTE [ One statement for many rows ]

    Python's sqlite3 lets the GIL go around each step of a statement, and ``executemany``
    steps once a row: a writer thread (a watched job's recorder, the dashboard's reader) then
    waits for the GIL back after every row, while the job's own thread holds it running the
    training loop. It gets it only when the interpreter asks that thread to let go (every
    switch interval, 5 ms): 2,000 rows took 1.3-2.0 s with a busy main thread against 4-6 ms
    without, and each row's hand-over cost the busy thread a switch (a watched fast loop writes
    ~1,150 rows a second). Here the rows go as multi-row statements: the same 2,000 in 35-42 ms
    with a busy main thread, 4.5-6.4 ms of the writer's CPU (bench/sqlite_gil.py).
"""

from __future__ import annotations

import sqlite3
from typing import Any, Sequence

# The parameters a statement takes: SQLite's own limit where Python can read it (3.11+),
# else the smallest any SQLite build has had (999, before 3.32)
DEFAULT_VARIABLES = 999
MAX_ROWS = 500  # rows a statement, at most (each distinct length is a statement to prepare)
UPDATE_ROWS = 100  # an update's rows are matched against each other: fewer a statement


def _variables(conn: sqlite3.Connection) -> int:
    getlimit = getattr(conn, "getlimit", None)
    limit = getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", None)
    if getlimit is None or limit is None:
        return DEFAULT_VARIABLES
    return int(getlimit(limit))


def _chunks(rows: Sequence[Sequence[Any]], per: int) -> list[Sequence[Sequence[Any]]]:
    """``rows`` in chunks of ``per``, the rest in chunks of powers of two (largest first): a
    flush's count differs each time, and each length is a statement to prepare, so a few
    lengths are kept in sqlite3's statement cache instead of a new one each flush."""
    sizes = [per] * (len(rows) // per)
    rest = len(rows) % per
    sizes += [1 << bit for bit in range(rest.bit_length() - 1, -1, -1) if rest >> bit & 1]
    chunks, start = [], 0
    for size in sizes:
        chunks.append(rows[start:start + size])
        start += size
    return chunks


def _per_statement(conn: sqlite3.Connection, width: int, most: int, extra: int = 0) -> int:
    """Rows of ``width`` values a statement may take (``extra``: parameters besides them)."""
    return max(1, min(most, (_variables(conn) - extra) // width))


def insert_rows(conn: sqlite3.Connection, table: str, columns: Sequence[str],
                rows: Sequence[Sequence[Any]], verb: str = "INSERT") -> None:
    """``rows`` (each a value per column) into ``table``, many to a statement (``verb``: or
    "INSERT OR REPLACE")."""
    if not rows:
        return
    one = "(" + ", ".join("?" * len(columns)) + ")"
    head = f"{verb} INTO {table} ({', '.join(columns)}) VALUES "
    for chunk in _chunks(rows, _per_statement(conn, len(columns), MAX_ROWS)):
        conn.execute(head + ", ".join([one] * len(chunk)), [v for row in chunk for v in row])


def update_by_seq(conn: sqlite3.Connection, table: str, run_id: int, columns: Sequence[str],
                  rows: Sequence[Sequence[Any]]) -> None:
    """Set ``columns`` of the rows of run ``run_id`` in ``table`` whose ``seq`` is each row's
    first value, to its other values (``(seq, *values)``), many to a statement; of two rows
    for one seq, the later (as one statement a row had it)."""
    rows = list({row[0]: row for row in rows}.values())
    if not rows:
        return
    width = 1 + len(columns)
    names = ", ".join(f"v{i}" for i in range(len(columns)))
    sets = ", ".join(f"{column} = (SELECT v{i} FROM late WHERE late.seq = {table}.seq)"
                     for i, column in enumerate(columns))
    one = "(" + ", ".join("?" * width) + ")"
    for chunk in _chunks(rows, _per_statement(conn, width, UPDATE_ROWS, extra=1)):
        conn.execute(
            f"WITH late(seq, {names}) AS (VALUES {', '.join([one] * len(chunk))}) "
            f"UPDATE {table} SET {sets} WHERE run_id = ? AND seq IN (SELECT seq FROM late)",
            [*(v for row in chunk for v in row), run_id])
