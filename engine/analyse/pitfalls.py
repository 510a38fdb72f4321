"""Silent mistakes a run can reveal: each a diagnostic with a stable code, a severity, a
one-line message, the numbers behind it and the fix (as code where one fits).

Pure functions over what a run recorded (batches, resource samples, worker probes, label
counts, the system snapshot), so each rule is tested on hand-made data.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping, Sequence

from dataloader_tuner.analyse.diagnostic import Diagnostic, seconds_text
from dataloader_tuner.record.cards import DatasetCard
from dataloader_tuner.record.rows import TimedBatch
from dataloader_tuner.system import SystemSnapshot

MIN_STEADY_BATCHES = 10
SKEW_RATIO = 5.0  # most common class at least 5x the rarest, at SKEW_CONFIDENCE
SKEW_CONFIDENCE = 0.95  # one-sided, shared by every pair of classes counted
SHM_SHARE = 0.5  # batches in flight above half of free /dev/shm
RESTART_SHARE = 0.05  # worker start-up above 5% of an epoch, paid every epoch

RNG_FIX = """def worker_init_fn(worker_id):
    info = torch.utils.data.get_worker_info()
    # a different stream per worker (info.seed differs per worker and per epoch)
    info.dataset.{attr} = np.random.default_rng(info.seed % 2**32)

DataLoader(dataset, ..., worker_init_fn=worker_init_fn)"""



def short_run(steady_batches: int, warmup: int) -> list[Diagnostic]:
    if steady_batches >= MIN_STEADY_BATCHES:
        return []
    return [Diagnostic(
        "short_run", "info",
        f"Only {steady_batches} batches after the {warmup}-batch warm-up: throughput figures "
        "are rough. Run longer (--seconds).", {"steady_batches": steady_batches})]


# Below this time per batch measuring is a visible share of it (record/ledger.py's
# NOTE [ Measuring cost on the fastest batches ]).
MEASURING_COST_BATCH_S = 100e-6


def measuring_cost(batches_per_s: float | None, samples_per_s: float | None) -> list[Diagnostic]:
    """Batches so fast that measuring them shows in the rate: say so, and what it means."""
    if not batches_per_s or 1.0 / batches_per_s >= MEASURING_COST_BATCH_S:
        return []
    batch_us = 1e6 / batches_per_s
    return [Diagnostic(
        "measuring_cost", "info",
        f"Batches arrive every {batch_us:.0f} us: at this speed the few microseconds the tool "
        "adds to each batch (timing, counting, streaming) are a visible share, so the rates "
        "shown may be up to ~15% below the same loop unmeasured. At "
        f"{samples_per_s or 0:,.0f} samples/s the loader is rarely what limits training.",
        {"batch_us": round(batch_us, 1), "threshold_us": MEASURING_COST_BATCH_S * 1e6})]


def pin_memory_without_gpu(config: dict[str, Any], gpu_available: bool) -> list[Diagnostic]:
    if not config.get("pin_memory") or gpu_available:
        return []
    return [Diagnostic(
        "pin_memory_without_gpu", "warning",
        "pin_memory=True but no GPU is present: pinning only costs time and locked RAM here.",
        {"pin_memory": True, "gpu": False}, "DataLoader(dataset, ..., pin_memory=False)")]


def duplicated_rng(probes: Sequence[dict[str, Any]]) -> list[Diagnostic]:
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
        found.append(Diagnostic(
            "duplicated_random_streams", "warning",
            f"Workers {', '.join(map(str, workers))} started drawing from {name} in the same "
            "state, so they produce identical random numbers (the same augmentations, the same "
            "noise). Give each worker its own generator in worker_init_fn.",
            {"generator": name, "workers": workers},
            RNG_FIX.format(attr=attr) if name.startswith("self.") else
            "def worker_init_fn(worker_id):\n    np.random.seed(torch.initial_seed() % 2**32)"))
    return found


SKEW_FIX = """import collections
from torch.utils.data import WeightedRandomSampler

def label_of(sample):  # where the tool found labels: last in a tuple, or under a label key
    if isinstance(sample, dict):
        return next(sample[k] for k in ("label", "labels", "target", "targets", "y") if k in sample)
    return sample[-1]

# one label per sample, from the dataset itself (ImageFolder and MNIST keep them in .targets;
# reading every sample instead decodes the whole dataset once)
source = getattr(dataset, "targets", None)
if source is None:
    source = getattr(dataset, "labels", None)
if source is None:
    source = [label_of(dataset[i]) for i in range(len(dataset))]
labels = [int(y) for y in source]
counts = collections.Counter(labels)
weights = [1.0 / counts[y] for y in labels]  # every class drawn equally often
sampler = WeightedRandomSampler(weights, num_samples=len(weights), replacement=True)
# DataLoader(dataset, ..., sampler=sampler)  # and no shuffle=True: the sampler shuffles"""


