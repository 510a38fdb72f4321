"""What does watch(loader) cost a training loop? The same loop watched and unwatched, in turns.

Each round times one epoch of a plain DataLoader and one epoch of the same loader watched (the
order alternating round by round), each from its first batch to its last (worker start-up is
left out: both pay it), with a simulated step after each batch (``time.sleep``: a GPU step
leaves the CPU free). Per case, the medians over rounds of:
  watched/plain  the loop's time per batch, watched over plain (target <= 1.01 with a 10 ms step;
                 there a sleep's jitter, tens of microseconds, hides any per-batch cost)
  cost/batch     watched minus plain, in microseconds per batch (target <= 5 us, judged without
                 a step, where batches are microseconds apart and the cost is all that differs)
Without a step and with 2 workers, this 2-core machine is saturated (two workers and the loop):
there any CPU the watcher spends anywhere (the workers' probes, the recorder thread's writes)
slows the whole loader, so that row shows the price of watching a loader that is already
CPU-starved, not the training thread's share.
The watched loop includes everything the watcher does in the job's process: the probed copy's
timing in the workers (or in the loop itself without workers), the per-batch record, and the
recorder thread writing to SQLite (a temporary history, deleted afterwards).

    ../shared/tools/capped 4 -- python bench/watch_overhead.py [--rounds 9] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from dataloader_tuner import watch  # noqa: E402

# name, num_workers, step in seconds, batches per epoch
CASES = [
    ("10 ms step, 2 workers", 2, 0.010, 200),
    ("10 ms step, 0 workers", 0, 0.010, 200),
    ("no step, 0 workers", 0, 0.0, 4000),
    ("no step, 2 workers", 2, 0.0, 4000),
]
BATCH_SIZE = 32


class Features(Dataset):
    """Small in-memory samples: the loader itself is cheap, so the watcher's share shows."""

    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 16)
        self.y = torch.randint(0, 10, (n,))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index]


def epoch_time(loader, step_s: float) -> tuple[float, int]:
    """Seconds from the first batch to the end of the last step, and the batches after the
    first."""
    iterator = iter(loader)
    next(iterator)
    start, count = time.perf_counter(), 0
    for _batch in iterator:
        if step_s:
            time.sleep(step_s)
        count += 1
    return time.perf_counter() - start, count


def measure(name: str, workers: int, step_s: float, batches: int, rounds: int, db: str) -> dict:
    dataset = Features(batches * BATCH_SIZE)

    def plain_loader():
        return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=workers)

    watched = watch(plain_loader(), name=name, db=db)
    epoch_time(watched, step_s)  # warm-up: the recorder's first flushes, the page cache
    epoch_time(plain_loader(), step_s)
    ratios, costs = [], []
    for r in range(rounds):
        order = ("plain", "watched") if r % 2 == 0 else ("watched", "plain")
        got = {}
        for which in order:
            got[which] = epoch_time(plain_loader() if which == "plain" else watched, step_s)
        (plain_s, n), (watched_s, _) = got["plain"], got["watched"]
        ratios.append(watched_s / plain_s)
        costs.append((watched_s - plain_s) / n * 1e6)
    watched.close()
    return {"case": name, "watched/plain": statistics.median(ratios),
            "cost_us_per_batch": statistics.median(costs),
            "plain_us_per_batch": plain_s / n * 1e6, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", help="run the cases whose name contains this")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; targets: watched/plain <= 1.01 "
          "with a 10 ms step, cost <= 5 us/batch without one (! marks a miss)")
    print(f"{'case':24s} {'watched/plain':>14s} {'cost us/batch':>14s} {'plain us/batch':>15s}")
    with tempfile.TemporaryDirectory() as folder:
        db = os.path.join(folder, "runs.sqlite")
        for name, workers, step_s, batches in CASES:
            if args.only and args.only not in name:
                continue
            row = measure(name, workers, step_s, batches, args.rounds, db)
            ratio_miss = "!" if step_s and row["watched/plain"] > 1.01 else " "
            cost_miss = "!" if not step_s and row["cost_us_per_batch"] > 5 else " "
            print(f"{name:24s} {row['watched/plain']:13.4f}{ratio_miss} "
                  f"{row['cost_us_per_batch']:13.1f}{cost_miss} {row['plain_us_per_batch']:15.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
