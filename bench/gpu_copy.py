"""Host-to-device copies, pageable against pinned, from 64 KB to 256 MB; then what watching
costs a GPU-bound training loop.

Copies: one buffer per size and memory kind (its pages touched, as a real batch's are), copied
into one device buffer, timed with CUDA events on the current stream; pageable copies as
``.to(device)`` makes them, pinned ones asynchronously (``non_blocking=True``, as loops with
``pin_memory=True`` do); after warm-up, the two kinds in turns, the median of ``--repeats``.
"pinned x" is the pinned copy's speed over the pageable one's (> 1: pinning pays). Then a pair
of one batch's copies, one of each kind, after the GPU idled: each kind first and second.

Overhead: one epoch of a GPU-bound loop (in-memory batches copied with ``loader.to``, a step of
fp32 matmuls taking about ``--step-ms`` on the GPU, never synchronised inside the loop),
plain and watched in turns, the order alternating round by round; each epoch timed from
``iter()`` to a final ``torch.cuda.synchronize()``. Reported per case: watched/plain median and
range over ``--rounds`` (target: median <= 1.01, the measuring adds only GPU events and never
waits for them), and the plain loop's ms per batch against the GPU step.

    python bench/gpu_copy.py [--repeats 9] [--rounds 7] [--batches 200] [--step-ms 5]

Without a CUDA GPU it prints one line saying so and exits 0.
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

KB, MB = 2**10, 2**20
SIZES = [64 * KB, 256 * KB, MB, 4 * MB, 16 * MB, 64 * MB, 256 * MB]
BATCH_SIZE, WIDTH = 64, 1024  # 256 KB float32 batches in the overhead loop
# name, pin_memory (pinned batches are copied asynchronously; pageable ones block, as
# ``.to(device)`` does, which waits for the step before: the usual loop)
CASES = [("pinned, non_blocking copies", True), ("pageable, blocking copies", False)]


def timing_events() -> tuple[torch.cuda.Event, torch.cuda.Event]:
    return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)


def copy_ms(src: torch.Tensor, dst: torch.Tensor) -> float:
    """One host-to-device copy, timed with CUDA events on the destination device's current
    stream, where the copy is queued (pinned sources copied asynchronously, as
    ``pin_memory=True`` loops do; pageable ones as ``.to(device)`` does)."""
    with torch.cuda.device(dst.device):
        stream = torch.cuda.current_stream(dst.device)
        start, end = timing_events()
        start.record(stream)
        dst.copy_(src, non_blocking=src.is_pinned())
        end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def pageable_and_pinned_ms(size: int, repeats: int, warmup: int = 2,
                           device: str = "cuda") -> tuple[float, float]:
    """Medians of ``repeats`` copies of ``size`` bytes from pageable and from pinned memory,
    taken in turns after ``warmup`` of each."""
    pageable = torch.ones(size, dtype=torch.uint8)  # pages touched: a real batch's are
    pinned = torch.ones(size, dtype=torch.uint8).pin_memory()
    dst = torch.empty(size, dtype=torch.uint8, device=device)
    for _ in range(warmup):
        copy_ms(pageable, dst)
        copy_ms(pinned, dst)
    page, pin = [], []
    for _ in range(repeats):
        page.append(copy_ms(pageable, dst))
        pin.append(copy_ms(pinned, dst))
    del pageable, pinned, dst
    return statistics.median(page), statistics.median(pin)


def gbps(size: int, ms: float) -> float:
    return size / (ms / 1000.0) / 1e9


def size_text(size: int) -> str:
    return f"{size // MB} MB" if size >= MB else f"{size // KB} KB"


class GpuStep:
    """Real GPU work standing in for a training step: ``repeats`` fp32 matmuls of ``size`` x
    ``size``, queued on the current stream and never waited for (as a step's kernels are).
    Given ``ms``, as many matmuls as take about that long on this GPU (timed here); ``ms``
    is then what one step takes on the GPU, measured with events."""

    def __init__(self, ms: float | None = None, size: int = 2048) -> None:
        generator = torch.Generator(device="cuda").manual_seed(0)
        scale = size ** -0.5  # products stay near unit size, never inf
        self.a = torch.randn(size, size, device="cuda", generator=generator) * scale
        self.b = torch.randn(size, size, device="cuda", generator=generator) * scale
        self.out = torch.empty_like(self.a)
        self.repeats = 1
        if ms is not None:
            self.repeats = max(1, round(ms / self.time_ms()))
        self.ms = self.time_ms()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeats):
            torch.mm(self.a, self.b, out=self.out)
        return self.out[0, 0] + x.float().mean()  # a "loss" that depends on the batch

    def time_ms(self, rounds: int = 5) -> float:
        x = torch.zeros(1, device="cuda")
        self(x)
        times = []
        for _ in range(rounds):
            start, end = timing_events()
            start.record()
            self(x)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


class InMemory(Dataset):
    """Samples already in memory: the loader is never what the loop waits for."""

    def __init__(self, n: int, width: int = WIDTH) -> None:
        self.x = torch.randn(n, width)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.x[index]


def copy_table(repeats: int) -> None:
    print(f"{'size':>8s} {'pageable ms':>12s} {'pinned ms':>10s} {'pageable GB/s':>14s} "
          f"{'pinned GB/s':>12s} {'pinned x':>9s}")
    for size in SIZES:
        page_ms, pin_ms = pageable_and_pinned_ms(size, repeats)
        print(f"{size_text(size):>8s} {page_ms:12.4f} {pin_ms:10.4f} {gbps(size, page_ms):14.2f} "
              f"{gbps(size, pin_ms):12.2f} {page_ms / pin_ms:9.2f}", flush=True)


ORDER_SIZES = [64 * KB, MB, 16 * MB]
IDLE_S = 0.005  # the GPU idles this long before each pair, as while a loop waits for a batch


def order_table(repeats: int) -> None:
    """A pair of copies of one batch, one of each memory kind, after the GPU has idled (as the
    watcher's and the engine's comparisons make them): each kind's median when it went first
    and when it went second. A kind faster second than first means the order, not the memory
    kind, decided part of the comparison."""
    print(f"{'size':>8s} {'pageable 1st':>13s} {'pageable 2nd':>13s} {'pinned 1st':>11s} "
          f"{'pinned 2nd':>11s}   (ms, after {IDLE_S * 1000:.0f} ms idle)")
    for size in ORDER_SIZES:
        pageable = torch.ones(size, dtype=torch.uint8)
        pinned = torch.ones(size, dtype=torch.uint8).pin_memory()
        dst = torch.empty(size, dtype=torch.uint8, device="cuda")
        got: dict[tuple[str, int], list[float]] = {}
        for r in range(2 + 2 * repeats):
            order = (("pageable", pageable), ("pinned", pinned))
            if r % 2:
                order = order[::-1]
            torch.cuda.synchronize()
            time.sleep(IDLE_S)
            for place, (name, src) in enumerate(order):
                ms = copy_ms(src, dst)
                if r >= 2:  # the first two rounds warm up
                    got.setdefault((name, place), []).append(ms)
        cells = [statistics.median(got[(name, place)]) for name in ("pageable", "pinned")
                 for place in (0, 1)]
        print(f"{size_text(size):>8s} {cells[0]:13.4f} {cells[1]:13.4f} {cells[2]:11.4f} "
              f"{cells[3]:11.4f}", flush=True)


def watched_over_plain(plain: DataLoader, watched, pin: bool, step: GpuStep, rounds: int
                       ) -> tuple[list[float], list[dict[str, float]]]:
    """Epochs of a GPU-bound loop, ``plain`` and ``watched`` (the same loader, watched) in
    turns, the order alternating, after one of each: watched/plain per round and the seconds.
    Each epoch is timed from ``iter()`` to a final synchronize; nothing in the loop waits."""
    def epoch_s(loader, to) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for batch in loader:
            step(to(batch))
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    def plain_to(batch):
        return batch.to("cuda", non_blocking=pin)

    def watched_to(batch):
        return watched.to(batch, "cuda")

    epoch_s(plain, plain_to)  # warm-up: pinned blocks, the recorder's first flushes
    epoch_s(watched, watched_to)
    ratios, times = [], []
    for r in range(rounds):
        got = {}
        for which in (("plain", "watched") if r % 2 == 0 else ("watched", "plain")):
            got[which] = (epoch_s(plain, plain_to) if which == "plain"
                          else epoch_s(watched, watched_to))
        ratios.append(got["watched"] / got["plain"])
        times.append(got)
    return ratios, times


def overhead(name: str, pin: bool, step: GpuStep, batches: int, rounds: int, db: str) -> None:
    from dataloader_tuner import watch

    dataset = InMemory(batches * BATCH_SIZE)
    plain = DataLoader(dataset, batch_size=BATCH_SIZE, pin_memory=pin)
    watched = watch(DataLoader(dataset, batch_size=BATCH_SIZE, pin_memory=pin), name=name,
                    db=db)
    if not hasattr(watched, "run_id"):
        raise SystemExit(f"{name}: watch() did not watch the loader (see its message above)")

    try:
        ratios, times = watched_over_plain(plain, watched, pin, step, rounds)
    finally:
        watched.close()
    plain_times = [t["plain"] for t in times]
    median = statistics.median(ratios)
    miss = "!" if median > 1.01 else " "
    print(f"{name:30s} {median:8.4f}{miss} {min(ratios):8.4f} {max(ratios):8.4f} "
          f"{statistics.median(plain_times) / batches * 1000:14.3f} {step.ms:12.3f}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="copies per size and kind")
    parser.add_argument("--rounds", type=int, default=7, help="plain/watched pairs per case")
    parser.add_argument("--batches", type=int, default=200, help="batches per epoch")
    parser.add_argument("--step-ms", type=float, default=5.0, help="GPU step per batch")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_copy: no CUDA GPU visible (torch.cuda.is_available() is False); nothing "
              "measured")
        return 0
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}; host-to-device copies, median of {args.repeats}")
    copy_table(args.repeats)
    print("\nthe order of a pinned/pageable pair after the GPU idled")
    order_table(args.repeats)
    step = GpuStep(args.step_ms)
    print(f"\nwatched/plain on a GPU-bound loop: {args.batches} batches of "
          f"{BATCH_SIZE}x{WIDTH} float32, {step.repeats} matmuls a step, {args.rounds} rounds "
          "(! marks a median over 1.01)")
    print(f"{'case':30s} {'median':>9s} {'min':>8s} {'max':>8s} {'plain ms/batch':>14s} "
          f"{'GPU step ms':>12s}")
    with tempfile.TemporaryDirectory() as folder:
        db = os.path.join(folder, "runs.sqlite")
        for name, pin in CASES:
            overhead(name, pin, step, args.batches, args.rounds, db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
