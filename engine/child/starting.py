"""The settings a run starts from: the user's own, so "current settings" means one thing.

In order, later wins: DataLoader's defaults (with batch_size 32 when the module says nothing),
the module's own names (``batch_size``, ``collate_fn``, ``sampler``, ``batch_sampler``,
``worker_init_fn``, built from the dataset where the module gives a factory), the module's
``dataloader_kwargs`` (the settings it trains with), then what the caller chose explicitly
(CLI flags, the dashboard's controls). The profile, the tune's baseline, every tune trial and the
recommended ``DataLoader(...)`` line all start from this one config, so settings the tool does not
tune (shuffle, sampler, drop_last, collate_fn, worker_init_fn, generator, ...) are kept.
"""

from __future__ import annotations

from dataloader_tuner.child.target import ResolvedTarget
from dataloader_tuner.config import WORKER_ONLY, LoaderConfig
from dataloader_tuner.errors import ConfigError
from dataloader_tuner.settings import DEFAULT_BATCH_SIZE, KNOWN_KEYS


def module_settings(resolved: ResolvedTarget) -> dict:
    """The DataLoader settings the module declares, as keyword arguments."""
    settings: dict = {}
    if resolved.batch_sampler is None:
        settings["batch_size"] = (resolved.batch_size if resolved.defines_batch_size
                                  else DEFAULT_BATCH_SIZE)
    for key in ("collate_fn", "sampler", "batch_sampler", "worker_init_fn"):
        value = getattr(resolved, key)
        if value is not None:
            settings[key] = value
    declared = dict(resolved.dataloader_kwargs or {})
    unknown = sorted(set(declared) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"dataloader_kwargs has keys DataLoader does not take: {', '.join(unknown)}. "
            f"Known: {', '.join(sorted(KNOWN_KEYS))}.",
            type="invalid_settings",
        )
    if "batch_sampler" in declared:
        settings.pop("batch_size", None)
    settings.update(declared)
    if resolved.is_iterable and (settings.get("sampler") is not None
                                 or settings.get("batch_sampler") is not None):
        raise ConfigError(
            "The module gives a sampler, but the dataset is an IterableDataset: DataLoader "
            "refuses samplers for it (the dataset decides the order itself). Remove the "
            "sampler, or make the dataset map-style.", type="invalid_settings")
    return settings


def starting_config(resolved: ResolvedTarget, chosen: dict | None = None) -> LoaderConfig:
    """The module's settings with the caller's explicit choices on top."""
    settings = module_settings(resolved)
    chosen = dict(chosen or {})
    if settings.get("num_workers", 0) and chosen.get("num_workers") == 0:
        # Dropping workers drops worker-only settings the module set, as DataLoader requires.
        for key in WORKER_ONLY:
            settings.pop(key, None)
    settings.update(chosen)
    if settings.get("batch_sampler") is not None and "batch_size" in chosen:
        raise ConfigError(
            "The module's batch_sampler makes the batches, so a batch size cannot be set. "
            "Drop --batch-size, or drop the batch_sampler.", type="invalid_settings")
    unknown = sorted(set(settings) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(f"Unknown DataLoader setting(s): {', '.join(unknown)}.",
                          type="invalid_settings")
    return LoaderConfig(**settings)


def snippet_names(resolved: ResolvedTarget, config: LoaderConfig) -> dict:
    """How the ``DataLoader(...)`` line names each object setting of ``config``, as the user's
    module makes it: ``sampler=make_sampler(dataset)``, ``collate_fn=collate_fn``,
    ``generator=dataloader_kwargs["generator"]``. Only for objects that are the module's own."""
    names = {}
    for key, value in (resolved.dataloader_kwargs or {}).items():
        if key in KNOWN_KEYS and getattr(config, key, None) is value:
            names[key] = f"dataloader_kwargs[{key!r}]"
    for key, expression in resolved.expressions.items():
        if key not in names and getattr(config, key, None) is getattr(resolved, key, None):
            names[key] = expression
    return names
