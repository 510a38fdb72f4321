"""A sampled profile of the loader's own work, from inside each process that does it: every
DataLoader worker, and the main process (its fetch at ``num_workers=0``, receiving batches).

NOTE [ Sampling inside the workers ]

    torch's profiler and ``torch.utils.bottleneck`` do not see ``num_workers > 0``
    (pytorch#6313), and py-spy needs ptrace rights to attach. Each process here samples
    itself: a timer on the process's CPU time (every INTERVAL_S of it) signals the process
    (cpu_timer.py: SIGURG, whose default is to be ignored, or SIGPROF where that cannot be
    had: NOTE [ A CPU timer that cannot end the process ]), and the interpreter runs the
    handler in the main thread at its next instruction, with the frame that was running. The
    handler charges the main thread's CPU and the time that passed since its last run to that
    stack, and each other thread's CPU
    (its CPU clock, made from its kernel id) to that thread, by its name: a worker's main
    thread (fetch, transforms, collate) and its queue's feeder thread (the batch pickled into
    shared memory: the hand-off) are both seen. Other threads' frames are not walked: reading
    them (``sys._current_frames``) from the handler crashed a worker (SIGSEGV) in CI, while its
    threads came and went (multiprocessing's resource sharer, passing a batch's file
    descriptors). A C call (a JPEG decode, a resize) holds the
    handler until it returns, so its time is charged to the Python frame that called it; time
    waiting (reading a file, a sleep) is time passed without CPU. Outside the fetch and the
    collate (a worker waiting for its next indices), only CPU is charged: the handler runs
    after the wait, in the loop's frame, where the wait's time would be misread as work.

    Each look arms the next at a jittered interval (0.5-1.5x), so that a periodic loader is
    not seen at the same phase of each period. The kernel fires a CPU timer only at its
    scheduler's tick (4 ms at HZ=250, 1 ms at 1000), so the jitter moves a look by whole
    ticks: work whose period is a whole number of ticks (a synthetic 15 + 5 ms loop) is still
    seen at the same points; real loaders' periods vary more than a tick. A thread that
    wakes to look (the first design) sees the main thread only where it lets the GIL go: a
    dataset spinning in Python between two torch calls was seen at the torch call every
    time, never in the functions that took the time.

    NOTE [ Waiting seen on a clock of its own ]

    A timer on CPU time looks only where CPU is spent: a worker whose samples waited 60% of
    their time in a read (a sleep) and spun the rest was charged 0.05 of it in the read and
    0.47 in a spin of 0.25, the wait's time going to wherever the next CPU tick fell. So a
    process that is all the loader's (a worker; the engine's own, which fetches itself at 0
    workers) has a second timer, on the time passing (CLOCK_MONOTONIC), sending the same
    signal; the handler asks each timer whether it fired (the kernel disarms a fired one-shot
    timer; a CPU timer fires at the tick after it is due, so a clock reading against when it
    was due took a look in a sleep for a CPU tick). A CPU tick charges the CPU since the last
    CPU tick; a wall tick inside the fetch or the collate charges the time since the last wall
    tick (looks fall evenly in time, so each function's share of the time is unbiased, and a
    sleep or a blocking read is seen at the frame that called it: the signal ends the wait,
    and the handler runs there before the call resumes). Outside the work only CPU counts, as
    before, and a wall tick that finds the process outside it sets the next IDLE_EVERY
    intervals on (an idle worker is woken ~25 times a second, not 100); the first tick back
    inside charges at most an interval. The time passing is looked at every 2 INTERVAL_S and
    the CPU every 4 (its shares are the lesser figure), so a busy worker pays about as many
    looks as with one timer (~50-80 us each: the handler runs with cold caches; known_stages
    at 2 workers: 0.131 s of handlers in a 6 s profile, 0.129 s with one timer). Measured:
    the same worker now 0.53 read, 0.23 decode, 0.14 augment of its time (truth 0.56, 0.23,
    0.14 of its 0.93 in __getitem__), the read's CPU 0.03.
    A job's own process keeps the CPU timer alone: its step's time is not the loader's.

    NOTE [ A step seen after it returned ]

    The interpreter checks for a signal at calls, function starts and loop jumps. A step of a
    ``Compose`` whose last work is an operator (``return (x - mean) / std``) returns before
    the next check, and the look lands on the Compose's loop with the step gone from the
    stack: imagefolder_compose's Normalize was seen 0 of the time against py-spy's 0.10-0.24
    on a loaded machine, charged to "transform" unnamed. A look whose leaf is a Compose's
    ``__call__``/``forward`` reads the step it just called from the loop's variable (``t``,
    ``transform``: torchvision v1 and v2, albumentations) and puts that step's ``__call__``
    (an nn.Module's ``forward``) back as the leaf: 0.26 against py-spy's 0.22 there. Reading
    a frame's locals costs a look ~1 us more, on these looks only.

    A watched job's own process is the job's, not the loader's: there a look is taken only
    while the loop is inside a watched loader's ``next()`` (NEXT_WINDOW, set around it by
    record/ledger.py), where the loader's work is receiving batches from the workers (the
    hand-off's main side: unpickling, rebuilding tensors from shared memory) or, without
    workers, the fetch itself. Outside, a tick costs the handler two clock reads; the job's
    step is never walked, nor its stacks shipped. A look inside stands for the main thread's
    CPU since the tick before (ticks fall at random points of the CPU spent, so the periods
    ending inside count the window's CPU without bias where the main thread spends it), and
    for the time waited in ``next()`` beyond it.
    Measured: a job spending 3 parts of its CPU in its step and 1 in ``next()`` is charged
    the 1 (tests/test_hotspots.py); a watched loader whose batches are 128 small tensors shows
    the main process rebuilding them (``_rebuild_tensor``, the resource sharer's sockets).

    System calls interrupted by the signal restart (``siginterrupt(False)``); a process whose
    signal is taken already (another profiler's SIGPROF, the job's SIGURG) is not sampled.
    Stacks are kept as tuples of code objects while sampling (functions, not lines), and
    named (file, first line, function) when a delta is taken: ``take()`` returns what was
    sampled since the last take as plain data that pickles, for the batch's meta to carry to
    the main process (probes.py).
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import sys
import threading
import time
from typing import Any

from dataloader_tuner.instrument.cpu_timer import CpuTimer
from dataloader_tuner.instrument.frames import Frame, in_work, named, read_stack
from dataloader_tuner.record.ledger import NEXT_WINDOW, NextWindow
from dataloader_tuner.record.loop import TimedLoop

# A look per ~5 ms of the process's CPU; the kernel's tick rounds it (~125 a CPU-second here)
INTERVAL_S = 0.005
OTHERS_EVERY = 4
CPU_APART = 2  # with two timers, the CPU's every this many of the time's intervals
IDLE_EVERY = 4  # a wall look outside the loader's work sets the next this many intervals on
# The handler's own CPU is kept under this share of the time passed: beyond it the looks are
# spaced out, up to MAX_STRETCH times (detectron2_style at 0 workers: 148 looks a second took
# 1.0% in the handler and ~3% of the rate, the caches it leaves cold counted)
LOOK_SHARE, MAX_STRETCH = 0.004, 4.0
# Where a job's own process is sampled, the frame its stacks end at: the watcher's epoch,
# whose next() on the loader is the only place it is looked at (NEXT_WINDOW is set there, in
# BatchLedger.next_batch or, in a steady epoch, inline); above it are the trainer's callers
NEXT_CODE = TimedLoop.epoch.__code__
SAMPLER_ROLE = "(the sampler itself)"  # its own time, shipped with the stacks
# A delta: [(thread role, frames leaf-first, cpu_s, wall_s, looks)]
Sampled = list[tuple[str, tuple[Frame, ...], float, float, int]]


def _thread_clock(native_id: int | None) -> int | None:
    """The CPU clock of the thread with kernel id ``native_id``, made from the id as Linux
    makes it (MAKE_THREAD_CPUCLOCK): ``pthread_getcpuclockid`` reads the thread's descriptor,
    which is gone once the thread has ended, and a look that raced an ending thread crashed
    the worker (SIGSEGV). A clock of an ended thread only fails to read (EINVAL)."""
    if native_id is None or not sys.platform.startswith("linux"):
        return None
    return ((~native_id) << 3) | 6  # CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED


class WallTicks:
    """The timer on the time passing (NOTE [ Waiting seen on a clock of its own ]): when it
    last looked, and whether it found the process outside the loader's work then."""

    __slots__ = ("timer", "at", "idle")

    def __init__(self, timer: CpuTimer) -> None:
        self.timer, self.at, self.idle = timer, time.monotonic(), False