def label_order(config: dict[str, Any], dataset: DatasetCard | None) -> bool | None:
    """Whether counted batches come in random order: True with shuffle=True or a random
    sampler, False when sequential (map-style, neither), None when unknown (an iterable's own
    stream, a custom sampler or batch sampler)."""
    if config.get("shuffle"):
        return True
    sampler = str(config.get("sampler") or config.get("batch_sampler") or "")
    if sampler:
        return True if "Random" in sampler else None
    return None if dataset is not None and dataset.kind == "iterable" else False


def skew_lower_bound(most: int, least: int, classes: int) -> float:
    """A lower confidence bound on how many times more common one class is than another,
    from their counts.

    Given most + least, the commoner class's count is binomial with p = r / (1 + r) for a true
    ratio r; Wilson's score interval bounds p. The two were picked as the extremes of
    ``classes``, so the error rate is split over every pair (Bonferroni): among 1000 evenly
    used classes counted ~8 times each, the extremes differ 8- to 19-fold by chance alone."""
    pairs = max(1.0, classes * (classes - 1) / 2)
    z = statistics.NormalDist().inv_cdf(1 - max((1 - SKEW_CONFIDENCE) / pairs, 1e-15))
    n, p = most + least, most / (most + least)
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    low = (centre - spread) / (1 + z * z / n)
    return low / (1 - low)


def skewed_labels(counts: Mapping[Any, int], order_independent: bool | None = True,
                  dataset_len: int | None = None, source: str = "batches") -> list[Diagnostic]:
    """Flag class imbalance only when the counts prove it: the rarest and the most common
    class differ at least SKEW_RATIO-fold at SKEW_CONFIDENCE.

    ``order_independent``: True when the counted batches came in random order, None when
    unknown. False (sequential, e.g. an ImageFolder without shuffle serves classes in sorted
    runs) is judged only when as many labels were counted as the dataset has."""
    counts = {int(k): int(v) for k, v in counts.items() if int(v) > 0}
    if len(counts) < 2:
        return []
    counted = sum(counts.values())
    covers = dataset_len is not None and counted >= dataset_len
    if order_independent is False and not covers:
        return []
    most_label, most = max(counts.items(), key=lambda kv: kv[1])
    least_label, least = min(counts.items(), key=lambda kv: kv[1])
    low = skew_lower_bound(most, least, len(counts))
    if low < SKEW_RATIO:
        return []
    order = {True: "shuffled", None: "unknown", False: "sequential"}[order_independent]
    how = {True: "in sampled batches in shuffled order",
           None: "in sampled batches in an order not known to be random",
           False: "in sampled batches in sequential order, as many as the dataset has"
           }[order_independent]
    if source == "dataset":
        how = "in the dataset's own label list (targets), every sample"
    return [Diagnostic(
        "skewed_labels", "warning",
        f"Labels are skewed: class {most_label} has {most / least:.1f}x the samples of class "
        f"{least_label} ({most} vs {least}; at least {low:.1f}x at {SKEW_CONFIDENCE:.0%} "
        f"confidence), counted from {counted} labels of {len(counts)} classes {how}. A model "
        "can score well by ignoring rare classes; a WeightedRandomSampler "
        "draws them as often as the others.",
        {"label_counts": dict(sorted(counts.items())), "most": [most_label, most],
         "least": [least_label, least], "ratio": round(most / least, 2),
         "ratio_lower_bound": round(low, 2), "confidence": SKEW_CONFIDENCE,
         "labels_counted": counted, "classes_counted": len(counts),
         "order": order, "dataset_len": dataset_len, "source": source},
        SKEW_FIX)]


# What frees /dev/shm for batches in flight, in words (a run's diagnostic, a job's node).
SHM_FIXES = ("Fixes: fewer workers or a lower prefetch_factor, a larger /dev/shm (a container's "
             "--shm-size), or torch.multiprocessing.set_sharing_strategy('file_system').")
SHM_FIX = ("docker run --shm-size=8g ...   # or --ipc=host; or fewer workers / a lower "
           "prefetch_factor; or, first in the script:\n"
           "torch.multiprocessing.set_sharing_strategy('file_system')")


def shm_pressure(num_workers: int, prefetch: int, batch_bytes: float | None,
                 shm: dict[str, Any] | None, ranks: int = 1,
                 estimated: bool = False, in_use: bool = False) -> list[Diagnostic]:
    """Batches in flight (workers x prefetch_factor x batch bytes, for each of the node's
    ``ranks``) against the free space of /dev/shm, where worker batches travel: a warning at
    half of it, and one that says the run will fail once they would not fit. ``estimated``:
    the batch's bytes come from sample 0 times the batch size (no batch made yet); ``in_use``:
    /dev/shm was read while these batches were in it (a sample during the run), so the space
    they hold is theirs, not taken."""
    if not num_workers or not batch_bytes or not shm or shm.get("free_mb") is None:
        return []
    ranks = max(ranks, 1)
    in_flight_mb = ranks * num_workers * prefetch * batch_bytes / 2**20
    free_mb = shm["free_mb"]
    if in_use:
        free_mb = min(free_mb + in_flight_mb, shm.get("total_mb") or float("inf"))
    if in_flight_mb < SHM_SHARE * free_mb:
        return []
    each = f"{batch_bytes / 2**20:.1f} MB" + (" (sample 0 x batch_size)" if estimated else "")
    node = f" x {ranks} ranks on this node" if ranks > 1 else ""
    where = (f"the {free_mb:.0f} MB free in /dev/shm"
             + (f" (rehearsed as {shm['total_mb']:.0f} MB)" if shm.get("rehearsed") else ""))
    verdict = (f"more than {where}: workers will die with a bus error or 'No space left on "
               "device'" if in_flight_mb >= free_mb else
               f"more than half of {where}: workers may die with a bus error")
    return [Diagnostic(
        "shm_too_small", "warning",
        f"Batches in flight ({num_workers} workers x prefetch {prefetch} x {each}{node} = "
        f"{in_flight_mb:.0f} MB) need {verdict}. {SHM_FIXES}",
        {"in_flight_mb": round(in_flight_mb, 1), "shm_free_mb": round(free_mb, 1),
         "ranks": ranks, "will_not_fit": in_flight_mb >= free_mb, "estimated": estimated,
         "during_run": in_use},
        SHM_FIX)]


