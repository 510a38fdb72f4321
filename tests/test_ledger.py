"""The per-batch core every measuring loop shares (record/ledger.py): numbering, epochs with
their start-up, first-seen workers, and 'waiting in next()' cleared however the wait ends."""

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from dataloader_tuner.record.ledger import UNKNOWN_WORKER, BatchLedger, samples_of, unprobed_meta
from dataloader_tuner.record.rows import BatchMeta
from dataloader_tuner.record.taken import rows_of_taken


def meta(pid: int, worker_id: int = 0, samples: int = 4, probe=None) -> BatchMeta:
    return BatchMeta(worker_id, pid, 0.0, 0.001, 0.0, None, samples, 64, probe)


def ledger_with_log():
    log: list = []
    ledger = BatchLedger(time.monotonic(), lambda *a: log.append(("epoch", *a)),
                         lambda *a: log.append(("worker", *a)))
    return ledger, log


def test_batches_are_numbered_across_epochs_and_each_epoch_opens_with_its_start_up():
    ledger, log = ledger_with_log()
    seqs = []
    for _ in range(2):
        mark = ledger.new_epoch()
        iterator = iter([("a", meta(11)), ("b", meta(12, 1))])
        time.sleep(0.01)  # the epoch's start-up: iter() to its first batch
        for _ in range(2):
            (_, m), t_request, t_ready, seq = ledger.next_batch(iterator)
            ledger.handed(mark, t_ready, m)
            seqs.append(seq)
    assert seqs == [0, 1, 2, 3]
    epochs = [entry for entry in log if entry[0] == "epoch"]
    assert [e[1] for e in epochs] == [0, 1] and all(e[3] >= 0.01 for e in epochs)
    assert [entry for entry in log if entry[0] == "worker"] == [("worker", 11, 0, None),
                                                                ("worker", 12, 1, None)]


def test_an_epochs_first_batch_is_waited_for_from_when_the_epoch_was_asked_for():
    ledger, _ = ledger_with_log()
    mark = ledger.new_epoch()
    time.sleep(0.05)  # iter(loader): starting the workers
    iterator = iter([("a", meta(11)), ("b", meta(11))])
    _, t_request, t_ready, _ = ledger.next_batch(iterator, mark)
    assert t_request == mark.start and t_ready - t_request >= 0.05
    ledger.handed(mark, t_ready, meta(11))
    _, t_request, t_ready, _ = ledger.next_batch(iterator, mark)
    assert t_ready - t_request < 0.05  # the next one from its own next()
    switched = time.monotonic()  # a tuned loop swaps loaders: the loop waits from there
    _, t_request, _, _ = ledger.next_batch(iter([("c", meta(11))]), mark, switched)
    assert t_request == switched


def test_the_jobs_own_work_between_iter_and_the_first_next_is_not_waiting():
    """A trainer that makes the epoch's iterator, then runs its hooks (Lightning): the loop
    waits in iter() and in the first next() only, and for an earlier epoch's workers shutting
    down in between."""
    ledger, log = ledger_with_log()
    mark = ledger.new_epoch()
    time.sleep(0.02)  # iter(): starting the workers
    mark.given = time.monotonic()
    time.sleep(0.1)  # the trainer's hooks
    ledger.closed(0.03)  # ...and the previous epoch's iterator dropped, its workers stopped
    _, t_request, t_ready, _ = ledger.next_batch(iter([("a", meta(11))]), mark)
    ledger.handed(mark, t_ready, meta(11))
    waited = t_ready - t_request
    assert 0.05 <= waited < 0.09, waited  # 20 ms in iter() + 30 ms shutting down, not 150 ms
    assert log[0][3] == pytest.approx(waited)  # the epoch's start-up, as lived
    later = ledger.new_epoch()  # once an epoch's first batch came, a shutdown is not its wait
    ledger.handed(later, time.monotonic(), meta(11))
    ledger.closed(5.0)
    assert later.closing == 0.0


def test_two_iterators_at_once_keep_their_own_epochs():
    ledger, log = ledger_with_log()
    first, second = ledger.new_epoch(), ledger.new_epoch()
    for mark in (second, first, second):
        (_, m), _, t_ready, _ = ledger.next_batch(iter([("a", meta(11))]))
        ledger.handed(mark, t_ready, m)
    assert [entry[1] for entry in log if entry[0] == "epoch"] == [1, 0]  # each opened once


