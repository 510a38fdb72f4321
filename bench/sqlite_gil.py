"""What a writer thread's SQLite inserts cost while another thread holds the GIL.

NOTE [ One statement for many rows ] (engine/bulk_sql.py): Python's sqlite3 lets the GIL go
around each step of a statement, and ``executemany`` steps once a row, so a writer thread (a
watched job's recorder) waits for the GIL back after every row while the job's own thread runs
Python. This writes 2,000 batch rows (17 values each, indexed as the history's are) both ways,
with the main thread idle and with it spinning in Python, and prints the writer's wall time and
its own CPU (medians of --repeats):

    python bench/sqlite_gil.py [--rows 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dataloader_tuner.bulk_sql import insert_rows  # noqa: E402

COLUMNS = ["run_id", *(f"c{i}" for i in range(16))]


def writer(rows: list[tuple], how: str, busy: bool) -> tuple[float, float]:
    """(wall s, the writer's CPU s) for ``rows`` written ``how`` in a fresh history file."""
    path = tempfile.mktemp(suffix=".sqlite")
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"CREATE TABLE batches ({', '.join(c + ' REAL' for c in COLUMNS)})")
    conn.execute("CREATE INDEX batches_run ON batches(run_id, c0)")
    stop, took = threading.Event(), []

    def write() -> None:
        started, cpu = time.perf_counter(), time.thread_time()
        with conn:
            if how == "executemany":
                conn.executemany(f"INSERT INTO batches VALUES ({', '.join('?' * 17)})", rows)
            else:
                insert_rows(conn, "batches", COLUMNS, rows)
        took.append((time.perf_counter() - started, time.thread_time() - cpu))
        stop.set()

    thread = threading.Thread(target=write)
    thread.start()
    spins = 0
    while busy and not stop.is_set():  # the job's thread, running Python
        spins += 1
    thread.join()
    conn.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    return took[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [(1, *(float(i) + j / 1000 for j in range(16))) for i in range(args.rows)]
    print(f"{args.rows} rows; writer's wall and own CPU, medians of {args.repeats}")
    for how in ("executemany", "insert_rows"):
        for busy in (False, True):
            got = [writer(rows, how, busy) for _ in range(args.repeats)]
            print(f"{how:12} main thread {'busy' if busy else 'idle'}: "
                  f"{statistics.median(w for w, _ in got) * 1e3:8.1f} ms wall, "
                  f"{statistics.median(c for _, c in got) * 1e3:6.1f} ms CPU", flush=True)


if __name__ == "__main__":
    main()
