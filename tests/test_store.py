"""The run history is written while a run goes, not only at the end."""

import os
import subprocess
import sys
import time

import pytest
import torch

from dataloader_tuner import protocol
from dataloader_tuner.run.runner import RunHandle, RunRequest, RunState
from dataloader_tuner.store import DB_ENV, RunStore, default_db_path

from .conftest import ROOT, dataset_path


def test_batches_are_in_the_database_while_the_run_is_going(db_path):
    store = RunStore(db_path)
    request = RunRequest(target=dataset_path("small_map.py"), settings={"batch_size": 4},
                         seconds=30)
    handle = RunHandle(request, store).start()
    try:
        reader = RunStore(db_path)  # a second connection, like the dashboard's
        deadline = time.monotonic() + 20
        while not reader.batches(handle.run_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        in_flight = reader.get_run(handle.run_id)
        assert in_flight.status == "running"
        assert reader.batches(handle.run_id) and in_flight.dataset.class_name.endswith("SmallMap")
        assert reader.resources(handle.run_id) is not None
    finally:
        assert handle.stop() is RunState.STOPPED
    final = reader.get_run(handle.run_id)
    assert final.status == "stopped" and final.result.batches > 0
    assert reader.events(handle.run_id, "finished")


def test_failed_runs_keep_their_error(db_path):
    store = RunStore(db_path)
    handle = RunHandle(RunRequest(target=dataset_path("nothing_here.py")), store).start()
    handle.wait(30)
    saved = store.get_run(handle.run_id)
    assert saved.status == "error" and saved.error["type"] == "target_no_dataset"


def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(DB_ENV, str(tmp_path / "x.sqlite"))
    assert default_db_path() == str(tmp_path / "x.sqlite")
    monkeypatch.delenv(DB_ENV)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_db_path() == str(tmp_path / "dataloader-tuner" / "runs.sqlite")


def _sample(t, dirty):
    return protocol.Resources(t, [
        {"pid": 11, "role": "worker", "worker_id": 0, "cpu_percent": 50.0, "rss_mb": 100.0,
         "threads": 2, "uss_mb": None if dirty is None else 20.0 + dirty, "pss_mb": 40.0, "dirty_mb": dirty}])


def test_worker_private_memory_is_stored_with_each_sample(tmp_path):
    store = RunStore(str(tmp_path / "runs.sqlite"))
    run_id = store.create_run("profile", "t.py", {})
    store.record_event(run_id, _sample(1.0, 13.0))
    store.record_event(run_id, _sample(3.0, None))  # not read this time: stays None
    rows = store.resources(run_id)
    assert [(r["t"], r["dirty_mb"], r["threads"]) for r in rows] == [(1.0, 13.0, 2), (3.0, None, 2)]
    assert rows[0]["uss_mb"] == 33.0 and rows[0]["pss_mb"] == 40.0


def test_a_history_file_from_before_private_memory_is_upgraded(tmp_path):
    import sqlite3
    path = str(tmp_path / "old.sqlite")
    with sqlite3.connect(path) as conn:  # the resources table as earlier versions made it
        conn.execute("CREATE TABLE resources (run_id INTEGER NOT NULL, t REAL, pid INTEGER, "
                     "role TEXT, worker_id INTEGER, cpu_percent REAL, rss_mb REAL)")
        conn.execute("INSERT INTO resources VALUES (99, 0.5, 11, 'main', -1, 90.0, 50.0)")
    store = RunStore(path)
    old = store.resources(99)
    assert old[0]["rss_mb"] == 50.0 and old[0]["dirty_mb"] is None
    run_id = store.create_run("profile", "t.py", {})
    store.record_event(run_id, _sample(1.0, 7.0))
    assert store.resources(run_id)[0]["dirty_mb"] == 7.0


OPEN_AT = """
import sys, time
from dataloader_tuner.store import RunStore
start = float(sys.argv[2])
while time.time() < start:
    pass
RunStore(sys.argv[1]).create_run("watch", "train.py", {}, label="train")
"""


@pytest.mark.slow
def test_the_ranks_of_a_job_can_open_a_new_history_at_the_same_moment(tmp_path):
    """8 ranks on a node open the default history together: switching a new file to WAL waits
    for no busy handler, and without a retry some got "database is locked" (and trained
    unwatched)."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    for trial in range(6):
        path = str(tmp_path / f"runs{trial}.sqlite")
        start = time.time() + 0.8
        ranks = [subprocess.Popen([sys.executable, "-c", OPEN_AT, path, str(start)], env=env,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]
        errors = [rank.communicate(timeout=60)[1] for rank in ranks]
        assert [rank.returncode for rank in ranks] == [0] * 4, errors
        assert len(RunStore(path).list_runs()) == 4


def test_many_rows_are_written_in_few_statements_and_late_timings_find_their_rows(tmp_path):
    """A flush's rows go as multi-row statements (NOTE [ One statement for many rows ]: one
    a row, a writer thread waited for the GIL after each while the job's thread held it,
    1.3-2.0 s for 2,000 rows); they read back as written, and late GPU timings land on their
    own rows of their own run only."""
    from dataloader_tuner import bulk_sql

    from .records import make_batches, to_the_microsecond

    store = RunStore(str(tmp_path / "runs.db"))
    run_id, other = (store.create_run("watch", "t.py", {}) for _ in range(2))
    rows = [b._replace(seq=i).to_row() for i, b in enumerate(make_batches(2000))]
    statements: list[str] = []
    conn = store._conn()
    conn.set_trace_callback(statements.append)
    store.record_events(run_id, [protocol.Batches(rows)])
    store.record_events(other, [protocol.Batches(rows[:10])])
    inserts = [s for s in statements if s.startswith("INSERT INTO batch_rows")]
    per = bulk_sql._per_statement(conn, 1 + len(rows[0]), bulk_sql.MAX_ROWS)
    # (2,000 in chunks of up to 500; 10 as 8 + 2: a few lengths, each a prepared statement)
    assert len(inserts) == len(bulk_sql._chunks(rows, per)) + 2 and len(inserts) <= 40
    # (times kept to the microsecond: NOTE [ A history's rows, kept small ])
    assert [r.to_row() for r in store.batches(run_id)] == [
        to_the_microsecond(r) for r in rows]
    gaps = [(seq, 0.5 + seq) for seq in range(0, 2000, 7)]  # 286: 100, 100, 64, 16, 4, 2
    copies = [(5, 9.0, 9.0), (1999, 1.5, 0.75), (5, 0.25, None)]  # the later for batch 5
    statements.clear()
    store.record_events(run_id, [protocol.LateTimings(gaps, copies)])
    conn.set_trace_callback(None)
    assert len([s for s in statements if s.startswith("WITH late")]) == 6 + 1
    got = {r.seq: r for r in store.batches(run_id)}
    assert all(got[seq].gpu_gap_ms == gap for seq, gap in gaps)
    assert got[1].gpu_gap_ms == rows[1][15] and got[8].gpu_gap_ms == rows[8][15]  # untouched
    assert (got[5].h2d_ms, got[5].h2d_other_ms) == (0.25, None)
    assert (got[1999].h2d_ms, got[1999].h2d_other_ms) == (1.5, 0.75)
    assert [r.to_row() for r in store.batches(other)] == [  # the other run's alone
        to_the_microsecond(r) for r in rows[:10]]


class Spins(torch.utils.data.Dataset):
    """~2 ms of Python a sample: stacks worth sampling, in 2 workers."""

    def __len__(self):
        return 600

    def __getitem__(self, index):
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            pass
        return index


def test_a_running_run_followed_reads_each_event_once_and_shows_what_a_whole_read_shows(
        tmp_path):
    """The Training jobs page follows a running job (run/live.py, ``Followed``): each refresh
    reads only what was written since the last, and shows what reading the whole run shows."""
    from torch.utils.data import DataLoader

    from dataloader_tuner import watch
    from dataloader_tuner.run.live import Followed, LiveRun

    source = str(tmp_path / "source.sqlite")
    watched = watch(DataLoader(Spins(), batch_size=4, num_workers=2), name="job", db=source)
    for _batch in watched:
        pass
    watched.close()
    written = RunStore(source)
    events = [e for e in written.events(watched.run_id) if not isinstance(e, protocol.Finished)]
    assert any(isinstance(e, protocol.Profiled) for e in events)  # stacks to be followed
    rows = [b.to_row() for b in written.batches(watched.run_id)]
    by_t: dict[float, list[dict]] = {}
    for row in written.resources(watched.run_id):
        by_t.setdefault(row["t"], []).append(row)
    samples = [protocol.Resources(t, procs) for t, procs in sorted(by_t.items())]

    store = RunStore(str(tmp_path / "followed.sqlite"))  # the job's events written again, in turns
    run_id = store.create_run("watch", "job.py", {})
    followed = Followed(store, run_id, last_batches=50)
    read = []
    real_events_after = store.events_after
    store.events_after = lambda run, after: _counted(real_events_after(run, after), read)
    turns = 4
    for turn in range(turns):
        part = slice(turn * len(events) // turns, (turn + 1) * len(events) // turns)
        store.record_events(run_id, [
            protocol.Batches(rows[turn * len(rows) // turns:(turn + 1) * len(rows) // turns]),
            *samples[turn * len(samples) // turns:(turn + 1) * len(samples) // turns],
            *events[part]], heartbeat=True)
        live, whole = followed.refresh(), LiveRun.stored(store, run_id, 50)
        assert len(read[-1]) == part.stop - part.start  # only the new ones
        assert live.batches == whole.batches and live.resources == whole.resources
        assert live.elapsed_s == whole.elapsed_s and live.warmup_batches == whole.warmup_batches
        assert live.stacks.merged() == whole.stacks.merged() and live.probes == whole.probes
        assert live.profile_result("ok").to_dict() == whole.profile_result("ok").to_dict()
    assert followed.refresh() is followed.live and read[-1] == []  # nothing new: nothing read
    assert sum(map(len, read)) == len(events)


def _counted(found, read):
    read.append(found[0])
    return found
