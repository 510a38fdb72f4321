"""How much does measuring cost? Plain DataLoader vs instrumented, side by side.

This machine's speed drifts by far more than the overhead (runs of the same plain loop differ
by 1.7x from one minute to the next), so every comparison is paired in time:
  instr/plain   - in one fresh Python process, a plain DataLoader loop and the engine's
                  instrumented loop (wrapped dataset + collate + the per-batch record) take
                  turns in short slices (A B B A A B ...); the median of the per-pair ratios.
  report/plain  - a real background run through the engine's child process and a plain loop
                  in a fresh process, back to back, the order alternating; the median of the
                  per-round ratios of their undisturbed rates (see undisturbed_rate: runs of
                  seconds cannot alternate finely enough to pair out the host's slow spells).
                  "(raw)" is the same ratio of the whole-run figures, the engine's reported
                  samples/s against the plain loop's stopwatch.
Targets: instr/plain >= 0.97, report/plain within 0.95-1.05.

    python bench/overhead.py [--seconds 3] [--rounds 7] [--only tiny] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


from dataloader_tuner.config import LoaderConfig  # noqa: E402
from dataloader_tuner.child.measure import Measurement  # noqa: E402
from dataloader_tuner.record.columns import BatchColumns  # noqa: E402
from dataloader_tuner.record.cards import Consumer  # noqa: E402
from dataloader_tuner.child.starting import starting_config  # noqa: E402
from dataloader_tuner.config import warmup_batches  # noqa: E402
from dataloader_tuner.run.runner import RunRequest, run_to_completion  # noqa: E402
from dataloader_tuner.child.target import resolve  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "real"))
from plain_loop import counting_loader  # noqa: E402  # the corpus's own plain loop

CASES = [
    ("examples/cpu_bound.py", 2),
    ("examples/latency_bound.py", 8),
    ("examples/tiny_in_memory.py", 0),
    ("examples/large_tensors.py", 2),
    ("dataloader_tuner.demo", 2),
]


WINDOW_S = 0.5


def undisturbed_rate(times: list[float], samples: list[int]) -> float | None:
    """The 75th percentile of a run's samples/s over 0.5 s windows.

    The host slows this VM by up to 1.7x for seconds at a time, both vCPUs at once (seen with
    two loops pinned to different CPUs); a run's undisturbed windows are what compare fairly.
    """
    if not times:
        return None
    rates, start, count = [], times[0], 0
    for t, n in zip(times, samples):
        count += n
        if t - start >= WINDOW_S:
            rates.append(count / (t - start))
            start, count = t, 0
    if len(rates) < 4:  # too short to tell spells apart: the whole run
        return sum(samples[1:]) / max(times[-1] - times[0], 1e-9)
    return statistics.quantiles(rates, n=4)[2]


class Stopwatch:
    """Counts samples after the warm-up batches, the same rule for every way of running."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.count, self.samples, self.start = warmup, 0, 0, None
        self.times: list[float] = []
        self.sizes: list[int] = []

    def tick(self, samples: int, at: float | None = None) -> None:
        """A batch of ``samples`` ended now (or ``at``, time.monotonic)."""
        now = time.monotonic() if at is None else at
        self.count += 1
        if self.count == self.warmup:
            self.start = now
        elif self.count > self.warmup:
            self.samples += samples
            self.times.append(now)
            self.sizes.append(samples)

    def rates(self) -> dict:
        return {"rate": self.samples / (self.times[-1] - self.start),
                "undisturbed": undisturbed_rate(self.times, self.sizes)}


def plain_rate(resolved, config: LoaderConfig, seconds: float) -> dict:
    # Samples counted as the corpus's plain loops count them (the batch sampler's indices):
    # read off the batch, a detectron2-style list of dicts counted 3 (its images' channels)
    loader, unpack = counting_loader(resolved.dataset, config.to_kwargs())
    watch = Stopwatch(warmup_batches(config.num_workers, config.effective_prefetch_factor))
    deadline = time.monotonic() + seconds
    while True:
        for item in loader:
            samples, batch = unpack(item)
            if resolved.train_step is not None:
                resolved.train_step(batch)
            watch.tick(samples)
            if time.monotonic() >= deadline:
                del loader
                return watch.rates()


def instrumented_rate(resolved, config: LoaderConfig, seconds: float) -> dict:
    watch = Stopwatch(warmup_batches(config.num_workers, config.effective_prefetch_factor))
    consumer = Consumer.choose(None, resolved.train_step is not None)
    columns = BatchColumns()
    measurement = Measurement(resolved, config, consumer, seconds, columns)
    measurement.run()
    for record in columns.rows():
        watch.tick(record.samples, record.t_ready + record.step_s + columns.t0)
    rates = watch.rates()
    del measurement
    return rates


