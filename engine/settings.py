"""DataLoader settings, in one place: the ones a run starts from, the ones a tune recommends,
and the settings file that carries them to the user's training script.

The settings a run starts from: the user's own, so "current settings" means one thing.

In order, later wins: DataLoader's defaults (with batch_size 32 when the module says nothing),
the module's own names (``batch_size``, ``collate_fn``, ``sampler``, ``batch_sampler``,
``worker_init_fn``, built from the dataset where the module gives a factory), the module's
``dataloader_kwargs`` (the settings it trains with), then what the caller chose explicitly
(CLI flags, the dashboard's controls). The profile, the tune's baseline, every tune trial and the
recommended ``DataLoader(...)`` line all start from this one config, so settings the tool does not
tune (shuffle, sampler, drop_last, collate_fn, worker_init_fn, generator, ...) are kept.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

from dataloader_tuner.config import WORKER_ONLY, LoaderConfig, supports_in_order
from dataloader_tuner.errors import ConfigError
from dataloader_tuner.instrument.heap import KeepFreedMemory
from dataloader_tuner.instrument.threads import LimitThreads
if TYPE_CHECKING:  # settings files and recommendations are read without torch (the parent)
    from dataloader_tuner.analyse.results import TuneResult
    from dataloader_tuner.child.target import ResolvedTarget

DEFAULT_BATCH_SIZE = 32
KNOWN_KEYS = frozenset(f.name for f in dataclasses.fields(LoaderConfig))


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


# -- what a tune recommends ----------------------------------------------------------------

def tuned_values(recommended: dict) -> dict:
    """The settings a recommendation stands for: those it leaves out are DataLoader's defaults
    (worker-only ones unset without workers); ``batch_size`` only where it chose one."""
    workers = int(recommended["num_workers"])
    values = {
        "num_workers": workers,
        "pin_memory": bool(recommended.get("pin_memory", False)),
        "prefetch_factor": recommended.get("prefetch_factor") if workers else None,
        "persistent_workers": bool(recommended.get("persistent_workers", False)) if workers
        else False,
    }
    if "batch_size" in recommended:
        values["batch_size"] = recommended["batch_size"]
    if "in_order" in recommended:  # only where the tune chose it (tune/order.py)
        values["in_order"] = bool(recommended["in_order"]) or not workers
    # one thread per pool in each worker, where the tune measured it pays (tune/thread_pools.py)
    values["worker_threads"] = recommended.get("worker_threads") if workers else None
    # each worker keeps the memory it frees, where the tune measured it pays (tune/heap_check.py)
    values["keep_freed_memory"] = bool(recommended.get("keep_freed_memory")) and bool(workers)
    return values


def recommended_config(config: LoaderConfig, recommended: dict) -> LoaderConfig:
    """``config`` with the tuner's choices (tuned_values); the user's other settings kept."""
    return config.replace(**tuned_values(recommended))


def recommended_settings(base: dict, recommended: dict) -> dict:
    """The same for a settings dict (the dashboard's controls): ``base`` with the choices."""
    config = recommended_config(LoaderConfig.from_settings(base), recommended)
    return {**base, **{key: getattr(config, key) for key in {*base, *tuned_values(recommended)}}}


# -- the settings file (engine tune --out, the dashboard's download) ---------------------------

def settings_file(result: "TuneResult") -> dict:
    """What ``--out`` writes: the settings and their evidence. ``dataloader_tuner.load_settings``
    turns them into DataLoader's keyword arguments (``worker_threads`` is this tool's: a
    worker_init_fn)."""
    return {
        "dataloader_kwargs": result.recommended,
        "target": result.target,
        "expected_samples_per_s": result.expected_samples_per_s,
        "baseline": result.baseline,
        "reasons": list(result.reasons),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_with": "from dataloader_tuner import load_settings; DataLoader(ds, <your other settings: "
                     "shuffle, sampler, collate_fn, ...>, **load_settings(path, "
                     "worker_init_fn=<yours, if any>))",
        "snippet": result.snippet,
    }


def load_settings(path: str, worker_init_fn: Callable[[int], Any] | None = None) -> dict:
    """Read a settings file written by ``engine tune --out`` for ``DataLoader(ds, **settings)``.

    Only the DataLoader keyword arguments are returned; the file's other keys (measurements,
    provenance) are ignored. Where the file limits each worker's thread pools to one thread
    (``worker_threads: 1``) the settings carry ``worker_init_fn=LimitThreads(worker_init_fn)``,
    and where each worker keeps the memory it frees (``keep_freed_memory: true``)
    ``KeepFreedMemory(worker_init_fn)``: pass your own ``worker_init_fn`` here, not to
    DataLoader.
    """
    settings = read_settings(path)
    worker_init_fn = tools_worker_init(worker_init_fn, settings.pop("keep_freed_memory", False),
                                       settings.pop("worker_threads", None))
    if worker_init_fn is not None:
        settings["worker_init_fn"] = worker_init_fn
    return settings


def tools_worker_init(init_fn: Callable[[int], Any] | None, keep_freed_memory: bool,
                      worker_threads: int | None) -> Callable[[int], Any] | None:
    """The user's worker_init_fn inside this tool's own settings' (config.py's
    NOT_DATALOADER): KeepFreedMemory, then LimitThreads outermost, as the snippet writes them."""
    if keep_freed_memory:
        init_fn = KeepFreedMemory(init_fn)
    if worker_threads == 1:
        init_fn = LimitThreads(init_fn)
    return init_fn


def read_settings(path: str) -> dict:
    """The settings file's settings as written (JSON values, this tool's ``worker_threads``
    included), checked: what the CLI sends a run."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except OSError as exc:
        raise ConfigError(f"Cannot read the settings file {path}: {exc.strerror}.",
                          type="invalid_settings") from exc
    except ValueError as exc:
        raise ConfigError(f"{path} is not a settings file (not valid JSON: {exc}). Write one "
                          "with `python -m dataloader_tuner tune TARGET --out FILE`.",
                          type="invalid_settings") from exc
    settings = document.get("dataloader_kwargs", document) if isinstance(document, dict) else None
    if not isinstance(settings, dict):
        raise ConfigError(f"{path} holds no DataLoader settings (a JSON object expected).",
                          type="invalid_settings")
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(LoaderConfig)})
    if unknown:
        raise ConfigError(
            f"{path} has keys that are not DataLoader settings: {', '.join(unknown)}.",
            type="invalid_settings",
        )
    settings = dict(settings)
    installed = importlib.metadata.version("torch")
    if "in_order" in settings and not supports_in_order(installed):
        # A file tuned on a newer torch: DataLoader here would refuse the keyword.
        warnings.warn(f"{path}: in_order={settings.pop('in_order')} left out: torch {installed} "
                      "has no in_order (2.6 or later does); batches come in order.",
                      stacklevel=2)
    return settings
