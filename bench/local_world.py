"""Node-level tuning: N ranks' loaders on one machine, the tool's pick against a measured grid.

For each workload and N = 1, 2, 4, in one run:
  1. the tuner through the real engine with ``local_world_size=N`` (every trial runs N loaders
     at once, engine/child/companions.py): its num_workers per rank;
  2. a grid of num_workers per rank, each point measured as N ranks would run: N processes (a
     fresh interpreter each, as torchrun starts them), each a plain DataLoader loop, all timed
     over the same window; the point's figure is their total samples/s. Passes alternate the
     order (A..Z, Z..A) so drift on this shared machine hits every point alike; the mean of
     the passes is taken;
  3. the score: the total at the pick over the grid's best total (target >= 0.95). The grid's
     best is the maximum of noisy points, so it is biased high: the score is conservative.

    ../shared/tools/capped 16 -- python bench/local_world.py [--seconds 3] [--only NAME]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dataloader_tuner.run.runner import RunRequest, run_to_completion  # noqa: E402
from dataloader_tuner.system import usable_cpus  # noqa: E402

WORKLOADS = ["examples/cpu_bound.py", "examples/latency_bound.py"]
RANKS = (1, 2, 4)
WARM_S = 4.0  # every rank's workers started and its prefetch full before the window opens


def grid_points(max_workers: int) -> list[int]:
    return [n for n in (0, 1, 2, 3, 4, 6, 8, 12, 16) if n <= max_workers]


def plain_rank(target: str, pipe) -> None:
    """One "rank": a plain DataLoader loop over the target, run for each order it gets."""
    # Started by spawn, this process would start its DataLoader workers by spawn too (an
    # import of torch each); a rank torchrun starts uses the platform's default (fork).
    multiprocessing.set_start_method(None, force=True)
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    from torch.utils.data import DataLoader

    from dataloader_tuner.instrument.tensors import samples_in
    from dataloader_tuner.child.target import resolve
    from dataloader_tuner.child.starting import starting_config

    resolved = resolve(target)
    base = starting_config(resolved)
    pipe.send("loaded")
    while True:
        order = pipe.recv()
        if order is None:
            return
        workers, start, end = order
        config = base.replace(num_workers=workers, persistent_workers=workers > 0)
        loader = DataLoader(resolved.dataset, **config.to_kwargs())
        samples, done = 0, False
        while not done:
            for batch in loader:
                now = time.monotonic()
                if start < now <= end:
                    samples += samples_in(batch)
                elif now > end:
                    done = True
                    break
        # Shut down here, not in the collector's time: a loader dropped with its persistent
        # workers alive had them abort as the next setting's workers started.
        if loader._iterator is not None:
            loader._iterator._shutdown_workers()
        del loader
        pipe.send(samples / (end - start))


class Ranks:
    """N plain ranks, told to run a setting over one shared window."""

    def __init__(self, target: str, n: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.pipes, self.procs = [], []
        for _ in range(n):
            mine, theirs = context.Pipe()
            proc = context.Process(target=plain_rank, args=(target, theirs))
            proc.start()
            self.pipes.append(mine)
            self.procs.append(proc)
        for pipe in self.pipes:
            assert pipe.recv() == "loaded"

    def total(self, workers: int, seconds: float) -> float:
        start = time.monotonic() + WARM_S
        for pipe in self.pipes:
            pipe.send((workers, start, start + seconds))
        return sum(pipe.recv() for pipe in self.pipes)

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for proc in self.procs:
            proc.join(30)


def tune(target: str, ranks: int, max_workers: int, budget_s: float) -> tuple[dict, float]:
    started = time.monotonic()
    handle = run_to_completion(RunRequest(target=target, kind="tune", max_workers=max_workers,
                                          local_world_size=ranks, budget_s=budget_s))
    doc = handle.live.result(handle.state.value).to_dict()
    if doc["status"] != "ok":
        raise SystemExit(f"{target} x{ranks}: {doc.get('error')}")
    return doc, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per grid point")
    parser.add_argument("--max-workers", type=int, default=16, help="per rank")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=45.0)
    parser.add_argument("--only", help="run only workloads whose path contains this")
    args = parser.parse_args()
    print(f"usable CPUs: {usable_cpus()}; grid {grid_points(args.max_workers)} workers per rank; "
          f"{args.seconds:g} s per point, {args.passes} passes\n")
    print(f"{'workload':16s} {'N':>2s} {'pick':>4s} {'per rank':>9s} {'node':>8s} "
          f"{'best':>4s} {'best node':>9s} {'pick/best':>9s} {'tune s':>6s}")
    scores = []
    for path in WORKLOADS:
        if args.only and args.only not in path:
            continue
        target = os.path.join(ROOT, path)
        for n in RANKS:
            doc, tune_s = tune(target, n, args.max_workers, args.budget_s)
            pick = doc["recommended"]["num_workers"]
            points = sorted(set(grid_points(args.max_workers)) | {pick})
            totals: dict[int, list[float]] = {w: [] for w in points}
            ranks = Ranks(target, n)
            try:
                for pass_no in range(args.passes):
                    for w in (points if pass_no % 2 == 0 else points[::-1]):
                        totals[w].append(ranks.total(w, args.seconds))
            finally:
                ranks.close()
            mean = {w: statistics.fmean(v) for w, v in totals.items()}
            best = max(mean, key=mean.get)
            score = mean[pick] / mean[best]
            scores.append(score)
            print(f"{os.path.basename(path)[:-3]:16s} {n:2d} {pick:4d} {mean[pick] / n:9.0f} "
                  f"{mean[pick]:8.0f} {best:4d} {mean[best]:9.0f} {score:9.3f} {tune_s:6.0f}",
                  flush=True)
            print("    grid (node samples/s): " + ", ".join(f"{w}: {mean[w]:.0f}" for w in points),
                  flush=True)
    print(f"\nworst pick/best: {min(scores):.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
