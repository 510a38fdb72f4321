"""How much run history is kept: its limits (size and age), deleting runs, pruning to the limits.

NOTE [ Keeping the history within its limits ]

    Nothing else ever removes a run, and a watched job adds ~1.7 million batch rows a day at 20
    batches a second: a history that only grows fills a disk. The limits: the history's size
    (DEFAULT_MAX_GB, what its pages and rows use, not the file's free pages) and the age of its
    runs (DEFAULT_MAX_DAYS, from when a run ended), each set by an environment variable or the
    command line (``dataloader-tuner runs --prune --max-gb 2 --max-days 30``).

    A prune deletes the finished runs older than the age limit, then the oldest finished runs
    until the history fits its size: never a running run, a run's rows, windows, resources,
    ranks' reports and events with it (one transaction per run; the tables cascade from
    ``runs``). Then ``VACUUM`` hands the freed pages back to the file system: SQLite keeps them
    in the file otherwise. A VACUUM rewrites the file and holds the write lock meanwhile
    (jobs writing wait for it, up to the store's 10 s busy timeout: their rows are kept in
    memory and written at the next flush); a failure leaves the file as it was.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Sequence

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
    def from_env(cls, max_gb: float | None = None, max_days: float | None = None) -> "Limits":
        """The limits given, else the environment's, else the defaults; 0 turns one off."""
        gb = max_gb if max_gb is not None else _env_float(MAX_GB_ENV, DEFAULT_MAX_GB)
        days = max_days if max_days is not None else _env_float(MAX_DAYS_ENV, DEFAULT_MAX_DAYS)
        return cls(gb * GB if gb > 0 else None, days * DAY_S if days > 0 else None)

    def text(self) -> str:
        size = f"{self.max_bytes / GB:g} GB" if self.max_bytes else "no size limit"
        age = f"runs {self.max_age_s / DAY_S:g} days" if self.max_age_s else "no age limit"
        return f"{size}, {age}"


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
        for run_id, ended_at in _finished(conn):
            if limits.max_age_s is not None and now - ended_at > limits.max_age_s:
                _delete(conn, run_id)
                deleted.append(run_id)
        if deleted:
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
# Roughly what a row of each table takes (bytes; events by their text): a run's weight
ROW_BYTES = {"batches": 160, "batch_windows": 400, "resources": 120, "rank_reports": 600,
             "gpu_samples": 40}


def _finished(conn: sqlite3.Connection) -> list[tuple[int, float]]:
    """The finished runs, oldest end first: (id, when it ended)."""
    return conn.execute(
        "SELECT id, COALESCE(ended_at, started_at) FROM runs WHERE status != 'running' "
        "ORDER BY COALESCE(ended_at, started_at), id").fetchall()


def _oldest_to_free(conn: sqlite3.Connection, share: float) -> list[int]:
    """The oldest finished runs whose rows weigh ``share`` of all rows (at least one)."""
    weights: dict[int, float] = {}
    for table, row_bytes in ROW_BYTES.items():
        for run_id, count in conn.execute(
                f"SELECT run_id, COUNT(*) FROM {table} GROUP BY run_id"):
            weights[run_id] = weights.get(run_id, 0.0) + count * row_bytes
    for run_id, text in conn.execute(
            "SELECT run_id, SUM(LENGTH(body_json)) FROM run_events GROUP BY run_id"):
        weights[run_id] = weights.get(run_id, 0.0) + (text or 0)
    total = sum(weights.values()) or 1.0
    chosen: list[int] = []
    freed = 0.0
    for run_id, _ended_at in _finished(conn):
        chosen.append(run_id)
        freed += weights.get(run_id, 0.0)
        if freed / total >= share:
            break
    return chosen


def _delete(conn: sqlite3.Connection, run_id: int) -> None:
    """One run and what it holds, in one transaction (the tables cascade from runs); a run
    that started running meanwhile is left."""
    with conn:
        conn.execute("DELETE FROM runs WHERE id = ? AND status != 'running'", (run_id,))


def _vacuum(conn: sqlite3.Connection) -> bool:
    """The freed pages back to the file system, the log folded into the file first; False
    where the history stayed busy past the timeout (the space is then reused, not returned)."""
    try:
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.OperationalError:
        return False
    return True


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number: set it to a number of "
                         f"{'GB' if name == MAX_GB_ENV else 'days'}, or 0 for no limit") from None
