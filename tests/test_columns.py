"""The engine's loop writes columns, and rows are built from them off the loop
(record/columns.py, record/loop.ColumnLoop): the same rows the per-batch loop writes."""

import gc
import json
import time
import weakref

import pytest

from dataloader_tuner import protocol
from dataloader_tuner.child.measure import LABEL_EVERY, Measurement
from dataloader_tuner.child.starting import starting_config
from dataloader_tuner.child.target import resolve
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.record.columns import NO_STEP_TIMES, BatchColumns
from dataloader_tuner.record.ledger import BatchLedger
from dataloader_tuner.record.loop import BatchSource, ColumnLoop, TimedLoop
from dataloader_tuner.record.taken import rows_of_taken
from dataloader_tuner.record.rows import BatchMeta

from .conftest import dataset_path
from .records import columns_of, make_batches


def _metas():
    """A timed first batch (with its probe), then untimed ones, as the probes send them."""
    yield BatchMeta(-1, 400, 5.0, 0.002, 0.0005, 0.0019, 8, 4096, {"pools": {}})
    for _ in range(5):
        yield (-1, 400, 8)


def _same(rows, others) -> bool:
    """Row for row, floats to rounding (the columns hold absolute clock readings)."""
    return len(rows) == len(others) and all(
        len(a) == len(b) and all(x == pytest.approx(y) if isinstance(x, float) else x == y
                                 for x, y in zip(a, b))
        for a, b in zip(rows, others))


def _epoch(loop, mark, items, step_s=0.0):
    if isinstance(loop, ColumnLoop):  # the step runs inside the loop
        def step(batch):
            time.sleep(step_s)
            return NO_STEP_TIMES

        assert not loop.epoch(mark, BatchSource(iter(items)), step, float("inf"),
                              lambda now: False, 1.0)
        return
    for batch in loop.epoch(mark, BatchSource(iter(items))):
        time.sleep(step_s)


def test_rows_from_columns_are_the_per_batch_loops_rows():
    """The two loops over the same two epochs: every field but the clocks' readings alike, and
    those consistent (the wait inside the time between asks)."""
    items = [([i], meta) for i, meta in enumerate(_metas())]
    per_batch: list = []
    timed = TimedLoop(BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None),
                      per_batch.append)
    columns = BatchColumns(time.monotonic())
    ledger = BatchLedger(columns.t0, lambda *a: None, lambda *a: None)
    column = ColumnLoop(ledger, columns)
    for _ in range(2):
        _epoch(timed, timed.ledger.new_epoch(), items, 0.001)
        _epoch(column, ledger.new_epoch(), items, 0.001)
    rows = columns.rows()
    per_batch = rows_of_taken(timed.ledger.t0, per_batch)
    assert len(rows) == len(per_batch) == 12
    clocks = ("t_request", "wait_s", "step_s", "fetch_start")  # (since each loop's own t0)
    for ours, theirs in zip(rows, per_batch):
        assert {k: v for k, v in ours._asdict().items() if k not in clocks} == \
            {k: v for k, v in theirs._asdict().items() if k not in clocks}
        assert ours.step_s >= 0.001 and ours.wait_s >= 0
    assert [r.epoch for r in rows] == [0] * 6 + [1] * 6
    assert rows[0].fetch_start == pytest.approx(5.0 - columns.t0)
    assert all(r.t_request >= prev.t_ready + prev.step_s - 1e-9
               for prev, r in zip(rows, rows[1:]))


def test_the_column_loop_frees_each_batch_before_it_asks_for_the_next():
    """NOTE [ One batch, in order ]: the step's reference is a batch's last; a step that raises
    still has its batch's row written, and the loop stops where it is told to."""
    class Batch:
        pass

    made = [Batch() for _ in range(4)]
    refs = [weakref.ref(b) for b in made]

    def produce():
        while made:
            yield made.pop(0), (0, 0, 1)

    columns = BatchColumns(time.monotonic())
    loop = ColumnLoop(BatchLedger(columns.t0, lambda *a: None, lambda *a: None), columns)
    seen: list[int] = []

    def step(batch):
        index = [r() for r in refs].index(batch)
        gc.collect()
        assert all(r() is None for r in refs[:index])  # the batches before: freed already
        seen.append(index)
        if index == 1:
            raise KeyError("the job's step")
        return (0.5, None, None)

    with pytest.raises(KeyError):
        loop.epoch(loop.ledger.new_epoch(), BatchSource(produce()), step, float("inf"),
                   lambda now: False, 1.0)
    assert seen == [0, 1] and len(columns) == 2  # the raising step's batch written too
    assert columns.step_times == {0: (0.5, None, None)}
    assert loop.epoch(loop.ledger.new_epoch(), BatchSource(produce()), step, 2,
                      lambda now: False, 1.0)  # batch number 2 was the last to take
    assert seen == [0, 1, 2] and len(columns) == 3 and len(made) == 1


