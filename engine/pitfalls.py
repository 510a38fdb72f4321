"""Silent mistakes a run can reveal: each a diagnostic with a stable code, a severity, a
one-line message, the numbers behind it and the fix (as code where one fits).

Pure functions over what a run recorded (batches, resource samples, worker probes, label
counts, the system snapshot), so each rule is tested on hand-made data.
"""

from __future__ import annotations

import statistics
from typing import Sequence

from .metrics import BatchRecord

MIN_STEADY_BATCHES = 10
MEMORY_GROWTH_MB = 50.0  # a worker growing this much, and by 10% of its start, is flagged
SKEW_RATIO = 5.0  # most common class at least 5x the rarest
SHM_SHARE = 0.5  # batches in flight above half of free /dev/shm
THREADS_PER_WORKER = 4
RESTART_SHARE = 0.05  # worker start-up above 5% of an epoch, paid every epoch

RNG_FIX = """def worker_init_fn(worker_id):
    info = torch.utils.data.get_worker_info()
    # a different stream per worker (info.seed differs per worker and per epoch)
    info.dataset.{attr} = np.random.default_rng(info.seed % 2**32)

DataLoader(dataset, ..., worker_init_fn=worker_init_fn)"""

THREADS_FIX = """import os
os.environ["OMP_NUM_THREADS"] = "1"   # before numpy/cv2 are imported, or:

def worker_init_fn(worker_id):
    torch.set_num_threads(1)
    # cv2.setNumThreads(0); threadpoolctl.threadpool_limits(1) for numpy's BLAS"""


def diagnostic(code: str, severity: str, message: str, evidence: dict | None = None,
               fix: str | None = None) -> dict:
    return {"code": code, "severity": severity, "message": message,
            "evidence": evidence or {}, "fix": fix}


def short_run(steady_batches: int, warmup: int) -> list[dict]:
    if steady_batches >= MIN_STEADY_BATCHES:
        return []
    return [diagnostic(
        "short_run", "info",
        f"Only {steady_batches} batches after the {warmup}-batch warm-up: throughput figures "
        "are rough. Run longer (--seconds).", {"steady_batches": steady_batches})]


def pin_memory_without_gpu(config: dict, gpu_available: bool) -> list[dict]:
    if not config.get("pin_memory") or gpu_available:
        return []
    return [diagnostic(
        "pin_memory_without_gpu", "warning",
        "pin_memory=True but no GPU is present: pinning only costs time and locked RAM here.",
        {"pin_memory": True, "gpu": False}, "DataLoader(dataset, ..., pin_memory=False)")]


def duplicated_rng(probes: Sequence[dict]) -> list[dict]:
    """Workers whose first fetch drew from a generator in the same state draw identical
    random numbers: the same 'random' augmentation in every worker."""
    found = []
    by_generator: dict[str, dict[str, list[int]]] = {}
    for probe in probes:
        if probe["worker_id"] < 0:
            continue
        for name, state in (probe["probe"].get("rng_used") or {}).items():
            by_generator.setdefault(name, {}).setdefault(state, []).append(probe["worker_id"])
    for name, states in by_generator.items():
        shared = max(states.values(), key=len)
        if len(set(shared)) < 2:
            continue
        workers = sorted(set(shared))
        attr = name.split(".", 1)[1] if name.startswith("self.") else "rng"
        found.append(diagnostic(
            "duplicated_random_streams", "warning",
            f"Workers {', '.join(map(str, workers))} started drawing from {name} in the same "
            "state, so they produce identical random numbers (the same augmentations, the same "
            "noise). Give each worker its own generator in worker_init_fn.",
            {"generator": name, "workers": workers},
            RNG_FIX.format(attr=attr) if name.startswith("self.") else
            "def worker_init_fn(worker_id):\n    np.random.seed(torch.initial_seed() % 2**32)"))
    return found


