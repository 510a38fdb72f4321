"""DataLoader settings a tune recommends, and the settings file that carries them to the
user's training script (``load_settings``). The settings a run starts from are the child's
(child/starting.py).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

from dataloader_tuner.config import LoaderConfig, supports_in_order
from dataloader_tuner.errors import ConfigError
from dataloader_tuner.instrument.heap import KeepFreedMemory
from dataloader_tuner.instrument.threads import LimitThreads
if TYPE_CHECKING:  # settings files and recommendations are read without torch (the parent)
    from dataloader_tuner.analyse.results import TuneResult

DEFAULT_BATCH_SIZE = 32
KNOWN_KEYS = frozenset(f.name for f in dataclasses.fields(LoaderConfig))


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