def test_the_column_loop_asks_whether_to_stop_every_check_s_and_writes_that_batch():
    columns = BatchColumns(time.monotonic())
    loop = ColumnLoop(BatchLedger(columns.t0, lambda *a: None, lambda *a: None), columns)
    asked: list[float] = []

    def stopping(now: float) -> bool:
        asked.append(now)
        return len(asked) == 3

    def step(batch):
        time.sleep(0.002)
        return NO_STEP_TIMES

    items = iter([([i], (-1, 400, 1)) for i in range(1000)])
    assert loop.epoch(loop.ledger.new_epoch(), BatchSource(items), step, float("inf"),
                      stopping, 0.02)
    n = len(columns)
    assert len(asked) == 3 and loop.ledger.seq == n and columns.metas[-1] == (-1, 400, 1)
    # The first batch, then every ~20 ms of 2 ms steps: not every batch (a loaded host's
    # sleeps overshoot, so fewer than 20 ms / 2 ms a check; 13 seen under an install)
    assert 2 * len(asked) <= n <= 40
    assert all(b - a >= 0.02 for a, b in zip(asked, asked[1:]))
    assert asked[-1] == columns.clocks[-1]  # asked with the stopped batch's end


def test_columns_cross_the_pipe_as_rows_and_a_flush_takes_only_whole_batches():
    rows = make_batches(30, workers=2)
    rows = [r._replace(epoch=0 if r.seq < 12 else 1) for r in rows]
    rows[5] = rows[5]._replace(fetch_s=None, fetch_start=None, collate_s=None,
                               fetch_cpu_s=None, nbytes=None)  # an untimed batch
    rows[7] = rows[7]._replace(h2d_ms=0.5, h2d_other_ms=0.7)
    columns = columns_of(rows)
    assert _same(columns.rows(), rows)
    # the first flush takes 20 (the loop goes on appending), the second the rest
    first = columns.peek()
    columns.drop(20)
    columns.clocks.extend([0.0, 0.0])  # a batch half written: its meta not yet in
    second = columns.peek()
    assert len(first) == 30 and len(second) == 10 and second.first_seq == 20
    decoded = protocol.decode(protocol.encode(protocol.Batches.of_columns(second)))
    assert isinstance(decoded, protocol.Batches)
    assert _same(decoded.rows, rows[20:])
    assert {r[1] for r in decoded.rows} == {1}  # the epoch begun before the flush's first


def test_a_columns_line_is_the_json_of_its_wire_form():
    # (written by hand, its base64 strings unscanned: the same document json would write)
    columns = columns_of(make_batches(40, workers=2))
    columns.step_times[3] = (0.5, None, 1.25)
    line = protocol.encode(protocol.Batches.of_columns(columns))
    assert line.endswith(b"}\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"e": "batches", "columns": json.loads(json.dumps(
        columns.to_wire()))}
    assert json.loads(protocol.encode(protocol.Batches.of_columns(BatchColumns()))) == {
        "e": "batches", "columns": json.loads(json.dumps(BatchColumns().to_wire()))}


def test_the_measurement_counts_labels_on_the_batches_it_looks_at():
    resolved = resolve(dataset_path("small_map.py"))
    config = starting_config(resolved, dict(batch_size=4))
    columns = BatchColumns()
    measurement = Measurement(resolved, config, Consumer(), 30.0, columns, max_batches=40,
                              labels=True)
    measurement.run()
    measurement.close()
    assert len(columns) == 40
    looked = 40 // LABEL_EVERY
    assert sum(measurement.label_counts.values()) == 4 * looked