def cpu_oversubscription(num_workers: int, system: SystemSnapshot, cpu_share: float | None,
                         tuned_workers: int | None = None) -> list[Diagnostic]:
    """More CPU-bound workers than usable CPUs. Not raised for a count the tuner measured to
    pay (``tuned_workers``): one worker beyond the cores often does, covering the hand-offs."""
    found = []
    usable = system.cores  # affinity capped by a cgroup quota, as the tuner counts
    other = system.other_load_cpus
    measured_to_pay = tuned_workers is not None and num_workers <= tuned_workers
    if (num_workers > usable and cpu_share is not None and cpu_share >= 0.5
            and not measured_to_pay):
        found.append(Diagnostic(
            "more_workers_than_cpus", "warning",
            f"{num_workers} workers on {usable:g} usable CPU(s), and the dataset is CPU-bound "
            f"({cpu_share:.0%} of each fetch is CPU): extra workers may only take turns on the "
            "same cores and add memory. Tune to measure whether they pay.",
            {"num_workers": num_workers, "cpus_usable": usable, "cpu_share": round(cpu_share, 2),
             "cpu_quota": system.cpu_quota},
            "python -m dataloader_tuner tune TARGET"))
    if other >= max(0.5, 0.25 * usable):
        found.append(Diagnostic(
            "cpus_busy_elsewhere", "info",
            f"Other processes were using {other:.1f} of the {usable:g} usable CPU(s) when the run "
            "started: figures here are lower than on an idle machine, and the best num_workers "
            "is lower too.", {"other_load_cpus": other, "cpus_usable": usable}))
    return found


def restarts_each_epoch(config: dict[str, Any], epochs: Sequence[dict[str, Any]],
                        seconds: float, making_s: float | None = None) -> list[Diagnostic]:
    """Workers started anew each epoch, when that start-up is a real share of an epoch; with
    what persistent_workers=True saves: each later epoch's start-up less the one batch a kept
    worker still has to make (``making_s``, its measured median) before the epoch's first
    arrives."""
    workers = config.get("num_workers") or 0
    if not workers or config.get("persistent_workers") or len(epochs) < 2 or seconds <= 0:
        return []
    startup = statistics.median(e["startup_s"] for e in epochs[1:])
    epoch_s = seconds / len(epochs)
    kept_s = min(making_s or 0.0, startup)  # a kept worker's first batch of the epoch
    if startup - kept_s < RESTART_SHARE * epoch_s:  # what keeping them would save
        return []
    saving_s = (startup - kept_s) * (len(epochs) - 1)
    return [Diagnostic(
        "workers_restarted_each_epoch", "warning",
        f"Each epoch starts {workers} new worker(s): the first batch of an epoch took "
        f"{seconds_text(startup)}, {startup / epoch_s:.0%} of a {seconds_text(epoch_s)} epoch, "
        f"paid {len(epochs) - 1} time(s) in this run. persistent_workers=True keeps them: it would "
        f"have saved about {seconds_text(saving_s)} of this {seconds:.1f} s run "
        f"({saving_s / seconds:.0%}), {seconds_text(startup - kept_s)} an epoch (an epoch's "
        f"start-up less the {seconds_text(kept_s)} a kept worker takes to make its first "
        "batch).",
        {"startup_s": round(startup, 3), "epoch_s": round(epoch_s, 3), "epochs": len(epochs),
         "saving_per_epoch_s": round(startup - kept_s, 3), "saving_s": round(saving_s, 3),
         "making_s": round(making_s, 4) if making_s is not None else None},
        "DataLoader(dataset, ..., persistent_workers=True)")]


def cpu_share_of(made: Sequence[TimedBatch]) -> float | None:
    """CPU time over wall time of the fetches whose CPU time was read (``timed(batches)``)."""
    read = [(b.fetch_s, b.fetch_cpu_s) for b in made if b.fetch_cpu_s is not None]
    wall = sum(fetch_s for fetch_s, _ in read)
    return sum(cpu_s for _, cpu_s in read) / wall if wall > 0 else None
