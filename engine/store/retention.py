"""How much run history is kept: its limits (size and age), deleting runs, pruning to the limits.

NOTE [ Keeping the history within its limits ]

    Nothing else ever removes a run, and a watched job adds ~1.7 million batch rows a day at 20
    batches a second: a history that only grows fills a disk. The limits: the history's size
    (DEFAULT_MAX_GB, what its pages and rows use, not the file's free pages) and the age of its
    runs (DEFAULT_MAX_DAYS, from when a run ended), each set on the command line
    (``dataloader-tuner runs --prune --max-gb 2 --max-days 30``), else by an environment
    variable, else as the History page saved them in the history itself (its
    ``history_limits`` table: every job writing there and the dashboard then agree without an
    environment in common), else the defaults.

    A prune deletes the finished runs older than the age limit, then the oldest finished runs
    until the history fits its size: never a running run, a run's rows, windows, resources,
    ranks' reports and events with it, in transactions of DELETE_CHUNK rows (a job writing
    beside it waits for one, not for a run of millions of rows), the run's own row last.
    ``runs --prune`` then runs ``VACUUM``, which hands the freed pages back to the file system
    (SQLite keeps them in the file otherwise): it rewrites the file and holds the write lock
    meanwhile (jobs writing wait for it, up to the store's 10 s busy timeout: their rows are
    kept in memory and written at the next flush); a failure leaves the file as it was.

    While jobs write, the limits hold without anyone pruning: each watched run's writer
    thread, at its first flush, and each engine run's (a profile, a tune, from the CLI or the
    dashboard), as it starts, beside the run's reader, delete what is past them
    (``keep_within``: one pass, the runs whose rows weigh the excess, never the training
    thread's time nor the engine child's pipe), and give the space
    back a few MB at a time by ``incremental_vacuum``, which needs a file made with
    ``auto_vacuum=INCREMENTAL``: every new history is (schema.py), an older one once
    ``runs --prune`` has rewritten it; until then its freed pages are reused by new rows, so
    it stops growing but does not shrink.
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Sequence

from dataloader_tuner.store.schema import add_later_indexes, keep_headlines, move_old_batches

MAX_GB_ENV = "DLTUNER_HISTORY_MAX_GB"
MAX_DAYS_ENV = "DLTUNER_HISTORY_MAX_DAYS"
DEFAULT_MAX_GB = 4.0  # a year of a few watched jobs a day, at today's size per batch row
DEFAULT_MAX_DAYS = 180.0
GB = 1024 ** 3
DAY_S = 86400.0


@dataclass(frozen=True)
class Limits:
    """The history's limits: its size in bytes and its runs' age in seconds (None: none)."""

    max_bytes: float | None
    max_age_s: float | None

    @classmethod
    def from_env(cls, max_gb: float | None = None, max_days: float | None = None,
                 saved: "SavedLimits | None" = None) -> "Limits":
        """The limits given, else the environment's, else ``saved`` (the history's own), else
        the defaults; 0 turns one off."""
        saved = saved or SavedLimits(None, None)
        gb = max_gb if max_gb is not None else _env_float(
            MAX_GB_ENV, saved.max_gb if saved.max_gb is not None else DEFAULT_MAX_GB)
        days = max_days if max_days is not None else _env_float(
            MAX_DAYS_ENV, saved.max_days if saved.max_days is not None else DEFAULT_MAX_DAYS)
        return cls(gb * GB if gb > 0 else None, days * DAY_S if days > 0 else None)

    @classmethod
    def for_history(cls, path: str, max_gb: float | None = None,
                    max_days: float | None = None) -> "Limits":
        """As ``from_env``, with the limits saved in the history at ``path``."""
        return cls.from_env(max_gb, max_days, saved_limits(path))

    def text(self) -> str:
        size = f"{self.max_bytes / GB:g} GB" if self.max_bytes else "no size limit"
        age = f"runs {self.max_age_s / DAY_S:g} days" if self.max_age_s else "no age limit"
        return f"{size}, {age}"


@dataclass(frozen=True)
class SavedLimits:
    """The limits saved in a history by the History page (None: not saved; 0: no limit)."""

    max_gb: float | None
    max_days: float | None


def saved_limits(path: str) -> SavedLimits:
    """The limits the History page saved in this history (none in a file from before them)."""
    with closing(connect(path)) as conn:
        try:
            saved = dict(conn.execute("SELECT name, value FROM history_limits").fetchall())
        except sqlite3.OperationalError:  # (no such table: nothing saved)
            return SavedLimits(None, None)
    return SavedLimits(saved.get("max_gb"), saved.get("max_days"))


def save_limits(path: str, max_gb: float, max_days: float) -> None:
    """Keep these limits in the history (0: none) for every job writing there, and the pages."""
    if max_gb < 0 or max_days < 0:
        raise ValueError("a limit is a number of GB or days, or 0 for no limit; not negative")
    with closing(connect(path)) as conn, conn:
        conn.execute("CREATE TABLE IF NOT EXISTS history_limits "
                     "(name TEXT PRIMARY KEY, value REAL NOT NULL)")
        conn.executemany("INSERT OR REPLACE INTO history_limits VALUES (?, ?)",
                         (("max_gb", float(max_gb)), ("max_days", float(max_days))))


def overridden_by_env() -> list[str]:
    """The environment variables that set a limit here, over what the history saved."""
    return [name for name in (MAX_GB_ENV, MAX_DAYS_ENV) if os.environ.get(name, "").strip()]


@dataclass(frozen=True)
class Pruned:
    """What a prune or a delete did: the runs deleted, and the history's size before and after."""

    deleted: tuple[int, ...]
    bytes_before: int
    bytes_after: int
    file_bytes_after: int
    given_back: bool  # the freed pages handed back to the file system (VACUUM done)


