"""The one per-batch loop (record/loop.py), on hand-made batch sources."""

import gc
import time
import weakref

import pytest
import torch
from torch.utils.data import DataLoader

from dataloader_tuner import watch
from dataloader_tuner.record.ledger import BatchLedger
from dataloader_tuner.record.loop import BatchSource, TimedLoop


class Batch:
    """A batch a weak reference can follow."""


def test_the_loop_holds_no_batch_while_the_job_has_it():
    """Freeing a batch is the job's, when it lets go, as unwatched (NOTE [ One batch, in
    order ]): nothing in the loop keeps it alive."""
    made = [Batch() for _ in range(3)]
    refs = [weakref.ref(b) for b in made]

    def produce():  # hands each batch over and keeps none
        while made:
            yield made.pop(0), (0, 0, 1)  # (an untimed batch's meta: worker, pid, samples)

    rows: list = []
    loop = TimedLoop(BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None), rows.append)
    batches = loop.epoch(loop.ledger.new_epoch(), BatchSource(produce()))
    batch = next(batches)
    assert refs[0]() is batch
    del batch
    gc.collect()
    assert refs[0]() is None  # freed with the job's reference, not at the next batch
    assert next(batches) is refs[1]()
    assert len(rows) == 1


def test_a_watched_loop_frees_each_batch_when_it_lets_go(db_path):
    watched = watch(DataLoader(torch.arange(32.0), batch_size=8, num_workers=2), name="free",
                    db=db_path)
    try:
        freed = []
        for batch in watched:
            ref = weakref.ref(batch)
            del batch
            freed.append(ref() is None)
        assert freed == [True] * 4
    finally:
        watched.close()


def test_a_one_ahead_epoch_s_end_lands_on_its_last_batch_s_wait():
    """A wrapper that asks one batch ahead (accelerate) asks for the epoch's end inside the
    loop's wait for the last batch: that batch's wait takes the end in, its step unchanged."""
    from dataloader_tuner.record.taken import ended, rows_of_taken

    last = (9, 1, 10.0, 10.5, 11.0, (0, 5, 8), (None, None, None))
    (before,) = rows_of_taken(0.0, [last])
    (after,) = rows_of_taken(0.0, [ended(last, 13.0)])
    assert (after.wait_s, after.step_s, after.t_request) == (2.5, before.step_s, 10.0)
    assert ended(last, 10.9) == last  # an end before the step's: nothing to take in

    rows: list = []
    loop = TimedLoop(BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None),
                     rows.append, ahead=True)
    batches = loop.epoch(loop.ledger.new_epoch(),
                         BatchSource(iter([(i, (0, 0, 1)) for i in range(3)])))
    for seen, _ in enumerate(batches):
        assert len(rows) == seen  # each held until the next batch came
    assert [batch[0] for batch in rows] == [0, 1, 2]
    assert rows[-1][4] >= rows[-1][3]


def test_a_steady_epoch_s_waits_and_steps_tile_the_loop_s_time():
    """After an epoch's first batch, each wait starts at the clock reading that ended the
    batch before's step, as the loop's own clock has it: nothing between the two goes
    untimed; while the loader is asked, the window says since when (the job's sampler)."""
    from dataloader_tuner.record.ledger import NEXT_WINDOW

    seen_window: list = []

    def produce():
        for i in range(5):
            seen_window.append(NEXT_WINDOW.since)
            time.sleep(0.002)
            yield i, (0, 0, 1)

    rows: list = []
    loop = TimedLoop(BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None), rows.append)
    started = time.monotonic()
    for _ in loop.epoch(loop.ledger.new_epoch(), BatchSource(produce())):
        time.sleep(0.001)
    took = time.monotonic() - started
    assert [batch[0] for batch in rows] == [0, 1, 2, 3, 4]
    for before, batch in zip(rows, rows[1:]):
        assert batch[2] == before[4]  # t_request: the batch before's t_back
    waited = sum(b[3] - b[2] for b in rows)
    stepped = sum(b[4] - b[3] for b in rows)
    assert waited + stepped == pytest.approx(rows[-1][4] - rows[0][2])
    assert waited >= 0.010 and stepped >= 0.005 and waited + stepped <= took
    assert all(since is not None for since in seen_window)
    assert NEXT_WINDOW.since is None and loop.ledger.asking_since is None


def test_a_steady_epoch_ends_and_fails_as_its_loader_does():
    """The steady path lets the loader's own error through, the window closed, and the batch
    before it keeps its row."""
    def produce():
        yield 0, (0, 0, 1)
        yield 1, (0, 0, 1)
        raise ValueError("a bad sample")

    rows: list = []
    loop = TimedLoop(BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None), rows.append)
    batches = loop.epoch(loop.ledger.new_epoch(), BatchSource(produce()))
    assert [next(batches), next(batches)] == [0, 1]
    with pytest.raises(ValueError, match="a bad sample"):
        next(batches)
    from dataloader_tuner.record.ledger import NEXT_WINDOW
    assert [b[0] for b in rows] == [0, 1]
    assert NEXT_WINDOW.since is None and loop.ledger.asking_since is None


def test_a_steady_epoch_brackets_each_wait_with_the_gpu_s_events():
    """A CUDA job's loop (GPU events around each wait): every batch, the epoch's first and
    the steady ones after it, is asked for and handed over in turn, its gaps resolved to the
    ledger."""
    calls: list = []

    class Gaps:
        def asking(self) -> None:
            calls.append("asking")

        def handed(self, seq: int) -> None:
            calls.append(seq)

        def resolved(self) -> list:
            return [(calls[-1], 0.5)]

    ledger = BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None, Gaps())
    loop = TimedLoop(ledger, [].append)
    assert list(loop.epoch(ledger.new_epoch(), BatchSource(iter([(i, (0, 0, 1))
                                                                 for i in range(3)])))) == [0, 1, 2]
    assert calls[:6] == ["asking", 0, "asking", 1, "asking", 2]
    assert ledger.resolved_gaps == [(0, 0.5), (1, 0.5), (2, 0.5)]


def test_an_epoch_that_runs_out_is_told_with_its_last_batch_emitted_and_one_cut_is_not():
    """NOTE [ Runs ended without a word ] (run/settle.py): the end is said once every batch of
    the epoch went out; a loop that breaks off has not ended its epoch."""
    rows: list = []
    told: list = []
    ledger = BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None)
    loop = TimedLoop(ledger, rows.append,
                     ran_out=lambda epoch: told.append((epoch, len(rows))))

    def batches(n):
        return BatchSource(iter([(i, (0, 0, 1)) for i in range(n)]))

    assert len(list(loop.epoch(ledger.new_epoch(), batches(4)))) == 4
    assert told == [(0, 4)]
    cut = loop.epoch(ledger.new_epoch(), batches(4))
    next(cut)
    cut.close()  # the loop broke off
    assert len(told) == 1
