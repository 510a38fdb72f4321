"""The per-batch bookkeeping every measuring loop shares: the engine's own loop
(child/measure.py) and a watched loader's plain and tuned epochs (watcher/loader.py), as torch's
``_BaseDataLoaderIter.__next__`` owns what its iterators share and each keeps only how it gets
a batch.

The ledger times ``next()`` (and says, while the loop waits in it, since when: a rank stuck
there is named by job_report.py), numbers batches as they are handed out, opens each epoch with
its start-up, notes each worker process the first time one of its batches arrives, brackets the
wait with GPU events where the job uses CUDA. The rows are built off the loop (columns.py,
taken.py).
Its cost is the loops' hot path: NOTE [ Measuring cost on the fastest batches ].

NOTE [ Measuring cost on the fastest batches ]

    Tiny in-memory batches take 40-140 us each, so every microsecond spent measuring one is
    visible in its rate (bench/overhead.py, bench/real_like.py; 2-core machine): 43 us batches
    are reported at 0.90 of a plain loop (0.87 before the making was sampled), 73 us at 0.90,
    136 us at 0.97-0.99; below 100 us a run says so (pitfalls.measuring_cost). What it cost,
    and what the code does about it:

    - timing a batch's making (clock reads in the fetch and collate wrappers, the 9-field meta
      that rides with the batch) cost ~2.8 us of a 45 us batch made in the main process: when
      batches take under 1 ms, each process times its first 64 and every 16th after
      (probes.TIME_EVERY); the others carry (worker, pid, samples), so every batch still has
      its row and exact sample count, and busy shares are scaled up from the timed ones
      (rows.timed_scale); "counting" in the output says on how many. In-process, the wrapped
      loader went from +2.8 to +1.0 us a batch; a row per batch is still ~0.8 us and the child's
      recorder ~0.5 us (long_tail: py-spy puts all of our code at ~3% of the child, yet the
      reported rate is ~10% under a plain loop's: the rest was not found in the child);
    - the process CPU clock (a system call) is felt at ~100 us per batch, and the walk that
      sizes a batch takes up to ~200 us for a list of per-image dicts: both are read on every
      n-th batch only, as rarely as keeps them under 0.5% of a batch (probes.py, "counting"
      in the output says on how many);
    - a method call per batch on the worker side shows in the rate: the fetch timer's
      bookkeeping is written out inline (probes.py);
    - batch rows are tracked containers that live until the next flush; they set off full
      collections a plain loop never makes, each walking torch's whole heap: ~6% of the rate
      with 80 ms stalls on 50 us batches (long_tail went 0.80 -> 0.87 of a plain loop once
      the heap made before measuring was frozen, gc.freeze in child/process.py);
    - asking the owner's should_stop() and the clock for the deadline after every batch shows
      too: the engine's loop asks every 5 ms (child/measure.py, CHECK_S);
    - a method of ours as the per-row callback costs ~0.3 us a batch (~1% of a 50 us batch):
      the engine hands over the row list's own append (child/process.py);
    - counting labels costs ~6 us a look (20 us with four torch calls), a whole tiny batch's
      making: not at all where the dataset lists its labels (``targets``, read once), else
      every 8th batch of the first 1024, then every 64th (child/measure.py);
    - building the row in the loop (this ledger's calls, the row's 16 fields) was ~5 us of the
      engine's own loop: it writes columns and its rows are built elsewhere (NOTE [ Rows built
      off the loop ], columns.py); a watched loop keeps each batch as one flat tuple, its row
      built on the recorder's thread (NOTE [ A watched batch's row built off the job's
      thread ], taken.py);
    - reading the user's dataset's ``vars()`` (the first fetch's probe looked for random
      generators there) slowed every ``self.x`` in its ``__getitem__`` for the rest of the
      process on CPython 3.11+, ~4% of long_tail's rate, in the main process and in every
      worker: the probe finds generators among the object's referents instead
      (first_fetch.rng_attributes). As a real profile run against a plain loop (5 pairs), after
      both: long_tail 0.866 -> 0.903, many_classes 0.872 -> 0.928.
"""

