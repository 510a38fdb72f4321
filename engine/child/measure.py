"""The measuring loop: run a real DataLoader over the user's dataset and time every batch.

This runs in the engine's child process (see runner.py), but it is plain in-process code so
tests and benchmarks can drive it directly. It knows nothing about pipes or databases: each
batch goes into the ``BatchColumns`` it is given (NOTE [ Rows built off the loop ]), whose
``rows()`` are the batches' ``BatchRecord`` rows.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import RunError
from dataloader_tuner.instrument import gpu, probes
from dataloader_tuner.instrument.probes import clock, timed_collate, wrap_dataset
from dataloader_tuner.instrument.stacks import OfferingStack
from dataloader_tuner.child.target import ResolvedTarget
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.record.columns import BatchColumns, samples_of_meta
from dataloader_tuner.record.ledger import BatchLedger
from dataloader_tuner.record.loop import BatchSource, ColumnLoop, stop_workers
from dataloader_tuner.settings import tools_worker_init


def build_loader(dataset: Any, config: LoaderConfig) -> DataLoader:
    """A real DataLoader over the wrapped dataset, with the timing collate."""
    kwargs = config.to_kwargs(torch.__version__)
    auto_collation = config.batch_sampler is not None or config.batch_size is not None
    kwargs["collate_fn"] = timed_collate(config.collate_fn, auto_collation)
    if config.num_workers > 0:
        init_fn = tools_worker_init(config.worker_init_fn, config.keep_freed_memory,
                                    config.worker_threads)
        kwargs["worker_init_fn"] = OfferingStack(init_fn)
    if (config.num_workers > 0 and config.batch_sampler is None and config.batch_size is not None
            and not isinstance(dataset, IterableDataset)):
        # The same batches DataLoader would build from these settings, but remembered, so a
        # hang report can say which sample indices a stuck worker holds. (Without workers
        # the main process is inside the fetch itself: probes.current_indices() says.)
        sampler = config.sampler or (RandomSampler(dataset) if config.shuffle
                                     else SequentialSampler(dataset))
        kwargs["batch_sampler"] = probes.RecordingBatchSampler(
            BatchSampler(sampler, config.batch_size, config.drop_last),
            config.num_workers * config.effective_prefetch_factor)
        for key in ("batch_size", "shuffle", "sampler", "drop_last"):
            kwargs.pop(key, None)
    return DataLoader(wrap_dataset(dataset), **kwargs)


class Measurement:
    """Runs the loader epoch after epoch until ``seconds`` pass or ``should_stop()`` is true.

    Each batch goes into ``columns``; ``on_epoch(epoch, t, startup_s)`` receives the start of
    each epoch with the time its first batch took; ``on_worker(pid, worker_id)`` each worker as
    it is first seen; ``on_profile(pid, worker_id, sampled)`` a worker's sampled stacks as its
    batches bring them. Times are relative to the moment the first iterator was created.
    """

    def __init__(
        self,
        resolved: ResolvedTarget,
        config: LoaderConfig,
        consumer: Consumer,
        seconds: float,
        columns: BatchColumns,
        should_stop: Callable[[], bool] = lambda: False,
        on_epoch: Callable[[int, float, float], None] = lambda *a: None,
        on_worker: Callable[[int, int, dict | None], None] = lambda *a: None,
        max_batches: int | None = None,
        on_profile: Callable[[int, int, list], None] | None = None,
        labels: bool = False,
    ) -> None:
        self.resolved, self.config, self.consumer = resolved, config, consumer
        self.seconds, self.max_batches = seconds, max_batches
        self.columns, self.should_stop = columns, should_stop
        self.loader: DataLoader[Any] | None = build_loader(resolved.dataset, config)
        self.transfer = gpu.TransferTimer.create()
        self.gaps = gpu.GapTimer.create()
        self.iterator: Iterator[Any] | None = None
        # The loop's bookkeeping (a stall watch reads it); its clock starts with run()
        self.ledger = BatchLedger(0.0, on_epoch, on_worker)
        if on_profile is not None:  # a worker's sampled stacks (instrument/sampler.py)
            self.ledger.on_profile = on_profile
        # ``labels``: class counts wanted (a profile's, not a trial's): from the dataset's own
        # label list where it has one (exact; no batch looked at: a look cost 20 us, 0.4% of a
        # fast loader's run), else counted on some batches as they arrive
        self.labels = labels
        self.label_counts: dict[int, int] = {}
        self.dataset_labels = dataset_labels(resolved.dataset, config) if labels else None

    @property
    def t0(self) -> float:
        """When the first iterator was made: the rows' times count from here."""
        return self.ledger.t0

    def run(self) -> int:
        """Returns the number of batches consumed. The per-batch bookkeeping is the engine's
        loop's (record/loop.ColumnLoop); sizes and worker timings come ready-made with the
        batch."""
        self.ledger.t0 = self.columns.t0 = t0 = clock()
        deadline = t0 + self.seconds
        last_seq = self.max_batches - 1 if self.max_batches is not None else float("inf")
        should_stop = self.should_stop
        ledger = self.ledger
        loop = ColumnLoop(ledger, self.columns)
        plain_step = self.transfer is None and self.gaps is None and self.consumer.kind == "none"

        def stopping(now: float) -> bool:
            return now >= deadline or should_stop()

        while True:
            mark = ledger.new_epoch()
            if self.loader is None:
                raise RunError("The measurement was closed.", type="engine_internal")
            self.iterator = iter(self.loader)
            if loop.epoch(mark, _Measured(self.iterator, self.label_counts, counting=(
                              self.labels and self.dataset_labels is None)),
                          None if plain_step else self._consume, last_seq, stopping, CHECK_S):
                return ledger.seq
            if not mark.opened:  # the epoch never produced a batch
                raise RunError(
                    "The dataset produced no batches: it is empty, or drop_last=True with fewer "
                    f"samples than batch_size={self.config.batch_size}.",
                    type="empty_dataset",
                )
            if ledger.seq > last_seq or stopping(clock()):
                return ledger.seq

    def worker_signals(self, grace_s: float = 0.0) -> dict[int, int]:
        """{pid: signal number} of this iterator's workers that were killed by a signal,
        waiting up to ``grace_s`` for one to show up."""
        deadline = clock() + grace_s
        while True:
            found = {}
            for worker in getattr(self.iterator, "_workers", None) or []:
                code = worker.exitcode  # polls waitpid: a dead worker is reaped here
                if code is not None and code < 0:
                    found[worker.pid] = -code
            if found or clock() >= deadline:
                return found
            time.sleep(0.05)

    def close(self) -> None:
        """Shut the loader's workers down (DataLoader's own, graceful shutdown), now: an
        iterator left to the garbage collector (held in a reference cycle) was copied into the
        next trial's forked workers and collected there, where its shutdown fails on workers
        that are not theirs ("AssertionError: can only test a child process", shown to the user
        as their code's output; jpeg_folder's tunes, 2 a tune)."""
        stop_workers(self.iterator)
        self.iterator = None
        self.loader = None

    def _consume(self, batch: Any) -> tuple[float | None, float | None, float | None]:
        """The consumer's step, with the GPU timings around it: (h2d_ms, other_ms, gap_ms)."""
        h2d_ms = other_ms = gap_ms = None
        if self.transfer is not None:
            h2d_ms, other_ms, _ = self.transfer.measure(batch)
        if self.gaps is not None:
            gap_ms = self.gaps.step_started()
        self._step(batch)
        if self.gaps is not None:
            self.gaps.step_ended()
        return h2d_ms, other_ms, gap_ms

    def _step(self, batch: Any) -> None:
        kind, train_step = self.consumer.kind, self.resolved.train_step
        if kind == "train_step" and train_step is not None:
            try:
                train_step(batch)
            except Exception as exc:  # noqa: BLE001 - the user's step: report, don't crash
                raise RunError(
                    f"train_step raised {type(exc).__name__}: {exc}",
                    details=_format_exc(exc),
                    type="train_step_error",
                ) from exc
        elif kind == "simulated" and self.consumer.step_ms > 0:
            if self.gaps is not None:
                gpu.simulated_gpu_step(self.consumer.step_ms / 1000.0)
            else:
                time.sleep(self.consumer.step_ms / 1000.0)


