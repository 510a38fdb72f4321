"""Overdue batches (instrument/stalls.py, analyse/overdue.py): noticed while the loop still waits,
named with the worker, its sample indices and its stack, for the engine's runs and watched jobs;
a slow sample is not a hang, and the run goes on."""

import os
import shutil
import stat
import tempfile
import time

import pytest
import torch
from torch.utils.data import DataLoader

from dataloader_tuner import protocol, watch
from dataloader_tuner.analyse.overdue import overdue_batches, overdue_now
from dataloader_tuner.instrument import stalls
from dataloader_tuner.record.ledger import BatchLedger
from dataloader_tuner.record.rows import BatchRecord
from dataloader_tuner.record.taken import seconds_of_taken
from dataloader_tuner.watcher.checks import stacks_folder as _stacks_folder

from tests.datasets.slow_indices import SlowOnAFew


def row(seq: int, wait_s: float, step_s: float = 0.0) -> BatchRecord:
    return BatchRecord(seq, 0, 0.0, wait_s, step_s, 4, None, 0, 1, None, None, None)


def usual(batches: int, wait_s: float, step_s: float = 0.0) -> list[float]:
    """What a stall watch reads of ``batches`` taken, each ``wait_s`` then ``step_s``."""
    taken = [(i, 0, 10.0 * i, 10.0 * i + wait_s, 10.0 * i + wait_s + step_s, (0, 1, 4),
              (None, None, None)) for i in range(batches)]
    return seconds_of_taken(taken, stalls.USUAL_SAMPLE)


def waiting_ledger(seq: int, for_s: float, opening: bool = False) -> BatchLedger:
    """A ledger whose loop has been in next() for ``for_s`` seconds, asking for batch ``seq``."""
    ledger = BatchLedger(0.0, lambda *a: None, lambda *a: None)
    ledger.seq, ledger.epochs, ledger.opening = seq, 1, opening
    ledger.asking_since = time.monotonic() - for_s
    return ledger


def where() -> list[dict]:
    return [{"worker_id": 1, "indices": [40, 41], "stack":
             'Current thread 0x1 (most recent call first):\n'
             '  File "/data/my_set.py", line 18 in __getitem__\n\n'
             'Thread 0x2 (most recent call first):\n  File "/x/threading.py", line 3 in run'}]


def test_a_batch_is_overdue_at_many_times_the_usual_and_reported_once():
    watch_ = stalls.StallWatch(0.0)
    # 5 ms a batch
    watch_.observe(usual(100, 0.004, 0.001))
    assert watch_.usual_s == pytest.approx(0.005)
    assert watch_.check(waiting_ledger(100, 0.5), time.monotonic(), where) is None  # < 1 s
    report = watch_.check(waiting_ledger(100, 1.2), time.monotonic(), where)
    assert report is not None and report.seq == 100 and report.waited_s >= 1.2
    assert report.outstanding[0]["indices"] == [40, 41] and not report.opening
    assert watch_.check(waiting_ledger(100, 3.0), time.monotonic(), where) is None  # once
    # slower batches: a higher bar
    watch_.observe(usual(10, 0.2))
    assert watch_.check(waiting_ledger(101, 1.5), time.monotonic(), where) is None
    assert watch_.check(waiting_ledger(101, 2.1), time.monotonic(), where) is not None


def test_an_epochs_first_batch_has_its_start_up_allowed_and_reports_are_capped():
    watch_ = stalls.StallWatch(0.0)
    watch_.observe(usual(100, 0.001))
    assert watch_.check(waiting_ledger(100, 5.0, opening=True), time.monotonic(), where) is None
    late = watch_.check(waiting_ledger(100, stalls.STARTUP_MIN_S + 1, opening=True),
                        time.monotonic(), where)
    assert late is not None and late.opening
    for seq in range(101, 101 + protocol.MAX_OVERDUE + 3):
        watch_.check(waiting_ledger(seq, 2.0), time.monotonic(), where)
    assert watch_.reports == protocol.MAX_OVERDUE
    # before any batch, nothing is known to be usual: no report
    assert stalls.StallWatch(0.0).check(waiting_ledger(0, 9.0), time.monotonic(), where) is None


def test_the_diagnostic_names_the_slowest_with_its_worker_indices_and_line():
    reports = [protocol.Overdue(3, 0.1, 1.1, 0.005, False, where()),
               protocol.Overdue(8, 0.9, 1.0, 0.005, False, [])]
    batches = [row(i, 2.4 if i == 3 else 0.005) for i in range(8)]  # batch 8 never came
    (diagnostic,) = overdue_batches(reports, batches)
    assert diagnostic.code == "overdue_batch" and diagnostic.severity == "warning"
    assert diagnostic.message.startswith("2 batches were overdue (3, 8); the slowest: batch 3 "
                                         "took 2.40 s, 480x the usual 5.0 ms a batch")
    assert ("worker 1 for sample indices [40, 41], at my_set.py:18 in __getitem__"
            in diagnostic.message)
    stack = diagnostic.evidence["stack"]
    assert "my_set.py" in stack and "threading.py" not in stack  # the signalled thread only
    assert [b["took_s"] for b in diagnostic.evidence["batches"]] == [2.4, None]
    assert overdue_batches([], batches) == []
    (unfinished,) = overdue_batches(reports[1:], batches)
    assert "batch 8 had waited 1.00 s when the run ended" in unfinished.message
    # a view of the latest batches only: the late one came, before them
    (earlier,) = overdue_batches(reports[:1], [row(i, 0.005) for i in range(5, 9)])
    assert "batch 3 took over 1.10 s" in earlier.message
    assert overdue_now(reports[0]).startswith("batch 3 has taken 1.10 s so far (usually 5.0 ms")