class HandlerCost:
    """The handler's own CPU: since the last take (shipped as the sampler's own time), and
    over each second, after which the intervals are stretched by its share over LOOK_SHARE
    (the share the last second's stretch gave: one step lands on the budget), 1 to
    MAX_STRETCH times."""

    __slots__ = ("since_take", "second_cost", "second_began", "stretch")

    def __init__(self) -> None:
        self.since_take = self.second_cost = 0.0
        self.second_began = time.monotonic()
        self.stretch = 1.0

    def paid(self, used: float, now: float) -> None:
        """A look's ``used`` seconds, at ``now`` (time.monotonic)."""
        self.since_take += used
        self.second_cost += used
        passed = now - self.second_began
        if passed >= 1.0:
            share = self.second_cost / passed
            self.stretch = min(MAX_STRETCH, max(1.0, self.stretch * share / LOOK_SHARE))
            self.second_cost, self.second_began = 0.0, now


class StackSampler:
    """Samples this process from its CPU timer's signal until ``stop()`` (``start()`` in the
    main thread); with a ``window``, only while the loop is inside a loader's ``next()``."""

    def __init__(self, interval_s: float = INTERVAL_S, window: NextWindow | None = None) -> None:
        self.interval_s = interval_s
        self.window = window
        self.main_ident = threading.main_thread().ident
        # (role, stack as code objects and lines) -> [cpu_s, wall_s, looks]
        self.stacks: dict[tuple[str, tuple], list] = {}
        self.looks = 0
        self.started = self.shipped = time.monotonic()  # shipped: last sent on (due())
        self._clocks: dict[int, tuple[int | None, float]] = {}  # ident -> (clock id, last cpu)
        self._last_wall = time.monotonic()
        self._last_cpu = time.thread_time()
        self._previous: Any = None
        self.timer: CpuTimer | None = None
        # A second timer, on the time passing, where the whole process is the loader's (not a
        # job's own: NOTE [ Waiting seen on a clock of its own ])
        self.wall: WallTicks | None = None
        self.running = False
        self.cost = HandlerCost()  # the handler's own time

    def start(self) -> "StackSampler | None":
        """Sampling from now, or None where it cannot be (not the main thread, no free
        signal for the timer: cpu_timer.py)."""
        if threading.current_thread() is not threading.main_thread():
            return None
        timer = CpuTimer.make()
        if timer is None:
            return None
        self.timer, self._previous = timer, signal.getsignal(timer.signum)
        wall_timer = timer.beside() if self.window is None else None
        if wall_timer is not None:  # the time passing at twice the interval, the CPU at
            self.interval_s *= 2  # CPU_APART times that: looks cost ~50-80 us (caches cold)
            self.wall = WallTicks(wall_timer)
        self._last_wall, self._last_cpu = time.monotonic(), time.thread_time()
        for thread in threading.enumerate():  # the threads there now: their CPU from now on
            if thread.ident is not None:
                self._cpu_since(thread.ident, thread.native_id)
        self.running = True  # (before the timer: its first tick re-arms it)
        signal.signal(timer.signum, self._on_signal)
        signal.siginterrupt(timer.signum, False)
        timer.set(self.interval_s * (CPU_APART if self.wall is not None else 1))
        if self.wall is not None:  # (not in step with the CPU's)
            self.wall.timer.set(self.interval_s * (0.1 + random.random()))
        # Stopped before the interpreter ends: its finalisation puts the signal back to its
        # default, which ends the process for SIGPROF (the fallback timer's): a timer still
        # armed then killed a watched job at exit ("Profiling timer expired").
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        if not self.running or self.timer is None:
            return
        self.running = False
        atexit.unregister(self.stop)
        self.timer.delete()
        if self.wall is not None:
            self.wall.timer.delete()
        if threading.current_thread() is threading.main_thread():
            # ignored, not its default (SIGPROF's ends the process), should one still come
            signal.signal(self.timer.signum, signal.SIG_IGN
                          if self._previous in (signal.SIG_DFL, None) else self._previous)

    def _on_signal(self, signum: int, frame: Any) -> None:
        # its CPU, not the time passed: another thread may take the GIL in the middle
        entered = time.thread_time()
        if self.wall is not None:
            self._on_either(frame, self.wall, entered)
            return
        # A process whose other threads work (a training job's step on many cores) spends
        # CPU faster than the time passes: a look at most every half interval of that time
        if time.monotonic() - self._last_wall >= self.interval / 2:
            self.look(frame)
        if self.running and self.timer is not None:  # the next look at a jittered interval:
            # a loader whose samples take a round number of milliseconds was otherwise seen
            # at the same point of each (known_stages: decode 0.56 of the CPU against its
            # 0.50, with a 1 ms timer)
            self.timer.set(self.interval * (0.5 + random.random()))
        self._paid(entered)

    @property
    def interval(self) -> float:
        """The time between looks now: the interval asked, stretched where looks are dear."""
        return self.interval_s * self.cost.stretch

    def _paid(self, entered: float) -> None:
        """The handler's CPU since ``entered`` counted (HandlerCost), last in the handler."""
        self.cost.paid(time.thread_time() - entered, time.monotonic())

    def _on_either(self, frame: Any, wall: "WallTicks", entered: float) -> None:
        """Two timers, one signal: which fired is asked of the timers (a CPU timer fires at
        the kernel's next tick after it is due: read from the clock, a look in a sleep took
        it for fired and charged the sleep CPU), each then set again at a jittered interval."""
        timer = self.timer
        if not self.running or timer is None:
            return
        cpu_tick, wall_tick = timer.expired(), wall.timer.expired()
        if cpu_tick or wall_tick:
            self.look_apart(frame, cpu_tick, wall if wall_tick else None)
        if self.running:
            interval = self.interval
            if cpu_tick:
                timer.set(interval * CPU_APART * (0.5 + random.random()))
            if wall_tick:  # (an idle process looked at less often: its looks find nothing)
                wall.timer.set(interval * (IDLE_EVERY if wall.idle else 1)
                               * (0.5 + random.random()))
        self._paid(entered)

    def look_apart(self, frame: Any, cpu_tick: bool, wall_tick: "WallTicks | None") -> None:
        """One look with two timers (NOTE [ Waiting seen on a clock of its own ]): a CPU tick
        charges the main thread's CPU since the last (and, outside the loader's work, that CPU
        as its time too), a wall tick the time passed since the last, inside the work only."""
        now, cpu_now = time.monotonic(), time.thread_time()
        if cpu_tick and now - self._last_wall < self.interval / 2:
            cpu_tick = False  # other threads spend CPU faster than time passes (as _on_signal)
        if not cpu_tick and wall_tick is None:
            return
        stack = read_stack(frame)
        working = in_work(stack)
        cpu = wall = 0.0
        if cpu_tick:
            cpu, self._last_cpu, self._last_wall = cpu_now - self._last_cpu, cpu_now, now
            if not working:
                wall = cpu
        if wall_tick is not None:
            passed, wall_tick.at = now - wall_tick.at, now
            if working:  # after an idle look, the work began at most an interval before
                wall += min(passed, self.interval) if wall_tick.idle else passed
            wall_tick.idle = not working
        self.looks += 1
        if cpu or wall:
            self._charge("main", stack, cpu, wall)
        if cpu_tick:  # (rarer than with one timer: each CPU tick reads them)
            self._charge_others()

    def look(self, frame: Any) -> None:
        """One look: the main thread at ``frame``, every other thread where it is."""
        now, cpu_now = time.monotonic(), time.thread_time()
        wall, cpu = now - self._last_wall, cpu_now - self._last_cpu
        self._last_wall, self._last_cpu = now, cpu_now
        window = self.window
        if window is not None:  # a job's own process: inside a loader's next() only
            if window.since is None or window.thread != self.main_ident:
                return  # (a next() on another thread: the main thread's frame is not in it)
            # The look stands for this thread's CPU since the tick before, wherever that was:
            # ticks fall at random points of the CPU spent, so the periods ending inside
            # next() count its CPU without bias (the time since next() began would miss each
            # window's start), and for the time waited inside next() beyond it. (Other
            # threads' CPU is theirs, by their own clocks, below.)
            wall = max(cpu, min(wall, now - window.since))
        self.looks += 1
        stack = read_stack(frame, None if window is None else NEXT_CODE)
        self._charge("main", stack, cpu, wall if in_work(stack) else min(cpu, wall))
        # The other threads every OTHERS_EVERY-th look (their CPU adds up between looks, and
        # listing them is most of a look's cost), and after the main thread was away long
        if self.looks % OTHERS_EVERY == 0 or wall > OTHERS_EVERY * self.interval:
            self._charge_others()

    def _charge_others(self) -> None:
        """Each other thread's CPU since it was last read, to its name."""
        # threading's own table, copied in one step: enumerate() and active_count() take a
        # lock the interrupted thread may hold (starting a thread), and the handler runs on
        # that same thread: it would wait for itself forever
        for thread in list(getattr(threading, "_active", {}).values()):
            ident = thread.ident
            if ident is None or ident == self.main_ident:
                continue
            used = self._cpu_since(ident, thread.native_id)
            if used:  # by the thread's name: its frames are not walked (NOTE above)
                self._charge(thread.name, (), used, used)

    def _charge(self, role: str, stack: tuple, cpu: float, wall: float) -> None:
        key = (role, stack)
        entry = self.stacks.get(key)
        if entry is None:
            self.stacks[key] = [cpu, wall, 1]
        else:
            entry[0] += cpu
            entry[1] += wall
            entry[2] += 1

    def _cpu_since(self, ident: int, native_id: int | None) -> float | None:
        known = self._clocks.get(ident)
        clock = known[0] if known is not None else _thread_clock(native_id)
        if clock is None:
            return None
        try:
            cpu = time.clock_gettime(clock)
        except OSError:  # the thread ended meanwhile
            self._clocks.pop(ident, None)
            return None
        self._clocks[ident] = (clock, cpu)
        # a thread started since sampling began: all of its CPU is since then
        return cpu - known[1] if known is not None else cpu

    def take(self) -> Sampled:
        """What was sampled since the last take, named (and forgotten here). The handler runs
        in the main thread, between its instructions: a swap here is not torn by it."""
        stacks, self.stacks = self.stacks, {}
        spent, self.cost.since_take = self.cost.since_take, 0.0
        sampled = [(role, named(stack), cpu, wall, looks)
                   for (role, stack), (cpu, wall, looks) in stacks.items()]
        # the handler's own time, as a thread of its own (never the loader's work)
        return sampled + [(SAMPLER_ROLE, (), spent, spent, 0)] if spent else sampled


