"""Does the tuner find the best settings, and how much faster than trying them all?

For each demo workload, in one run:
  1. the tuner, through the real engine (child process, real workers): its pick and wall time;
  2. an exhaustive num_workers grid with a plain DataLoader, measured in passes of alternating
     order (A..Z, Z..A, ...) and averaged, so slow drift on this shared machine hits every point
     alike; the grid's time is one pass;
  3. the folk rules read off the same grid: 0, the CPU count, Lightning's max(1, cpus - 1);
  4. when the pick is not the grid's best, the two head to head: plain runs alternating
     (A B A B), the median of the per-pair ratios. The grid's best is the maximum of a dozen
     noisy points, so it is biased high (the winner's curse: on a flat plateau the same 2 vs 8
     workers measured 1.07 in one grid and 0.93 head to head); the paired ratio is the target's
     figure, the grid ratio is printed beside it.
The tuner's pick is scored on plain measurements, like the rest. For the workload with a
train_step, the score is consumer idle: the pick must be at most one worker above the fewest
that keep the step fed (idle within 2 points of the best); its grid gets twice the passes, as
idle differences of a point or two are what decides there.

    python bench/tune_quality.py [--seconds 3] [--max-workers 32] [--only NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from torch.utils.data import DataLoader  # noqa: E402

from dataloader_tuner.config import LoaderConfig  # noqa: E402
from dataloader_tuner.child.starting import starting_config  # noqa: E402
from dataloader_tuner.config import warmup_batches  # noqa: E402
from dataloader_tuner.instrument.tensors import samples_in  # noqa: E402
from dataloader_tuner.run.runner import RunRequest, run_to_completion  # noqa: E402
from dataloader_tuner.system import usable_cpus  # noqa: E402
from dataloader_tuner.child.target import resolve  # noqa: E402

WORKLOADS = [
    "examples/cpu_bound.py",
    "examples/latency_bound.py",
    "examples/tiny_in_memory.py",
    "examples/large_tensors.py",
    "dataloader_tuner.demo",
]
FED_TOLERANCE = 0.02
# torch warns about every worker count above the CPU count; the grid asks for them on purpose.
warnings.filterwarnings("ignore", message="This DataLoader will create")


def plain_measure(resolved, config: LoaderConfig, seconds: float) -> tuple[float, float | None]:
    """(samples/s, consumer idle) of a plain DataLoader over ``seconds`` after warm-up."""
    loader = DataLoader(resolved.dataset, **config.to_kwargs())
    warmup = warmup_batches(config.num_workers, config.effective_prefetch_factor)
    step = resolved.train_step
    count, samples, waited, start = 0, 0, 0.0, None
    while True:
        iterator = iter(loader)
        while True:
            t_request = time.monotonic()
            try:
                batch = next(iterator)
            except StopIteration:
                break
            t_ready = time.monotonic()
            if step is not None:
                step(batch)
            count += 1
            if count == warmup:
                start = time.monotonic()
            elif count > warmup:
                samples += samples_in(batch)
                waited += t_ready - t_request
                elapsed = time.monotonic() - start
                if elapsed >= seconds:
                    del iterator
                    return samples / elapsed, (waited / elapsed if step else None)


def tune(target: str, max_workers: int) -> tuple[dict, float]:
    started = time.monotonic()
    handle = run_to_completion(RunRequest(target=target, kind="tune", max_workers=max_workers))
    wall = time.monotonic() - started
    doc = handle.live.result(handle.state.value).to_dict()
    if doc["status"] != "ok":
        raise SystemExit(f"{target}: {doc.get('error')}")
    return doc, wall


def head_to_head(resolved, base: LoaderConfig, pick: int, best: int, seconds: float,
                 pairs: int) -> float:
    """Median of per-pair ratios pick/best, plain runs alternating (A B B A ...)."""
    ratios = []
    for pair in range(pairs):
        order = (pick, best) if pair % 2 == 0 else (best, pick)
        rate = {n: plain_measure(resolved, base.replace(num_workers=n), seconds)[0] for n in order}
        ratios.append(rate[pick] / rate[best])
    return statistics.median(ratios)


def grid_points(max_workers: int) -> list[int]:
    points = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    return [n for n in points if n <= max_workers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per grid point")
    parser.add_argument("--max-workers", type=int, default=32)
    parser.add_argument("--passes", type=int, default=2, help="grid passes (x2 with a step)")
    parser.add_argument("--pairs", type=int, default=4, help="head-to-head pairs, pick vs best")
    parser.add_argument("--only", help="run only workloads whose path contains this")
    args = parser.parse_args()
    cpus = usable_cpus()
    folk = {"0": 0, "cpus": cpus, "lightning": max(1, cpus - 1)}
    print(f"usable CPUs: {cpus}; grid {grid_points(args.max_workers)}; {args.seconds:g} s/point\n")
    header = (f"{'workload':20s} {'pick':>4s} {'best':>4s} {'paired':>6s} {'grid':>5s} "
              f"{'0/best':>7s} {'cpus/best':>9s} {'light/best':>10s} {'tune s':>7s} "
              f"{'grid s':>7s} {'tune/grid':>9s}")
    rows = []
    for path in WORKLOADS:
        if args.only and args.only not in path:
            continue
        target = os.path.join(ROOT, path) if path.endswith(".py") else path  # else a module
        doc, tune_s = tune(target, args.max_workers)
        pick = doc["recommended"]["num_workers"]
        resolved = resolve(target)
        base = starting_config(resolved)
        points = grid_points(args.max_workers)
        rates = {n: [] for n in points}
        idles = {n: [] for n in points}
        passes = args.passes * (2 if resolved.train_step is not None else 1)
        grid_started = time.monotonic()
        for pass_no in range(passes):
            for n in (points if pass_no % 2 == 0 else points[::-1]):
                rate, idle = plain_measure(resolved, base.replace(num_workers=n), args.seconds)
                rates[n].append(rate)
                idles[n].append(idle)
            if pass_no == 0:
                grid_s = time.monotonic() - grid_started
        rate = {n: sum(v) / len(v) for n, v in rates.items()}
        name = os.path.basename(path)[:-3]
        if resolved.train_step is not None:
            idle = {n: sum(v) / len(v) for n, v in idles.items()}
            best_idle = min(idle.values())
            fed = min(n for n in points if idle[n] <= best_idle + FED_TOLERANCE)
            next_up = min((n for n in points if n > fed), default=fed)
            verdict = "ok" if fed <= pick <= next_up else ("UNDER" if pick < fed else "OVER")
            print(f"{name}: idle by workers " + ", ".join(f"{n}:{idle[n]:.1%}" for n in points))
            rows.append(f"{name:20s} {pick:4d} {fed:4d}   fed@{fed}, pick idle "
                        f"{idle.get(pick, float('nan')):.1%} ({verdict})"
                        f"{'':>20s} {tune_s:7.1f} {grid_s:7.1f} {tune_s / grid_s:9.2f}")
        else:
            best = max(rate, key=rate.get)
            pick_rate = rate.get(pick)
            if pick_rate is None:  # the tuner may pick a count off the grid: measure it too
                pick_rate = plain_measure(resolved, base.replace(num_workers=pick), args.seconds)[0]
            print(f"{name}: samples/s by workers " +
                  ", ".join(f"{n}:{rate[n]:.0f}" for n in points))
            paired = 1.0 if pick == best else head_to_head(resolved, base, pick, best,
                                                            args.seconds, args.pairs)
            rows.append(
                f"{name:20s} {pick:4d} {best:4d} {paired:6.2f} {pick_rate / rate[best]:5.2f} "
                f"{rate[folk['0']] / rate[best]:7.2f} {rate[folk['cpus']] / rate[best]:9.2f} "
                f"{rate[folk['lightning']] / rate[best]:10.2f} {tune_s:7.1f} {grid_s:7.1f} "
                f"{tune_s / grid_s:9.2f}")
        sys.stdout.flush()
    print("\n" + header)
    print("\n".join(rows))
    print("\npaired: pick/best head to head (1.00 when the pick is the grid's best); grid: the "
          "pick's grid point over the grid's best")
    print("targets: pick/best (paired) >= 0.95; tune/grid <= 0.25 and tune <= 60 s; "
          "train_step pick at most one grid step above the fewest that keep it fed")


if __name__ == "__main__":
    main()
