"""A dataset whose samples spend known shares of their time in three named functions, most of
it waiting: reading 60% (a sleep, as a remote read or a slow disk waits), decoding 25% and
augmenting 15% (spins on the thread's CPU clock), for the sampled profile's time and CPU to be
checked apart (tests/test_hotspots.py).

Under load the shares move (a sleep wakes late, a spin is preempted), so where
``WAITING_STAGES_CLOCK`` names a folder each process times its own stages and keeps the sums
there (``<pid>.json``, rewritten every CLOCK_EVERY samples): the loop's own clock, the truth
the profile is checked against."""

import json
import os
import time

import torch
from torch.utils.data import Dataset

batch_size = 8
SHARES = {"read_bytes": 0.6, "decode_sample": 0.25, "augment": 0.15}
SAMPLE_S = 0.002
CLOCK_EVERY = 16


def _spin(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def read_bytes() -> None:
    time.sleep(SHARES["read_bytes"] * SAMPLE_S)


def decode_sample() -> None:
    _spin(SHARES["decode_sample"] * SAMPLE_S)


def augment() -> None:
    _spin(SHARES["augment"] * SAMPLE_S)


class WaitingStages(Dataset):
    def __init__(self) -> None:
        self.clock_dir = os.environ.get("WAITING_STAGES_CLOCK")
        self.spent = dict.fromkeys(SHARES, 0.0)
        self.timed = 0
        self.pid = os.getpid()  # a forked worker starts its own sums (not its parent's copy)

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, index: int):
        if self.clock_dir is None:
            read_bytes()
            decode_sample()
            augment()
        else:
            if self.pid != os.getpid():
                self.spent, self.timed, self.pid = dict.fromkeys(SHARES, 0.0), 0, os.getpid()
            for stage in (read_bytes, decode_sample, augment):
                began = time.perf_counter()
                stage()
                self.spent[stage.__name__] += time.perf_counter() - began
            self._keep_clock()
        return torch.full((4,), float(index))

    def _keep_clock(self) -> None:
        self.timed += 1
        if self.timed % CLOCK_EVERY == 0:
            path = os.path.join(self.clock_dir, f"{os.getpid()}.json")
            with open(path + ".tmp", "w") as out:
                json.dump(self.spent, out)
            os.replace(path + ".tmp", path)  # (a reader never sees half a file)


def own_clock_shares(clock_dir: str) -> dict[str, float]:
    """Every process's stage times summed, as shares of the three."""
    spent = dict.fromkeys(SHARES, 0.0)
    for name in os.listdir(clock_dir):
        if name.endswith(".json"):
            with open(os.path.join(clock_dir, name)) as kept:
                for stage, seconds in json.load(kept).items():
                    spent[stage] += seconds
    total = sum(spent.values())
    assert total > 0, f"no process kept its stage clock in {clock_dir}"
    return {stage: seconds / total for stage, seconds in spent.items()}


dataset = WaitingStages()
