"""Overdue batches as a diagnostic: what the stall watch reported while a batch was late
(instrument/stalls.py), completed with how long the batch took in the end."""

from __future__ import annotations

import dataclasses
import os
import re
import sysconfig
from dataclasses import dataclass
from typing import Any, Sequence

from dataloader_tuner.analyse.diagnostic import Diagnostic, seconds_text
from dataloader_tuner.instrument.fork_stuck import FORK_STUCK_FIX, INSIDE_FORK
from dataloader_tuner.protocol import MAX_OVERDUE, Overdue
from dataloader_tuner.record.rows import BatchRecord, row_index

# A frame in a Python stack as faulthandler and traceback print it.
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')
OUR_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
TORCH = f"{os.sep}torch{os.sep}"


@dataclass(frozen=True)
class LateBatch:
    """One overdue batch as the run ended: how long it took (None: it had not come), who held
    it, where that worker was."""

    seq: int
    took_s: float | None
    came: bool  # it arrived (its wait, took_s, is known only when its row is among the kept)
    waited_s: float  # when it was reported
    usual_s: float | None
    first_of_epoch: bool
    worker_id: int | None
    indices: Any
    at: str | None  # the user's innermost frame in the stack
    stack: str | None  # the signalled thread's block
    stuck_in_fork: bool = False  # its worker never started (instrument/fork_stuck.py)
    pid: int | None = None  # its worker's process (None: the main process, or not known)

    @property
    def late_s(self) -> float:
        return self.took_s if self.took_s is not None else self.waited_s


def late_batches(reports: Sequence[Overdue], batches: Sequence[BatchRecord]) -> list[LateBatch]:
    """The reports, each completed with its batch's wait once it came."""
    found = []
    for report in reports:
        # (by number: where fast batches are kept in windows, not every batch has a row; a
        # window's slowest does)
        index = row_index(batches, report.seq)
        row = batches[index] if index is not None else None
        holder = report.outstanding[0] if report.outstanding else {}
        stack = holder.get("stack")
        came = bool(batches) and batches[-1].seq > report.seq
        found.append(LateBatch(
            report.seq, row.wait_s if row is not None else None, came or row is not None,
            report.waited_s, report.usual_s, report.opening, holder.get("worker_id"),
            holder.get("indices"), where_held(holder),
            stack.split("\n\n")[0] if stack else None, bool(holder.get("stuck_in_fork")),
            holder.get("pid")))
    return found


def where_held(holder: dict[str, Any]) -> str | None:
    """Where the worker holding a batch (an outstanding entry: instrument/stalls.where_stuck)
    is: inside fork(), as said where it was found (fork_stuck.py), or the user's innermost
    frame in its stack."""
    return holder.get("stuck_in_fork") or stuck_at(holder.get("stack"))


def overdue_batches(reports: Sequence[Overdue], batches: Sequence[BatchRecord]
                    ) -> list[Diagnostic]:
    """One diagnostic for the run's overdue batches: the slowest named, with its worker, its
    sample indices and the stack it was in; every report in the evidence."""
    found = late_batches(reports, batches)
    if not found:
        return []
    worst = max(found, key=lambda late: late.late_s)
    message = _sentence(worst)
    if len(found) > 1:
        numbers = ", ".join(str(late.seq) for late in found)
        message = (f"{len(found)} batches were overdue ({numbers}"
                   f"{', the first reported' if len(found) >= MAX_OVERDUE else ''}); the "
                   f"slowest: " + message)
    return [Diagnostic(
        "overdue_batch", "warning", message,
        {"batches": [dataclasses.asdict(late) for late in found], "stack": worst.stack},
        fix=FORK_STUCK_FIX if worst.stuck_in_fork else
        "# Look at that line for those sample indices: a huge or corrupt file, a network\n"
        "# read, a lock. DataLoader(..., timeout=SECONDS) turns a hang into an error.")]


