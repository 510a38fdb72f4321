"""From an exception out of the loader to a headline that names the problem and the fix.

torch reports worker failures as text (a worker's exception is re-raised in the main process
with the worker's traceback inside its message; a dead worker is a RuntimeError), so most of
this is recognising torch's exact wording (quoted in tests/test_pitfalls.py) and the notes the
probes attach (probes.NOTE_PREFIX: which sample, which batch, which field of the samples).
"""

from __future__ import annotations

import re
import signal
import traceback
from typing import Any

from dataloader_tuner.analyse.overdue import no_stack, placed, where_held
from dataloader_tuner.errors import RunError
from dataloader_tuner.instrument.probes import NOTE_PREFIX

SHM_FIX = ("Give the container more shared memory (docker run --shm-size=8g, or --ipc=host), "
           "or use fewer workers / a smaller prefetch_factor or batch size.")
FILES_FIX = ("Raise the limit (ulimit -n 65536) or, before creating the DataLoader, call "
             "torch.multiprocessing.set_sharing_strategy('file_system').")
SIGNAL_CAUSES = {
    "Bus error": "workers ran out of shared memory (/dev/shm). " + SHM_FIX,
    "SIGBUS": "workers ran out of shared memory (/dev/shm). " + SHM_FIX,
    "Killed": "usually the kernel's out-of-memory killer: the workers together used more RAM "
              "than the machine has. Use fewer workers, or keep the dataset's data in numpy "
              "arrays instead of Python lists (copy-on-read grows every worker).",
    "SIGKILL": "usually the kernel's out-of-memory killer: use fewer workers or less memory "
               "per worker.",
    "Segmentation fault": "a crash in native code the dataset calls (an image or audio "
                          "library, a C extension). Run the dataset with num_workers=0 to see "
                          "the crash in the main process.",
    "SIGSEGV": "a crash in native code the dataset calls. Run with num_workers=0 to see it.",
}


def notes_in(exc: BaseException, text: str) -> list[str]:
    """Our notes, from the exception object (0 workers) or from a worker's traceback text."""
    found = [n[len(NOTE_PREFIX):].strip() for n in getattr(exc, "__notes__", [])
             if n.startswith(NOTE_PREFIX)]
    found += [line.strip()[len(NOTE_PREFIX):].strip() for line in text.splitlines()
              if line.strip().startswith(NOTE_PREFIX)]
    return list(dict.fromkeys(found))  # unique, in order


def may_be_worker_death(exc: BaseException) -> bool:
    """Whether ``exc`` may be the main process's view of a worker dying: torch's own text,
    or the connection a tensor was being handed over on breaking mid-way."""
    return isinstance(exc, (ConnectionError, EOFError)) or "DataLoader worker" in str(exc)