# Set in the engine's child for the runs it profiles; its workers inherit it (fork, spawn).
SAMPLE_ENV = "DATALOADER_TUNER_SAMPLE"
# A worker's samples ride with a batch at most every SHIP_S, and at first more often (a
# quarter of the sampler's age, at least FIRST_SHIP_S): workers restarted each epoch
# (jpeg_folder: ~0.2 s a life) lose little when they end, and a long-lived one sends its
# stacks twice a second, not twenty times (each send pickles them, and the engine writes them
# to its parent as JSON: 2.7% of jpeg_folder's rate at 20 a second).
SHIP_S, FIRST_SHIP_S = 0.5, 0.0

_process: StackSampler | None = None  # this process's, once started
_watchers = 0  # watched loaders asking for samples (ask/release): forked workers inherit it


def _after_fork() -> None:
    global _process
    sampler = _process
    if sampler is not None and sampler.running and sampler.timer is not None:
        # its handler came along, not its timer (neither kind is inherited): the parent's
        # sampler is left stopped here, and its exit hook with it (a child that exits
        # normally would otherwise delete a timer of its own by the parent's id)
        sampler.running = False
        sampler.timer.forget()
        if sampler.wall is not None:
            sampler.wall.timer.forget()
        atexit.unregister(sampler.stop)
        try:
            signal.signal(sampler.timer.signum, signal.SIG_DFL)  # (a worker's start checks it)
        except ValueError:  # forked from another thread: the handler is not ours to reset
            pass
    _process = None  # a worker starts its own, at its first fetch


