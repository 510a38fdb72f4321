"""GPU timing of a watched job, from CUDA events resolved lazily: the real GPU idle gaps
(``StepGaps``) and the host-to-device copies made through ``loader.to(batch, device)``
(``CopyTimes``).

The idle gap: how long the GPU sat idle waiting for the next batch.

Two CUDA events per batch on the job's current stream: one recorded as the loop asks for the
next batch (the previous step's work is queued by then), one as the batch is handed over. On
the GPU's own clock the first completes when the previous step's work is done, the second not
before it is recorded; the time between them is how long the GPU waited for the host to come
back with a batch: 0 when the host ran ahead (the GPU was still busy), the whole input wait
when the GPU had nothing queued.

They are resolved lazily: ``Event.query()`` on the oldest pending pair at each batch, never
``synchronize()``, so the host keeps running ahead of the GPU as it would unwatched. Nothing is
recorded until the job itself has initialised CUDA: a job training on the CPU of a machine with
a GPU gets no CUDA context from the watcher (a context costs hundreds of MB, and CUDA before
forking workers breaks them).

NOTE [ Comparing memory kinds ]

    What pin_memory buys is read from one batch in so many, copied in both kinds. The batch's
    own copy cannot be one side of that comparison. Measured on an H200 (bench/gpu_copy.py): a
    copy made right after the GPU idled, where the loop's own copy is (after its wait for the
    batch), took 0.090 ms at 64 KB pageable and the same copy made next 0.038 (pinned: 0.044
    and 0.016). A watched training's 64 KB batches: with the other kind's copy made second, the
    pinned batches looked 2x slower than their pageable twins; made first, the loop's copies
    were still 1.6-1.9x slower than the other kind's, whichever kind the loop used (its copy
    also holds the walk through its batch). So the batch's tensors are copied once more in their
    own kind and once in the other, both after the loop's copy and by the same code, in an order
    swapped from one compared batch to the next; their ratio scales the loop's own copy time
    into the other kind's figure.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple

from dataloader_tuner.instrument.tensors import moved, tensors_of

MAX_PENDING = 64  # pairs not yet complete; beyond this the oldest are dropped, not waited for


class StepGaps:
    def __init__(self, make_event: Callable[[], Any], current_stream: Callable[[], Any],
                 cuda_in_use: Callable[[], bool]) -> None:
        self.make_event, self.current_stream = make_event, current_stream
        self.cuda_in_use = cuda_in_use
        self.pending: collections.deque = collections.deque()
        self._asked = None
        self.dropped = 0  # pairs let go at MAX_PENDING, their gaps never known

    @classmethod
    def create(cls) -> "StepGaps | None":
        """None without a CUDA GPU: the output then says GPU gaps were not measured."""
        import torch

        if not torch.cuda.is_available():  # not gpu.cuda_available: it sets the job's env
            return None
        return cls(lambda: torch.cuda.Event(enable_timing=True), torch.cuda.current_stream,
                   torch.cuda.is_initialized)

    def asking(self) -> None:
        """The loop asks for the next batch (its previous step's GPU work is queued)."""
        if not self.cuda_in_use():
            self._asked = None
            return
        event = self.make_event()
        event.record(self.current_stream())
        self._asked = event

    def handed(self, seq: int) -> None:
        """Batch ``seq`` is handed to the loop."""
        if self._asked is None:
            return
        event = self.make_event()
        event.record(self.current_stream())
        self.pending.append((seq, self._asked, event))
        self._asked = None
        if len(self.pending) > MAX_PENDING:
            self.pending.popleft()
            self.dropped += 1

    def resolved(self) -> list[tuple[int, float]]:
        """``(seq, gap_ms)`` of the pairs the GPU has passed since the last call."""
        done = []
        pending = self.pending
        while pending and pending[0][2].query():
            seq, asked, handed = pending.popleft()
            done.append((seq, max(asked.elapsed_time(handed), 0.0)))
        return done


COMPARE_EVERY = 32  # batches: one in this many is also copied in the other memory kind


def other_kind_ms(own_ms: float, same_ms: float, other_ms: float) -> float | None:
    """The loop's copy had it been in the other memory kind: ``own_ms`` scaled by the like-for-like
    pair's ratio (NOTE [ Comparing memory kinds ])."""
    return own_ms * other_ms / same_ms if same_ms > 0 else None


def pair_ms(own_ms: float, pair: "Pair") -> float | None:
    """``other_kind_ms`` read from a pair whose copies are done."""
    return other_kind_ms(own_ms, pair.same[0].elapsed_time(pair.same[1]),
                         pair.other[0].elapsed_time(pair.other[1]))


def other_kind_twins(tensors: list) -> list:
    """The tensors in the other memory kind: pageable clones of pinned ones, else pinned."""
    pinned = all(t.is_pinned() for t in tensors)
    return [t.clone() if pinned else t.pin_memory() for t in tensors]


class Pair(NamedTuple):
    """The events of a like-for-like pair: each copy's (start, end), and the one recorded last
    (done means both are)."""

    same: tuple[Any, Any]
    other: tuple[Any, Any]
    last: Any


def record_pair(make_event: Callable[[], Any], stream: Any, tensors: list, twins: list,
                device: Any, turn: int) -> Pair:
    """Events around a copy of ``tensors`` again and one of their ``twins``; the other kind
    goes first on odd turns (NOTE [ Comparing memory kinds ])."""
    timed = {}
    order = [("same", tensors), ("other", twins)]
    for name, sources in order[::-1] if turn % 2 else order:
        start, end = make_event(), make_event()
        start.record(stream)
        for tensor in sources:
            tensor.to(device, non_blocking=True)
        end.record(stream)
        timed[name] = (start, end)
    return Pair(timed["same"], timed["other"], end)


class CopyTimes:
    """Times each copy made through ``loader.to`` with two events on the current stream (the
    copy the training step waits for anyway: nothing extra is synchronised); every
    COMPARE_EVERY-th batch is also copied in both memory kinds into throwaways, so pinned and
    pageable compare at the real size (NOTE [ Comparing memory kinds ])."""

    def __init__(self, make_event: Callable[[], Any], current_stream: Callable[[Any], Any],
                 twins: Callable[[list], list] = other_kind_twins) -> None:
        self.make_event, self.current_stream, self.twins = make_event, current_stream, twins
        self.pending: collections.deque = collections.deque()
        self.count = 0

    @classmethod
    def create(cls) -> "CopyTimes | None":
        import torch

        if not torch.cuda.is_available():  # not gpu.cuda_available: it sets the job's env
            return None
        return cls(lambda: torch.cuda.Event(enable_timing=True),
                   lambda device: torch.cuda.current_stream(torch.device(device)))

    def copy(self, seq: int, batch: Any, device: Any, non_blocking: bool) -> Any:
        stream = self.current_stream(device)  # the target device's: where the copy is queued
        start, end = self.make_event(), self.make_event()
        start.record(stream)
        result = moved(batch, device, non_blocking)
        end.record(stream)
        self.count += 1
        pair = None
        tensors = tensors_of(batch) if self.count % COMPARE_EVERY == 0 else []
        if tensors and all(t.device.type == "cpu" for t in tensors):
            pair = record_pair(self.make_event, stream, tensors, self.twins(tensors), device,
                               self.count // COMPARE_EVERY)
        self.pending.append((seq, start, end, pair))
        if len(self.pending) > MAX_PENDING:
            self.pending.popleft()
        return result

    def resolved(self) -> list[tuple[int, float, float | None]]:
        """``(seq, copy ms, other kind's copy ms or None)`` of the copies the GPU has done."""
        done = []
        pending = self.pending
        while pending and (pending[0][3] or pending[0][1:3])[-1].query():
            seq, start, end, pair = pending.popleft()
            own = start.elapsed_time(end)
            done.append((seq, own, pair_ms(own, pair) if pair is not None else None))
        return done
