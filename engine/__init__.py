"""DataLoader Tuner's engine: run a user's Dataset in a real DataLoader and measure it.

This is the public API: the dashboard, scripts and tests drive the engine through these names
only (tests/test_layout.py keeps ``__all__`` complete and the dashboard to it). No torch is
imported here: the parent side (starting runs, reading them, showing them) stays light, and
torch lives in the engine's child process.

The packages behind it (docs/development.md says more):
    engine/run/        the parent side of a run: start the child, fold its events, store them
    engine/child/      the engine's child process: the target, its dataset card, the measuring
    engine/instrument/ probes in the workers, resource samples, GPU and copy timing
    engine/record/     the batch row, the per-batch ledger, the recorder and its sinks, what
                       travels (wire, dataset card, trials)
    engine/tune/       every search for settings: offline, in place, a node's ranks together
    engine/analyse/    pure reading of measurements: metrics, diagnostics, results, traces
    engine/watcher/    watch(loader): a user's training job, measured in its own process
    engine/cli/        python -m dataloader_tuner, one module per command
and, shared by all: protocol (request and events), store, errors, system, config, settings,
access (the dashboard's token; files kept to their owner).
"""

from dataloader_tuner.access import (NO_TOKEN_ENV, TOKEN_ENV, TOKEN_QUERY, dashboard_url,
                                     new_token, tokens_match)
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.analyse.metrics import busy_timeline, epoch_starts
from dataloader_tuner.record.rows import BatchRecord, timed
from dataloader_tuner.analyse.ranks import (JobView, RankSummary, job_view, summary_from_batches,
                                  window_figures)
from dataloader_tuner.analyse.report import (counting_text, fmt, shm_check, speedup_text,
                                             startup_text)
from dataloader_tuner.analyse.results import ProfileResult, Result, TuneResult
from dataloader_tuner.analyse.trace import chrome_trace
from dataloader_tuner.config import LoaderConfig
from dataloader_tuner.errors import ConfigError, EngineError, RunError, TargetError
from dataloader_tuner.protocol import (DEFAULT_BUDGET_S, DEFAULT_MAX_WORKERS, DEFAULT_SECONDS,
                                       DEFAULT_TIMEOUT_S, RunRequest)
from dataloader_tuner.run.live import LiveRun
from dataloader_tuner.record.trials import InPlaceTrial, TrialRecord, TrialResult
from dataloader_tuner.record.cards import DatasetCard
from dataloader_tuner.run.runner import (Inspection, RunHandle, RunState, inspect_target,
                                         run_to_completion)
from dataloader_tuner.store import RunStore, StoredRun, default_db_path
from dataloader_tuner.run.verify import Verification, check_claim
from dataloader_tuner.instrument.heap import KeepFreedMemory
from dataloader_tuner.instrument.threads import LimitThreads
from dataloader_tuner.settings import (DEFAULT_BATCH_SIZE, load_settings, recommended_settings,
                                       settings_file)
from dataloader_tuner.system import SystemSnapshot


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
    # start and follow runs
    "RunRequest", "RunHandle", "RunState", "run_to_completion", "inspect_target", "Inspection",
    "LiveRun",
    "DEFAULT_SECONDS", "DEFAULT_TIMEOUT_S", "DEFAULT_BUDGET_S", "DEFAULT_MAX_WORKERS",
    "DEFAULT_BATCH_SIZE",
    "Verification", "check_claim",
    # the run history
    "RunStore", "StoredRun", "default_db_path",
    # settings
    "LoaderConfig", "LimitThreads", "KeepFreedMemory", "load_settings", "recommended_settings", "settings_file",
    # what runs produce
    "ProfileResult", "TuneResult", "Result", "Diagnostic", "SystemSnapshot", "BatchRecord", "timed",
    "DatasetCard", "TrialRecord", "TrialResult", "InPlaceTrial", "busy_timeline", "epoch_starts",
    "chrome_trace", "counting_text", "fmt", "shm_check", "speedup_text", "startup_text",
    # a torchrun job's ranks
    "RankSummary", "JobView", "job_view", "summary_from_batches", "window_figures",
    # the dashboard's token
    "TOKEN_ENV", "NO_TOKEN_ENV", "TOKEN_QUERY", "new_token", "tokens_match", "dashboard_url",
    # errors
    "EngineError", "ConfigError", "RunError", "TargetError",
]