os.register_at_fork(after_in_child=_after_fork)


def start_if_asked() -> StackSampler | None:
    """This process's sampler, started once, where the engine's run asked for one
    (SAMPLE_ENV=1) or a watched loader did (``ask``); SAMPLE_ENV=0 turns it off."""
    global _process
    wanted = os.environ.get(SAMPLE_ENV)
    if _process is None and (wanted == "1" or (_watchers and wanted != "0")):
        _process = StackSampler().start()
    return _process


def start_in_job() -> StackSampler | None:
    """A watched job's own process (its main thread), looked at only inside its loaders'
    ``next()`` (NEXT_WINDOW): what receiving batches from the workers costs there, or the
    fetch itself without workers. Where a watched loader asked (``ask``) and the job did not
    turn sampling off (SAMPLE_ENV=0); the engine's own process (SAMPLE_ENV=1) samples all of
    its time instead (start_if_asked)."""
    global _process
    if _process is None and _watchers and os.environ.get(SAMPLE_ENV) not in ("0", "1"):
        _process = StackSampler(window=NEXT_WINDOW).start()
    return _process


def ask() -> None:
    """A watched loader's workers (forked from here after this) sample themselves, and this
    process where it fetches itself; until ``release``. Not through the environment: a job's
    other processes, and other loaders once it ends, are left alone."""
    global _watchers
    _watchers += 1


def release() -> None:
    """A watched loader ended: the last one stops this process's sampler."""
    global _watchers
    _watchers = max(_watchers - 1, 0)
    if not _watchers and os.environ.get(SAMPLE_ENV) != "1":
        stop()


def running() -> StackSampler | None:
    return _process


def due(now: float) -> Sampled | None:
    """This process's samples since it last shipped them, once SHIP_S has passed (else None)."""
    sampler = _process
    if sampler is None or now - sampler.shipped < min(
            SHIP_S, max(FIRST_SHIP_S, (now - sampler.started) / 4)):
        return None
    sampler.shipped = now
    return sampler.take()


def stop() -> None:
    global _process
    if _process is not None:
        _process.stop()
        _process = None