# A stop (and the deadline) is asked for this often, not after every batch: a callable per
# batch shows on the fastest (NOTE [ Measuring cost on the fastest batches ]).
CHECK_S = 0.005
# Labels counted on some batches only: NOTE [ Measuring cost on the fastest batches ].
LABEL_EVERY, LABEL_DENSE, LABEL_SPARSE = 8, 1024, 64
MAX_LABEL = 100_000
LABEL_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


class _Measured(BatchSource):
    """The measuring loop's batches; some have their class labels counted as they arrive,
    outside their wait."""

    def __init__(self, iterator: Iterator[Any], label_counts: dict[int, int],
                 counting: bool) -> None:
        super().__init__(iterator)
        self.label_counts = label_counts
        self.look_every = LABEL_EVERY if counting else 0

    def look(self, seq: int, batch: Any, meta: tuple) -> None:
        if seq < LABEL_DENSE or seq % LABEL_SPARSE == 0:
            count_labels(batch, samples_of_meta(meta), self.label_counts)


def count_labels(batch: Any, samples: int, counts: dict[int, int]) -> None:
    """Add the batch's class labels to ``counts`` when they can be read: a 1-D integer tensor
    of one label per sample, last in a (inputs, labels) pair or under a label-like key."""
    labels = None
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        labels = batch[-1]
    elif isinstance(batch, dict):
        labels = next((batch[k] for k in ("label", "labels", "target", "targets", "y")
                       if k in batch), None)
    if (not isinstance(labels, torch.Tensor) or labels.dtype not in LABEL_DTYPES
            or labels.shape != (samples,) or samples == 0):
        return
    values = labels.tolist()  # one torch call, the rest on Python ints (a look: 20 -> 6 us)
    if min(values) < 0 or max(values) > MAX_LABEL:
        return
    for label in values:
        counts[label] = counts.get(label, 0) + 1


