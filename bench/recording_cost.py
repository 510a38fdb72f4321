"""The in-process cost of recording one batch: the per-batch core (record/ledger.py) every
measuring loop runs, timed alone over ready-made batches so nothing else varies.

A plain loop (``for batch, meta in items``) and the same loop through the ledger (timing
``next()``, numbering, the batch as taken (record/taken.py), appending it) take turns over the
same items (A B A B ...); the cost is the median of the per-pair differences, in microseconds
per batch. Target: <= 2.5 us.

    python bench/recording_cost.py [--batches 200000] [--pairs 9]
"""

from __future__ import annotations

import argparse
import statistics
import time

from dataloader_tuner.record.columns import NO_STEP_TIMES
from dataloader_tuner.record.ledger import BatchLedger
from dataloader_tuner.record.rows import BatchMeta

# a worker's timed meta (a plain tuple is an untimed one: worker, pid, samples)
META = BatchMeta(0, 4242, 0.0, 0.0001, 0.00001, None, 32, None, None)


def plain(items: list) -> float:
    started = time.perf_counter()
    rows = []
    for batch, meta in items:
        rows.append(batch)
    return time.perf_counter() - started


def recorded(items: list) -> float:
    started = time.perf_counter()
    ledger = BatchLedger(time.monotonic(), lambda *a: None, lambda *a: None)
    next_batch, handed, clock = ledger.next_batch, ledger.handed, time.monotonic
    rows = []
    mark = ledger.new_epoch()
    iterator = iter(items)
    while True:
        try:
            (batch, meta), t_request, t_ready, seq = next_batch(iterator)
        except StopIteration:
            break
        rows.append((seq, mark.epoch, t_request, t_ready, clock(), meta, NO_STEP_TIMES))
        handed(mark, t_ready, meta)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=200_000)
    parser.add_argument("--pairs", type=int, default=9)
    args = parser.parse_args()
    items = [(index, META) for index in range(args.batches)]
    costs = []
    for pair in range(args.pairs):
        order = (plain, recorded) if pair % 2 == 0 else (recorded, plain)
        times = {way.__name__: way(items) for way in order}
        costs.append((times["recorded"] - times["plain"]) / args.batches * 1e6)
    print(f"recording cost: {statistics.median(costs):.2f} us per batch (median of {args.pairs} "
          f"pairs; range {min(costs):.2f}-{max(costs):.2f}; target <= 2.5)")


if __name__ == "__main__":
    main()
