"""A loop over a realistic pipeline with the tool's sampler on, for tests that profile the same
loop from outside (py-spy): ``python -m tests.sampled_loop NAME SECONDS`` loads
``tests/real/NAME.py``, runs its loader (the probes' wrappers, as the engine builds it, in
this one process) for SECONDS with the sampler armed, and prints the sampled profile's
summary as one JSON line."""

from __future__ import annotations

import importlib
import json
import sys
import time

from dataloader_tuner.analyse.hotspots import SampledProfile
from dataloader_tuner.child.measure import build_loader
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.instrument.sampler import StackSampler


def main(name: str, seconds: float) -> None:
    module = importlib.import_module(f"tests.real.{name}")
    config = LoaderConfig(batch_size=module.batch_size,
                          collate_fn=getattr(module, "collate_fn", None))
    loader = build_loader(module.make_dataset(), config)
    for i, _ in enumerate(loader):  # first batches (lazy imports, the heap's growth) unsampled
        if i == 2:
            break
    sampler = StackSampler().start()
    assert sampler is not None, "SIGPROF is taken in this process"
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in loader:
            if time.monotonic() >= end:
                break
    sampler.stop()
    profile = SampledProfile()
    profile.add(0, sampler.take())
    print(json.dumps(profile.merged()))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