class RunningRun(ValueError):
    """A run still running cannot be deleted: its job is writing to it."""


def size_text(path: str, limits: Limits) -> str:
    """"It uses 12.3 MB of its 4 GB; runs are kept 180 days": for the History page."""
    used = used_bytes(path) / 2 ** 20
    size = (f"of its {limits.max_bytes / GB:g} GB limit" if limits.max_bytes
            else "(no size limit)")
    age = (f"runs are kept {limits.max_age_s / DAY_S:g} days after they end" if limits.max_age_s
           else "runs are kept however old")
    return f"It uses {used:,.1f} MB {size}; {age}"


def connect(path: str) -> sqlite3.Connection:
    """A connection of its own to the history at ``path`` (its tables cascade from runs only
    with foreign keys on, as the store's connections have them)."""
    conn = sqlite3.connect(path, timeout=10)
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def used_bytes(path: str) -> int:
    """What the history's pages and rows use (the file less its free pages)."""
    with closing(connect(path)) as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    return (pages - free) * size


def file_bytes(path: str) -> int:
    """The file's size on disk, its write-ahead log included."""
    return sum(os.path.getsize(part) for part in (path, path + "-wal") if os.path.exists(part))


def delete_runs(path: str, run_ids: Sequence[int]) -> Pruned:
    """Delete these runs with everything they hold, and give the space back (see the NOTE).
    A run that is not there raises KeyError, a running one RunningRun: nothing is deleted."""
    before = used_bytes(path)
    with closing(connect(path)) as conn:
        marks = ", ".join("?" * len(run_ids))
        statuses = dict(conn.execute(f"SELECT id, status FROM runs WHERE id IN ({marks})",
                                     tuple(run_ids)).fetchall())
        missing = [run_id for run_id in run_ids if run_id not in statuses]
        if missing:
            raise KeyError(f"no run {', '.join(map(str, missing))} in {path}")
        running = [run_id for run_id, status in statuses.items() if status == "running"]
        if running:
            raise RunningRun(f"run {', '.join(map(str, running))} is still running: its job "
                             "is writing to it; delete it once it has ended")
        for run_id in run_ids:
            _delete(conn, run_id)
        given_back = _vacuum(conn)
    return Pruned(tuple(run_ids), before, used_bytes(path), file_bytes(path), given_back)


def prune(path: str, limits: Limits, now: float | None = None) -> Pruned:
    """Delete finished runs past the age limit, then the oldest finished ones until the
    history fits its size; then give the space back (see the NOTE)."""
    now = time.time() if now is None else now
    before = used_bytes(path)
    deleted: list[int] = []
    given_back = True
    with closing(connect(path)) as conn:
        add_later_indexes(conn, any_size=True)  # (its VACUUM holds the lock as long)
        moved = move_old_batches(conn, any_size=True)
        keep_headlines(conn)
        for run_id, ended_at in _finished(conn):
            if limits.max_age_s is not None and now - ended_at > limits.max_age_s:
                _delete(conn, run_id)
                deleted.append(run_id)
        if deleted or moved:
            given_back = _vacuum(conn)
        for _round in range(SIZE_ROUNDS):
            used = used_bytes(path)
            if limits.max_bytes is None or used <= limits.max_bytes:
                break
            chosen = _oldest_to_free(conn, (used - limits.max_bytes) / used)
            if not chosen:
                break  # nothing finished left: the running runs stay
            for run_id in chosen:
                _delete(conn, run_id)
            deleted += chosen
            given_back = _vacuum(conn)
    return Pruned(tuple(deleted), before, used_bytes(path), file_bytes(path), given_back)


# Rounds of deleting by size: each frees what the runs' rows say it should, then measures
# again after VACUUM (a run's rows share pages with others': only a VACUUM shows what went)
SIZE_ROUNDS = 8
# Roughly what a row of each table takes (bytes; an event compressed or short): a run's weight
ROW_BYTES = {"batch_rows": 45, "batches": 80, "batch_windows": 400, "resources": 120,
             "rank_reports": 600, "gpu_samples": 40, "run_events": 600}
# Tables whose rows a run numbers (seq): its rows read as its last number + 1, one index seek a
# run (a count of 50 million rows took 5.6 s; an over-count where batches were windowed)
NUMBERED = ("batch_rows", "batches")


def _finished(conn: sqlite3.Connection) -> list[tuple[int, float]]:
    """The finished runs, oldest end first: (id, when it ended)."""
    return conn.execute(
        "SELECT id, COALESCE(ended_at, started_at) FROM runs WHERE status != 'running' "
        "ORDER BY COALESCE(ended_at, started_at), id").fetchall()


