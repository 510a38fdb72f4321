"""DataLoader Tuner: measure and tune a PyTorch DataLoader, in your training job or on its own.

The public API, what users' code calls (``__all__``): ``watch(loader)`` and
``watch_trainer(trainer)`` in a training job; the recommended settings in your own DataLoader
(``load_settings``, ``LimitThreads``, ``KeepFreedMemory``); a profile or tune from code
(``RunRequest``, ``run_to_completion``) and the run history (``RunStore``). The dashboard's
pages import these and ``dataloader_tuner.ui``, nothing else (tests/test_layout.py). No torch
is imported here: the parent side stays light, and torch lives in the engine's child process.

The packages behind it, bottom to top: docs/development.md, "Layers".
"""

from dataloader_tuner.analyse.results import ProfileResult, Result, TuneResult
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import ConfigError, EngineError, RunError, TargetError
from dataloader_tuner.instrument.heap import KeepFreedMemory
from dataloader_tuner.instrument.threads import LimitThreads
from dataloader_tuner.protocol import RunRequest
from dataloader_tuner.run.runner import run_to_completion
from dataloader_tuner.settings import load_settings, recommended_settings, settings_file
from dataloader_tuner.store import RunStore, StoredRun, default_db_path

def watch(loader, name: str | None = None, db: str | None = None, tune: bool = False,
          max_workers: int | None = None, settings_out: str | None = None):
    """Measure a training job's own DataLoader as it trains: ``loader = watch(loader)``;
    ``tune=True`` also tunes it in place. See engine/watcher/loader.py. (Imported here on
    first use: it needs torch.)"""
    from dataloader_tuner.watcher.loader import watch as watch_loader

    return watch_loader(loader, name, db, tune, max_workers, settings_out)


def watch_trainer(trainer, tune: bool = False, db: str | None = None,
                  max_workers: int | None = None):
    """Measure the loaders a Hugging Face Trainer builds: ``watch_trainer(trainer)`` before
    ``trainer.train()``. See engine/watcher/trainers.py."""
    from dataloader_tuner.watcher.trainers import watch_trainer as watch_hf_trainer

    return watch_hf_trainer(trainer, tune, db, max_workers)


__all__ = [
    # watch a training job
    "watch", "watch_trainer",
    # the settings a tune recommends, in your own DataLoader
    "load_settings", "recommended_settings", "settings_file", "LimitThreads", "KeepFreedMemory",
    "LoaderConfig",
    # a profile or tune from code, and what it returns
    "RunRequest", "run_to_completion", "ProfileResult", "TuneResult", "Result",
    # the run history
    "RunStore", "StoredRun", "default_db_path",
    # errors
    "EngineError", "ConfigError", "RunError", "TargetError",
]
