"""A worker that never started, still inside fork(), is named as such in an overdue batch's
report (instrument/fork_stuck.py), with the Python release that fixes it."""

import multiprocessing
import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from dataloader_tuner.analyse.overdue import overdue_batches, overdue_now, placed
from dataloader_tuner.child.failures import hang_error
from dataloader_tuner.instrument import fork_stuck
from dataloader_tuner.instrument.stalls import where_stuck
from dataloader_tuner.protocol import Overdue

pytestmark = pytest.mark.skipif(not fork_stuck.torch_names_its_workers(),
                                reason="this torch's workers do not name their processes")


@pytest.fixture(params=["default", "fork"])
def forked_sleeper(request):
    """A real forked process that never reaches a worker loop (it sleeps instead), made as a
    DataLoader without a context makes its workers (torch.multiprocessing's default context,
    whose processes say no start method of their own) or with ``"fork"``."""
    context = torch.multiprocessing if request.param == "default" else (
        multiprocessing.get_context("fork"))
    process = context.Process(target=time.sleep, args=(30,))
    process.start()
    yield process
    process.kill()
    process.join()


def test_a_forked_process_that_never_reached_the_worker_loop_is_stuck(forked_sleeper):
    assert not fork_stuck.stuck_in_fork(forked_sleeper, after_s=30)  # not yet: just made
    time.sleep(0.3)
    assert fork_stuck.stuck_in_fork(forked_sleeper, after_s=0.2)


def test_a_real_worker_a_spawned_one_and_one_not_started_are_not(forked_sleeper):
    iterator = iter(DataLoader(torch.arange(8.0), batch_size=2, num_workers=1))
    try:
        next(iterator)  # its worker is in its loop now
        time.sleep(0.3)
        assert not fork_stuck.stuck_in_fork(iterator._workers[0], after_s=0.2)
    finally:
        iterator._shutdown_workers()
    # A spawned or forkserver worker imports torch before its loop: seconds, not a hang.
    spawned = SimpleNamespace(pid=forked_sleeper.pid, _start_method="spawn")  # (live, unnamed)
    assert not fork_stuck.stuck_in_fork(spawned, after_s=0.0)
    not_started = multiprocessing.get_context("fork").Process(target=time.sleep, args=(5,))
    assert not fork_stuck.stuck_in_fork(not_started, after_s=0.0)  # no pid: not this process


def test_the_python_releases_with_the_fork_bug():
    assert fork_stuck.python_has_the_fork_bug((3, 11, 7))
    assert fork_stuck.python_has_the_fork_bug((3, 10, 14))
    assert not fork_stuck.python_has_the_fork_bug((3, 11, 10))
    assert not fork_stuck.python_has_the_fork_bug((3, 12, 1))


def test_the_overdue_batch_s_worker_is_reported_inside_fork(forked_sleeper, monkeypatch):
    """where_stuck marks the outstanding batch whose worker never started; the live line and
    the run's diagnostic say where it is and what fixes it."""
    monkeypatch.setattr(fork_stuck, "STUCK_AFTER_S", 0.2)
    iterator = iter(DataLoader(torch.arange(8.0), batch_size=2, num_workers=1))
    try:
        time.sleep(0.3)
        found = where_stuck(iterator, None)  # its batches asked for, none received yet
        assert found and not any(entry.get("stuck_in_fork") for entry in found)
        real = iterator._workers[0]
        iterator._workers[0] = forked_sleeper  # as if worker 0 had never left fork()
        found = where_stuck(iterator, None)
        iterator._workers[0] = real
    finally:
        iterator._shutdown_workers()
    assert found[0]["worker_id"] == 0
    assert found[0]["stuck_in_fork"].startswith("inside fork(): it never started")
    report = Overdue(0, 0.1, 25.0, None, True, found)
    line = overdue_now(report)
    assert "waiting on worker 0" in line and ", inside fork(): it never started" in line
    assert "at inside" not in line
    if fork_stuck.python_has_the_fork_bug():
        assert "gh-112275" in line
    [diagnostic] = overdue_batches([report], [])
    assert "inside fork()" in diagnostic.message
    assert 'multiprocessing_context="forkserver"' in diagnostic.fix
    headline = hang_error(60, found).message
    assert "Waiting on worker 0" in headline and ", inside fork(): it never started" in headline


def test_a_place_is_said_with_at_unless_it_is_inside_fork():
    assert placed("slow.py:18 in __getitem__") == "at slow.py:18 in __getitem__"
    assert placed("inside fork(): it never started") == "inside fork(): it never started"


def _sleep_at_start(worker_id):
    time.sleep(1.5)  # as a worker asleep in its start-up (a watched Lightning fit's, seeding)


def test_a_worker_asleep_in_its_start_up_is_named_with_how_to_read_its_stack():
    """Past fork() but not yet at the dataset, and no stacks folder (a watched job's): its stack
    cannot be read here, so the line and the hang's error give its pid to read it with."""
    loader = DataLoader(torch.arange(8.0), batch_size=2, num_workers=1,
                        worker_init_fn=_sleep_at_start)
    iterator = iter(loader)
    try:
        time.sleep(0.3)
        found = where_stuck(iterator, None)
        pid = iterator._workers[0].pid
    finally:
        iterator._shutdown_workers()  # (once its start-up's sleep ends: killed, torch's
        # SIGCHLD handler would raise in whatever this process runs next)
    assert found[0]["worker_id"] == 0 and found[0]["pid"] == pid
    assert found[0]["stack"] is None and not found[0].get("stuck_in_fork")
    command = f"`py-spy dump --native --pid {pid}` shows where it is"
    line = overdue_now(Overdue(0, 0.1, 25.0, None, True, found))
    assert "waiting on worker 0" in line and f"its stack could not be read; {command}" in line
    [diagnostic] = overdue_batches([Overdue(0, 0.1, 25.0, None, True, found)], [])
    assert command in diagnostic.message
    assert command in hang_error(60, found).details
