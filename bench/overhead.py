"""How much does measuring cost? Plain DataLoader vs instrumented, side by side.

For each demo dataset, three ways are run interleaved (A B C A B C ...), medians taken, each
in a fresh Python process so all three start from the same state (on this machine a loader
in a long-lived process and one in a fresh process differ by more than the overhead):
  plain     - a plain DataLoader loop, timed with a stopwatch
  instr     - the engine's instrumented loop (wrapped dataset + collate), same stopwatch
  reported  - a real background run through the engine's child process; its own reported
              samples/s
Prints instr/plain (target >= 0.97) and reported/plain (target within 0.95-1.05).

    python bench/overhead.py [--seconds 3] [--rounds 3] [--only tiny]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from torch.utils.data import DataLoader  # noqa: E402

from engine.config import LoaderConfig  # noqa: E402
from engine.measure import Consumer, Measurement, effective_config  # noqa: E402
from engine.metrics import warmup_batches  # noqa: E402
from engine.probes import batch_size_of  # noqa: E402
from engine.runner import RunRequest, run_to_completion  # noqa: E402
from engine.target import resolve  # noqa: E402

CASES = [
    ("examples/cpu_bound.py", 2),
    ("examples/latency_bound.py", 8),
    ("examples/tiny_in_memory.py", 0),
    ("examples/large_tensors.py", 2),
    ("examples/with_train_step.py", 2),
]


class Stopwatch:
    """Counts samples after the warm-up batches, the same rule for every way of running."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.count, self.samples, self.start = warmup, 0, 0, None

    def tick(self, samples: int) -> None:
        self.count += 1
        if self.count == self.warmup:
            self.start = time.monotonic()
        elif self.count > self.warmup:
            self.samples += samples

    def rate(self) -> float:
        return self.samples / (time.monotonic() - self.start)


def plain_rate(resolved, config: LoaderConfig, seconds: float) -> float:
    loader = DataLoader(resolved.dataset, **config.to_kwargs())
    watch = Stopwatch(warmup_batches(config.num_workers, config.effective_prefetch_factor))
    deadline = time.monotonic() + seconds
    while True:
        for batch in loader:
            if resolved.train_step is not None:
                resolved.train_step(batch)
            watch.tick(batch_size_of(batch))
            if time.monotonic() >= deadline:
                del loader
                return watch.rate()


def instrumented_rate(resolved, config: LoaderConfig, seconds: float) -> float:
    watch = Stopwatch(warmup_batches(config.num_workers, config.effective_prefetch_factor))
    consumer = Consumer.choose(None, resolved.train_step is not None)
    measurement = Measurement(resolved, config, consumer, seconds,
                              on_batch=lambda record: watch.tick(record.samples))
    measurement.run()
    rate = watch.rate()
    del measurement
    return rate


def reported_rate(target: str, config: LoaderConfig, seconds: float) -> float:
    handle = run_to_completion(RunRequest(target=target, config=config, seconds=seconds))
    doc = handle.live.summary(handle.state.value)
    if doc["status"] != "ok":
        raise SystemExit(f"{target}: {doc.get('error')}")
    return doc["samples_per_s"]


def fresh_process_rate(way: str, target: str, workers: int, seconds: float) -> float:
    """Run ``plain`` or ``instr`` in a new interpreter and return its samples/s."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", way, target, str(workers), str(seconds)],
        capture_output=True, text=True, check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def one(way: str, target: str, workers: int, seconds: float) -> None:
    resolved = resolve(target)
    config = effective_config(resolved, LoaderConfig(num_workers=workers), False)
    rate = (plain_rate if way == "plain" else instrumented_rate)(resolved, config, seconds)
    print(rate)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--one":
        return one(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--verbose", action="store_true", help="print every round")
    parser.add_argument("--only", help="only the demo datasets whose file name contains this")
    args = parser.parse_args()
    print(f"{'dataset':30s} {'workers':>7s} {'plain/s':>10s} {'instr/s':>10s} "
          f"{'report/s':>10s} {'instr/plain':>11s} {'report/plain':>12s}")
    worst_instr, worst_report = 1.0, 1.0
    for path, workers in CASES:
        if args.only and args.only not in os.path.basename(path):
            continue
        target = os.path.join(ROOT, path)
        resolved = resolve(target)
        config = effective_config(resolved, LoaderConfig(num_workers=workers), False)
        runs = {"plain": [], "instr": [], "report": []}
        for _ in range(args.rounds):
            runs["plain"].append(fresh_process_rate("plain", target, workers, args.seconds))
            runs["instr"].append(fresh_process_rate("instr", target, workers, args.seconds))
            runs["report"].append(reported_rate(target, config, args.seconds))
        plain, instr, report = (statistics.median(runs[k]) for k in ("plain", "instr", "report"))
        worst_instr, worst_report = min(worst_instr, instr / plain), min(
            worst_report, 1 - abs(report / plain - 1))
        if args.verbose:
            print("   ", {k: [round(v) for v in vals] for k, vals in runs.items()})
        print(f"{os.path.basename(path):30s} {workers:7d} {plain:10.1f} {instr:10.1f} "
              f"{report:10.1f} {instr / plain:11.3f} {report / plain:12.3f}", flush=True)
    print(f"\nworst instr/plain: {worst_instr:.3f} (target >= 0.97); "
          f"worst |report/plain - 1|: {1 - worst_report:.3f} (target <= 0.05)")


if __name__ == "__main__":
    main()
