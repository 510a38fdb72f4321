"""The history kept within its limits (NOTE [ Keeping the history within its limits ],
engine/store/retention.py): runs deleted with everything they hold, never a running one, pruned
by age and by size, and the space handed back to the file system; real SQLite, real runs."""

import json
import sqlite3
import time

import pytest
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner import RunStore, watch
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.run.runner import RunHandle, RunState
from dataloader_tuner.store import retention, schema

from .conftest import dataset_path
from .replay import replayed_starter
from .test_cli import cli


class Samples(Dataset):
    """1 ms a sample: batches slow enough to keep a row each (not folded into windows)."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> int:
        time.sleep(0.001)
        return index


def _watched_runs(db_path: str, count: int, batches: int = 64) -> list[int]:
    """``count`` finished watched runs of ``batches`` batches each (rows, events, resources)."""
    ids = []
    for n in range(count):
        watched = watch(DataLoader(Samples(4 * batches), batch_size=4), name=f"run{n}",
                        db=db_path)
        for _batch in watched:
            pass
        watched.close()
        ids.append(watched.run_id)
    return ids


def _rows(db_path: str, run_id: int) -> dict[str, int]:
    with sqlite3.connect(db_path) as conn:
        return {table: conn.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?",
                                    (run_id,)).fetchone()[0]
                for table in ("batch_rows", "run_events", "resources", "batch_windows")}


def _intact(db_path: str) -> bool:
    with sqlite3.connect(db_path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_deleted_run_takes_its_rows_and_events_and_a_running_one_is_refused(db_path):
    first, second, third = _watched_runs(db_path, 3)
    assert _rows(db_path, second)["batch_rows"] == 64 and _rows(db_path, second)["run_events"]
    running = RunStore(db_path).create_run("watch", "job.py", {})
    with pytest.raises(retention.RunningRun, match=f"run {running} is still running"):
        retention.delete_runs(db_path, [second, running])
    assert {run.id for run in RunStore(db_path).list_runs()} == {first, second, third, running}
    with pytest.raises(KeyError, match="no run 99"):
        retention.delete_runs(db_path, [99])
    done = retention.delete_runs(db_path, [second])
    assert done.deleted == (second,) and done.given_back and done.bytes_after < done.bytes_before
    assert {run.id for run in RunStore(db_path).list_runs()} == {first, third, running}
    assert set(_rows(db_path, second).values()) == {0}
    assert _rows(db_path, first)["batch_rows"] == 64 and _intact(db_path)


def test_a_prune_deletes_by_age_then_oldest_first_by_size_and_gives_the_space_back(db_path):
    ids = _watched_runs(db_path, 4, batches=400)
    running = RunStore(db_path).create_run("watch", "job.py", {})
    long_ago = time.time() - 200 * retention.DAY_S
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE runs SET ended_at = ? WHERE id = ?", (long_ago, ids[1]))
    by_age = retention.prune(db_path, retention.Limits(None, 180 * retention.DAY_S))
    assert by_age.deleted == (ids[1],)  # the old one only, whatever its place
    file_before = retention.file_bytes(db_path)
    used = retention.used_bytes(db_path)
    # Room for all but about half a run (of three, beside the tables' own pages): the oldest
    by_size = retention.prune(db_path, retention.Limits(used * 0.85, None))
    assert by_size.deleted == (ids[0],) and by_size.bytes_after <= used * 0.85
    assert retention.file_bytes(db_path) < file_before  # handed back to the file system
    everything = retention.prune(db_path, retention.Limits(1, None))  # room for nothing
    assert running not in everything.deleted
    assert [run.id for run in RunStore(db_path).list_runs()] == [running] and _intact(db_path)


def test_the_limits_come_from_the_command_line_the_environment_or_the_defaults(monkeypatch):
    monkeypatch.delenv(retention.MAX_GB_ENV, raising=False)
    monkeypatch.delenv(retention.MAX_DAYS_ENV, raising=False)
    assert retention.Limits.from_env().text() == "4 GB, runs 180 days"
    monkeypatch.setenv(retention.MAX_GB_ENV, "0.5")
    monkeypatch.setenv(retention.MAX_DAYS_ENV, "0")
    assert retention.Limits.from_env().text() == "0.5 GB, no age limit"
    assert retention.Limits.from_env(max_gb=2).max_bytes == 2 * retention.GB
    monkeypatch.setenv(retention.MAX_GB_ENV, "two")
    with pytest.raises(ValueError, match="DLTUNER_HISTORY_MAX_GB='two' is not a number"):
        retention.Limits.from_env()


def test_limits_saved_in_the_history_hold_where_neither_flag_nor_environment_sets_them(
        db_path, monkeypatch):
    """The History page saves them in the history itself: every job writing there keeps them
    (a watched run's first flush prunes by them), the command line and the environment first."""
    monkeypatch.delenv(retention.MAX_GB_ENV, raising=False)
    monkeypatch.delenv(retention.MAX_DAYS_ENV, raising=False)
    old, recent = _watched_runs(db_path, 2, batches=8)
    assert retention.saved_limits(db_path) == retention.SavedLimits(None, None)
    retention.save_limits(db_path, 1.5, 30)
    assert retention.Limits.for_history(db_path).text() == "1.5 GB, runs 30 days"
    assert retention.Limits.for_history(db_path, max_days=7).text() == "1.5 GB, runs 7 days"
    monkeypatch.setenv(retention.MAX_GB_ENV, "2")
    assert retention.Limits.for_history(db_path).text() == "2 GB, runs 30 days"
    assert retention.overridden_by_env() == [retention.MAX_GB_ENV]
    with pytest.raises(ValueError, match="not negative"):
        retention.save_limits(db_path, -1, 30)
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE runs SET ended_at = ? WHERE id = ?",
                     (time.time() - 40 * retention.DAY_S, old))
    (new,) = _watched_runs(db_path, 1, batches=8)
    assert {run.id for run in RunStore(db_path).list_runs()} == {recent, new}
    pruned = cli("runs", "--prune", db=db_path)
    assert "limits: 2 GB, runs 30 days" in pruned.stdout, pruned.stdout