def test_stack_folders_left_by_killed_processes_are_removed_and_live_ones_kept(monkeypatch):
    monkeypatch.setenv("DATALOADER_TUNER_STACKS", "")  # the folder made here is named there
    tmp = tempfile.gettempdir()
    dead = tempfile.mkdtemp(prefix=f"{stalls.STACKS_PREFIX}999999999-")  # no such pid
    recent_dead = tempfile.mkdtemp(prefix=f"{stalls.STACKS_PREFIX}999999998-")
    alive = tempfile.mkdtemp(prefix=f"{stalls.STACKS_PREFIX}{os.getpid()}-")
    old = time.time() - 2 * stalls.STALE_AFTER_S
    for path in (dead, alive):
        os.utime(path, (old, old))
    made = stalls.new_stacks_folder()
    try:
        assert not os.path.exists(dead)
        assert os.path.isdir(alive) and os.path.isdir(recent_dead)  # a pid may be in use
        assert os.path.dirname(made) == tmp and os.path.isdir(made)
    finally:
        for path in (made, alive, recent_dead):
            shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow  # 3 s each: the fast loop keeps the units above
@pytest.mark.parametrize("workers", [2, 0])
def test_a_watched_job_names_a_slow_sample_with_its_worker_and_stack(db_path, workers, capfd):
    loader = watch(DataLoader(SlowOnAFew(), batch_size=4, num_workers=workers), name="train",
                   db=db_path)
    seen = [int(batch[0, 0]) for batch in loader]
    result = loader.close()
    assert seen == list(range(0, 200, 4))  # every batch, in order: nothing was interrupted
    found = {w.code: w for w in result.warnings}
    late = found["overdue_batch"]
    (batch,) = late.evidence["batches"]
    assert batch["seq"] == 10 and batch["took_s"] >= 1.5
    assert batch["indices"] == [40, 41, 42, 43]
    assert batch["worker_id"] == (0 if workers else -1)
    assert "slow_indices.py" in late.evidence["stack"] and "__getitem__" in late.evidence["stack"]
    assert "at slow_indices.py:18 in __getitem__" in late.message
    said = capfd.readouterr().err
    assert "train: batch 10 has taken" in said and "sample indices [40, 41, 42, 43]" in said


@pytest.mark.slow  # 6 s: DataLoader's own shutdown waits 5 s for the stuck worker
def test_a_worker_stuck_before_its_first_fetch_still_offers_its_stack(tmp_path, monkeypatch):
    """A worker_init_fn that never returns: the probed loader's init offers the stack first."""
    monkeypatch.setenv("DATALOADER_TUNER_STACKS", str(tmp_path))
    from dataloader_tuner.instrument import stacks

    loader = DataLoader(torch.arange(8.0), batch_size=2, num_workers=1,
                        worker_init_fn=stacks.OfferingStack(_sleep_forever))
    iterator = iter(loader)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not list(tmp_path.glob("*.stack")):
            time.sleep(0.1)
        pid = iterator._workers[0].pid
        stack = stacks.worker_stack(str(tmp_path), pid, wait_s=5.0)
        assert stack is not None and "_sleep_forever" in stack
    finally:
        iterator._shutdown_workers()


def test_a_workers_stack_file_is_its_owners_only(tmp_path, monkeypatch):
    """The stack names the user's code and what it read: 0600 in a 0700 folder."""
    monkeypatch.delenv("DATALOADER_TUNER_STACKS", raising=False)  # restored after the test
    umask = os.umask(0o022)  # the usual one: a file made without a mode of its own is 0644
    folder = stalls.new_stacks_folder()  # (names itself in the environment the workers inherit)
    try:
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        from dataloader_tuner.instrument import stacks

        loader = DataLoader(torch.arange(4.0), batch_size=2, num_workers=1,
                            worker_init_fn=stacks.OfferingStack(None))
        assert len(list(loader)) == 2
        stacks = [os.path.join(folder, name) for name in os.listdir(folder)]
        assert stacks and all(stat.S_IMODE(os.stat(s).st_mode) == 0o600 for s in stacks)
    finally:
        os.umask(umask)
        shutil.rmtree(folder, ignore_errors=True)


def _sleep_forever(worker_id: int) -> None:
    time.sleep(3600)


def test_a_stacks_folder_named_by_a_parent_process_is_not_this_ones(monkeypatch):
    """A rank started by rank 0 (Lightning's launcher), or a job launched from a watched
    notebook, inherits its parent's folder in the environment: removed when the parent exits,
    so a watched loader makes its own."""
    parents = tempfile.mkdtemp(prefix=f"{stalls.STACKS_PREFIX}{os.getppid()}-")
    monkeypatch.setenv("DATALOADER_TUNER_STACKS", parents)
    made = ""
    try:
        made = _stacks_folder() or ""
        assert made and made != parents and os.path.isdir(made)
        assert _stacks_folder() == made  # once a process
    finally:
        for path in (parents, made):
            shutil.rmtree(path, ignore_errors=True)
