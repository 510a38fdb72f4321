"""A training loop that tunes its loader in place, epoch by epoch, against a plain grid.

For each case a loop (a sleep per step, as a GPU step leaves the CPU free) runs ``--epochs``
epochs over ``watch(loader, tune=True)`` starting from a poor setting; each epoch's rate is the
samples it delivered over its wall time (start-up included, as training pays it). Then a plain
``num_workers`` grid runs the same loop one epoch per point, in two passes of alternating order,
the median per point. Printed per epoch: the setting at the epoch's end, its rate over the
grid's best (the best of noisy points: biased high); and the pick's grid point over the best
(target >= 0.95), the epochs the search took.

    ../shared/tools/capped 6 -- python bench/tune_in_place.py [--epochs N] [--only NAME]
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

from torch.utils.data import DataLoader  # noqa: E402

from dataloader_tuner import watch  # noqa: E402
from dataloader_tuner.child.target import resolve  # noqa: E402

# name, target, step ms, starting num_workers, max workers, grid, epochs, batch size (None:
# the target's)
CASES = [
    ("latency_bound", "examples/latency_bound.py:RemoteStorageDataset(length=800, latency_s=0.004)",
     8.0, 0, 12, [0, 1, 2, 3, 4, 6, 9, 12], 12, None),
    ("tiny_in_memory", "examples/tiny_in_memory.py", 0.0, 2, 4, [0, 1, 2, 3, 4], 30, None),
    # pytorch/examples' ImageNet loop at batch 32 from the job's 0 workers (issue 62): 1 worker
    # no faster than 0, 2 workers ~2x on 2 cores (NOTE [ The count the wait predicts ])
    ("imagenet_b32", "tests/real/imagenet_like.py", 2.0, 0, 4, [0, 1, 2, 3, 4], 12, 32),
]


def epoch_rate(loader, step_s: float) -> float:
    start, samples = time.perf_counter(), 0
    for batch in loader:
        samples += len(batch[-1])
        if step_s:
            time.sleep(step_s)
    return samples / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, help="epochs per case (default 12 or 30)")
    parser.add_argument("--only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)  # the settings files the search writes
        for name, target, step_ms, start, max_workers, grid, epochs_default, size in CASES:
            if args.only and args.only not in name:
                continue
            resolved = resolve(os.path.join(ROOT, target))
            dataset, step_s = resolved.dataset, step_ms / 1000
            batch_size = size or resolved.batch_size

            def plain(workers: int):
                return DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                  num_workers=workers)

            watched = watch(plain(start), name=name, db=os.path.join(folder, "runs.sqlite"),
                            tune=True, max_workers=max_workers)
            epochs = []
            started = time.perf_counter()
            for _ in range(args.epochs or epochs_default):
                rate = epoch_rate(watched, step_s)
                epochs.append((watched.search.current.num_workers, rate,
                               watched.search.finished))
            tuned_s = time.perf_counter() - started
            watched.close()
            best_trial = watched.search.best
            pick = (best_trial.setting if best_trial is not None
                    else watched.search.current).num_workers
            points = {n: [] for n in grid}
            for order in (grid, grid[::-1]):
                for n in order:
                    points[n].append(epoch_rate(plain(n), step_s))
            medians = {n: statistics.median(r) for n, r in points.items()}
            best_n = max(medians, key=medians.get)
            best = medians[best_n]
            print(f"\n{name}: step {step_ms:g} ms, start num_workers={start}; grid best "
                  f"num_workers={best_n} at {best:.0f} samples/s; watched run {tuned_s:.0f} s")
            print("  epoch  num_workers  samples/s  /best  search")
            for i, (n, rate, finished) in enumerate(epochs):
                print(f"  {i:5d}  {n:11d}  {rate:9.0f}  {rate / best:5.2f}  "
                      f"{'done' if finished else 'searching'}")
            share = medians.get(pick, epoch_rate(plain(pick), step_s)) / best
            done_at = next((i for i, (_, _, f) in enumerate(epochs) if f), None)
            print(f"  pick num_workers={pick}: {share:.2f} of the grid's best"
                  f"{' !' if share < 0.95 else ''}; "
                  + (f"search done in epoch {done_at}" if done_at is not None
                     else "search NOT finished within the epochs run !"))


if __name__ == "__main__":
    main()