def test_runs_delete_and_prune_from_the_command_line(db_path):
    first, second = _watched_runs(db_path, 2)
    refused = cli("runs", "--delete", "99", db=db_path)
    assert refused.returncode == 2 and "no run 99 in" in refused.stdout
    deleted = cli("runs", "--delete", str(first), "--json", db=db_path)
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["deleted"] == [first]
    kept = cli("runs", "--prune", "--max-gb", "1", "--max-days", "30", db=db_path)
    assert kept.returncode == 0 and "deleted 0 run(s) (none)" in kept.stdout
    assert "limits: 1 GB, runs 30 days" in kept.stdout
    assert [run.id for run in RunStore(db_path).list_runs()] == [second]


def test_a_watched_run_keeps_the_history_within_its_limits_as_it_starts(db_path, monkeypatch):
    """No one prunes: the next watched run's writer deletes the runs past the age limit at its
    first flush, and gives their space back in steps (a new history allows it)."""
    old, recent = _watched_runs(db_path, 2, batches=150)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental
        conn.execute("UPDATE runs SET ended_at = ? WHERE id = ?",
                     (time.time() - 40 * retention.DAY_S, old))
    monkeypatch.setenv(retention.MAX_DAYS_ENV, "30")
    size_before = retention.file_bytes(db_path)
    (new,) = _watched_runs(db_path, 1, batches=8)
    assert {run.id for run in RunStore(db_path).list_runs()} == {recent, new}
    assert set(_rows(db_path, old).values()) == {0} and _intact(db_path)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("PRAGMA freelist_count").fetchone()[0] == 0  # given back
    assert retention.file_bytes(db_path) < size_before