LABEL_ATTRIBUTES = ("targets", "labels")  # ImageFolder, DatasetFolder and many custom sets


def dataset_labels(dataset: Any, config: LoaderConfig) -> dict[int, int] | None:
    """Every sample's class counted from the dataset's own label list (``labels_of_dataset``),
    where the loader draws each sample as often as the dataset holds it: not with a sampler of
    its own (a WeightedRandomSampler changes what the model sees: the batches say that)."""
    if config.sampler is not None or config.batch_sampler is not None:
        return None
    try:
        return labels_of_dataset(dataset)
    except Exception:  # noqa: BLE001 - a dataset attribute that misbehaves: count batches
        return None


def labels_of_dataset(dataset: Any) -> dict[int, int] | None:
    """Every sample's class from the dataset's own ``targets``/``labels`` (one int per sample),
    counted: exact and independent of the order batches come in. None when it has no such
    list."""
    try:
        length = len(dataset)
    except TypeError:
        return None
    for name in LABEL_ATTRIBUTES:
        labels = getattr(dataset, name, None)
        if labels is None or isinstance(labels, (str, bytes, dict)):
            continue
        try:
            values = labels.tolist() if hasattr(labels, "tolist") else list(labels)
        except TypeError:
            continue
        if len(values) == length and values and all(type(v) is int for v in values):
            counts: dict[int, int] = {}
            for label in values:
                counts[label] = counts.get(label, 0) + 1
            return counts
    return None


def _format_exc(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))
