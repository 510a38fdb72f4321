"""The measuring loop in-process, with real worker processes."""

import pytest

from dataloader_tuner.errors import RunError
from dataloader_tuner.child.measure import Measurement
from dataloader_tuner.record.columns import BatchColumns
from dataloader_tuner.record.cards import Consumer
from dataloader_tuner.child.starting import starting_config
from dataloader_tuner.child.target import resolve

from .conftest import dataset_path


def _measure(target, settings, consumer=Consumer(), seconds=30.0, max_batches=None):
    resolved = resolve(dataset_path(target))
    config = starting_config(resolved, settings)
    columns, epochs = BatchColumns(), []
    Measurement(resolved, config, consumer, seconds, columns,
                on_epoch=lambda *a: epochs.append(a), max_batches=max_batches).run()
    return columns.rows(), epochs


def test_zero_workers_crosses_epochs_until_max_batches():
    records, epochs = _measure("small_map.py", dict(batch_size=16), max_batches=10)
    assert len(records) == 10
    assert [e[0] for e in epochs] == [0, 1, 2]  # 64 samples / 16 = 4 batches per epoch
    assert {r.worker_id for r in records} == {-1}
    assert all(r.samples == 16 for r in records)
    assert all(r.nbytes > 0 for r in records if r.nbytes is not None)
    assert [r.seq for r in records] == list(range(10))


def test_fast_batches_read_the_cpu_clock_and_bytes_on_a_sample():
    """Batches under 1 ms: the costly reads happen on every 16th batch only."""
    from dataloader_tuner.instrument import probes
    from dataloader_tuner.instrument.probes import MAX_EVERY

    probes._after_fork()  # a fresh per-process timer, as a new worker has: no earlier test's state
    records, _ = _measure("small_map.py", dict(batch_size=1), max_batches=200)
    read = [r for r in records if r.fetch_cpu_s is not None]
    assert all(r.nbytes is not None for r in read)
    # Every 16th batch at most, rarer while the reads cost over 0.5% of a batch (up to every
    # 64th); a batch slowed past 1 ms (page faults, a GC pass, a busy machine) makes the next
    # one read too, so the exact count depends on load: sampling is what is asserted.
    assert 200 // MAX_EVERY - 1 <= len(read) <= 200 / 4


def test_fast_batches_each_keep_a_row_with_their_making_timed_on_a_sample():
    from dataloader_tuner.instrument import probes

    probes._after_fork()  # a fresh per-process timer, as a new worker has
    records, _ = _measure("small_map.py", dict(batch_size=1), max_batches=400)
    assert [r.seq for r in records] == list(range(400))  # a row per batch, samples exact
    assert all(r.samples == 1 and r.worker_id == -1 for r in records)
    timed = [r.seq for r in records if r.fetch_s is not None]
    assert timed[:probes.TIME_ALL_FIRST] == list(range(probes.TIME_ALL_FIRST))
    # ...then every 16th (a batch slowed past 1 ms by a busy machine makes the next timed too)
    assert (400 - probes.TIME_ALL_FIRST) // probes.TIME_EVERY <= len(
        timed) - probes.TIME_ALL_FIRST < (400 - probes.TIME_ALL_FIRST) / 2


def test_several_workers_are_attributed():
    records, _ = _measure("small_map.py", dict(batch_size=8, num_workers=2),
                          max_batches=16)
    assert {r.worker_id for r in records} == {0, 1}
    assert all(r.fetch_start >= 0 for r in records)


def test_module_batch_size_applies_unless_given():
    records, _ = _measure("small_map.py", dict(), max_batches=2)
    assert records[0].samples == 4


def test_iterable_dataset_with_workers():
    records, _ = _measure("stream.py", dict(batch_size=5, num_workers=2), max_batches=30)
    assert {r.worker_id for r in records} == {0, 1}


def test_train_step_consumer_is_timed():
    records, _ = _measure("with_step.py", dict(batch_size=4),
                          consumer=Consumer("train_step"), max_batches=5)
    assert len(records) == 5 and all(r.step_s >= 0.002 for r in records)


def test_simulated_step_without_gpu_sleeps():
    records, _ = _measure("small_map.py", dict(batch_size=4),
                          consumer=Consumer("simulated", 5.0), max_batches=3)
    assert len(records) == 3 and all(r.step_s >= 0.005 for r in records)


def test_empty_dataset_is_reported():
    with pytest.raises(RunError, match="produced no batches"):
        _measure("empty.py", dict(batch_size=4), max_batches=3)


