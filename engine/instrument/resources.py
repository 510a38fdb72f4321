"""CPU, memory and threads of a process and its DataLoader workers, sampled from a helper thread
(the engine's child process, and the watcher in a user's training job)."""

from __future__ import annotations

import os
import time

import psutil

from dataloader_tuner import protocol, system
from dataloader_tuner.instrument import gpu, threads


SHM_KEYS = ("shm_used_mb", "shm_total_mb")  # the main process's rows only


class BusiestThread:
    """The CPU % of a process's busiest thread since the last reading: the bound on work that
    one thread does batch after batch (the loop receiving batches, the pin-memory thread). The
    process's own % adds threads that run alongside: torch's intra-op pool copying a batch
    (OpenMP's threads may spin a while after each parallel copy), the samplers; on a 16-CPU GPU
    machine the main process read 143% while handing over 60 batches a second, its busiest
    thread 22%."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.last: tuple[float, dict[int, float]] | None = None
        self.percent()

    def percent(self) -> float | None:
        """Its CPU % since the last reading; None at the first or where threads can't be read."""
        read = self._since_last()
        return None if read is None else 100.0 * read[0] / read[1]

    def seconds(self) -> float | None:
        """Its CPU seconds since the last reading."""
        read = self._since_last()
        return None if read is None else read[0]

    def _since_last(self) -> tuple[float, float] | None:
        """(the busiest thread's CPU seconds, the wall seconds) since the last reading."""
        try:
            now = time.monotonic()
            used = {t.id: t.user_time + t.system_time for t in self.proc.threads()}
        except (psutil.Error, OSError, NotImplementedError):  # (no /proc/PID/task to list)
            return None
        last, self.last = self.last, (now, used)
        if last is None or now <= last[0]:
            return None
        before = last[1]  # (a thread started since: all its CPU is within the interval)
        return (max((cpu - before.get(tid, 0.0) for tid, cpu in used.items()), default=0.0),
                now - last[0])


