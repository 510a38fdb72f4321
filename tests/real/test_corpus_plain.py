"""The corpus fixtures themselves are right: each module builds, and one batch from a plain
DataLoader (``num_workers=0``) holds exactly ``EXPECTED["samples_per_batch"]`` samples,
counted twice: from the indices the batch sampler handed out and from the batch's contents.
The slow pipelines' fixtures (imagenet_like: ~20 s to generate once, ~1 s a batch) are marked
slow; their train_steps take one real batch.
"""

from __future__ import annotations

import importlib
import os
import threading
import types
from collections.abc import Mapping

import pytest
import torch

from tests.real import _data, plain_loop

SLOW_FIXTURE = pytest.mark.slow  # a fixture that takes many seconds to build or to batch
MODULES = [
    "detection", "detectron2_style", "jpeg_folder", "webdataset_style", "copy_on_read_leak",
    "copy_on_read_fixed", "memmap_store", "long_tail", "many_classes", "duck_typed",
    "noisy_worker", "audio_like", pytest.param("imagenet_like", marks=SLOW_FIXTURE),
    "audio_mel", "cpu_mlp", pytest.param("imagefolder_compose", marks=SLOW_FIXTURE),
    pytest.param("tokenized_text", marks=SLOW_FIXTURE),  # (imports transformers)
]
CODES = {"worker_memory_growth", "skewed_labels"}
WORKER_ONLY = ("persistent_workers", "prefetch_factor", "multiprocessing_context", "timeout")


def load(name: str):
    return importlib.import_module(f"tests.real.{name}")


