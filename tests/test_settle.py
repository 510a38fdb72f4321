"""NOTE [ Runs ended without a word ] (engine/run/settle.py): a watched job whose process is
ended without exit handlers right after its loop completes (as Ray Train ends its workers,
or SIGKILL after SIGTERM's grace) is finished, with its result; one cut mid-epoch is lost with
every batch it wrote."""

import os
import signal
import subprocess
import sys
import time

import pytest

from dataloader_tuner import RunStore
from dataloader_tuner.run.settle import settle_dead_runs

from .conftest import ROOT

# Epochs of 16 batches of ~70 ms. The process dies of SIGKILL, no handler run, 0.1 s after its
# loop (right after its fourth epoch's fifth batch and a second, with ``extra``).
ENDED_OUTRIGHT = """
import os, signal, sys, threading, time
from torch.utils.data import DataLoader
from dataloader_tuner import watch

db, where, extra = sys.argv[1], sys.argv[2], int(sys.argv[3])

class Slow:
    def __len__(self):
        return 128
    def __getitem__(self, index):
        time.sleep(0.008)
        return index

def train():
    loader = watch(DataLoader(Slow(), batch_size=8, num_workers=0), name="train", db=db)
    for epoch in range(3):
        for batch in loader:
            time.sleep(0.005)
    if extra:  # a fourth epoch, cut after ``extra`` batches
        for taken, batch in enumerate(loader, 1):
            if taken == extra:
                break
        time.sleep(1.0)  # its batches written (the recorder's flushes)
    else:  # the epoch's end is written by the writer thread, woken at once; a launcher takes
        time.sleep(0.1)  # longer than this to end the process (Ray: seconds)
    os.kill(os.getpid(), signal.SIGKILL)

if where == "thread":  # as Ray Train runs the training function: off the main thread
    worker = threading.Thread(target=train)
    worker.start()
    worker.join()
else:
    train()
"""


def _ended_outright(db_path: str, where: str, extra: int) -> int:
    """Runs the job to its SIGKILL; returns its run's id once the history settled it."""
    job = subprocess.run([sys.executable, "-c", ENDED_OUTRIGHT, db_path, where, str(extra)],
                         cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=120)
    assert job.returncode == -signal.SIGKILL, job.stderr
    store = RunStore(db_path)
    (run,) = store.list_runs()
    assert run.status == "running"  # nobody said goodbye...
    deadline = time.monotonic() + 15  # ...until its writer is found gone (5 s of silence)
    while store.get_run(run.id).status == "running" and time.monotonic() < deadline:
        settle_dead_runs(store)
        time.sleep(0.5)
    return run.id


@pytest.mark.slow  # a job of ~5 s, then the 5 s of silence that says its writer is gone
@pytest.mark.parametrize("where", ["main", "thread"])
def test_a_job_killed_right_after_its_loop_completes_is_finished_with_its_result(db_path,
                                                                                 where):
    store = RunStore(db_path)
    run = store.get_run(_ended_outright(db_path, where, extra=0))
    assert run.status == "ok" and run.result is not None, run
    assert run.result.batches == 3 * 16 and run.result.epochs == 3
    assert run.ended_at is not None and run.ended_at <= time.time()
    assert settle_dead_runs(store) == []  # settled once


@pytest.mark.slow
def test_a_job_killed_mid_epoch_is_lost_with_every_batch_it_wrote(db_path):
    store = RunStore(db_path)
    run = store.get_run(_ended_outright(db_path, "main", extra=5))
    assert run.status == "lost" and run.result is None
    assert len(store.batches(run.id)) == 3 * 16 + 5