def test_an_engine_run_keeps_the_history_within_its_limits_as_it_starts(db_path, monkeypatch):
    """A profile or a tune (the CLI's, the dashboard's) keeps the limits as a watched run does,
    beside its reader: the runs past the age limit are gone by its end, it is kept."""
    old, recent = _watched_runs(db_path, 2, batches=8)
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE runs SET ended_at = ? WHERE id = ?",
                     (time.time() - 40 * retention.DAY_S, old))
    monkeypatch.setenv(retention.MAX_DAYS_ENV, "30")
    request = RunRequest(dataset_path("small_map.py"), settings={"num_workers": 2},
                         seconds=2.0, step_ms=2.0)  # as recorded (tests/replay.py)
    with RunHandle(request, RunStore(db_path), starter=replayed_starter()) as handle:
        assert handle.wait(30) == RunState.FINISHED
    assert {run.id for run in RunStore(db_path).list_runs()} == {recent, handle.run_id}
    assert set(_rows(db_path, old).values()) == {0} and _intact(db_path)


def test_keeping_within_the_size_deletes_the_oldest_runs_in_one_pass(db_path):
    ids = _watched_runs(db_path, 4, batches=150)
    running = RunStore(db_path).create_run("watch", "job.py", {})
    used = retention.used_bytes(db_path)
    gone = retention.keep_within(db_path, retention.Limits(used * 0.7, None))
    assert gone and gone == tuple(ids[:len(gone)]) and len(gone) < 4  # the oldest first
    assert running in {run.id for run in RunStore(db_path).list_runs()} and _intact(db_path)


def _plan(db_path: str) -> str:
    with sqlite3.connect(db_path) as conn:
        return " ".join(row[-1] for row in conn.execute(
            "EXPLAIN QUERY PLAN SELECT body_json FROM run_events WHERE run_id = 1"))


def test_an_older_history_gains_the_events_index_at_open_or_at_its_first_prune(
        db_path, monkeypatch):
    """NOTE [ Indexes a history gains later ] (store/schema.py): a run's events read by index,
    not by scanning every run's; a small older table is indexed when opened, a large one (here:
    more rows than the threshold, lowered) only by a prune, which holds the lock anyway."""
    _watched_runs(db_path, 2, batches=8)
    assert "USING INDEX run_events_run" in _plan(db_path)
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP INDEX run_events_run")
    assert "USING INDEX" not in _plan(db_path)
    monkeypatch.setattr(schema, "INDEX_AT_OPEN_ROWS", 1)  # the table counts as large
    RunStore(db_path)
    assert "USING INDEX" not in _plan(db_path)
    retention.prune(db_path, retention.Limits(None, None))
    assert "USING INDEX run_events_run" in _plan(db_path) and _intact(db_path)
    with sqlite3.connect(db_path) as conn:
        conn.execute("DROP INDEX run_events_run")
    monkeypatch.setattr(schema, "INDEX_AT_OPEN_ROWS", 200_000)
    RunStore(db_path)
    assert "USING INDEX run_events_run" in _plan(db_path)


def test_a_prune_keeps_each_run_s_headline_where_an_older_version_kept_none(db_path):
    """The headline samples/s beside a run's result (the Training jobs page lists by it): a
    run an older version ended has none until a prune reads it from its result."""
    ids = _watched_runs(db_path, 2, batches=8)
    store = RunStore(db_path)
    rates = [store.get_run(run_id).samples_per_s for run_id in ids]
    assert all(rates)
    with sqlite3.connect(db_path) as conn:  # as an older version left them
        conn.execute("UPDATE runs SET samples_per_s = NULL")
    assert [run.headline for run in store.list_runs(kind="watch", results=False)] == [None] * 2
    retention.prune(db_path, retention.Limits(None, None))
    listed = store.list_runs(kind="watch", results=False)
    assert [run.headline for run in listed] == rates[::-1]
    assert [run.result for run in listed] == [None] * 2 and _intact(db_path)


def test_a_prune_passes_over_a_result_it_cannot_read(db_path):
    """One unreadable saved result leaves that run without a headline, not the prune failed."""
    ids = _watched_runs(db_path, 2, batches=8)
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE runs SET samples_per_s = NULL")
        conn.execute("UPDATE runs SET summary_json = ? WHERE id = ?", (b"not zlib", ids[0]))
    retention.prune(db_path, retention.Limits(None, None))
    with sqlite3.connect(db_path) as conn:
        kept = dict(conn.execute("SELECT id, samples_per_s FROM runs").fetchall())
    assert kept[ids[0]] is None and kept[ids[1]] and _intact(db_path)
