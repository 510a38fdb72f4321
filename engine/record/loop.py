"""The per-batch loop: a batch asked for, timed, handed over, and its row written when the
loop comes back for the next. A watched epoch and a tuned epoch (watcher/) run ``TimedLoop``;
what differs is where the batches come from, a ``BatchSource``, as torch's
``_BaseDataLoaderIter.__next__`` keeps the shared bookkeeping and its subclasses give
``_next_data``. The engine's own measuring loop (child/measure.py) runs ``ColumnLoop``: the
same order, its batches written as columns (NOTE [ Rows built off the loop ], columns.py).

NOTE [ One batch, in order ]

    1. ``ledger.next_batch``: the wait, from the loop's ``next()`` (or the epoch's ``iter()``,
       or a switch of loaders: ``source.since``) to the batch; in a steady epoch (one
       iterator: no loaders switched) after its first batch, written out in the loop and from the
       clock reading that ended the step before, so waits and steps tile the loop's time;
    2. the batch held from the one before is complete (``Handover.arrived``);
    3. ``ledger.handed``: an epoch's or a worker's first batch is announced, outside the
       timed windows (``ledger.seq - 1`` is the batch the loop holds);
    4. the batch goes to the loop (``yield``); what the loop does until it asks again is its
       step (ColumnLoop runs the step itself, and asks whether to stop after it: in neither
       the step nor the wait). A loop that raises or breaks off there still gets its row,
       with the step until then;
    5. the batch as taken is written (or held one batch, where a wrapper asks one batch
       ahead), its row built later on the recorder's thread (NOTE [ A watched batch's row
       built off the job's thread ], taken.py), and the source is told (``taken``: a tuned
       epoch may switch loaders here, outside the timing).
    The epoch's end closes the source (its workers, unless a loader keeps them) and then
    lets the batch held take in the end's wait.

    Nothing here holds a batch while the loop has it, so the loop's reference is its last, as
    unwatched. Held here, the batch was freed inside the job's next batch's next() (a worker's
    batch unmaps its shared memory: ~1.4 ms for 6 MB, ~4 ms for 19 MB), outside the timed
    wait: Lightning's profiler timed ~1.4 ms a batch more fetching than the tool's wait (65 ms
    an epoch with 19 MB batches), and the job held two batches at once. The one exception: a
    large batch the loop still holds when it asks for the next (it will let go of it when it
    binds the next one's tensors, in its own clock's wait) is held from then until the loop
    asks again, and freed inside that wait (NOTE [ A batch freed where the loop's clock has
    it ], freed.py).
"""

from __future__ import annotations

import time
from threading import get_ident
from typing import Any, Callable, Generator, Iterator

from dataloader_tuner.record import freed
from dataloader_tuner.record.columns import NO_STEP_TIMES, BatchColumns, column_meta
from dataloader_tuner.record.ledger import NEXT_WINDOW, BatchLedger, EpochMark
from dataloader_tuner.record.rows import BatchMeta, UntimedMeta
from dataloader_tuner.record.taken import TakenBatch, ended

Emit = Callable[[TakenBatch], Any]
# A loop's step on a batch: what it timed on a GPU around it (h2d_ms, other_ms, gap_ms)
Step = Callable[[Any], tuple[float | None, float | None, float | None]]


class BatchSource:
    """An epoch's batches: one iterator, its items ``(batch, meta)`` (a probed loader's).
    Subclasses change what an item is, what happens after each batch, and the end."""

    since: float | None = None  # a switch of loaders started then: the next batch waits from it

    def __init__(self, iterator: Iterator[Any]) -> None:
        self.iterator = iterator

    def unpack(self, item: Any) -> tuple[Any, BatchMeta | UntimedMeta]:
        return item

    def recover(self, error: Exception) -> bool:
        """The loader raised ``error``: True where the source went on from another loader
        (the loop asks again), False to let the error through as the job's own."""
        return False

    def taken(self, seq: int, meta: BatchMeta | UntimedMeta, t_request: float,
              t_ready: float, t_back: float) -> None:
        """The loop is back for the next batch after batch ``seq``'s row was written."""

    look_every = 0  # ColumnLoop: look() at every n-th batch (0: never)

    def look(self, seq: int, batch: Any, meta: tuple) -> None:
        """ColumnLoop: batch ``seq`` arrived (outside its wait), before the loop has it."""

    def close(self) -> None:
        """The epoch ran out or the loop left it."""


