"""The history's rows kept small (NOTE [ A history's rows, kept small ], store/compact.py):
batch rows in whole microseconds keyed by their run and number, long event bodies compressed,
and an older history's rows read beside the new ones until they are moved."""

from __future__ import annotations

import sqlite3

from dataloader_tuner import protocol
from dataloader_tuner.record.rows import BATCH_COLUMNS
from dataloader_tuner.store import RunStore, retention, schema

from .records import make_batches, to_the_microsecond


def _bytes(conn: sqlite3.Connection, *names: str) -> int:
    return sum(conn.execute("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name = ?",
                            (name,)).fetchone()[0] for name in names)


def _old_rows(conn: sqlite3.Connection, run_id: int, rows) -> None:
    """Rows as a history from before batch_rows kept them: seconds, in ``batches``."""
    with conn:
        conn.executemany(f"INSERT INTO batches (run_id, {', '.join(BATCH_COLUMNS)}) VALUES "
                         f"({', '.join('?' * (1 + len(BATCH_COLUMNS)))})",
                         [(run_id, *row) for row in rows])


def test_batch_rows_take_at_most_six_tenths_of_the_old_layout(tmp_path):
    """The same rows, from four runs written in turns (as jobs writing at once do), in the
    compact table and in the old one with its index."""
    store = RunStore(str(tmp_path / "runs.sqlite"))
    conn = store._conn()
    runs = [store.create_run("watch", "t.py", {}) for _ in range(4)]
    rows = [b.to_row() for b in make_batches(6000, fetch_s=0.0153, wait_s=0.00217)]
    for start in range(0, len(rows), 250):
        for run_id in runs:
            store.record_events(run_id, [protocol.Batches(rows[start:start + 250])])
            _old_rows(conn, run_id, rows[start:start + 250])
    new, old = _bytes(conn, "batch_rows"), _bytes(conn, "batches", "batches_run")
    assert new <= 0.6 * old, (new, old)


def test_a_time_that_is_no_number_is_kept_as_none_and_the_rest_of_its_flush_written(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    run_id = store.create_run("watch", "t.py", {})
    rows = [b.to_row() for b in make_batches(3, h2d_ms=0.25)]
    rows[1] = rows[1][:13] + (float("nan"),) + rows[1][14:]  # h2d_ms
    store.record_events(run_id, [protocol.Batches(rows),
                                 protocol.LateTimings([(2, float("inf"))], [])])
    read = store.batches(run_id)
    assert [b.h2d_ms for b in read] == [0.25, None, 0.25] and read[2].gpu_gap_ms is None


def test_a_long_event_body_is_kept_compressed_and_reads_back_whole(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    run_id = store.create_run("profile", "t.py", {})
    frames = [["/site-packages/torch/utils/data/_utils/collate.py", 100 + i, f"fn{i}", 120 + i]
              for i in range(12)]
    stacks = protocol.Profiled(123, 0, [["worker", frames, 0.01 * i, 0.02 * i, i]
                                        for i in range(40)])
    short = protocol.Probe(123, 0, {"threads": 1})
    store.record_events(run_id, [stacks, short])
    kept = dict(store._conn().execute(
        "SELECT kind, body_json FROM run_events WHERE run_id = ?", (run_id,)).fetchall())
    assert isinstance(kept["profiled"], bytes) and isinstance(kept["probe"], str)
    (read,) = store.events(run_id, "profiled")
    assert read.sampled == [[r[0], r[1], r[2], r[3], r[4]] for r in stacks.sampled]
    assert len(kept["profiled"]) * 4 < len(protocol.encode(stacks))
    assert store.events(run_id, "probe") == [short]
    assert store.events(run_id, but="profiled") == [short]  # (an ended run's page: no stacks)


def test_an_older_history_s_rows_are_read_beside_the_new_and_moved_by_a_prune(
        tmp_path, monkeypatch):
    path = str(tmp_path / "runs.sqlite")
    store = RunStore(path)
    run_id = store.create_run("watch", "t.py", {})
    rows = [b.to_row() for b in make_batches(30, fetch_s=0.0153)]
    _old_rows(store._conn(), run_id, rows[:20])
    # (an old history's text body: read as it was)
    with store._conn() as conn:
        conn.execute("INSERT INTO run_events VALUES (?, 'probe', ?)",
                     (run_id, '{"e": "probe", "pid": 1, "worker_id": 0, "probe": {}}'))
    store.record_events(run_id, [protocol.Batches(rows[20:])])
    monkeypatch.setattr(schema, "INDEX_AT_OPEN_ROWS", 10)  # a large old table: left at open
    again = RunStore(path)
    assert again._conn().execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 20
    assert [b.to_row() for b in again.batches(run_id)] == [
        *rows[:20], *map(to_the_microsecond, rows[20:])]
    assert [b.seq for b in again.batches(run_id, last=12)] == list(range(18, 30))
    assert again.last_seq(run_id) == 29
    assert again.events(run_id, "probe") == [protocol.Probe(1, 0, {})]
    retention.prune(path, retention.Limits(None, None))
    conn = again._conn()
    assert conn.execute("SELECT COUNT(*) FROM batches").fetchone()[0] == 0
    assert conn.execute("SELECT COUNT(*) FROM batch_rows").fetchone()[0] == 30
    assert [b.to_row() for b in again.batches(run_id)] == [to_the_microsecond(r) for r in rows]
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_run_s_saved_result_is_kept_compressed_and_listed_as_saved(tmp_path):
    from dataloader_tuner.run.live import LiveRun

    store = RunStore(str(tmp_path / "runs.sqlite"))
    run_id = store.create_run("watch", "t.py", {})
    store.record_events(run_id, [protocol.Batches([b.to_row() for b in make_batches(200)])])
    result = LiveRun.stored(store, run_id).result("ok")
    store.finish_run(run_id, "ok", result, None)
    (kept,) = store._conn().execute("SELECT summary_json FROM runs").fetchone()
    assert isinstance(kept, bytes)
    (listed,) = store.list_runs()
    assert listed.result.to_dict() == RunStore(store.path).get_run(run_id).result.to_dict()
    assert listed.result.samples_per_s == result.samples_per_s and listed.result.batches == 200