def _oldest_to_free(conn: sqlite3.Connection, share: float,
                    going: Sequence[int] = ()) -> list[int]:
    """The oldest finished runs whose rows weigh ``share`` of all rows (at least one), those
    ``going`` already counted among them."""
    weights: dict[int, float] = {}
    for table, row_bytes in ROW_BYTES.items():
        query = (f"SELECT id, (SELECT MAX(seq) + 1 FROM {table} WHERE run_id = runs.id) "
                 "FROM runs" if table in NUMBERED else
                 f"SELECT run_id, COUNT(*) FROM {table} GROUP BY run_id")
        for run_id, count in conn.execute(query):
            weights[run_id] = weights.get(run_id, 0.0) + (count or 0) * row_bytes
    total = sum(weights.values()) or 1.0
    chosen: list[int] = list(going)
    freed = sum(weights.get(run_id, 0.0) for run_id in going)
    for run_id, _ended_at in _finished(conn):
        if chosen and freed / total >= share:
            break
        if run_id not in chosen:
            chosen.append(run_id)
            freed += weights.get(run_id, 0.0)
    return chosen


# A run's rows go in transactions of this many at most (by their run_id index): a job writing
# beside a prune waits for one of them, not for a whole run of millions of rows
DELETE_CHUNK = 20_000
# (each indexed by run_id: a history from before run_events' and gpu_samples' indexes gains
# them at its first prune, schema.add_later_indexes)
CHUNKED = ("batch_rows", "batches", "batch_windows", "resources", "rank_reports", "run_events", "gpu_samples")
WHOLE = ("rank_latest",)  # (a row per rank)
KEYS = {"batch_rows": "seq"}  # a row's key within its run, where it is not its rowid


def _delete(conn: sqlite3.Connection, run_id: int) -> None:
    """One run and what it holds, in short transactions, the run's own row last (a run cut
    short meanwhile is still listed, with fewer rows, and goes at the next prune); a run that
    is running is left."""
    row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
    if row is None or row[0] == "running":
        return
    for table in CHUNKED:
        key = KEYS.get(table, "rowid")
        while True:
            with conn:
                gone = conn.execute(
                    f"DELETE FROM {table} WHERE run_id = ? AND {key} IN (SELECT {key} FROM "
                    f"{table} WHERE run_id = ? LIMIT {DELETE_CHUNK})", (run_id, run_id)).rowcount
            if gone < DELETE_CHUNK:
                break
    with conn:
        for table in WHOLE:
            conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        conn.execute("DELETE FROM runs WHERE id = ? AND status != 'running'", (run_id,))


def _vacuum(conn: sqlite3.Connection) -> bool:
    """The freed pages back to the file system, the log folded into the file first (and an
    older file made one whose space later deletes give back in steps); False where the
    history stayed busy past the timeout (the space is then reused, not returned)."""
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError:
        return False
    return True


VACUUM_STEP_PAGES = 2_000  # 8 MB of 4 KB pages a step: a short write each


def _give_back_in_steps(conn: sqlite3.Connection) -> bool:
    """The freed pages back to the file system a few MB at a time, where the file allows it
    (auto_vacuum incremental: new histories, and older ones once pruned from the command
    line); False where it does not (they are reused by later rows)."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        return False
    try:
        while conn.execute("PRAGMA freelist_count").fetchone()[0] > 0:
            conn.execute(f"PRAGMA incremental_vacuum({VACUUM_STEP_PAGES})")
            conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError:
        return False
    return True


def keep_within(path: str, limits: Limits | None = None,
                now: float | None = None) -> tuple[int, ...]:
    """From a run's writer thread, as it starts: the finished runs past the limits deleted,
    in short transactions, and their space given back in steps where the file allows it (see
    the NOTE). The runs deleted."""
    limits = Limits.for_history(path) if limits is None else limits
    now = time.time() if now is None else now
    with closing(connect(path)) as conn:
        doomed = [run_id for run_id, ended_at in _finished(conn)
                  if limits.max_age_s is not None and now - ended_at > limits.max_age_s]
        used = used_bytes(path)
        if limits.max_bytes is not None and used > limits.max_bytes:
            share = (used - limits.max_bytes) / used
            doomed += [run_id for run_id in _oldest_to_free(conn, share, doomed)
                       if run_id not in doomed]
        for run_id in doomed:
            _delete(conn, run_id)
        if doomed:
            _give_back_in_steps(conn)
    return tuple(doomed)


def keep_within_or_say(path: str) -> tuple[int, ...]:
    """``keep_within`` from a run's writer: a bad limit or a busy file said on stderr, never
    raised (the run is written all the same). The runs deleted."""
    try:
        return keep_within(path)
    except (sqlite3.Error, ValueError) as exc:
        print(f"[dataloader-tuner] the history's limits were not kept: {exc}", file=sys.stderr)
        return ()


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number: set it to a number of "
                         f"{'GB' if name == MAX_GB_ENV else 'days'}, or 0 for no limit") from None