def skewed_labels(counts: dict) -> list[dict]:
    counts = {int(k): int(v) for k, v in counts.items() if int(v) > 0}
    if len(counts) < 2:
        return []
    most, least = max(counts.values()), min(counts.values())
    if most < SKEW_RATIO * least:
        return []
    weights = {label: round(most / n, 2) for label, n in sorted(counts.items())}
    return [diagnostic(
        "skewed_labels", "warning",
        f"Labels are skewed: the most common class has {most / least:.1f}x the samples of the "
        f"rarest ({most} vs {least} in the batches counted). A model can score well by "
        "ignoring rare classes; a WeightedRandomSampler draws them as often as the others.",
        {"label_counts": dict(sorted(counts.items())), "ratio": round(most / least, 2)},
        f"class_weight = {weights}\n"
        "weights = [class_weight[label] for label in labels]  # one weight per sample\n"
        "sampler = WeightedRandomSampler(weights, num_samples=len(weights), replacement=True)\n"
        "DataLoader(dataset, ..., sampler=sampler)  # and no shuffle=True")]


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over t."""
    mean_t = statistics.fmean(t for t, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (y - mean_y) for t, y in points) / var if var else 0.0


def worker_memory_growth(resources: Sequence[dict]) -> list[dict]:
    grew = {}
    by_pid: dict[int, list[dict]] = {}
    for row in resources:
        if row["role"] == "worker" and row.get("rss_mb"):
            by_pid.setdefault(row["pid"], []).append(row)
    for pid, rows in by_pid.items():
        if len(rows) < 5 or rows[-1]["t"] - rows[0]["t"] < 2.0:
            continue
        first, last = rows[0]["rss_mb"], rows[-1]["rss_mb"]
        slope = _slope([(r["t"], r["rss_mb"]) for r in rows])
        if last - first >= MEMORY_GROWTH_MB and last >= 1.1 * first and slope > 0:
            grew[pid] = {"worker_id": rows[-1].get("worker_id"), "start_mb": round(first),
                         "end_mb": round(last), "mb_per_min": round(slope * 60, 1)}
    if not grew:
        return []
    worst = max(grew.values(), key=lambda g: g["mb_per_min"])
    return [diagnostic(
        "worker_memory_growth", "warning",
        f"Worker memory keeps growing: worker {worst['worker_id']} went from "
        f"{worst['start_mb']} MB to {worst['end_mb']} MB ({worst['mb_per_min']} MB/min), "
        f"{len(grew)} worker(s) in all. Python lists and dicts in a dataset are copied into each "
        "worker page by page as they are read (reference counts write to them), and caches "
        "fill up: every worker pays it, and long runs end in the out-of-memory killer.",
        {"workers": list(grew.values())},
        "# keep bulk data in numpy arrays (or pyarrow / a memory-mapped file), not Python "
        "objects:\nself.paths = np.array(paths)  # instead of a list of str\n"
        "# and do not cache samples inside the dataset in each worker")]


def shm_pressure(num_workers: int, prefetch: int, batch_bytes: float | None,
                 shm: dict | None) -> list[dict]:
    if not num_workers or not batch_bytes or not shm or not shm.get("free_mb"):
        return []
    in_flight_mb = num_workers * prefetch * batch_bytes / 2**20
    if in_flight_mb < SHM_SHARE * shm["free_mb"]:
        return []
    return [diagnostic(
        "shm_too_small", "warning",
        f"Batches in flight ({num_workers} workers x prefetch {prefetch} x "
        f"{batch_bytes / 2**20:.1f} MB = {in_flight_mb:.0f} MB) need more than half of the "
        f"{shm['free_mb']:.0f} MB free in /dev/shm: workers may die with a bus error.",
        {"in_flight_mb": round(in_flight_mb, 1), "shm_free_mb": round(shm["free_mb"], 1)},
        "docker run --shm-size=8g ...   # or --ipc=host; or fewer workers / prefetch_factor")]


def cpu_oversubscription(num_workers: int, system: dict, cpu_share: float | None) -> list[dict]:
    found = []
    usable = system.get("cpus_usable") or 1
    other = system.get("other_load_cpus") or 0.0
    if num_workers > usable and (cpu_share or 0) >= 0.5:
        found.append(diagnostic(
            "more_workers_than_cpus", "warning",
            f"{num_workers} workers on {usable} usable CPU(s), and the dataset is CPU-bound "
            f"({cpu_share:.0%} of each fetch is CPU): extra workers only take turns on the same "
            "cores and add memory. Tune to find the count that pays.",
            {"num_workers": num_workers, "cpus_usable": usable, "cpu_share": round(cpu_share, 2)},
            "python -m engine tune TARGET"))
    if other >= max(0.5, 0.25 * usable):
        found.append(diagnostic(
            "cpus_busy_elsewhere", "info",
            f"Other processes were using {other:.1f} of the {usable} usable CPU(s) when the run "
            "started: figures here are lower than on an idle machine, and the best num_workers "
            "is lower too.", {"other_load_cpus": other, "cpus_usable": usable}))
    return found


def thread_oversubscription(resources: Sequence[dict], num_workers: int,
                            cpus_usable: int) -> list[dict]:
    threads = [r["threads"] for r in resources if r["role"] == "worker" and r.get("threads")]
    if not threads or not num_workers:
        return []
    typical = int(statistics.median(threads))
    if typical < THREADS_PER_WORKER or num_workers * typical <= 2 * cpus_usable:
        return []
    return [diagnostic(
        "thread_oversubscription", "warning",
        f"Each worker runs {typical} threads ({num_workers} workers: {num_workers * typical} "
        f"threads on {cpus_usable} CPU(s)). Libraries inside the dataset (OpenMP, BLAS, OpenCV, "
        "thread pools) start one thread per core in every worker; they fight over the cores.",
        {"threads_per_worker": typical, "num_workers": num_workers, "cpus_usable": cpus_usable},
        THREADS_FIX)]


def restarts_each_epoch(config: dict, epochs: Sequence[dict], seconds: float) -> list[dict]:
    workers = config.get("num_workers") or 0
    if not workers or config.get("persistent_workers") or len(epochs) < 2 or seconds <= 0:
        return []
    startup = statistics.median(e["startup_s"] for e in epochs[1:])
    epoch_s = seconds / len(epochs)
    if startup < RESTART_SHARE * epoch_s:
        return []
    return [diagnostic(
        "workers_restarted_each_epoch", "warning",
        f"Each epoch starts {workers} new worker(s): the first batch of an epoch took "
        f"{startup:.2f} s, {startup / epoch_s:.0%} of a {epoch_s:.2f} s epoch, paid "
        f"{len(epochs) - 1} time(s) in this run. persistent_workers=True keeps them.",
        {"startup_s": round(startup, 3), "epoch_s": round(epoch_s, 3), "epochs": len(epochs)},
        "DataLoader(dataset, ..., persistent_workers=True)")]


def cpu_share_of(batches: Sequence[BatchRecord]) -> float | None:
    wall = sum(b.fetch_s for b in batches)
    return sum(b.fetch_cpu_s for b in batches) / wall if wall > 0 else None