class Handover:
    """An epoch's batches on their way out. Where a wrapper asks the loader one batch ahead of
    the loop (``ahead``: accelerate), each is held until the next batch or the epoch's end
    came, so that the end's wait lands on the last batch (taken.ended)."""

    __slots__ = ("emit", "ahead", "held")

    def __init__(self, emit: Emit, ahead: bool) -> None:
        self.emit, self.ahead = emit, ahead
        self.held: TakenBatch | None = None

    def arrived(self) -> None:
        """The next batch came: the batch held is complete."""
        if self.held is not None:
            self.emit(self.held)
            self.held = None

    def taken(self, batch: TakenBatch) -> None:
        """The loop is back for another batch after ``batch``."""
        if self.ahead:
            self.held = batch
        else:
            self.emit(batch)

    def end(self, t_end: float | None) -> None:
        """The epoch ran out at ``t_end`` (time.monotonic; None: it broke off)."""
        if self.held is not None:
            self.emit(ended(self.held, t_end) if t_end is not None else self.held)
            self.held = None


def _inherited(method: Callable[..., Any], base: Callable[..., Any]) -> bool:
    """``method`` (bound to a source) is ``base``'s own, not overridden nor set on it."""
    return getattr(method, "__func__", None) is base


class TimedLoop:
    """Epochs of batches through one ledger, each batch as taken to ``emit`` (NOTE [ One
    batch, in order ]). ``step_times``: what the loop measured around the last batch's step on a GPU
    (h2d_ms, other_ms, gap_ms), set before it asks for the next."""

    __slots__ = ("ledger", "emit", "ahead", "step_times", "ran_out")

    def __init__(self, ledger: BatchLedger, emit: Emit, ahead: bool = False,
                 ran_out: Callable[[int], None] | None = None) -> None:
        """``ran_out(epoch)``: told when an epoch ran out, its last batch emitted."""
        self.ledger, self.emit, self.ahead, self.ran_out = ledger, emit, ahead, ran_out
        self.step_times: tuple[float | None, float | None, float | None] = NO_STEP_TIMES

    def epoch(self, mark: EpochMark, source: BatchSource) -> Generator[Any, None, None]:
        """The epoch's batches, each timed; the hot path of every measurement (a plain loop
        over tiny batches takes ~40 us a batch: bench/overhead.py)."""
        ledger, clock, emit, epoch = self.ledger, time.monotonic, self.emit, mark.epoch
        next_batch, handed = ledger.next_batch, ledger.handed
        handover = Handover(emit, self.ahead)
        # (batches go straight out unless held: a call less per batch on the hot path)
        put = handover.taken if self.ahead else emit
        # A source's hooks that do nothing are not called: two calls a batch less (~2k
        # instructions of a watched loop's ~27k: bench/instructions.py)
        unpack = None if _inherited(source.unpack, BatchSource.unpack) else source.unpack
        taken = None if _inherited(source.taken, BatchSource.taken) else source.taken
        # A source that keeps its one iterator (no loaders switched: no ``taken`` nor
        # ``recover`` of its own): each batch after its epoch's first is asked for here,
        # next_batch's steady state written out (its call, its tuple and what only a switch
        # reads), its wait from the clock reading that ended the batch before's step, as the
        # loop's own clock has it (what runs between is the loop's wait too): ~2k
        # instructions a batch less (bench/instructions.py)
        steady = taken is None and _inherited(source.recover, BatchSource.recover)
        iterator, window = source.iterator, NEXT_WINDOW
        gaps, resolved_gaps = ledger.gaps, ledger.resolved_gaps  # (GPU events: a CUDA job's)
        t_back: float | None = None  # (set: the epoch's first batch has been taken)
        # (the batch the loop holds, and the one before it that the loop let go of, held here:
        # freed inside the next wait, NOTE [ A batch freed where the loop's clock has it ])
        # (a wrapper asking one batch ahead, accelerate's, hands the loop its batch a wait
        # later: the loop lets go of it a wait later too, so it is held one wait longer)
        followed: tuple = ()
        _kept: tuple = ()  # (held, never read)
        _older: tuple = ()  # (likewise, where ahead)
        ahead = self.ahead
        ran_out = False
        try:
            while True:
                if steady and t_back is not None:
                    if gaps is not None:
                        gaps.asking()
                    window.thread = ident = get_ident()
                    ledger.asking_since = window.since = t_request = t_back
                    if ahead:
                        _older = _kept
                    _kept = freed.held(followed) if followed else ()  # (the last freed)
                    try:
                        item = next(iterator)
                    except StopIteration:
                        ran_out = True
                        return
                    finally:
                        ledger.asking_since = None
                        if window.thread == ident:  # (else another thread's next() since)
                            window.since = None
                    t_ready = clock()
                    seq = ledger.seq
                    ledger.seq = seq + 1
                    if gaps is not None:
                        gaps.handed(seq)
                        resolved_gaps.extend(gaps.resolved())
                else:
                    try:
                        item, t_request, t_ready, seq = next_batch(source.iterator, mark,
                                                                   source.since)
                    except StopIteration:
                        ran_out = True
                        return
                    except Exception as exc:
                        if exc is ledger.next_error and source.recover(exc):
                            continue
                        raise
                batch, meta = unpack(item) if unpack is not None else item
                # (a batch the loop may free in its next wait is followed: a worker's, in shared
                # memory, or a large one, its size read where its making was timed)
                followed = (freed.watch(batch) if steady and freed.worth_following(meta)
                            else ())
                # Held by nothing here while the loop has it: the loop's reference is the
                # batch's last (NOTE [ One batch, in order ])
                held, item, batch = [batch], None, None
                if handover.held is not None:
                    handover.arrived()
                if meta.__class__ is not tuple or not mark.opened:  # a first of epoch/worker
                    handed(mark, t_ready, meta)
                try:
                    yield held.pop()
                except BaseException:  # also the last batch of a loop that breaks off
                    emit((seq, epoch, t_request, t_ready, clock(), meta, self.step_times))
                    raise
                t_back = clock()
                put((seq, epoch, t_request, t_ready, t_back, meta, self.step_times))
                if taken is not None:
                    taken(seq, meta, t_request, t_ready, t_back)
        finally:
            source.close()
            handover.end(clock() if ran_out else None)
            if ran_out and self.ran_out is not None:
                self.ran_out(epoch)


