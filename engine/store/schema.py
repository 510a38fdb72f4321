"""The history file's tables, and how a file is opened: WAL once, the columns a file written by
an older version lacks added, the indexes it lacks made where that is quick.

NOTE [ Indexes a history gains later ]

    A history made before an index existed gains it when opened. Building one reads the whole
    table under the write lock: on a history of years, seconds to minutes in which every job
    writing there would wait past its busy timeout. So at open only a small table is indexed
    (under INDEX_AT_OPEN_ROWS, its largest rowid read from the table's b-tree: no scan; 2.1
    million events of 300 bytes took 1.6 s to index here); ``runs --prune``, whose VACUUM holds
    the lock as long, indexes any. One run's events out of those 2.1 million: 0.41-0.45 s by
    scanning them all, 0.4-1 ms by the index.
"""

from __future__ import annotations

import random
import sqlite3
import time
import zlib

from dataloader_tuner.analyse.results import result_from_dict
from dataloader_tuner.record.rows import BATCH_COLUMNS
from dataloader_tuner.record.windows import BatchWindow
from dataloader_tuner.store.compact import BATCH_ROWS_SCHEMA, body_json, stored_select

# One row per process per resource sample (instrument/resources.py): the private-memory columns
# are what analyse/memory_growth.py judges, so a stored run can be judged again as it was live.
RESOURCE_COLUMNS = ("t", "pid", "role", "worker_id", "cpu_percent", "rss_mb", "threads",
                    "uss_mb", "pss_mb", "dirty_mb", "helper_cpu_share", "busy_threads",
                    "shm_used_mb", "shm_total_mb", "busiest_thread_percent")
RESOURCE_TYPES = {"pid": "INTEGER", "role": "TEXT", "worker_id": "INTEGER", "threads": "INTEGER",
                  "busy_threads": "INTEGER"}
# Fast batches in windows (record/windows.py), their pairs as JSON text.
WINDOW_COLUMNS = BatchWindow._fields
WINDOW_TYPES = {**dict.fromkeys(("first_seq", "batches", "epoch", "samples", "gaps"), "INTEGER"),
                "wait_hist": "TEXT", "workers": "TEXT"}
# Who writes a run: the dashboard or CLI for the engine's runs, the training script for watched
# ones. A run whose writer has died without ending it is marked "lost" (mark_lost_runs).
WRITER_COLUMNS = ("host", "pid", "script", "heartbeat_at", "tune_requested_at", "rank_json",
                  "framework")