def reported_rate(target: str, config: LoaderConfig, seconds: float) -> dict:
    """The engine's own figure for a real background run, and its undisturbed rate."""
    handle = run_to_completion(RunRequest(target=target, seconds=seconds,
                                          settings={"num_workers": config.num_workers}))
    doc = handle.live.result(handle.state.value).to_dict()
    if doc["status"] != "ok":
        raise SystemExit(f"{target}: {doc.get('error')}")
    measured = handle.live.batches[handle.live.warmup_batches:]
    return {"rate": doc["samples_per_s"],
            "undisturbed": undisturbed_rate([b.t_ready + b.step_s for b in measured],
                                            [b.samples for b in measured])}


def fresh_process_rate(target: str, workers: int, seconds: float) -> dict:
    """A plain loop in a new interpreter: its rates."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", "plain", target, str(workers), str(seconds)],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def alternating_rates(target: str, workers: int, seconds: float, pairs: int) -> dict:
    """In a new interpreter, ``pairs`` slices each of plain and instr, alternating."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", "pairs", target, str(workers), str(seconds),
         str(pairs)],
        capture_output=True, text=True, check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(way: str, target: str, workers: int, seconds: float, pairs: int = 1) -> None:
    resolved = resolve(target)
    config = starting_config(resolved, {"num_workers": workers})
    if way == "plain":
        print(json.dumps(plain_rate(resolved, config, seconds)))
        return
    rates: dict[str, list[dict]] = {"plain": [], "instr": []}
    for pair in range(pairs):
        order = ("plain", "instr") if pair % 2 == 0 else ("instr", "plain")
        for name in order:
            rate = plain_rate if name == "plain" else instrumented_rate
            rates[name].append(rate(resolved, config, seconds))
    print(json.dumps(rates))


def paired_ratio(a: list[dict], b: list[dict], key: str) -> float:
    return statistics.median(x[key] / y[key] for x, y in zip(a, b))


def main() -> None:
    if len(sys.argv) >= 6 and sys.argv[1] == "--one":
        pairs = int(sys.argv[6]) if len(sys.argv) > 6 else 1
        return one(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), pairs)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--verbose", action="store_true", help="print every round")
    parser.add_argument("--only", help="only the demo datasets whose file name contains this")
    args = parser.parse_args()
    print(f"{'dataset':30s} {'workers':>7s} {'plain/s':>10s} {'instr/s':>10s} "
          f"{'report/s':>10s} {'instr/plain':>11s} {'report/plain':>12s} {'(raw)':>10s}")
    worst_instr, worst_report = 1.0, 1.0
    for path, workers in CASES:
        if args.only and args.only not in os.path.basename(path):
            continue
        target = os.path.join(ROOT, path)
        resolved = resolve(target)
        config = starting_config(resolved, {"num_workers": workers})
        # A slice is long enough for its warm-up and a few hundred batches; with tiny batches
        # short slices track the machine's drift more closely.
        slice_s = args.seconds if workers else min(args.seconds, 0.5)
        pairs = args.rounds * (3 if not workers else 1)
        alternated = alternating_rates(target, workers, slice_s, pairs)
        instr_ratio = paired_ratio(alternated["instr"], alternated["plain"], "rate")
        report_runs: dict[str, list[dict]] = {"plain": [], "report": []}
        for round_no in range(args.rounds):
            order = ("plain", "report") if round_no % 2 == 0 else ("report", "plain")
            for way in order:
                report_runs[way].append(
                    fresh_process_rate(target, workers, args.seconds) if way == "plain"
                    else reported_rate(target, config, args.seconds))
        report_ratio = paired_ratio(report_runs["report"], report_runs["plain"], "undisturbed")
        report_raw = paired_ratio(report_runs["report"], report_runs["plain"], "rate")
        worst_instr = min(worst_instr, instr_ratio)
        worst_report = min(worst_report, 1 - abs(report_ratio - 1))
        if args.verbose:
            every = {**alternated, "plain (fresh)": report_runs["plain"],
                     "report": report_runs["report"]}
            for key in ("rate", "undisturbed"):
                print(f"    {key}:", {k: [round(r[key]) for r in runs] for k, runs in every.items()})
        plain, instr, report = (statistics.median(r["rate"] for r in runs) for runs in (
            report_runs["plain"], alternated["instr"], report_runs["report"]))
        print(f"{os.path.basename(path):30s} {workers:7d} {plain:10.1f} {instr:10.1f} "
              f"{report:10.1f} {instr_ratio:11.3f} {report_ratio:12.3f} {report_raw:10.3f}",
              flush=True)
    print(f"\nworst instr/plain: {worst_instr:.3f} (target >= 0.97); "
          f"worst |report/plain - 1|: {1 - worst_report:.3f} (target <= 0.05)")


if __name__ == "__main__":
    main()
