"""One measured loader configuration reduced to the numbers the tuner reasons on (a
record/trials.py TrialResult), and when a trial is conclusive.

NOTE [ Windows of a fixed length for fast batches ]

    A trial of fast batches (20 steady ones in less than its window) measures a window of a
    fixed length: SEARCH_WINDOW_S for the search's trials, CLAIM_WINDOW_S for the end's (the
    claim and the pick's expected rate). Before, such a trial stopped once its rate was known
    to TARGET_CI over 0.6 s, or ran to a 4 s cap where it never was: on 2 cores a rate of
    millisecond batches drifts +-5-24% over seconds, so some pipelines' trials settled in
    0.6 s and others' ran 4 s, and no plan could say which. A tune's time was off by 2-3x
    (tokenized_text 36.5 s said 13.4 s; detection 21.6 s said 10.2 s; issue 62). With a
    fixed window each trial's time is known before it starts; the drift that kept rates from
    settling is still measured into each trial's interval, and a window of 2 s read the search's
    ranking alike (tokenized_text 28.7 s said 29.1 s). The end's trials keep the 4 s: 32
    workers over 2 s read +-30-67% (their first round of batches is a third of the window),
    and a claim from them would claim nothing. Slower batches keep their rule: at least 20
    steady batches over the window, then stop once the rate is known, or at CAP_BATCHES.
"""

from __future__ import annotations

import statistics
from collections import Counter

from dataloader_tuner.analyse import metrics
from dataloader_tuner.record.rows import BatchRecord, timed
from dataloader_tuner.record.trials import TrialResult


MIN_STEADY_BATCHES = 20  # a rate from fewer batches is not shown as a claim
TARGET_CI = 0.04  # a trial runs until its samples/s is known to +-4% (95% confidence)
CAP_BATCHES = 1.5 * MIN_STEADY_BATCHES  # a trial's time cap leaves room for this many
# NOTE [ Windows of a fixed length for fast batches ]
SEARCH_WINDOW_S = 2.0
CLAIM_WINDOW_S = 4.0
# the end's trials, read for the claim and the pick's expected rate (child/tuning.py)
CLAIM_PHASES = ("baseline", "final", "in_order", "out_of_order")
# A trial's cap grows with the batch time up to this (a batch of ~4 s still gets its 20 steady
# ones: NOTE [ A budget in batches ], plan.py)...
HARD_CAP_S = 120.0  # ...leaving room for CAP_BATCHES after warm-up


def window_s(phase: str) -> float:
    """How long a trial of fast batches in ``phase`` measures."""
    return CLAIM_WINDOW_S if phase in CLAIM_PHASES else SEARCH_WINDOW_S


def trial_cap_s(per_batch_s: float, warmup: int, block: int,
                window: float = SEARCH_WINDOW_S) -> float:
    """When a trial whose rate never settles to TARGET_CI is cut: at ``window``, or later
    where its batches (``per_batch_s`` each) need it for its warm-up and CAP_BATCHES, and for
    the interval's three blocks of ``block`` batches (metrics.rate_interval)."""
    room = warmup + max(CAP_BATCHES, 3 * block)
    return min(max(window, per_batch_s * room), HARD_CAP_S)


def interval_block(records: list[BatchRecord], warmup: int, num_workers: int) -> int:
    """Batches per block of a trial's rate interval (metrics.rate_interval): a round of workers,
    or a whole epoch where epochs are short enough for three of them. Each epoch's start (the
    pipeline's refill, restarted workers) then falls in every block alike; in blocks of a round
    it fell in some only, and 2 persistent workers over 4-batch epochs measured +-22% where
    their rate over whole epochs held within 3%."""
    per_epoch = Counter(r.epoch for r in records[warmup:])
    return epoch_block([per_epoch[e] for e in sorted(per_epoch)], len(records) - warmup,
                       num_workers)


def epoch_block(epoch_lengths: list[int], steady: int, num_workers: int) -> int:
    """``interval_block`` from the steady batches' count in each epoch, in order."""
    block = max(num_workers, 1)
    whole = epoch_lengths[1:-1]  # the first and last are cut
    if whole:
        length = int(statistics.median(whole))
        if block < length <= steady // 3:
            block = length
    return block


def trial_from_batches(
    records: list[BatchRecord],
    warmup: int,
    *,
    num_workers: int,
    prefetch_factor: int | None,
    persistent_workers: bool,
    pin_memory: bool,
    batch_size: int | None,
    seconds: float,
    has_consumer: bool,
    main_cpu_s: float | None,
    worker_private_mb: float | None,
    main_thread_cpu_s: float | None = None,
    phase: str = "search",
    repeat: int = 0,
    in_order: bool = True,
) -> TrialResult | None:
    """Reduce one trial's batch records; None when too few batches reached steady state."""
    steady = metrics.steady_state(records, warmup)
    if steady is None or not steady.samples_per_s:
        return None
    measured = records[warmup:]
    made = timed(measured)  # fast batches' making is timed on a sample
    work = [b.making_s * 1000 for b in made]
    mean = sum(work) / len(work) if work else 0.0
    variance = sum((w - mean) ** 2 for w in work) / len(work) if work else 0.0
    copies = [b.h2d_ms for b in measured if b.h2d_ms is not None]
    others = [b.h2d_other_ms for b in measured if b.h2d_other_ms is not None]
    idle = metrics.consumer_idle_fraction(records, steady) if has_consumer else None
    ci = metrics.rate_interval(records, warmup, interval_block(records, warmup, num_workers))
    return TrialResult(
        num_workers=num_workers,
        prefetch_factor=prefetch_factor,
        persistent_workers=persistent_workers,
        pin_memory=pin_memory,
        batch_size=batch_size,
        samples_per_s=steady.samples_per_s,
        batches=steady.batches,
        seconds=seconds,
        startup_s=records[0].wait_s if records else 0.0,
        consumer_idle_frac=idle,
        latency_p50_ms=metrics.percentile([b.wait_s * 1000 for b in measured], 50),
        latency_p95_ms=metrics.percentile([b.wait_s * 1000 for b in measured], 95),
        worker_ms=metrics.percentile(work, 50),
        worker_cpu_ms=metrics.percentile(
            [(b.fetch_cpu_s + b.collate_s) * 1000 for b in made
             if b.fetch_cpu_s is not None], 50),
        worker_ms_cv=(variance ** 0.5) / mean if mean > 0 else None,
        step_ms=metrics.percentile([b.step_s * 1000 for b in measured], 50),
        main_cpu_ms=(main_cpu_s * 1000 / len(records)) if main_cpu_s is not None else None,
        main_thread_cpu_ms=(main_thread_cpu_s * 1000 / len(records)
                            if main_thread_cpu_s is not None else None),
        batch_bytes=metrics.percentile([b.nbytes for b in made if b.nbytes is not None], 50),
        worker_private_mb=worker_private_mb,
        h2d_ms=metrics.percentile(copies, 50) if copies else None,
        h2d_other_ms=metrics.percentile(others, 50) if others else None,
        phase=phase,
        repeat=repeat,
        rate_ci=ci,
        batches_per_s=steady.batches_per_s,
        conclusive=steady.batches >= MIN_STEADY_BATCHES and ci is not None,
        restarts_measured=measured[-1].epoch - records[warmup - 1].epoch,
        in_order=in_order,
    )
