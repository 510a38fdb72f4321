"""Watch each DataLoader worker's memory while a plain loop runs a target module.

    ../shared/tools/capped 6 -- python3 tests/real/measure_memory.py copy_on_read_leak [15]

Runs ``plain_loop`` settings (the module's own) for N seconds and samples every worker's
``psutil.Process.memory_full_info()`` (USS = private memory, RSS) once a second; prints one
line per sample and a start/end summary per worker. Used to get the numbers written in
``copy_on_read_leak.py`` / ``copy_on_read_fixed.py`` / ``memmap_store.py``.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plain_loop import build_dataset, load_module, loader_settings  # noqa: E402

MB = 2**20


def watch(stop: threading.Event, rows: dict[int, list[tuple[float, float, float]]],
          t0: float) -> None:
    me = psutil.Process()
    while not stop.wait(1.0):
        for child in me.children():
            try:
                info = child.memory_full_info()
            except psutil.Error:
                continue
            rows.setdefault(child.pid, []).append(
                (time.monotonic() - t0, info.uss / MB, info.rss / MB))
            print(f"t={time.monotonic() - t0:5.1f}s worker {child.pid}: "
                  f"uss {info.uss / MB:7.1f} MB  rss {info.rss / MB:7.1f} MB", flush=True)


def main(name: str, seconds: float) -> None:
    module, _ = load_module(name if name.endswith(".py") else
                            os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         name + ".py"))
    t0 = time.monotonic()
    dataset = build_dataset(module)
    print(f"built in {time.monotonic() - t0:.2f}s; parent rss "
          f"{psutil.Process().memory_info().rss / MB:.0f} MB", flush=True)
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, **loader_settings(module, dataset))
    rows: dict[int, list] = {}
    stop = threading.Event()
    t0 = time.monotonic()
    thread = threading.Thread(target=watch, args=(stop, rows, t0), daemon=True)
    thread.start()
    batches = 0
    try:
        while time.monotonic() - t0 < seconds:
            for _ in loader:  # a new epoch each time round (same workers if persistent)
                batches += 1
                if time.monotonic() - t0 >= seconds:
                    break
    finally:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None:
            iterator._shutdown_workers()
    stop.set()
    thread.join()
    print(f"{batches} batches in {time.monotonic() - t0:.1f}s")
    for pid, samples in rows.items():
        (t_a, uss_a, rss_a), (t_b, uss_b, rss_b) = samples[0], samples[-1]
        print(f"worker {pid}: USS {uss_a:.0f} -> {uss_b:.0f} MB, RSS {rss_a:.0f} -> "
              f"{rss_b:.0f} MB over {t_b - t_a:.0f}s")


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 15.0)