def _sentence(late: LateBatch) -> str:
    what = f"batch {late.seq}" + (" (the first of an epoch, its workers' start-up included)"
                                  if late.first_of_epoch else "")
    if late.took_s is not None:
        text = f"{what} took {seconds_text(late.took_s)}"
    elif late.came:  # before the batches kept for this view
        text = f"{what} took over {seconds_text(late.waited_s)}"
    else:
        text = f"{what} had waited {seconds_text(late.waited_s)} when the run ended"
    if late.usual_s and not late.first_of_epoch:  # (a start-up is not a batch's usual time)
        text += (f", {late.late_s / late.usual_s:.0f}x the usual {seconds_text(late.usual_s)} "
                 "a batch")
    if late.worker_id is not None:
        text += ": it " + _waited_on(late.worker_id, late.indices, late.at, "waited")
        if not late.at and late.stack is None:
            text += f" ({no_stack(late.pid)})"
    return text


def _waited_on(worker_id: int, indices: Any, at: str | None, verb: str) -> str:
    """"waited on worker 0 for sample indices [40, 41], at slow.py:18 in __getitem__"."""
    text = f"{verb} on " + ("the main process" if worker_id < 0 else f"worker {worker_id}")
    if indices is not None:
        text += f" for sample indices {indices}"
    return text + (f", {placed(at)}" if at else "")


def placed(where: str, preposition: str = "at") -> str:
    """"at slow.py:18 in __getitem__"; "inside fork(): it never started" as it is."""
    return where if where.startswith(INSIDE_FORK) else f"{preposition} {where}"


def overdue_now(report: Overdue) -> str:
    """The report as it arrives, in a line: "batch 10 has taken 1.0 s so far (usually 2.0 ms a
    batch): waiting on worker 0 for sample indices [40, ...], at slow.py:18 in __getitem__"."""
    text = f"batch {report.seq} has taken {seconds_text(report.waited_s)} so far"
    if report.usual_s:
        text += f" (usually {seconds_text(report.usual_s)} a batch)"
    if report.outstanding:
        holder = report.outstanding[0]
        stack = holder.get("stack")
        text += ": " + _waited_on(holder.get("worker_id", -1), holder.get("indices"),
                                  where_held(holder) or outside_users_code(stack,
                                                                           holder.get("pid")),
                                  "waiting")
    return text


def outside_users_code(stack: str | None, pid: int | None = None) -> str:
    """Where a stack without the user's code is ("queues.py:113 in get, not your code": a
    worker idle for indices that never came tells a different story than one inside torch),
    or that no stack came (a worker that never offered one, or did not answer)."""
    frame = FRAME.search((stack or "").split("\n\n")[0])
    if frame is None:
        return no_stack(pid)
    return f"{os.path.basename(frame['file'])}:{frame['line']} in {frame['name']}, not your code"


def no_stack(pid: int | None) -> str:
    """That a worker's stack could not be read, and how its user can read it: a watched job's
    workers offer none (instrument/stacks.offer_stack), and a worker asleep before its first
    fetch (a watched Lightning fit's, in torch's start-up seeding) has not offered one yet."""
    text = "its stack could not be read"
    if pid is not None:
        text += f"; `py-spy dump --native --pid {pid}` shows where it is"
    return text


def stuck_at(stack: str | None) -> str | None:
    """"stuck_in_main.py:18 in __getitem__": the innermost frame of the user's code in a stack
    (most recent call first; a worker's signalled thread, the first block, is read first);
    None without one."""
    for block in (stack or "").split("\n\n"):
        for frame in FRAME.finditer(block):
            if users_frame(frame["file"]):
                return f"{os.path.basename(frame['file'])}:{frame['line']} in {frame['name']}"
    return None


def users_frame(path: str) -> bool:
    """Whether a frame is the user's code: not this package, torch or the standard library
    (what is installed into it is the user's)."""
    if path.startswith(OUR_PACKAGE) or TORCH in path or path.startswith("<"):
        return False
    return not path.startswith(STDLIB) or "-packages" in path