from __future__ import annotations

import time
from threading import get_ident
from typing import Any, Callable, Iterator, Protocol

from dataloader_tuner.record.rows import BatchMeta, UntimedMeta

UNKNOWN_WORKER = -2  # a batch of a loader that could not be probed: its worker is not known
# A meta is read by position on the hot path: where it holds its batch's sample count.
SAMPLES = BatchMeta._fields.index("samples")


class GapEvents(Protocol):
    """GPU idle gaps from events around the wait (instrument/gpu_events.StepGaps)."""

    def asking(self) -> None: ...

    def handed(self, seq: int) -> None: ...

    def resolved(self) -> list[tuple[int, float]]: ...


class NextWindow:
    """Since when the loop has been inside a loader's ``next()`` (None: it is not), set
    around each ``next()`` (BatchLedger.next_batch), whichever ledger it is: in a watched
    job's own process only that is the loader's work, where instrument/sampler.py looks."""

    __slots__ = ("since", "thread")

    def __init__(self) -> None:
        self.since: float | None = None
        self.thread: int | None = None  # the thread in next() (threading.get_ident())


NEXT_WINDOW = NextWindow()


def samples_of(meta: BatchMeta | UntimedMeta) -> int:
    """The batch's sample count, from either kind of meta."""
    return meta[2] if meta.__class__ is tuple else meta[SAMPLES]  # type: ignore[return-value]


def unprobed_meta(samples: int) -> UntimedMeta:
    """The meta of a batch whose worker is not known (a loader that could not be probed)."""
    return (UNKNOWN_WORKER, 0, samples)


class EpochMark:
    """One epoch as one iterator runs it: its number, when it was asked for, and whether its
    first batch has come (each iterator keeps its own: two at once never mix their epochs).

    ``given``: when ``iter()`` handed its iterator over, where that is apart from the first
    ``next()`` (None: the epoch starts inside it). A trainer may do its own work between the two
    (Lightning makes the epoch's iterator, then runs its hooks): the workers start meanwhile,
    and the loop waits only in ``iter()`` and in the first ``next()``; ``away`` is the time
    between, not waited, but for ``closing``: the previous epoch's workers shutting down
    meanwhile (Lightning drops that iterator only after making the new one)."""

    __slots__ = ("epoch", "start", "opened", "given", "away", "closing")

    def __init__(self, epoch: int, start: float) -> None:
        self.epoch, self.start, self.opened = epoch, start, False
        self.given: float | None = None
        self.away = self.closing = 0.0

    def asked(self, t: float) -> None:
        """The loop's first ``next()`` came at ``t`` (once; an iterator that does the epoch's
        work inside it says so at its start, before that work)."""
        if self.given is not None:
            self.away = max(t - self.given - self.closing, 0.0)
            self.given = None


