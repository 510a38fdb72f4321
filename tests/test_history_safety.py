"""The history survives what ends a process mid-way (issue 64 item 4): a prune killed with
SIGKILL while it deletes and while it gives the space back, a writer killed while it keeps the
history within its limits (what a job and the dashboard do as a run starts), and 32 jobs
writing at once while the dashboard reads. Each leaves a file that opens, passes SQLite's
integrity check, and holds every run it was not deleting whole. Real processes, real SQLite."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from dataloader_tuner import RunStore, protocol
from dataloader_tuner.store import retention

from .conftest import ROOT
from .records import make_batches

RUNS, OLD, ROWS = 8, 4, 60_000  # runs in the history, the oldest of them past the age limit
DAY = 86_400.0


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> str:
    """A history of RUNS finished runs of ROWS batch rows and some events each, the first OLD
    ended 40 days ago."""
    path = str(tmp_path_factory.mktemp("built") / "runs.sqlite")
    store = RunStore(path)
    rows = [b.to_row() for b in make_batches(ROWS)]
    stacks = protocol.Profiled(1, 0, [["worker", [["data.py", 1, f"f{i}", 2]] * 10, 0.1, 0.1, 1]
                                      for i in range(30)])
    for n in range(RUNS):
        run_id = store.create_run("watch", "t.py", {})
        for start in range(0, ROWS, 5000):
            store.record_events(run_id, [protocol.Batches(rows[start:start + 5000]), stacks])
        with store._conn() as conn:  # (ended: by age, the first OLD are past a 30-day limit)
            conn.execute("UPDATE runs SET status = 'ok', ended_at = ? WHERE id = ?",
                         (time.time() - (40 * DAY if n < OLD else 0.0), run_id))
    with store._conn() as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    return path


def _copy(built: str, folder) -> str:
    path = str(folder / "runs.sqlite")
    shutil.copy(built, path)
    return path


def _counts(path: str) -> dict[int, int]:
    with sqlite3.connect(path, timeout=10) as conn:
        listed = [r[0] for r in conn.execute("SELECT id FROM runs")]
        return {run_id: conn.execute("SELECT COUNT(*) FROM batch_rows WHERE run_id = ?",
                                     (run_id,)).fetchone()[0] for run_id in listed}


def _whole_after(path: str) -> dict[int, int]:
    """The history as a new process finds it: it opens, it is intact; each run's rows."""
    with sqlite3.connect(path, timeout=10) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    RunStore(path).list_runs()
    return _counts(path)


def _old_runs(path: str, old: list[int]) -> list[tuple[bool, int | None]]:
    """Each old run: is it listed, and its first batch row left (rows go lowest first)."""
    with sqlite3.connect(path, timeout=10) as conn:
        return [(conn.execute("SELECT 1 FROM runs WHERE id = ?", (r,)).fetchone() is not None,
                 conn.execute("SELECT MIN(seq) FROM batch_rows WHERE run_id = ?", (r,))
                 .fetchone()[0]) for r in old]


def _killed_when(command: list[str], path: str, old: list[int], ready) -> None:
    """``command`` started, then SIGKILLed as soon as ``ready`` holds of the old runs."""
    job = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while job.poll() is None and time.monotonic() < deadline:
            if ready(_old_runs(path, old)):
                break
            time.sleep(0.005)
        assert job.poll() is None, "it ended before the moment it was to be killed at"
        job.send_signal(signal.SIGKILL)
    finally:
        job.kill()
        job.wait()


PRUNE = [sys.executable, "-m", "dataloader_tuner", "runs", "--prune", "--max-days", "30",
         "--max-gb", "0", "--db"]
KEEP_WITHIN = [sys.executable, "-c", "import sys; from dataloader_tuner.store import retention; "
               "retention.keep_within(sys.argv[1], retention.Limits(None, 30 * 86400.0))"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["prune", "keep_within"])
@pytest.mark.parametrize("when", ["deleting", "giving the space back"])
def test_a_history_cut_short_mid_prune_opens_whole(built, tmp_path, how, when):
    path = _copy(built, tmp_path)
    before = _counts(path)
    old, kept = sorted(before)[:OLD], sorted(before)[OLD:]
    command = [*PRUNE, path] if how == "prune" else [*KEEP_WITHIN, path]
    if when == "deleting":  # an old run listed with some of its rows gone
        moment = (lambda runs: any(listed and first != 0 for listed, first in runs))
    else:  # every old run gone: the space being given back
        moment = (lambda runs: not any(listed for listed, _first in runs))
    _killed_when(command, path, old, moment)
    if when != "deleting":  # killed before the space was all back: free pages, or a log left
        with sqlite3.connect(path) as conn:
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        assert free > 0 or os.path.getsize(path + "-wal") > 0
    after = _whole_after(path)
    assert all(after[run_id] == ROWS for run_id in kept), after  # every other run whole
    # a run cut short mid-delete is still listed with fewer rows; the next prune takes it
    retention.prune(path, retention.Limits(None, 30 * DAY))
    assert _whole_after(path) == {run_id: ROWS for run_id in kept}


JOB = """
import sys, time
from torch.utils.data import DataLoader
from dataloader_tuner import watch
for batch in watch(DataLoader(range(4 * int(sys.argv[2])), batch_size=4), name="train",
                   db=sys.argv[1]):
    time.sleep(0.002)
"""
READER = """
import os, sys, time
from streamlit.testing.v1 import AppTest
pages = ["from dataloader_tuner.dashboard import watched_page\\nwatched_page.render()\\n",
         "from dataloader_tuner.dashboard import history_page\\nhistory_page.render()\\n"]
renders = 0
while not os.path.exists(sys.argv[1]) or renders == 0:  # (until the jobs are done)
    at = AppTest.from_string(pages[renders % 2], default_timeout=60).run()
    assert not at.exception, at.exception
    renders += 1
print(renders)
"""


@pytest.mark.slow
def test_thirty_two_jobs_write_at_once_while_the_dashboard_reads(tmp_path):
    path, batches, jobs = str(tmp_path / "runs.sqlite"), 300, 32
    env = {**os.environ, "DLTUNER_DB": path, "DLTUNER_AUTOSTART": "0"}
    RunStore(path).close()
    writers = [subprocess.Popen([sys.executable, "-c", JOB, path, str(batches)], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True) for _ in range(jobs)]
    done = str(tmp_path / "the jobs are done")
    reader = subprocess.Popen([sys.executable, "-c", READER, done],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        outs = [w.communicate(timeout=600) for w in writers]
        open(done, "w").close()
        shown, problem = reader.communicate(timeout=300)
    finally:
        for process in (*writers, reader):
            process.kill()
            process.wait()
    assert all(w.returncode == 0 for w in writers), [err for _, err in outs if err][:1]
    assert not [err for _, err in outs if "locked" in err]
    assert reader.returncode == 0 and int(shown) > 0, problem
    store = RunStore(path)
    runs = store.list_runs()
    assert len(runs) == jobs and {r.status for r in runs} == {"ok"}
    assert all(len(store.batches(r.id)) == batches for r in runs)  # every batch counted
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
