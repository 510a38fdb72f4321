"""A diagnostic: something a run revealed that the user should know (a pitfall in their
settings, a warning their code printed, a caveat on the tuner's pick), with a stable code.

Two words, two ideas: an *error* (errors.py) means the run failed; a *diagnostic* means it ran
and found something. Every diagnostic is this one type, whoever finds it (pitfalls.py, the
output log, the tuner), and its code is one of CODES, so programs reading ``--json`` can rely on
them. In JSON a diagnostic is ``{code, severity, message, evidence, fix}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

SEVERITIES = ("warning", "info")

CODES = {
    # the run's own figures
    "short_run": "too few batches after warm-up for the figures to be sure",
    "measuring_cost": "batches so fast that measuring them shows in the rate",
    "overdue_batch": "a batch took many times the usual (a slow sample, a stuck worker)",
    # settings and the machine (pitfalls.py)
    "pin_memory_without_gpu": "pin_memory=True with no GPU to copy to",
    "duplicated_random_streams": "workers drawing identical random numbers",
    "skewed_labels": "some classes far more common than others",
    "worker_memory_growth": "a worker's private memory keeps rising (copy-on-read, a leak)",
    "shm_too_small": "batches in flight need most of /dev/shm",
    "more_workers_than_cpus": "more CPU-bound workers than usable CPUs",
    "cpus_busy_elsewhere": "other processes were using the CPUs",
    "thread_oversubscription": "each worker runs many threads (OpenMP, BLAS, OpenCV)",
    "workers_restarted_each_epoch": "worker start-up paid again every epoch",
    # what the user's code printed (output.py)
    "python_warning": "a Python warning from the user's code or a library",
    "torch_warning": "a warning from torch",
    "printed_output": "lines the user's code printed",
    # the tuner's caveats on its pick
    "baseline_faster": "the baseline measured faster than the pick",
    "noisy_machine": "repeated measurements of the pick varied widely",
    "drifted_while_tuning": "a setting measured early and late in the tune disagreed",
}


@dataclass(frozen=True)
class Diagnostic:
    code: str
    severity: str  # one of SEVERITIES
    message: str  # one line, with the numbers behind it
    evidence: dict[str, Any] = field(default_factory=dict)  # those numbers, for programs
    fix: str | None = None  # code that fixes it, where one fits

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown diagnostic code {self.code!r}: add it to CODES")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "evidence": self.evidence, "fix": self.fix}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], strict: bool = True) -> "Diagnostic":
        """``strict=False`` reads a saved one as it was saved, even if its code has since left
        the catalogue (a run saved by an older version)."""
        values = (doc["code"], doc.get("severity", "warning"), doc["message"],
                  doc.get("evidence") or {}, doc.get("fix"))
        try:
            return cls(*values)
        except ValueError:
            if strict:
                raise
        made = object.__new__(cls)
        for f, value in zip(fields(cls), values):
            object.__setattr__(made, f.name, value)
        return made


def seconds_text(seconds: float) -> str:
    """1.41 s; 120 ms under a second; 0.4 ms under 10 ms."""
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"
