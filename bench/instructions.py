"""What does measuring cost each batch, in instructions? A count the host's noise cannot move.

This machine's speed swings by a third between seconds (docs/benchmarks.md), so a 3% cost is
lost in the spread of timed pairs. Here the work is counted instead: the whole run goes under
valgrind's callgrind, and each phase (N batches of one way of iterating) is bracketed by
callgrind's client requests (a tiny C shim, compiled here with gcc), which zero and dump its
counters; a phase's instructions over its batches is its cost per batch, the same to within
~0.1% from one repeat to the next. Per module, at ``num_workers=0`` (every per-batch cost of
the tool is then in the one process, the worst case for fast batches):
  plain     a plain DataLoader with the module's settings (tests/real/plain_loop.py's)
  engine    the engine's measuring loop (child/measure.py: wrapped dataset, timing collate,
            columns) plus the child's encoding of those batches for its pipe; the parent's
            share (decode, fold into windows: another process, another core) is ``parent``
  watched   ``watch(loader)`` over the same loader, its recorder thread writing a temporary
            history (every row, window and flush it makes for these batches); of it,
            ``recorder`` is that thread's flush (counted in a phase of its own, after the
            loop's, which holds the recorder's flushes off), each flush's own cost (a flush
            of nothing new, counted apart) charged as often a batch as at full speed (a
            flush every 0.25 s: ~5,800 of long_tail's batches, not a phase's 1,500)
  probes    the loader's probed copy (the dataset and collate wrappers the engine and a watched
            loader run, watcher/rebuild.py), iterated by a plain loop: what they cost alone
  bare      the plain loader through the least a timing loop does (two clock readings and two
            appends a batch, in a generator): with ``probes``, the floor of any loop that
            times every batch and counts its samples exactly
  child     a real engine child's profile run (``python -m dataloader_tuner.child``, as a run
            starts it, its stack sampler on), under valgrind from start to end: two runs of
            different lengths, their difference over their batches' (--no-child: skipped)
Figures are instructions per batch; ``x plain`` is the cost over plain's. ``cpu/time`` is a
plain loop's CPU over its time at full speed, and ``+t`` a way's instructions beyond plain's
as a share of a batch's time there (run at plain's pace: ``time_share``): where a batch waits
on the disk, its instructions are a small part of its time and ``x plain`` overstates what
the tool costs it. Not counted: the stack sampler in the phases (in ``child`` only) and what a
system call costs beyond its instructions. With a few batches a phase (``--batches 5``), each
phase's epoch start (a new iterator, the first batches all timed) weighs on its figure.

Under valgrind a batch takes ~50x longer, and the tool decides by the clock (a batch under
1 ms is timed every 16th only; beyond 2,000 batches a second rows fold into windows; the
recorder flushes every 0.25 s, stretched by the same factor). So the run's ``time.monotonic``
is slowed by the factor
measured (a plain loop's time per batch under valgrind over the same outside it), before the
tool is imported: it decides as it would at full speed. That clock is a Python function, a few
hundred instructions a call more than the real one: its calls are counted, and what they cost
beyond the real clock's (timed in a phase of their own) is taken off each way's figure.

    python bench/instructions.py [--only NAME] [--batches 1500] [--repeats 2] [--no-child]
        [--keep DIR] [--seeded]

With ``--seeded`` every phase starts from the same seeds (``random``, torch's, numpy's): each
way draws the same shuffle and augmentations, for modules whose samples differ in cost (a JPEG
folder's photos of different sizes). Off by default: on long_tail it moved the watched way's
job-thread phase from 1.032 to 1.056 of plain (plain and engine unmoved), not yet explained.

Needs valgrind and gcc (Debian: valgrind, gcc); ~4 minutes a module (importing torch under
valgrind alone takes ~2), and ~8 more for ``child``. A slow pipeline (imagefolder_compose,
memmap_store: 66-82 ms a batch natively) is counted on a few batches a phase, its warm-up and
calibration as short (``--batches 5 --seeded``).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = ["tests/real/long_tail.py", "tests/real/many_classes.py"]
SHIM = """#include <valgrind/callgrind.h>
void phase_start(void) { CALLGRIND_ZERO_STATS; }
void phase_end(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }
"""
WAYS = ("plain", "engine", "parent", "watched", "recorder", "idle", "probes", "bare")
CLOCK_CALLS = 20_000  # calls of each clock timed, for what the slowed one costs more a call


def warm_up(batches: int) -> int:
    """Batches iterated before any phase (the first epoch's one-time costs): 50, or a phase's
    where phases are shorter (a slow pipeline's: 66 ms a batch natively is ~5 s under
    valgrind, and 50 of them alone took ~4 minutes)."""
    return min(50, batches)


def calibration(batches: int) -> int:
    """Batches timed under valgrind for the slowing factor: 200, or a phase's where phases are
    shorter (a slow batch's time is known from a few)."""
    return min(200, max(batches, 5))


# -- inside valgrind ---------------------------------------------------------------------------

def plain_loader(target: str):
    """The module's dataset and DataLoader settings at 0 workers, as a plain loop builds them."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "real"))
    import plain_loop  # the corpus's own, independent of the tool

    module, attr = plain_loop.load_module(os.path.join(ROOT, target))
    dataset = plain_loop.build_dataset(module, attr)
    settings = plain_loop.loader_settings(module, dataset, num_workers=0)
    for name in ("persistent_workers", "prefetch_factor"):  # workers' own: an error without
        settings.pop(name, None)  # (memmap_store asks for persistent workers)
    return dataset, settings


def timed_only(loader) -> Iterator[Any]:
    """``loader``'s batches, epoch after epoch, each batch's wait and step times kept: two
    clock readings and two appends a batch (the real clock: the slowed one's Python call
    would be counted)."""
    times: list[float] = []
    clock, keep = time.perf_counter, times.append
    while True:
        t_request = clock()
        for batch in loader:
            t_ready = clock()
            keep(t_request)
            keep(t_ready)
            yield batch
            t_request = clock()


def seeded() -> None:
    """The random generators a loader draws from (its shuffle, the dataset's augmentations)
    set alike: on a JPEG folder of photos of different sizes, 20 batches of different images
    and crops part ways by more than the tool costs."""
    import random

    import torch

    random.seed(0)
    torch.manual_seed(0)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(0)


def iterate(loader, batches: int) -> None:
    """``batches`` batches of ``loader``, epoch after epoch, as a training loop takes them."""
    taken = 0
    while True:
        for _batch in loader:
            taken += 1
            if taken >= batches:
                return


class SlowClock:
    """``time.monotonic`` slowed by ``factor`` (and moved on by ``skipped``): the tool's clock
    reads the time as if the run were at full speed. It counts its calls, so that what it
    costs beyond the real clock can be taken off each way's count."""

    def __init__(self, factor: float) -> None:
        self.raw, self.factor, self.skipped = time.monotonic, factor, 0.0
        self.start = self.raw()
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return self.start + (self.raw() - self.start) / self.factor + self.skipped


def clock_calls(clock, calls: int) -> None:
    for _ in range(calls):
        clock()


def inner(args: argparse.Namespace) -> None:
    shim = ctypes.CDLL(args.shim)
    from torch.utils.data import DataLoader

    dataset, settings = plain_loader(args.inner)
    iterate(DataLoader(dataset, **settings), warm_up(args.batches))  # one-time costs
    started = time.monotonic()
    iterate(DataLoader(dataset, **settings), args.calibrate)
    factor = max(1.0, (time.monotonic() - started) / args.calibrate / args.native_s)
    clock = SlowClock(factor)
    time.monotonic = clock  # before the tool is imported: its modules read this one

    from dataloader_tuner import watch
    from dataloader_tuner.run import recorder
    # The recorder thread waits on the real clock between its flushes (an Event's wait):
    # stretched too, so that a watched phase flushes (and samples resources) as often a batch
    # as at full speed, not ~factor times as often
    recorder.FLUSH_S *= factor
    from dataloader_tuner.child.measure import Measurement
    from dataloader_tuner.child.target import resolve
    from dataloader_tuner.child.starting import starting_config
    from dataloader_tuner.protocol import Batches, decode, encode
    from dataloader_tuner.record.cards import Consumer
    from dataloader_tuner.record.columns import BatchColumns
    from dataloader_tuner.record.folding import Thinner
    from dataloader_tuner.record.windows import TAIL_S
    from dataloader_tuner.watcher.rebuild import instrumented

    resolved = resolve(os.path.join(ROOT, args.inner))
    config = starting_config(resolved, {"num_workers": 0})
    consumer = Consumer.choose(None, False)
    wires: list[bytes] = []

    # Each way is made ready outside its phase (a run's start-up: the loader built, the
    # dataset's label list read) and returns what runs inside it: the per-batch work
    def engine(batches: int) -> Callable[[], None]:
        columns = BatchColumns()
        measurement = Measurement(resolved, config, consumer, float("inf"), columns,
                                  max_batches=batches)

        def run() -> None:
            try:
                measurement.run()
            finally:
                measurement.close()
            wires[:] = [encode(Batches.of_columns(columns))]  # the child's recorder thread's

        return run

    def parent(batches: int) -> Callable[[], None]:
        thinner = Thinner(loose_below=config.warmup_batches)

        def run() -> None:
            thinner.arrived(decode(wires[0]).rows)
            thinner.flush()

        return run

    history = tempfile.mkdtemp(prefix="instructions-")
    watched = watch(DataLoader(dataset, **settings), name="instructions",
                    db=os.path.join(history, "runs.sqlite"))

    # A watched way is counted in two phases: the job's thread (the recorder's flushes held
    # off, so none falls inside it by chance) and then the recorder's flush of those batches
    flush = watched.recorder.flush

    def watched_loop(batches: int) -> Callable[[], None]:
        def run() -> None:
            watched.recorder.flush = lambda *args, **kwargs: None
            iterate(watched, batches)

        return run

    def recorded(batches: int) -> Callable[[], None]:
        def run() -> None:
            watched.recorder.flush = flush
            clock.skipped += TAIL_S + 1  # every batch's row is past its wait: all written now
            flush()

        return run

    def idle(batches: int) -> Callable[[], None]:
        return flush  # (right after the recorder's: nothing new to write)

    def plain(batches: int) -> Callable[[], None]:
        loader = DataLoader(dataset, **settings)
        return lambda: iterate(loader, batches)

    def probes(batches: int) -> Callable[[], None]:
        probed, why_not = instrumented(DataLoader(dataset, **settings))
        if probed is None:
            raise SystemExit(f"{args.inner}: no probed copy: {why_not}")
        return lambda: iterate(probed, batches)

    def bare(batches: int) -> Callable[[], None]:
        loader = DataLoader(dataset, **settings)
        return lambda: iterate(timed_only(loader), batches)

    ways = {"plain": plain, "engine": engine, "parent": parent, "watched": watched_loop,
            "recorder": recorded, "idle": idle, "probes": probes, "bare": bare}
    calls: dict[str, list[int]] = {name: [] for name in WAYS}
    for repeat in range(args.repeats + 1):  # the first is a warm-up, its counts dropped
        for name in WAYS:
            run = ways[name](args.batches)
            gc.collect()  # each phase from the same collector state (a full collection in
            before = clock.calls  # one phase and not another moved ways by ~0.7%)
            if args.seeded:  # each way the same samples and augmentations (a JPEG's size)
                seeded()
            shim.phase_start()
            run()
            shim.phase_end(f"{repeat}:{name}".encode())
            if repeat:
                calls[name].append(clock.calls - before)
        for name, timer in (("slow-clock", clock), ("real-clock", clock.raw)):
            shim.phase_start()
            clock_calls(timer, CLOCK_CALLS)
            shim.phase_end(f"{repeat}:{name}".encode())
    watched.close()
    shutil.rmtree(history, ignore_errors=True)
    print(json.dumps({"factor": factor, "clock_calls": calls}))


# -- the engine's child, as a run starts it ----------------------------------------------------

# Installed before the child imports anything of the tool (a sitecustomize.py on its path): its
# clock slowed by the phases' factor, and its recorder's flushes and its stack sampler's timers
# (on the CPU time and the time passing, both valgrind's) stretched by it.
SLOWED_SITE = """
import os, time
factor = float(os.environ["INSTRUCTIONS_SLOWED"])
raw, start = time.monotonic, time.monotonic()
time.monotonic = lambda: start + (raw() - start) / factor
from dataloader_tuner.run import recorder
recorder.FLUSH_S *= factor
from dataloader_tuner.instrument import sampler
sampler.StackSampler.__init__.__defaults__ = (sampler.INTERVAL_S * factor, None)
"""
CHILD_SECONDS = (1.0, 4.0)  # two profile runs; their difference is the steady state's


def child_run(target: str, seconds: float, factor: float, folder: str) -> tuple[int, int]:
    """(batches, instructions) of a real engine child's profile run of ``target`` at
    num_workers=0 for ``seconds`` (its slowed clock's), stack sampler on, under callgrind."""
    from dataloader_tuner.protocol import EVENT_FD_ENV, Batches, RunRequest, decode

    site = os.path.join(folder, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as file:
        file.write(SLOWED_SITE)
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, INSTRUCTIONS_SLOWED=repr(factor), PYTHONHASHSEED="0",
               PYTHONPATH=os.pathsep.join((site, ROOT)), **{EVENT_FD_ENV: str(write_fd)})
    env.pop("DATALOADER_TUNER_SAMPLE", None)
    out = os.path.join(folder, f"child-{seconds}.out")
    request = RunRequest(target=target, settings={"num_workers": 0}, seconds=seconds,
                         step_ms=0, timeout_s=3600)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
         "dataloader_tuner.child"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, pass_fds=(write_fd,), env=env, cwd=ROOT)
    os.close(write_fd)
    assert proc.stdin is not None  # started with stdin=PIPE
    proc.stdin.write(json.dumps(request.to_json()).encode())
    proc.stdin.close()
    with os.fdopen(read_fd, "rb") as events:
        lines = events.read().splitlines()
    if proc.wait() != 0:
        raise SystemExit(f"{target}: the engine's child under valgrind failed")
    batches = sum(len(event.rows) for event in map(decode, lines) if isinstance(event, Batches))
    with open(out) as dump:
        total = next(int(line.split()[1]) for line in dump if line.startswith("totals:"))
    return batches, total


def child_per_batch(target: str, factor: float, folder: str) -> float:
    """A real engine child's instructions a batch in its steady state: two runs' difference
    over their batches' (the start-up the same in both)."""
    (short_n, short), (long_n, long) = (child_run(target, seconds, factor, folder)
                                        for seconds in CHILD_SECONDS)
    return (long - short) / (long_n - short_n)


# -- outside ------------------------------------------------------------------------------------

def native_seconds_per_batch(target: str, batches: int = 300) -> tuple[float, float]:
    """A plain loop's time and CPU time per batch at full speed (medians of three): a batch
    that waits on the disk (memmap_store: 2x slower under valgrind, not ~50x) spends most of
    its time outside its instructions."""
    from torch.utils.data import DataLoader

    dataset, settings = plain_loader(target)
    iterate(DataLoader(dataset, **settings), 50)
    times, cpu = [], []
    for _ in range(3):
        started, cpu_started = time.monotonic(), time.process_time()
        iterate(DataLoader(dataset, **settings), batches)
        times.append((time.monotonic() - started) / batches)
        cpu.append((time.process_time() - cpu_started) / batches)
    return statistics.median(times), statistics.median(cpu)


def time_share(way: float, plain: float, cpu_share: float) -> float:
    """A way's instructions a batch beyond plain's, as a share of a batch's time at full speed:
    run at plain's pace, over the batch's time (``cpu_share``: plain's CPU over its time). For
    a batch all CPU this is ``x plain - 1``; for one waiting on the disk, much less."""
    return (way - plain) / plain * cpu_share


def counts(folder: str) -> dict[str, list[int]]:
    """Each way's instructions per phase, from the dumps (``desc: Trigger: ... R:WAY``)."""
    found: dict[str, list[int]] = {}
    for path in glob.glob(os.path.join(folder, "cg.*.*")):
        name = total = None
        with open(path) as dump:
            for line in dump:
                if line.startswith("desc: Trigger:"):
                    name = line.rsplit(" ", 1)[-1].strip()
                elif line.startswith("totals:"):
                    total = int(line.split()[1])
        if name and total is not None and ":" in name:
            repeat, way = name.split(":", 1)
            if repeat != "0":
                found.setdefault(way, []).append(total)
    return found


def measure(target: str, args: argparse.Namespace, folder: str, shim: str) -> dict:
    native_s, native_cpu_s = native_seconds_per_batch(target)
    out = os.path.join(folder, os.path.basename(target))
    os.makedirs(out)
    env = dict(os.environ, DATALOADER_TUNER_SAMPLE="0",
               PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/cg.%p",
         sys.executable, os.path.abspath(__file__), "--inner", target, "--shim", shim,
         "--native-s", repr(native_s), "--batches", str(args.batches),
         "--repeats", str(args.repeats), "--calibrate", str(calibration(args.batches))]
        + (["--seeded"] if args.seeded else []),
        cwd=ROOT, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{target}: the run under valgrind failed:\n{run.stderr[-2000:]}")
    said = json.loads(run.stdout.strip().splitlines()[-1])
    found = counts(out)
    extra_per_call = statistics.median(
        (slow - real) / CLOCK_CALLS for slow, real in zip(found["slow-clock"], found["real-clock"]))
    # The recorder's flushes: the least of the repeats, not the median. A flush that writes a
    # statement's row count for the first time prepares it (sqlite3_prepare_v2: 4.2M
    # instructions in one repeat of long_tail's, ~2.8k a batch; none in the next), and a
    # running job's statements are cached after its first few flushes.
    per_batch = {way: (min if way == "recorder" else statistics.median)(
        total - extra_per_call * calls for total, calls in zip(found[way], said["clock_calls"][way])
    ) / args.batches for way in WAYS}
    # A flush's own cost (``idle``: of nothing new) once a flush's batches at full speed
    from dataloader_tuner.run.recorder import FLUSH_S
    flush_batches = max(FLUSH_S / native_s, 1.0)
    per_flush = per_batch.pop("idle") * args.batches
    per_batch["recorder"] += per_flush / flush_batches - per_flush / args.batches
    per_batch["watched"] += per_batch["recorder"]  # the job's thread's and its recorder's
    # (the engine's and plain's: the watched way's moves with where its recorder's flushes fall)
    spread = {way: (max(found[way]) - min(found[way])) / statistics.median(found[way])
              for way in ("plain", "engine")}
    if args.child:  # (its clock's extra cost taken off as the engine way's, for its calls)
        per_batch["child"] = (child_per_batch(target, said["factor"], out) - extra_per_call
                              * statistics.median(said["clock_calls"]["engine"]) / args.batches)
    return {"module": os.path.basename(target), "native_us": native_s * 1e6,
            "cpu_share": min(native_cpu_s / native_s, 1.0),
            "per_flush": per_flush,
            "factor": said["factor"], **per_batch, "spread": max(spread.values()),
            "clock_calls": statistics.median(said["clock_calls"]["engine"]) / args.batches,
            "extra_per_call": extra_per_call}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="the corpus modules (tests/real) whose name has this")
    parser.add_argument("--batches", type=int, default=1500, help="per phase")
    parser.add_argument("--repeats", type=int, default=2, help="phases of each way counted")
    parser.add_argument("--no-child", dest="child", action="store_false",
                        help="skip the real engine child's runs (~6 minutes a module)")
    parser.add_argument("--keep", metavar="DIR",
                        help="copy callgrind's dumps here (for callgrind_annotate)")
    parser.add_argument("--seeded", action="store_true",
                        help="every phase from the same seeds (for modules that augment)")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    parser.add_argument("--shim", help=argparse.SUPPRESS)
    parser.add_argument("--native-s", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--calibrate", type=int, default=200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        return inner(args)
    missing = [tool for tool in ("valgrind", "gcc") if shutil.which(tool) is None]
    if missing or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        raise SystemExit(f"needs valgrind (with its callgrind.h) and gcc; missing: "
                         f"{', '.join(missing) or 'callgrind.h'} (Debian: apt-get install "
                         f"valgrind gcc)")
    targets = MODULES
    if args.only:
        targets = sorted(os.path.relpath(p, ROOT) for p in glob.glob(
            os.path.join(ROOT, "tests", "real", f"*{args.only}*.py")))
    with tempfile.TemporaryDirectory(prefix="instructions-") as folder:
        shim = os.path.join(folder, "libphases.so")
        source = os.path.join(folder, "phases.c")
        with open(source, "w") as file:
            file.write(SHIM)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", shim, source], check=True)
        print(f"instructions per batch at num_workers=0, {args.batches} batches a phase, "
              f"median of {args.repeats}")
        print(f"{'module':22s} {'us/batch':>8s} {'plain':>9s} {'engine':>9s} {'x plain':>8s} "
              f"{'watched':>9s} {'x plain':>8s} {'recorder':>8s} {'a flush':>9s} {'parent':>8s} "
              f"{'probes x':>8s} "
              f"{'bare x':>7s} "
              f"{'child x':>8s} {'spread':>7s} {'slowed':>6s} {'cpu/time':>8s} "
              f"{'engine +t':>9s} {'watched +t':>10s}")
        for target in targets:
            row = measure(target, args, folder, shim)
            if args.keep:
                shutil.copytree(os.path.join(folder, os.path.basename(target)),
                                os.path.join(args.keep, os.path.basename(target)),
                                dirs_exist_ok=True)
            plain = row["plain"]
            print(f"{row['module']:22s} {row['native_us']:8.1f} {plain:9,.0f} "
                  f"{row['engine']:9,.0f} {row['engine'] / plain:8.4f} {row['watched']:9,.0f} "
                  f"{row['watched'] / plain:8.4f} {row['recorder']:8,.0f} {row['per_flush']:9,.0f} "
                  f"{row['parent']:8,.0f} "
                  f"{row['probes'] / plain:8.4f} {row['bare'] / plain:7.4f} "
                  f"{row['child'] / plain if 'child' in row else math.nan:8.4f} "
                  f"{row['spread']:7.2%} {row['factor']:5.0f}x "
                  f"{row['cpu_share']:8.2f} "
                  f"{time_share(row['engine'], plain, row['cpu_share']):9.2%} "
                  f"{time_share(row['watched'], plain, row['cpu_share']):10.2%}", flush=True)


if __name__ == "__main__":
    main()
