"""GPU measurements: host-to-device copy time, GPU idle gaps, NVML samples.

Everything here degrades to "not measured, and why" without a CUDA GPU: callers get ``None``
timers and ``gpu_info()`` says what is missing. Nothing initialises CUDA before the caller asks,
so forked DataLoader workers stay safe.
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from typing import Any

import torch

from dataloader_tuner.instrument.gpu_events import other_kind_twins, pair_ms, record_pair
from dataloader_tuner.instrument.tensors import tensors_of

NO_GPU_REASON = (
    "no CUDA GPU is visible to this process (torch.cuda.is_available() is False), so "
    "host-to-device copies and GPU idle gaps were not measured"
)


def cuda_available() -> bool:
    # The NVML-based check answers without creating a CUDA context, so forking workers later
    # is still safe.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a broken driver means "no GPU" to us
        return False


def gpu_info() -> dict:
    """GPU name and memory if there is one, else ``available: False`` with the reason."""
    if not cuda_available():
        return {"available": False, "reason": NO_GPU_REASON}
    info = {"available": True, "reason": None, "count": torch.cuda.device_count()}
    nvml = NvmlSampler.open()
    if nvml is not None:
        info.update(nvml.device_info())
        nvml.close()
    return info


class TransferTimer:
    """Times each batch's host-to-device copy with CUDA events on a side stream.

    The batch is copied as the loader delivered it (pinned when ``pin_memory=True``); every
    ``compare_every``-th batch is also copied in the other memory kind, so pinned and pageable
    are compared at the real batch size in the same run.
    """

    def __init__(self, compare_every: int = 8) -> None:
        self.device = torch.device("cuda")
        self.stream = torch.cuda.Stream()
        self.compare_every = compare_every
        self.count = 0

    @classmethod
    def create(cls) -> "TransferTimer | None":
        return cls() if cuda_available() else None

    def _timed_copy(self, tensors: list[torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            start.record(self.stream)
            moved = [t.to(self.device, non_blocking=True) for t in tensors]
            end.record(self.stream)
        end.synchronize()
        return start.elapsed_time(end), moved

    def measure(self, batch: Any) -> tuple[float | None, float | None, list[torch.Tensor]]:
        """Returns (copy ms as delivered, copy ms in the other memory kind or None, on-GPU)."""
        tensors = tensors_of(batch)
        if not tensors:
            return None, None, []
        ms, moved = self._timed_copy(tensors)
        other = None
        self.count += 1
        if self.count % self.compare_every == 0:  # NOTE [ Comparing memory kinds ]
            with torch.cuda.stream(self.stream):
                pair = record_pair(lambda: torch.cuda.Event(enable_timing=True), self.stream,
                                   tensors, other_kind_twins(tensors), self.device,
                                   self.count // self.compare_every)
            pair.last.synchronize()
            other = pair_ms(ms, pair)
        return ms, other, moved


class GapTimer:
    """GPU idle gaps: from the end of step i to the start of step i+1 on the GPU's timeline."""

    def __init__(self) -> None:
        self.last_end: torch.cuda.Event | None = None

    @classmethod
    def create(cls) -> "GapTimer | None":
        return cls() if cuda_available() else None

    def step_started(self) -> float | None:
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        gap = None
        if self.last_end is not None:
            start.synchronize()
            gap = self.last_end.elapsed_time(start)
        return gap

    def step_ended(self) -> None:
        self.last_end = torch.cuda.Event(enable_timing=True)
        self.last_end.record()


def simulated_gpu_step(step_s: float) -> None:
    """Keep the GPU busy for about ``step_s`` of the loop's time, the CPU waiting (as a real
    forward/backward ending in ``loss.item()``): a spin kernel of as many cycles as the fit of
    this process's GPU asks (``spin_fit``)."""
    spin_s, s_per_cycle = spin_fit()
    _spin(spin_cycles(step_s, spin_s, s_per_cycle))


def spin_cycles(step_s: float, spin_s: float, s_per_cycle: float) -> int:
    """Cycles of spin that take ``step_s`` when a spin of none takes ``spin_s``."""
    return max(0, int((step_s - spin_s) / s_per_cycle))


# The fit's two spins, in the clock rate's cycles: long enough that the host's clock resolves
# them, short enough that fitting costs ~30 ms once a process.
FIT_SHORT_S, FIT_LONG_S, FIT_REPEATS = 0.001, 0.006, 3


@functools.lru_cache(maxsize=1)
def spin_fit() -> tuple[float, float]:
    """(seconds a spin of no cycles takes, seconds per cycle), timed on the host's clock from
    launch to the end of the wait: the reported clock rate alone left a fixed ~0.65 ms out (an
    H200: 5 ms asked took 5.62, 20 took 20.72, 50 took 50.75). Falls back to the clock rate
    when the fit is implausible (a host too busy to time it)."""
    nominal = 1.0 / (torch.cuda.get_device_properties(0).clock_rate * 1000.0)
    short, long = round(FIT_SHORT_S / nominal), round(FIT_LONG_S / nominal)
    _spin(short)  # warm-up: the kernel's first launch loads it
    timed: dict[int, list[float]] = {short: [], long: []}
    for _ in range(FIT_REPEATS):
        for cycles in (short, long):
            t0 = time.perf_counter()
            _spin(cycles)
            timed[cycles].append(time.perf_counter() - t0)
    t_short, t_long = statistics.median(timed[short]), statistics.median(timed[long])
    s_per_cycle = (t_long - t_short) / (long - short)
    spin_s = t_short - short * s_per_cycle
    if not (0.5 * nominal <= s_per_cycle <= 2.0 * nominal and 0.0 <= spin_s <= 0.005):
        return 0.0, nominal
    return spin_s, s_per_cycle


def _spin(cycles: int) -> None:
    torch.cuda._sleep(cycles)
    torch.cuda.current_stream().synchronize()


class NvmlSampler:
    """Utilisation and memory of GPU 0 through nvidia-ml-py (imported as pynvml)."""

    def __init__(self, pynvml: Any, handle: Any) -> None:
        self.pynvml, self.handle = pynvml, handle

    @classmethod
    def open(cls) -> "NvmlSampler | None":
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception:  # noqa: BLE001 - no driver / no GPU: NVML samples are simply absent
            return None

    def device_info(self) -> dict:
        name = self.pynvml.nvmlDeviceGetName(self.handle)
        memory = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {
            "name": name.decode() if isinstance(name, bytes) else name,
            "memory_total_mb": memory.total / 2**20,
        }

    def sample(self) -> dict:
        rates = self.pynvml.nvmlDeviceGetUtilizationRates(self.handle)
        memory = self.pynvml.nvmlDeviceGetMemoryInfo(self.handle)
        return {"util_percent": rates.gpu, "memory_used_mb": memory.used / 2**20}

    def close(self) -> None:
        try:
            self.pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
