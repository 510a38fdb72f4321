import json

import pytest

from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.settings import load_settings
from dataloader_tuner.errors import ConfigError


@pytest.mark.parametrize(
    "kwargs, phrase",
    [
        ({"sampler": object(), "shuffle": True}, "sampler and shuffle=True"),
        ({"batch_sampler": object(), "batch_size": 8}, "batch_sampler cannot be combined"),
        ({"batch_sampler": object(), "drop_last": True}, "batch_sampler cannot be combined"),
        ({"batch_sampler": object(), "shuffle": True}, "batch_sampler cannot be combined"),
        ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor only applies"),
        ({"num_workers": 0, "persistent_workers": True}, "persistent_workers=True needs"),
        ({"num_workers": -1}, "num_workers must be an integer >= 0"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"num_workers": 2, "prefetch_factor": 0}, "prefetch_factor must be an integer >= 1"),
        ({"timeout": -1}, "timeout must be >= 0"),
    ],
)
def test_invalid_combinations_are_rejected_with_the_fix(kwargs, phrase):
    with pytest.raises(ConfigError) as caught:
        LoaderConfig(**kwargs)
    assert phrase in str(caught.value)
    assert caught.value.type == "invalid_settings"


def test_valid_worker_settings_render_as_kwargs_and_a_code_line():
    config = LoaderConfig(batch_size=32, num_workers=4, pin_memory=True, prefetch_factor=4,
                          persistent_workers=True)
    assert config.to_kwargs() == {
        "batch_size": 32, "num_workers": 4, "pin_memory": True, "prefetch_factor": 4,
        "persistent_workers": True,
    }
    assert config.snippet("train_set") == (
        "DataLoader(train_set, batch_size=32, num_workers=4, pin_memory=True, "
        "prefetch_factor=4, persistent_workers=True)"
    )
    assert config.effective_prefetch_factor == 4
    assert LoaderConfig(num_workers=2).effective_prefetch_factor == 2
    assert LoaderConfig().effective_prefetch_factor == 0


def test_objects_are_named_in_the_code_line_and_json():
    def my_collate(samples):
        return samples

    config = LoaderConfig(batch_size=8, collate_fn=my_collate)
    assert "collate_fn=" in config.snippet() and "my_collate" in config.snippet()
    assert json.dumps(config.to_json_dict())  # JSON-safe


def test_in_order_dropped_for_old_torch():
    config = LoaderConfig(in_order=False)
    assert "in_order" in config.to_kwargs("2.13.0")
    assert "in_order" not in config.to_kwargs("2.2.1+cu121")


def test_batch_sampler_kwargs_omit_batch_size():
    config = LoaderConfig(batch_sampler=[[0, 1]])
    assert "batch_size" not in config.to_kwargs()


def test_replace_to_zero_workers_drops_worker_only_settings():
    config = LoaderConfig(num_workers=4, prefetch_factor=4, persistent_workers=True)
    zero = config.replace(num_workers=0)
    assert zero.prefetch_factor is None and zero.persistent_workers is False


def test_settings_roundtrip_through_a_file(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"dataloader_kwargs": {"num_workers": 3, "pin_memory": False}}))
    settings = load_settings(str(path))
    assert settings == {"num_workers": 3, "pin_memory": False}
    assert LoaderConfig.from_settings(settings).num_workers == 3


def test_unknown_settings_are_named(tmp_path):
    with pytest.raises(ConfigError, match="num_wrokers"):
        LoaderConfig.from_settings({"num_wrokers": 2})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"workers": 2}))
    with pytest.raises(ConfigError, match="workers"):
        load_settings(str(path))
