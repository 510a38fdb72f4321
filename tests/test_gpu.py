"""GPU code paths on a machine without a GPU: absent fields and a plain reason, no crash."""

import pytest
import torch

from dataloader_tuner.instrument import gpu
from dataloader_tuner.instrument.tensors import tensors_of

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


def test_describe_says_why_nothing_was_measured():
    info = gpu.gpu_info()
    assert info["available"] is False
    assert "no CUDA GPU" in info["reason"] and "not measured" in info["reason"]


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