def test_consumer_choice():
    assert Consumer.choose(None, True).kind == "train_step"
    assert Consumer.choose(None, False).kind == "none"
    assert Consumer.choose(10, True) == Consumer("simulated", 10.0)
    assert Consumer.choose(0, True).kind == "none"


def test_labels_are_read_from_the_dataset_when_it_lists_them():
    """An ImageFolder-style targets list gives exact counts whatever order batches come in."""
    import numpy as np

    from dataloader_tuner.child.measure import labels_of_dataset

    class Folder:
        def __init__(self, targets):
            self.targets = targets

        def __len__(self):
            return len(self.targets)

    assert labels_of_dataset(Folder([0] * 22 + [1])) == {0: 22, 1: 1}
    assert labels_of_dataset(Folder(np.array([2, 2, 3]))) == {2: 2, 3: 1}
    assert labels_of_dataset(Folder(["a", "b"])) is None  # not class indices
    assert labels_of_dataset(Folder([])) is None
    assert labels_of_dataset([1, 2, 3]) is None


def test_a_dataset_that_lists_its_labels_has_no_batch_looked_at_for_them(tmp_path,
                                                                         monkeypatch):
    """long_tail and many_classes list ``targets``: their counts come from it, exact, and the
    loop spends nothing per batch on labels; with a sampler of the user's, batches are counted
    (it changes what the model sees)."""
    import dataloader_tuner.child.measure as measure_module
    from dataloader_tuner.child.measure import LABEL_EVERY, count_labels

    target = tmp_path / "listed.py"
    target.write_text(
        "import torch\n"
        "class Listed(torch.utils.data.Dataset):\n"
        "    targets = [0] * 30 + [1] * 10\n"
        "    def __len__(self): return 40\n"
        "    def __getitem__(self, i): return torch.zeros(2), self.targets[i]\n"
        "dataset = Listed()\n")
    looked: list[int] = []
    resolved = resolve(str(target))
    for settings, counted in (({"batch_size": 4}, False),
                              ({"batch_size": 4, "sampler": list(range(40))[::-1]}, True)):
        config = starting_config(resolved, settings)
        measurement = Measurement(resolved, config, Consumer(), 30.0, BatchColumns(),
                                  max_batches=40, labels=True)

        def spy(batch, samples, counts):
            looked.append(samples)
            count_labels(batch, samples, counts)

        monkeypatch.setattr(measure_module, "count_labels", spy)
        try:
            measurement.run()
        finally:
            measurement.close()
        if counted:
            assert measurement.dataset_labels is None
            assert len(looked) == 40 // LABEL_EVERY
            assert sum(measurement.label_counts.values()) == 4 * len(looked)
        else:
            assert measurement.dataset_labels == {0: 30, 1: 10} and looked == []
    # a trial (labels not asked for) neither reads the list nor looks at a batch
    trial = Measurement(resolved, starting_config(resolved, {"batch_size": 4}), Consumer(),
                        30.0, BatchColumns(), max_batches=40)
    try:
        trial.run()
    finally:
        trial.close()
    assert trial.dataset_labels is None and not trial.label_counts and len(looked) == 5


def test_the_snippet_names_objects_as_the_module_makes_them():
    from dataloader_tuner.child.starting import snippet_names

    resolved = resolve(dataset_path("duck_table.py"))
    config = starting_config(resolved, {"num_workers": 1})
    line = config.snippet(expressions=snippet_names(resolved, config))
    assert "sampler=make_sampler(dataset)" in line and "collate_fn=collate_fn" in line


def test_a_module_batch_sampler_makes_the_batches_and_refuses_a_batch_size():
    from dataloader_tuner.errors import ConfigError

    records, _ = _measure("with_batch_sampler.py", {}, max_batches=12)
    assert {r.samples for r in records} == {5}
    resolved = resolve(dataset_path("with_batch_sampler.py"))
    with pytest.raises(ConfigError, match="batch_sampler makes the batches"):
        starting_config(resolved, {"batch_size": 8})


def test_worker_only_settings_go_with_the_workers():
    from dataloader_tuner.config import LoaderConfig
    from dataloader_tuner.errors import ConfigError

    with_workers = LoaderConfig(num_workers=2, multiprocessing_context="spawn", timeout=30)
    alone = with_workers.replace(num_workers=0)
    assert alone.multiprocessing_context is None and alone.timeout == 0
    with pytest.raises(ConfigError, match="multiprocessing_context only applies"):
        LoaderConfig(num_workers=0, multiprocessing_context="spawn")
