"""GPU code paths on a machine without a GPU (absent fields and a plain reason, no crash), and
the arithmetic behind them that needs none."""

import pytest
import torch

from dataloader_tuner.instrument import gpu
from dataloader_tuner.instrument.tensors import tensors_of

without_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


@without_gpu
def test_describe_says_why_nothing_was_measured():
    info = gpu.gpu_info()
    assert info["available"] is False
    assert "no CUDA GPU" in info["reason"] and "not measured" in info["reason"]


@without_gpu
def test_timers_are_absent_without_a_gpu():
    assert gpu.TransferTimer.create() is None
    assert gpu.GapTimer.create() is None


def test_nvml_sampler_is_absent_or_usable():
    sampler = gpu.NvmlSampler.open()
    if sampler is None:  # no driver answers NVML: then torch sees no CUDA GPU either
        assert not torch.cuda.is_available()
        return
    try:  # a driver answers: a sample has both figures, in range
        sample = sampler.sample()
        assert 0 <= sample["util_percent"] <= 100 and sample["memory_used_mb"] >= 0
    finally:
        sampler.close()


def test_tensors_are_found_in_nested_batches():
    batch = {"x": torch.zeros(2), "y": [torch.ones(1), 3]}
    assert len(tensors_of(batch)) == 2


def test_a_simulated_step_spins_for_what_the_fit_leaves_after_the_launch_and_wait():
    """gpu.spin_cycles: with a spin of no cycles taking 0.65 ms and a 1.98 GHz clock, a 5 ms
    step spins 4.35 ms of cycles; a step shorter than the launch and wait spins none."""
    s_per_cycle = 1 / 1.98e9
    assert gpu.spin_cycles(0.005, 0.00065, s_per_cycle) == pytest.approx(0.00435 * 1.98e9, 1)
    assert gpu.spin_cycles(0.0005, 0.00065, s_per_cycle) == 0
