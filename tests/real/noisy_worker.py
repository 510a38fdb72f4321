"""A dataset whose workers talk: each worker process emits one ``UserWarning`` and prints one
line to stderr on its first sample, like libraries that warn on first use (PIL's
``DecompressionBombWarning``, torchvision's deprecation warnings, a tokenizer's fork notice).

Why the shape matters: the workers' warnings and stderr must reach the user, once per worker
(not lost, not multiplied per batch), and must not be mistaken for a failure. "Once" is
tracked per process id, so a sample fetched in the parent (e.g. a probe with
``num_workers=0``) does not silence the forked workers.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.utils.data import Dataset

STDERR_LINE = "fixture stderr line from worker"
WARNING_PREFIX = "fixture warning:"

batch_size = 8
dataloader_kwargs = {"num_workers": 2}

_spoke_in_pid: int | None = None  # the process that has already warned


def _speak_once() -> None:
    global _spoke_in_pid
    if _spoke_in_pid == os.getpid():
        return
    _spoke_in_pid = os.getpid()
    # The same text in every worker, as a library's warning is: the tool must count it, not list
    # it once per process.
    warnings.warn(f"{WARNING_PREFIX} this library warns on first use", UserWarning, stacklevel=2)
    print(STDERR_LINE, file=sys.stderr, flush=True)


class Noisy(Dataset):
    def __len__(self) -> int:
        return 2000

    def __getitem__(self, index: int):
        _speak_once()
        return torch.full((4,), float(index)), index % 4


def make_dataset() -> Noisy:
    return Noisy()


EXPECTED = {
    "samples_per_batch": 8,
    "diagnostics_present": [],
    "diagnostics_absent": ["skewed_labels", "worker_memory_growth"],
    "stderr_line": STDERR_LINE,
    "warning_prefix": WARNING_PREFIX,
    "note": "one UserWarning and one stderr line per worker process, on its first sample",
}