def test_the_row_carries_the_batch_as_the_loop_saw_it():
    ledger, _ = ledger_with_log()
    t0 = ledger.t0
    (row,) = rows_of_taken(t0, [(7, 0, t0 + 1.0, t0 + 1.25, t0 + 1.75, meta(11, samples=16),
                                 (0.5, None, 2.0))])
    assert (row.seq, row.epoch, row.t_request, row.wait_s, row.step_s, row.samples) == (
        7, 0, 1.0, 0.25, 0.5, 16)
    assert (row.nbytes, row.worker_pid, row.fetch_start, row.fetch_s) == (64, 11, -t0, 0.001)
    assert (row.h2d_ms, row.h2d_other_ms, row.gpu_gap_ms) == (0.5, None, 2.0)


def test_an_unprobed_batch_notes_no_worker():
    ledger, log = ledger_with_log()
    mark = ledger.new_epoch()
    unprobed = unprobed_meta(8)
    ledger.handed(mark, ledger.t0, unprobed)
    (row,) = rows_of_taken(ledger.t0, [(0, mark.epoch, ledger.t0, ledger.t0, ledger.t0,
                                        unprobed, (None, None, None))])
    assert row.worker_id == UNKNOWN_WORKER and row.samples == samples_of(unprobed) == 8
    assert (row.fetch_start, row.fetch_s, row.collate_s, row.worker_end) == (None,) * 4
    assert not [entry for entry in log if entry[0] == "worker"]


def test_a_batch_whose_making_was_not_timed_keeps_its_worker_and_samples():
    ledger, log = ledger_with_log()
    mark = ledger.new_epoch()
    ledger.handed(mark, ledger.t0, meta(11, worker_id=1))
    ledger.handed(mark, ledger.t0, (1, 11, 32))  # the probes' untimed meta
    (row,) = rows_of_taken(ledger.t0, [(5, mark.epoch, ledger.t0, ledger.t0, ledger.t0,
                                        (1, 11, 32), (None, None, None))])
    assert (row.worker_id, row.worker_pid, row.samples, row.fetch_s) == (1, 11, 32, None)
    assert [entry for entry in log if entry[0] == "worker"] == [("worker", 11, 1, None)]


@pytest.mark.parametrize("ending", [StopIteration, ValueError, KeyboardInterrupt])
def test_the_loop_is_no_longer_shown_waiting_however_the_wait_ends(ending):
    ledger, _ = ledger_with_log()
    ledger.new_epoch()

    def iterator():
        assert ledger.asking_since is not None  # shown waiting while inside next()
        raise ending()
        yield  # a generator

    with pytest.raises(RuntimeError if ending is StopIteration else ending):
        ledger.next_batch(iterator())  # (a generator turns StopIteration into RuntimeError)
    assert ledger.asking_since is None
    assert ledger.seq == 0  # nothing was handed out
    assert ledger.next_error is not None  # the loader's own error, as a tuned loop tells it


class InterruptedOnce(Dataset):
    """Raises KeyboardInterrupt at one index, once (a user's Ctrl-C the job catches)."""

    def __init__(self) -> None:
        self.raised = False

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int):
        if index == 20 and not self.raised:
            self.raised = True
            raise KeyboardInterrupt
        return torch.tensor([float(index)])


def test_a_caught_keyboard_interrupt_while_tuning_leaves_no_rank_shown_stuck(db_path):
    from dataloader_tuner import watch

    watched = watch(DataLoader(InterruptedOnce(), batch_size=4), name="ki", db=db_path,
                    tune=True, max_workers=1)
    assert watched.search is not None  # the tuned loop is the one that ran
    seen = 0
    try:
        for _ in watched:
            seen += 1
    except KeyboardInterrupt:  # the job catches it and goes on
        pass
    assert seen == 5 and watched.ledger.asking_since is None
    watched.close()


def test_samples_riding_with_a_worker_s_first_batch_are_samples_not_its_probe():
    """A worker whose first fetch was not probed (a watched loader's later epochs) may send
    its first samples with its first batch: they go to the profile, and the worker is noted
    with no probe (it was taken for a first fetch's probe, and its samples lost)."""
    log: list = []
    ledger = BatchLedger(time.monotonic(), lambda *a: None,
                         lambda *a: log.append(("worker", *a)))
    ledger.on_profile = lambda *a: log.append(("profile", *a))
    mark = ledger.new_epoch()
    sampled = [["main", [], 0.001, 0.002, 1]]
    ledger.handed(mark, ledger.t0, meta(11, probe={"profile": sampled}))
    ledger.handed(mark, ledger.t0, meta(12, worker_id=1, probe={"rng_used": {}, "pools": {}}))
    assert log == [("worker", 11, 0, None), ("profile", 11, 0, sampled),
                   ("worker", 12, 1, {"rng_used": {}, "pools": {}})]
