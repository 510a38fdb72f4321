"""Timers for the sampler (sampler.py) that signal the process with a signal whose default
action is to do nothing: one on the process's CPU time, and one on the time passing (for the
time a process waits: NOTE [ Waiting seen on a clock of its own ] in sampler.py).

NOTE [ A CPU timer that cannot end the process ]

    ``setitimer(ITIMER_PROF)`` raises SIGPROF, whose default action ends the process. A job
    may put every signal's handler back as it found it: Lightning's trainer does as a fit
    ends (its signal connector restores all of them, before any callback hears of the end),
    and a timer still running then ended the job with "Profiling timer expired" (a watched
    fit without workers, 4 runs in 6). So on Linux the timer is a POSIX CPU timer
    (``timer_create`` on CLOCK_PROCESS_CPUTIME_ID, through ctypes) that sends SIGURG, whose
    default is to be ignored: a handler put back to the default leaves the timer's signals
    unheard, not the job ended. It is sent to the process, as ITIMER_PROF's is: sent to the
    main thread instead, it cut short the sleeps of a job's step (a watched loop with a 10 ms
    sleep for a step at 1.008-1.011 of plain, against 1.004 with the process's). SIGURG is
    taken only where nobody handles it
    already (it signals a socket's out-of-band data, rarely used). Elsewhere, or where the
    POSIX timer cannot be made, ``ITIMER_PROF`` and SIGPROF as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

CLOCK_MONOTONIC = 1
CLOCK_PROCESS_CPUTIME_ID = 2
SIGEV_SIGNAL = 0  # to the process: the kernel picks a thread, as for ITIMER_PROF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):  # Linux's: 64 bytes
    _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int),
                ("sigev_notify", ctypes.c_int), ("sigev_tid", ctypes.c_int),
                ("_pad", ctypes.c_int * 11)]


_LIBRT: list[ctypes.CDLL | None] = []  # found once a process (forked workers inherit it)


def _librt() -> ctypes.CDLL | None:
    """The library with timer_create: libc (glibc >= 2.34), else librt, looked for once
    (``find_library`` runs ldconfig: not at every worker's start)."""
    if not _LIBRT:
        _LIBRT.append(_find_librt())
    return _LIBRT[0]


def _find_librt() -> ctypes.CDLL | None:
    for name in (None, "librt.so.1", "rt"):
        try:
            lib = ctypes.CDLL(name if name != "rt" else ctypes.util.find_library("rt"),
                              use_errno=True)
        except (OSError, TypeError):
            continue
        if all(hasattr(lib, f) for f in ("timer_create", "timer_settime", "timer_gettime",
                                         "timer_delete")):
            return lib
    return None


class CpuTimer:
    """One-shot timers on the process's CPU time, each signalling ``signum`` once; made in
    the main thread (``make``)."""

    def __init__(self, signum: int, lib: ctypes.CDLL | None, timer_id: ctypes.c_void_p | None
                 ) -> None:
        self.signum, self._lib, self._id = signum, lib, timer_id
        self._value = _Itimerspec()  # set in place: a look's cost is mostly cold caches
        self._value_ref = ctypes.byref(self._value)
        self._left = _Itimerspec()
        self._left_ref = ctypes.byref(self._left)

    @classmethod
    def make(cls) -> "CpuTimer | None":
        """A POSIX CPU timer signalling SIGURG where it can be had, else ITIMER_PROF's
        SIGPROF where that is free; None where neither signal is free."""
        posix = cls._posix()
        if posix is not None:
            return posix
        if not hasattr(signal, "setitimer"):
            return None
        if signal.getsignal(signal.SIGPROF) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return None  # another profiler's
        return cls(signal.SIGPROF, None, None)

    @classmethod
    def _posix(cls) -> "CpuTimer | None":
        if not sys.platform.startswith("linux") or not hasattr(signal, "SIGURG"):
            return None
        if signal.getsignal(signal.SIGURG) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            return None  # the job handles SIGURG itself
        lib = _librt()
        if lib is None:
            return None
        return _created(lib, CLOCK_PROCESS_CPUTIME_ID, signal.SIGURG)

    def beside(self) -> "CpuTimer | None":
        """A second timer, on the time passing (CLOCK_MONOTONIC), sending this one's signal;
        None where this one is not a POSIX timer (ITIMER_PROF's fallback has one of a kind)."""
        return _created(self._lib, CLOCK_MONOTONIC, self.signum) if self._lib else None

    def expired(self) -> bool:
        """This one-shot timer has fired since it was last set (the kernel disarmed it); True
        for ITIMER_PROF's, whose signal is its own."""
        lib, timer_id = self._lib, self._id
        if lib is None:
            return True
        left = self._left
        if lib.timer_gettime(timer_id, self._left_ref) != 0:
            return False
        return left.it_value.tv_sec == 0 and left.it_value.tv_nsec == 0

    def set(self, seconds: float) -> None:
        """Signal once, after ``seconds`` more of the process's CPU (0: never)."""
        lib, timer_id = self._lib, self._id  # (once: ``delete`` may run on another thread)
        if lib is None:
            if self.signum == signal.SIGPROF:  # (not once a POSIX timer was deleted)
                signal.setitimer(signal.ITIMER_PROF, seconds)
            return
        whole = int(seconds)
        value = self._value.it_value
        value.tv_sec, value.tv_nsec = whole, int((seconds - whole) * 1e9)
        lib.timer_settime(timer_id, 0, self._value_ref, None)

    def delete(self) -> None:
        """Stopped for good (a POSIX timer's own resources freed)."""
        lib, timer_id = self._lib, self._id
        self._lib = self._id = None
        if lib is None:
            self.set(0)
            return
        disarmed = _Itimerspec(_Timespec(0, 0), _Timespec(0, 0))
        lib.timer_settime(timer_id, 0, ctypes.byref(disarmed), None)
        lib.timer_delete(timer_id)

    def forget(self) -> None:
        """In a forked child: the parent's timer is not this process's (POSIX timers are not
        inherited, and its id may be a timer this process makes later)."""
        self._lib = self._id = None


def _created(lib: ctypes.CDLL, clock: int, signum: int) -> CpuTimer | None:
    """A POSIX one-shot timer on ``clock`` that sends ``signum`` to the process, or None."""
    event = _Sigevent(sigev_signo=signum, sigev_notify=SIGEV_SIGNAL)
    timer_id = ctypes.c_void_p()
    if lib.timer_create(clock, ctypes.byref(event), ctypes.byref(timer_id)) != 0:
        return None
    return CpuTimer(signum, lib, timer_id)
