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


def _chunks(conn: sqlite3.Connection, rows: Sequence[Sequence[Any]], width: int,
            most: int) -> list[Sequence[Sequence[Any]]]:
    per = max(1, min(most, _variables(conn) // width))
    return [rows[start:start + per] for start in range(0, len(rows), per)]


def insert_rows(conn: sqlite3.Connection, table: str, columns: Sequence[str],
                rows: Sequence[Sequence[Any]]) -> None:
    """``rows`` (each a value per column) into ``table``, many to a statement."""
    if not rows:
        return
    one = "(" + ", ".join("?" * len(columns)) + ")"
    head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
    for chunk in _chunks(conn, rows, len(columns), MAX_ROWS):
        conn.execute(head + ", ".join([one] * len(chunk)), [v for row in chunk for v in row])


def update_by_seq(conn: sqlite3.Connection, table: str, run_id: int, columns: Sequence[str],
                  rows: Sequence[Sequence[Any]]) -> None:
    """Set ``columns`` of the rows of run ``run_id`` in ``table`` whose ``seq`` is each row's
    first value, to its other values (``(seq, *values)``), many to a statement."""
    if not rows:
        return
    width = 1 + len(columns)
    names = ", ".join(f"v{i}" for i in range(len(columns)))
    sets = ", ".join(f"{column} = (SELECT v{i} FROM late WHERE late.seq = {table}.seq)"
                     for i, column in enumerate(columns))
    one = "(" + ", ".join("?" * width) + ")"
    for chunk in _chunks(conn, rows, width, UPDATE_ROWS):
        conn.execute(
            f"WITH late(seq, {names}) AS (VALUES {', '.join([one] * len(chunk))}) "
            f"UPDATE {table} SET {sets} WHERE run_id = ? AND seq IN (SELECT seq FROM late)",
            [*(v for row in chunk for v in row), run_id])