class BatchLedger:
    def __init__(self, t0: float, on_epoch: Callable[[int, float, float], None],
                 on_worker: Callable[[int, int, dict | None], None],
                 gaps: GapEvents | None = None,
                 resolved_gaps: list | None = None) -> None:
        """``on_epoch(epoch, start, startup_s)`` as an epoch's first batch arrives (times since
        ``t0``); ``on_worker(pid, worker_id, probe)`` for each worker process's first batch;
        GPU gaps, where ``gaps`` is given, go to ``resolved_gaps`` as ``(seq, ms)``."""
        self.t0 = t0
        self.on_epoch, self.on_worker = on_epoch, on_worker
        # a worker's sampled stacks as its batches bring them (instrument/sampler.py)
        self.on_profile: Callable[[int, int, list], None] = lambda pid, worker, sampled: None
        self.gaps = gaps
        self.resolved_gaps = resolved_gaps if resolved_gaps is not None else []
        self.seq = 0  # the next batch's number, across epochs and iterators
        self.epochs = 0
        self.asking_since: float | None = None  # the loop is in next() since (time.monotonic)
        # What the loader itself raised in the last next() (not the bookkeeping around it): a
        # tuned loop drops a setting for that only.
        self.next_error: BaseException | None = None
        self.seen_pids: set[int] = set()
        # The loop waits for a loader's first batch (an epoch's, or a switched loader's): its
        # workers' start-up is in that wait (a stall watch allows for it).
        self.opening = False
        self.last_startup_s: float | None = None  # the last epoch's, once its first batch came
        self.latest: EpochMark | None = None  # the epoch asked for last

    def new_epoch(self) -> EpochMark:
        """An epoch starts now: its start-up runs from here to its first batch."""
        mark = self.latest = EpochMark(self.epochs, time.monotonic())
        self.epochs += 1
        self.opening = True
        return mark

    def closed(self, seconds: float) -> None:
        """An earlier epoch's iterator took ``seconds`` to shut down: waited, if it came
        between the latest epoch's ``iter()`` and its first ``next()`` (EpochMark)."""
        mark = self.latest
        if mark is not None and mark.given is not None:  # (not asked yet)
            mark.closing += seconds

    def next_batch(self, iterator: Iterator, mark: EpochMark | None = None,
                   since: float | None = None) -> tuple[Any, float, float, int]:
        """``next(iterator)``, timed: ``(item, t_request, t_ready, seq)``. The first batch of
        ``mark``'s epoch was asked for when the epoch was (``iter()`` starting the workers is
        waiting for data too, as the loop lives it; the job's own work between ``iter()`` and
        this ``next()`` is not: EpochMark), and a batch after ``since`` (a tuned
        loop's switch of loaders, time.monotonic) from then. StopIteration and errors pass through,
        the loop no longer shown waiting whatever ended the wait (a job may catch a
        KeyboardInterrupt and go on)."""
        gaps = self.gaps
        if gaps is not None:
            gaps.asking()
        self.next_error = None
        # (the window: where a job's own process is sampled, instrument/sampler.py; its
        # thread first, so a look between the two never sees a new ``since`` with an old thread)
        NEXT_WINDOW.thread = ident = get_ident()
        self.asking_since = NEXT_WINDOW.since = t_request = time.monotonic()
        try:
            item = next(iterator)
        except BaseException as exc:
            self.next_error = exc
            raise
        finally:
            self.asking_since = None
            if NEXT_WINDOW.thread == ident:  # (a next() on another thread since: its window)
                NEXT_WINDOW.since = None
        t_ready = time.monotonic()
        if mark is not None and not mark.opened:
            mark.asked(t_request)
            t_request = mark.start + mark.away
        elif since is not None:
            t_request = since
        seq = self.seq
        self.seq = seq + 1
        if gaps is not None:
            gaps.handed(seq)
            self.resolved_gaps.extend(gaps.resolved())
        return item, t_request, t_ready, seq

    def handed(self, mark: EpochMark, t_ready: float, meta: BatchMeta | UntimedMeta) -> None:
        """What a batch's arrival tells once: its epoch's start-up (the epoch's first batch)
        and its worker (that worker's first). Called outside the timed windows."""
        if not mark.opened:
            mark.opened = True
            self.opening = False
            self.last_startup_s = t_ready - mark.start - mark.away
            self.on_epoch(mark.epoch, mark.start - self.t0, self.last_startup_s)
        if meta.__class__ is tuple:  # making not timed (each worker's first batch is)
            return
        pid, probe = meta[1], meta[8]  # type: ignore[misc]  # a BatchMeta
        # a batch carries a first fetch's probe or a worker's samples (sampler.py), not both;
        # samples can ride with a first batch where the first fetch was not probed (a
        # watched loader's later epochs: epoch_iterators._probe_once)
        sampled = probe is not None and "profile" in probe
        if pid not in self.seen_pids:
            self.seen_pids.add(pid)
            self.on_worker(pid, meta[0], None if sampled else probe)
        if sampled:
            self.on_profile(pid, meta[0], probe["profile"])  # type: ignore[index]  # sampled