# A finished run's headline samples/s beside its saved result: the Training jobs page lists 500
# runs by it without parsing their results (~0.15 s of its first render at 10,000 runs).
HEADLINE_COLUMNS = ("samples_per_s",)
WRITER_TYPES = {"host": "TEXT", "pid": "INTEGER", "script": "TEXT", "rank_json": "TEXT",
                "framework": "TEXT"}
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    label TEXT,
    target TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    config_json TEXT,
    dataset_json TEXT,
    system_json TEXT,
    summary_json TEXT,
    error_json TEXT,
    parent_id INTEGER,
    host TEXT,
    pid INTEGER,
    script TEXT,
    heartbeat_at REAL,
    tune_requested_at REAL,
    rank_json TEXT,
    framework TEXT,
    samples_per_s REAL
);
{BATCH_ROWS_SCHEMA}
CREATE TABLE IF NOT EXISTS batches (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    {", ".join(f"{c} REAL" for c in BATCH_COLUMNS)}
);
CREATE INDEX IF NOT EXISTS batches_run ON batches(run_id, seq);
CREATE TABLE IF NOT EXISTS batch_windows (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    {", ".join(f"{c} {WINDOW_TYPES.get(c, 'REAL')}" for c in WINDOW_COLUMNS)}
);
CREATE INDEX IF NOT EXISTS batch_windows_run ON batch_windows(run_id, first_seq);
CREATE TABLE IF NOT EXISTS resources (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    {", ".join(f"{c} {RESOURCE_TYPES.get(c, 'REAL')}" for c in RESOURCE_COLUMNS)}
);
CREATE INDEX IF NOT EXISTS resources_run ON resources(run_id, t);
CREATE TABLE IF NOT EXISTS gpu_samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t REAL, util_percent REAL, memory_used_mb REAL
);
CREATE TABLE IF NOT EXISTS rank_latest (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    rank INTEGER, received_at REAL, body_json TEXT,
    PRIMARY KEY (run_id, rank)
);
CREATE TABLE IF NOT EXISTS rank_reports (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    rank INTEGER, seq INTEGER, received_at REAL, body_json TEXT
);
CREATE INDEX IF NOT EXISTS rank_reports_time ON rank_reports(run_id, received_at);
CREATE TABLE IF NOT EXISTS run_events (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    kind TEXT, body_json TEXT
);
"""


# NOTE [ Indexes a history gains later ]: tables that had no run_id index (a run's events were
# read, and deleted, by scanning every run's: 3.0 GB of sampled stacks at 7,000 runs)
LATER_INDEXES = {  # index -> (its table, its columns)
    "run_events_run": ("run_events", "run_id"),
    "gpu_samples_run": ("gpu_samples", "run_id, t"),
    # (a page polling for changes reads the runs of one kind: a scan of every run's row,
    # each a few KB of JSON, 22 ms at 10,000 runs)
    "runs_kind": ("runs", "kind, status"),
}
# ...made when a file is opened only where the table holds fewer rows than this (a second or
# less); a larger one gets its index from `runs --prune`, which holds the file's lock anyway
INDEX_AT_OPEN_ROWS = 200_000


def _small(conn: sqlite3.Connection, table: str) -> bool:
    """Is ``table`` small enough to be worked on as a file opens (its largest rowid, read from
    its b-tree: no scan)?"""
    largest = conn.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0
    return largest < INDEX_AT_OPEN_ROWS


def add_later_indexes(conn: sqlite3.Connection, any_size: bool = False) -> list[str]:
    """The LATER_INDEXES a file lacks, made where its table is small, or at ``any_size``
    (NOTE [ Indexes a history gains later ]); the tables indexed now."""
    made = []
    for name, (table, columns) in LATER_INDEXES.items():
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?",
                        (name,)).fetchone():
            continue
        if any_size or _small(conn, table):
            with conn:
                conn.execute(f"CREATE INDEX IF NOT EXISTS {name} ON {table}({columns})")
            made.append(table)
    return made


OLD_ROWS_MOVED = 20_000  # old rows moved into batch_rows a transaction


def move_old_batches(conn: sqlite3.Connection, any_size: bool = False) -> int:
    """An older history's ``batches`` rows moved into ``batch_rows`` (NOTE [ A history's rows,
    kept small ], store/compact.py), where they are few as for the later indexes, or at
    ``any_size``, in transactions of OLD_ROWS_MOVED; the rows moved."""
    if conn.execute("SELECT 1 FROM batches LIMIT 1").fetchone() is None or not (
            any_size or _small(conn, "batches")):
        return 0
    chunk = f"SELECT rowid FROM batches ORDER BY rowid LIMIT {OLD_ROWS_MOVED}"
    moved = 0
    while conn.execute("SELECT 1 FROM batches LIMIT 1").fetchone() is not None:
        with conn:
            # (OR IGNORE: a row already in batch_rows, of a run written by both versions)
            moved += conn.execute(
                f"INSERT OR IGNORE INTO batch_rows (run_id, {', '.join(BATCH_COLUMNS)}) "
                f"SELECT run_id, {stored_select()} FROM batches WHERE rowid IN ({chunk})"
            ).rowcount
            conn.execute(f"DELETE FROM batches WHERE rowid IN ({chunk})")
    return moved


HEADLINES_KEPT = 200  # runs given their headline a transaction


def keep_headlines(conn: sqlite3.Connection) -> int:
    """Each ended run's headline samples/s kept beside its saved result where an older version
    kept none (HEADLINE_COLUMNS), read from the result; by ``runs --prune``, as the later
    indexes (a year's history holds thousands of results to read). The runs given one."""
    add_missing_columns(conn, "runs", HEADLINE_COLUMNS, {})
    ids = [row[0] for row in conn.execute(
        "SELECT id FROM runs WHERE samples_per_s IS NULL AND summary_json IS NOT NULL")]
    kept = 0
    for start in range(0, len(ids), HEADLINES_KEPT):
        chunk = ids[start:start + HEADLINES_KEPT]
        rows = conn.execute(f"SELECT id, kind, summary_json FROM runs WHERE id IN "
                            f"({', '.join('?' * len(chunk))})", chunk).fetchall()
        headlines = [(_headline(kind, saved), run_id) for run_id, kind, saved in rows]
        with conn:
            kept += conn.executemany("UPDATE runs SET samples_per_s = ? WHERE id = ?",
                                     [h for h in headlines if h[0] is not None]).rowcount
    return kept


def _headline(kind: str, saved: str | bytes) -> float | None:
    """A saved result's headline samples/s; None where it cannot be read (one unreadable result
    must not stop a prune: the page reads such a run as before, and says what it can)."""
    try:
        return result_from_dict(kind, body_json(saved)).headline_samples_per_s
    except (ValueError, KeyError, TypeError, zlib.error):
        return None


def use_wal(conn: sqlite3.Connection, patience_s: float = 10.0) -> None:
    """WAL mode (readers never block the writer), once per file: it persists. Switching waits
    for no busy handler, so the ranks of a torchrun job opening a new history together would
    get "database is locked" from all but one: they retry until one has switched."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return
            # A file system without WAL support answers with the mode it keeps: used as is.
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.01, 0.05))


def add_missing_columns(conn: sqlite3.Connection, table: str, columns: tuple,
                         types: dict) -> None:
    """A history file written by an older version lacks newer columns: add them (NULL in its
    old rows), so old runs stay readable and new ones are stored whole."""
    present = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    for column in columns:
        if column not in present:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {types.get(column, 'REAL')}")