class ResourceSampler:
    """CPU %, RSS and threads of the main process and each worker, each worker's private
    memory every few seconds, plus NVML samples on a GPU.

    Private memory is what a copy-on-read leak grows: RSS already counts the pages a forked
    worker shares with its parent, and stays flat while reference-count writes copy them.
    Rows carry ``uss_mb`` (private pages), ``pss_mb`` and ``dirty_mb`` (private pages written
    to: anonymous memory). ``dirty_mb`` is the one to judge leaks by, because USS also counts
    clean file pages (mmap, LMDB) that only this worker happens to map: reclaimable, not a leak.
    All three are None when not read this time, or when the process's memory is off limits.
    """

    # Reading /proc/PID/smaps_rollup walks the page tables: milliseconds on a big process (6-12
    # ms for a worker of a Lightning job: 2-3% of a core where each worker was read on sight).
    USS_EVERY_S = 2.0  # so each worker's is read this often at most, one worker a sample,
    USS_MAX_CPU_SHARE = 0.01  # all workers' together within 1% of a core, in turns, in a
    # watched job (the user's process). The engine's own profile runs in a process of ours and
    # may spend more: at 1%, 350 MB workers (15-20 ms a read) were read every ~3.5 s each, too
    # few reads in a default 15 s profile to judge a copy-on-read leak by (memory_growth.py)
    ENGINE_USS_CPU_SHARE = 0.05
    USS_MIN_AGE_S = 2.0  # a worker is first read this long after it was first seen: one that
    # ends sooner (an epoch's workers restarting) has no growth to judge (analyse/pitfalls.py
    # counts a worker's warm-up from its first row, read or not)
    PRIVATE_KEYS = ("uss_mb", "pss_mb", "dirty_mb")

    def __init__(self, worker_ids: dict[int, int], uss_cpu_share: float = USS_MAX_CPU_SHARE
                 ) -> None:
        """``uss_cpu_share``: of a core, what reading the workers' private memory may take."""
        self.me = psutil.Process()
        self.uss_cpu_share = uss_cpu_share
        self.worker_ids = worker_ids  # pid -> DataLoader worker id, filled as batches arrive
        self.known: dict[int, psutil.Process] = {self.me.pid: self.me}
        self.uss_due: dict[int, float] = {}  # pid -> when its next USS reading is due
        self.uss_gate = 0.0  # no worker's reading before this (the shared CPU budget)
        # each worker's threads' use, read from when it was first seen to have made a batch
        # (NOTE [ Threads per worker ])
        self.threads_since = threads.ThreadsSinceFirstBatch()
        self.me.cpu_percent(None)
        self.main_threads = BusiestThread(self.me)
        self.nvml = gpu.NvmlSampler.open() if gpu.cuda_available() else None

    def sample(self, t: float) -> protocol.Resources:
        procs, primed = [], set()
        for pid in self._children():
            if pid not in self.known:
                try:
                    child = psutil.Process(pid)
                except psutil.Error:
                    continue
                self.known[pid] = child
                self.uss_due[pid] = time.monotonic() + self.USS_MIN_AGE_S
                primed.add(child.pid)
                try:
                    child.cpu_percent(None)  # the first reading only primes the counter
                except psutil.Error:
                    pass
        reader = self._next_to_read(time.monotonic())
        for pid, proc in list(self.known.items()):
            try:
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:  # exited, not yet reaped
                        continue
                    # A process seen for the first time has no CPU reading yet (None).
                    cpu = None if pid in primed else proc.cpu_percent(None)
                    rss = proc.memory_info().rss / 2**20
                    thread_count = proc.num_threads()
                    private = (self._private_mb(pid, proc) if pid == reader
                               else dict.fromkeys(self.PRIVATE_KEYS))
                    # a worker's pools at work (NOTE [ Threads per worker ])
                    use = self._thread_use(pid)
            except psutil.Error:
                self.known.pop(pid, None)
                self.threads_since.forget(pid)
                self.uss_due.pop(pid, None)
                continue
            role = "main" if pid == self.me.pid else "worker"
            procs.append(
                {"pid": pid, "role": role, "worker_id": self.worker_ids.get(pid),
                 "cpu_percent": cpu, "rss_mb": rss, "threads": thread_count, **private,
                 "helper_cpu_share": use.helper_share if use else None,
                 "busy_threads": use.busy_threads if use else None,
                 **(self._shm() if role == "main" else dict.fromkeys(SHM_KEYS)),
                 "busiest_thread_percent": self.main_threads.percent() if role == "main"
                 else None}
            )
        gpu_sample = None
        if self.nvml is not None:
            try:
                gpu_sample = self.nvml.sample()
            except Exception:  # noqa: BLE001
                pass
        return protocol.Resources(t, procs, gpu_sample)

    def _thread_use(self, pid: int) -> threads.ThreadUse | None:
        """A worker's threads' use since it made its first batch: a spawned worker's start-up
        (a second of importing torch on its main thread) would otherwise dilute its pool's
        share for the length of a short run, and a process that makes no batches (the
        resource tracker) is not read, nor the main process (its fetch at 0 workers)."""
        if pid not in self.worker_ids or pid == self.me.pid:
            return None
        if not self.threads_since.started(pid):
            self.threads_since.start(pid)
            return None
        return self.threads_since.use(pid)

    @staticmethod
    def _shm() -> dict[str, float | None]:
        """/dev/shm as this sample found it (on the main process's row: it is the machine's),
        with the batches in flight in it: a check during the run counts them as its own."""
        usage = system.shm_usage()
        if usage is None:
            return dict.fromkeys(SHM_KEYS)
        return {"shm_used_mb": round(usage["used_mb"], 1),
                "shm_total_mb": round(usage["total_mb"], 1)}

    def _children(self) -> list[int]:
        """This process's children. From /proc/PID/task/*/children where the kernel has it:
        psutil's own way reads every process on the machine (~1% of a 2-core child's time on
        50 us batches, sampled twice a second)."""
        pids: list[int] = []
        try:
            for task in os.listdir(f"/proc/{self.me.pid}/task"):
                with open(f"/proc/{self.me.pid}/task/{task}/children") as f:
                    pids.extend(int(pid) for pid in f.read().split())
            return pids
        except (OSError, ValueError):  # not Linux, or a kernel without the file
            return [child.pid for child in self.me.children(recursive=False)]

    def _next_to_read(self, now: float) -> int | None:
        """The worker whose private memory this sample reads: of the DataLoader workers due
        (never the main process, nor a child that is not a worker, such as a rank another
        launcher started), the longest due; None while the shared budget's pause lasts."""
        if now < self.uss_gate:
            return None
        due = [pid for pid in self.known
               if pid in self.worker_ids and pid != self.me.pid  # (loading in the main: -1)
               and self.uss_due.get(pid, 0.0) <= now]
        return min(due, key=lambda pid: self.uss_due.get(pid, 0.0)) if due else None

    def _private_mb(self, pid: int, proc: psutil.Process) -> dict:
        """PRIVATE_KEYS in MB, read now; the next reading of any worker waits for the shared
        budget, this one's for USS_EVERY_S at least. A process that has gone raises
        psutil.NoSuchProcess to the caller."""
        now = time.monotonic()
        start = time.thread_time()  # our CPU, not the wait for a core on a busy machine
        found = self._smaps_rollup(pid) or self._psutil_private(proc)
        cost = time.thread_time() - start
        self.uss_due[pid] = now + self.USS_EVERY_S
        self.uss_gate = now + cost / self.uss_cpu_share
        return found

    @staticmethod
    def _smaps_rollup(pid: int) -> dict | None:
        """All three from one read of /proc/PID/smaps_rollup (Linux 4.14+); psutil's
        memory_full_info reads the same file but does not return the dirty part."""
        kb = {}
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
                for line in f:
                    name, _, value = line.partition(b":")
                    if name in (b"Pss", b"Private_Clean", b"Private_Dirty", b"Private_Hugetlb"):
                        kb[name] = int(value.split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if b"Private_Dirty" not in kb:
            return None
        uss = kb.get(b"Private_Clean", 0) + kb[b"Private_Dirty"] + kb.get(b"Private_Hugetlb", 0)
        return {"uss_mb": uss / 1024, "pss_mb": kb.get(b"Pss", 0) / 1024,
                "dirty_mb": kb[b"Private_Dirty"] / 1024}

    @staticmethod
    def _psutil_private(proc: psutil.Process) -> dict:
        """USS (and PSS where the platform has it) without the dirty part: older kernels,
        macOS. Raises psutil.NoSuchProcess when the process has gone."""
        found = dict.fromkeys(ResourceSampler.PRIVATE_KEYS)
        try:
            full = proc.memory_full_info()
        except psutil.AccessDenied:  # another user's process, or a locked-down /proc
            return found
        found["uss_mb"] = full.uss / 2**20
        if getattr(full, "pss", None) is not None:
            found["pss_mb"] = full.pss / 2**20
        return found