class ColumnLoop:
    """The engine's own measuring loop: NOTE [ One batch, in order ] as TimedLoop keeps it, each
    batch written to ``columns`` instead of a row (NOTE [ Rows built off the loop ], columns.py),
    and the loop's step run here (``step``), not by a caller the batches are yielded to: one
    generator's resume and a list less a batch; and one clock reading ends a batch's step and
    starts the next one's wait, as nothing runs between them. Its items are ``(batch, meta)``
    as the probes make them; no wrapper asks ahead and no loader is switched, so the source is
    told nothing per batch but ``look``, on every ``look_every``-th batch (0: none), before
    the step."""

    __slots__ = ("ledger", "columns", "check_at")

    def __init__(self, ledger: BatchLedger, columns: BatchColumns) -> None:
        self.ledger, self.columns = ledger, columns
        self.check_at = 0.0  # when to ask stopping() next (a clock reading)

    def epoch(self, mark: EpochMark, source: BatchSource, step: Step | None, last_seq: float,
              stopping: Callable[[float], bool], check_s: float) -> bool:
        """The epoch's batches, each timed and given to ``step`` (None: dropped at once); True
        where the run is to end: batch ``last_seq`` was taken, or ``stopping(now)`` said so
        (asked every ``check_s``, not every batch); False where the epoch ran out."""
        ledger, clock, columns = self.ledger, time.monotonic, self.columns
        add_clocks, add_meta = columns.clocks.extend, columns.metas.append
        iterator, every = source.iterator, source.look_every
        t_request = clock()
        opened, check_at = mark.opened, self.check_at
        try:
            while True:
                ledger.asking_since = t_request
                try:
                    batch, meta = next(iterator)
                except StopIteration:
                    return False
                except BaseException as exc:
                    ledger.next_error = exc
                    raise
                finally:
                    ledger.asking_since = None
                t_ready = clock()
                seq = ledger.seq
                ledger.seq = seq + 1
                if meta.__class__ is not tuple or not opened:  # a first of epoch/worker
                    if not opened:
                        mark.asked(t_request)
                        t_request = mark.start + mark.away
                        columns.epochs.append((seq, mark.epoch))
                    ledger.handed(mark, t_ready, meta)
                    opened = mark.opened
                    meta = column_meta(meta)
                if every and seq % every == 0:
                    source.look(seq, batch, meta)
                try:
                    if step is not None:
                        times = step(batch)
                        if times != NO_STEP_TIMES:
                            columns.step_times[seq] = times
                finally:  # also the last batch of a step that raised
                    batch = None  # freed before the next is asked for, as a loop's own
                    t_back = clock()
                    add_clocks((t_request, t_ready, t_back))
                    add_meta(meta)
                if seq >= last_seq or t_back >= check_at:
                    if seq >= last_seq or stopping(t_back):
                        return True
                    self.check_at = check_at = t_back + check_s
                    t_back = clock()  # (asking whether to stop is not waiting for data)
                t_request = t_back  # the loop asks again at once: one clock reading for both
        finally:
            source.close()


def stop_workers(iterator: Any, ledger: BatchLedger | None = None) -> None:
    """A DataLoader iterator's workers stopped now, as DataLoader does (gracefully); anything
    else left alone. With ``ledger``, the time it took is told to it (an epoch's end the next
    epoch may wait for: ``BatchLedger.closed``)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is None:
        return
    started = time.monotonic()
    shutdown()
    if ledger is not None:
        ledger.closed(time.monotonic() - started)