def explain_failure(exc: BaseException, worker_signals: dict[int, int] | None = None
                    ) -> RunError:
    """A RunError whose headline names the problem, where it happened, and the fix.

    ``worker_signals`` ({pid: signal number} of workers that died by a signal) fills in what
    torch's text lacks when multiprocessing reaped the worker first and torch could only say
    "exited unexpectedly"."""
    text = str(exc)
    details = "".join(traceback.format_exception(exc))
    first = text.splitlines()[0] if text else type(exc).__name__
    notes = notes_in(exc, text)
    where = f" ({'; '.join(notes)})" if notes else ""

    # A dead worker often surfaces as "exited unexpectedly" with the signal in the chained
    # exception, so search the whole chain.
    killed = re.search(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.]+)\.",
                       details)
    if killed is not None or worker_signals:
        if killed is not None:
            pid, name = killed.group(1), killed.group(2)
        else:
            found_pid, number = next(iter((worker_signals or {}).items()))
            pid, name = str(found_pid), signal.strsignal(number) or f"signal {number}"
        cause = SIGNAL_CAUSES.get(name, "the worker process died.")
        return RunError(f"A DataLoader worker (pid {pid}) was killed by signal {name}: {cause}",
                        details=details, type="worker_killed")
    if "exited unexpectedly" in text and "DataLoader worker" in text:
        return RunError(f"{first.rstrip('.')}: a worker process died without a Python error "
                        "(a crash in native code, or the out-of-memory killer). Run with "
                        "num_workers=0 to see the crash in the main process.",
                        details=details, type="worker_exited")
    if "Too many open files" in text or "received 0 items of ancdata" in text:
        return RunError("Too many open files: the workers hand tensors over as file "
                        f"descriptors and ran out of them. {FILES_FIX}",
                        details=details, type="too_many_open_files")
    if "No space left on device" in text and ("torch_" in text or "/dev/shm" in text):
        return RunError("Shared memory (/dev/shm) is full: the batches in flight do not fit. "
                        + SHM_FIX, details=details, type="shm_full")
    if "Cannot re-initialize CUDA in forked subprocess" in text:
        return RunError("The dataset uses CUDA inside a forked DataLoader worker, which CUDA "
                        "forbids. Keep samples on the CPU in the dataset and move batches to "
                        "the GPU in the training loop, or use "
                        "multiprocessing_context='spawn'.", details=details, type="cuda_in_fork")
    if _is_pickling_error(text):
        return RunError("The dataset cannot be pickled, which spawn/forkserver workers need "
                        f"({first.strip()}). Replace lambdas and local functions or classes "
                        "with module-level ones, or use multiprocessing_context='fork' (Linux).",
                        details=details, type="not_picklable")
    if "stack expects each tensor to be equal size" in text or (
            notes and any("shapes" in n and "collate_fn" in n for n in notes)):
        field = next((n.split("; ", 1)[1] for n in notes if "; " in n and "shapes" in n), None)
        return RunError("The default collate_fn cannot stack samples of different shapes"
                        + (f": {field}" if field else f" ({first.strip()})")
                        + ". Pass a custom collate_fn, e.g. stack the images and keep per-image "
                          "targets as a list.", details=details, type="collate_shapes")
    if "in DataLoader worker process" in first:
        original = text.split("Original Traceback (most recent call last):", 1)[-1]
        lines = [ln for ln in original.strip().splitlines()
                 if ln.strip() and not ln.strip().startswith(NOTE_PREFIX)]
        cause = lines[-1].strip() if lines else type(exc).__name__
        return RunError(f"{first.rstrip('.')}: {cause}{where}", details=text, type="worker_error")
    return RunError(f"{type(exc).__name__}: {first}{where}", details=details,
                    type="dataset_error")


def _is_pickling_error(text: str) -> bool:
    return any(s in text for s in ("Can't pickle", "Can't get local object", "cannot pickle",
                                   "PicklingError", "Can't get attribute"))


def hang_error(timeout_s: float, outstanding: list[dict]) -> RunError:
    """No batch within the timeout; which worker and which indices were still outstanding."""
    headline = f"No batch arrived within {timeout_s:g} s: the dataset or a worker seems stuck"
    if outstanding:
        first = outstanding[0]
        who = "the main process" if first["worker_id"] < 0 else f"worker {first['worker_id']}"
        indices = first.get("indices")
        headline += f". Waiting on {who}" + (f" for sample indices {indices}" if indices else "")
        where = where_held(first)
        headline += f", {placed(where, 'stuck at')}" if where else ""
        if len(outstanding) > 1:
            others = ", ".join(f"worker {o['worker_id']}" for o in outstanding[1:6])
            headline += f" (also outstanding: {len(outstanding) - 1} batch(es) from {others})"
    headline += (". Check for blocking I/O or locks in __getitem__, or raise --timeout-s if a "
                 "batch really takes that long.")
    parts, shown = [], set()
    for o in outstanding:
        who = "main process" if o["worker_id"] < 0 else f"worker {o['worker_id']}"
        stack = ("(its stack is above)" if o["worker_id"] in shown
                 else o.get("stack") or f"({no_stack(o.get('pid'))})")
        shown.add(o["worker_id"])
        parts.append(f"{who}, sample indices {o.get('indices')}:\n{stack}")
    return RunError(headline, details="\n\n".join(parts), type="hang")




def worker_deaths_raise_once(handling: Any = None) -> None:
    """torch's SIGCHLD handler raises "DataLoader worker (pid N) is killed by signal" at
    whatever bytecode the main thread is at, and again for each child that exits while the
    dead worker is still registered (its siblings stop as the first error unwinds). A second
    raise while the first was being caught ended a run with exit code 1 and no report (CI,
    tests/broken/worker_segfault.py with 2 workers). After its first raise the check is a
    no-op in this process: the run is failing and reports that, and a loader still finds a dead
    worker itself (its get()'s timeout checks). ``handling``: torch's signal_handling module."""
    if handling is None:
        from torch.utils.data._utils import signal_handling as handling
    check = getattr(handling, "_error_if_any_worker_fails", None)
    if check is None or getattr(check, "raises_once", False):
        return
    raised = False

    def raise_once() -> None:
        nonlocal raised
        if raised:
            return
        try:
            check()
        except RuntimeError:
            raised = True
            raise

    raise_once.raises_once = True  # type: ignore[attr-defined]
    handling._error_if_any_worker_fails = raise_once
