"""The one per-batch loop (record/loop.py), on hand-made batch sources."""

import gc
import time
import weakref

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
