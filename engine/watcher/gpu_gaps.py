"""The real GPU idle gaps of a watched job: how long the GPU sat idle waiting for the next batch.

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
"""

from __future__ import annotations

import collections
from typing import Any, Callable

MAX_PENDING = 64  # pairs not yet complete; beyond this the oldest are dropped, not waited for


class StepGaps:
    def __init__(self, make_event: Callable[[], Any], current_stream: Callable[[], Any],
                 cuda_in_use: Callable[[], bool]) -> None:
        self.make_event, self.current_stream = make_event, current_stream
        self.cuda_in_use = cuda_in_use
        self.pending: collections.deque = collections.deque()
        self._asked = None

    @classmethod
    def create(cls) -> "StepGaps | None":
        """None without a CUDA GPU: the output then says GPU gaps were not measured."""
        import torch

        if not torch.cuda.is_available():
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

    def resolved(self) -> list[tuple[int, float]]:
        """``(seq, gap_ms)`` of the pairs the GPU has passed since the last call."""
        done = []
        pending = self.pending
        while pending and pending[0][2].query():
            seq, asked, handed = pending.popleft()
            done.append((seq, max(asked.elapsed_time(handed), 0.0)))
        return done