def samples_in(batch) -> int:
    """Samples in a collated batch, read from its contents: a tensor's leading dimension, a
    list of per-sample dicts' length; every part of a tuple / mapping must agree."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, Mapping):
        parts = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        if batch and all(isinstance(item, Mapping) for item in batch):
            return len(batch)  # a list of per-sample dicts (trivial_batch_collator)
        parts = list(batch)
    else:
        raise TypeError(f"cannot count samples in a {type(batch).__name__}")
    counts = set()
    for part in parts:
        if isinstance(part, (torch.Tensor, Mapping, list, tuple)):
            counts.add(samples_in(part))
    assert len(counts) == 1, f"parts of the batch disagree on its size: {counts}"
    return counts.pop()


@pytest.mark.filterwarnings("ignore:fixture warning")
@pytest.mark.filterwarnings("ignore:.pin_memory. argument is set as true")
@pytest.mark.parametrize("name", MODULES)
def test_one_batch_has_the_expected_samples(name):
    module = load(name)
    expected = module.EXPECTED
    assert set(expected["diagnostics_present"]) <= CODES
    assert set(expected["diagnostics_absent"]) <= CODES
    assert not set(expected["diagnostics_present"]) & set(expected["diagnostics_absent"])

    dataset = module.make_dataset()
    settings = plain_loop.loader_settings(module, dataset, num_workers=0)
    for key in WORKER_ONLY:
        settings.pop(key, None)
    loader, unpack = plain_loop.counting_loader(dataset, settings)
    iterator = iter(loader)
    counted, batch = unpack(next(iterator))
    del iterator

    assert counted == expected["samples_per_batch"]
    assert samples_in(batch) == expected["samples_per_batch"]


def test_long_tail_counts_match_expected():
    module = load("long_tail")
    targets = module.make_dataset().targets
    counts = {label: targets.count(label) for label in set(targets)}
    assert counts == module.EXPECTED["label_counts"]
    assert max(counts.values()) / min(counts.values()) == module.EXPECTED["label_ratio"] == 22.0
    assert targets == sorted(targets)  # stored class-sorted, like ImageFolder


@pytest.mark.parametrize("name", [pytest.param("imagenet_like", marks=SLOW_FIXTURE),
                                  "audio_mel", "cpu_mlp"])
def test_slow_pipelines_label_counts_match_expected(name):
    module = load(name)
    dataset = module.make_dataset()
    targets = getattr(dataset, "targets", None)
    if targets is None:  # cpu_mlp: label i % 10; items cost ~2 ms each, so check a few
        assert [dataset[i][1] for i in range(20)] == [i % module.NUM_CLASSES for i in range(20)]
        targets = [index % module.NUM_CLASSES for index in range(len(dataset))]
    counts = {label: targets.count(label) for label in set(targets)}
    assert counts == module.EXPECTED["label_counts"]


@pytest.mark.slow
def test_imagenet_like_is_imagefolder_shaped_with_train_transforms():
    module = load("imagenet_like")
    dataset = module.make_dataset()
    assert len(dataset) == 1024 and dataset.classes == sorted(dataset.classes)
    assert dataset.samples[0][0].endswith(".JPEG") and dataset.targets == sorted(dataset.targets)
    image, label = dataset[0]
    assert image.shape == (3, 224, 224) and image.dtype == torch.float32 and label == 0
    assert -3.0 < float(image.min()) and float(image.max()) < 3.0  # normalised, not [0, 255]
    assert module.dataloader_kwargs["num_workers"] == 4 and module.batch_size == 256


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (640, 480), (224, 224), (1000, 100)])
def test_random_resized_crop_params_stay_inside_the_image(size):
    module = load("imagenet_like")
    width, height = size
    for _ in range(200):
        top, left, h, w = module.random_resized_crop_params(width, height)
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h and w


@pytest.mark.parametrize("name", ["audio_mel", "cpu_mlp"])
def test_slow_pipelines_train_step_takes_a_real_batch(name):
    module = load(name)
    dataset = module.make_dataset()
    settings = plain_loop.loader_settings(module, dataset, num_workers=0, shuffle=False)
    batch = next(iter(torch.utils.data.DataLoader(dataset, **settings)))
    loss = module.train_step(batch)
    assert isinstance(loss, float) and loss > 0


def test_audio_mel_features_are_a_normalised_log_mel():
    module = load("audio_mel")
    features, label = module.make_dataset()[3]
    assert features.shape == (1, module.N_MELS, 1 + module.RATE // module.HOP) and label == 3
    assert abs(float(features.mean())) < 1e-3 and abs(float(features.std()) - 1) < 1e-2
    tone = torch.sin(torch.arange(module.FILE_RATE) * 2 * torch.pi * 440 / module.FILE_RATE)
    resampled = module.resample(tone, module.FILE_RATE, module.RATE)
    assert resampled.shape == (module.RATE,)
    assert float(resampled[1000:-1000].abs().max()) == pytest.approx(1.0, abs=0.01)


def _counting_module(samples: int, batch_size: int) -> tuple[types.ModuleType, list]:
    """A target module built in memory: a list dataset and a train_step that records batches."""
    steps: list[int] = []
    module = types.ModuleType("counting_target")
    module.dataset = [torch.tensor([float(i)]) for i in range(samples)]
    module.batch_size = batch_size
    module.train_step = lambda batch: steps.append(len(batch))
    return module, steps


def test_plain_rate_with_step_runs_the_step_on_every_batch():
    module, steps = _counting_module(64, 4)
    result = plain_loop.plain_rate(module, 0.05, with_step=True, min_batches=5)
    assert result["batches"] >= 5 and result["epochs_timed"] is None
    assert len(steps) == 1 + result["batches"]  # the warm-up batch is stepped too
    with pytest.raises(LookupError):
        plain_loop.plain_rate(load("jpeg_folder"), 0.05, with_step=True)


def test_plain_rate_times_whole_epochs_when_they_are_short():
    # 10 samples in batches of 4: 4, 4, 2 an epoch; the first epoch is the warm-up, then whole
    # epochs until at least 5 batches are timed: two epochs, 6 batches, 20 samples
    module, steps = _counting_module(10, 4)
    result = plain_loop.plain_rate(module, 0.0, with_step=True, min_batches=5, whole_epochs=True)
    assert (result["batches"], result["samples"], result["epochs_timed"]) == (6, 20, 2)
    assert steps == [4, 4, 2] * 3
    assert result["samples_per_s"] == pytest.approx(result["samples"] / result["seconds"])


def test_duck_typed_is_not_a_torch_dataset():
    module = load("duck_typed")
    dataset = module.make_dataset()
    assert not isinstance(dataset, torch.utils.data.Dataset)
    batch = module.collate_fn(dataset.__getitems__([0, 1, 2]))
    assert isinstance(batch, Mapping) and not isinstance(batch, dict)
    assert batch["input_ids"].shape == batch["attention_mask"].shape


def test_plain_rate_counts_whole_batches_from_a_stream_with_workers():
    result = plain_loop.plain_rate(load("webdataset_style"), 0.25)
    assert result["batches"] > 0
    assert result["samples"] == 64 * result["batches"]
    assert result["samples_per_s"] == pytest.approx(result["samples"] / result["seconds"])


def test_plain_rate_by_file_path_with_persistent_workers():
    path = os.path.join(os.path.dirname(__file__), "memmap_store.py")
    result = plain_loop.plain_rate(path, 0.25)
    assert result["batches"] > 0 and result["samples"] == 128 * result["batches"]


def test_plain_rate_counts_a_short_last_batch():
    # 200 images in order: batches of 32 x 6 then 8, and a new epoch after it; the first
    # batch is the warm-up (num_workers=0), so counting starts at the second
    # (at least 8 batches: 0.25 s made fewer with three more test processes beside it)
    result = plain_loop.plain_rate(load("jpeg_folder"), 0.25, min_batches=8, shuffle=False)
    sizes = [32] * 6 + [8]
    assert result["batches"] > 7
    assert result["samples"] == sum(sizes[(1 + i) % 7] for i in range(result["batches"]))


def test_noisy_worker_speaks_once_per_worker(capfd):
    module = load("noisy_worker")
    loader = torch.utils.data.DataLoader(module.make_dataset(), batch_size=8, num_workers=2)
    iterator = iter(loader)
    for _ in range(20):
        next(iterator)
    iterator._shutdown_workers()
    del iterator
    err = capfd.readouterr().err
    assert err.count(module.STDERR_LINE) == 2


def test_fixture_dir_builds_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DLTUNER_FIXTURE_DIR", str(tmp_path))
    calls = []

    def build(folder):
        calls.append(folder)
        with open(os.path.join(folder, "data.txt"), "w") as f:
            f.write("x")

    first = _data.fixture_dir("thing-v1", build)
    assert first == str(tmp_path / "thing-v1")
    assert _data.fixture_dir("thing-v1", build) == first
    assert len(calls) == 1
    assert os.listdir(tmp_path) == ["thing-v1"]  # no temporary folder left behind


def test_fixture_dir_loser_of_a_race_keeps_the_winners_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("DLTUNER_FIXTURE_DIR", str(tmp_path))

    def build(folder):
        # another process publishes while we are still building
        winner = tmp_path / "race-v1"
        winner.mkdir()
        (winner / "data.txt").write_text("winner")
        with open(os.path.join(folder, "data.txt"), "w") as f:
            f.write("loser")

    final = _data.fixture_dir("race-v1", build)
    with open(os.path.join(final, "data.txt")) as f:
        assert f.read() == "winner"
    assert os.listdir(tmp_path) == ["race-v1"]


def test_fixture_dir_concurrent_builders_agree(tmp_path, monkeypatch):
    monkeypatch.setenv("DLTUNER_FIXTURE_DIR", str(tmp_path))
    start = threading.Barrier(4)
    seen = []

    def build(folder):
        with open(os.path.join(folder, "data.txt"), "w") as f:
            f.write(os.path.basename(folder))

    def worker():
        start.wait()
        final = _data.fixture_dir("concurrent-v1", build)
        with open(os.path.join(final, "data.txt")) as f:
            seen.append(f.read())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 4 and len(set(seen)) == 1
    assert os.listdir(tmp_path) == ["concurrent-v1"]
