"""What the dashboard shows, gathered from the engine's parts: the one module besides the
public API (``dataloader_tuner``) that the dashboard imports (tests/test_layout.py keeps it
so), so a page never reaches into the packages below. Not for users' code: the names here
may change with the pages."""

from dataloader_tuner.analyse.batch_log import BatchLog, window_figures
from dataloader_tuner.access import (NO_TOKEN_ENV, TOKEN_ENV, TOKEN_QUERY, dashboard_url,
                                     new_token, tokens_match)
from dataloader_tuner.analyse.diagnostic import Diagnostic
from dataloader_tuner.analyse.metrics import LOOP_TIME, busy_timeline, epoch_starts
from dataloader_tuner.analyse.ranks import (JobView, RankSummary, job_view, spends_most_in,
                                            summary_from_batches)
from dataloader_tuner.analyse.shm import shm_check
from dataloader_tuner.analyse.speedscope import speedscope_document
from dataloader_tuner.analyse.text import (counting_text, fmt, sampled_basis, speedup_text,
                                           startup_text, windows_text)
from dataloader_tuner.analyse.chrome_trace import chrome_trace
from dataloader_tuner.protocol import (DEFAULT_BUDGET_S, DEFAULT_MAX_WORKERS, DEFAULT_SECONDS,
                                       DEFAULT_TIMEOUT_S)
from dataloader_tuner.record.rows import BatchRecord, timed
from dataloader_tuner.record.trials import InPlaceDecision, TrialRecord
from dataloader_tuner.record.windows import BatchWindow, latest_stretch
from dataloader_tuner.run.live import Followed, LiveRun
from dataloader_tuner.run.inspection import Inspection, inspect_target
from dataloader_tuner.run.runner import RunHandle
from dataloader_tuner.run.settle import settle_dead_runs
from dataloader_tuner.run.verify import Verification, check_claim
from dataloader_tuner.settings import DEFAULT_BATCH_SIZE
from dataloader_tuner.store.retention import MAX_GB_ENV as HISTORY_MAX_GB_ENV
from dataloader_tuner.store.retention import Limits as HistoryLimits
from dataloader_tuner.store.retention import overridden_by_env as history_limits_in_env
from dataloader_tuner.store.retention import save_limits as save_history_limits
from dataloader_tuner.store.retention import saved_limits as saved_history_limits
from dataloader_tuner.store.retention import size_text as history_size_text
from dataloader_tuner.system import SystemSnapshot

__all__ = [
    # the dashboard's token
    "TOKEN_ENV", "NO_TOKEN_ENV", "TOKEN_QUERY", "new_token", "tokens_match", "dashboard_url",
    # starting and following runs from the Live page
    "Inspection", "RunHandle", "inspect_target", "LiveRun", "Followed", "Verification",
    "check_claim", "settle_dead_runs", "HistoryLimits", "history_size_text", "HISTORY_MAX_GB_ENV",
    "save_history_limits", "saved_history_limits", "history_limits_in_env",
    "DEFAULT_SECONDS", "DEFAULT_TIMEOUT_S", "DEFAULT_BUDGET_S", "DEFAULT_MAX_WORKERS",
    "DEFAULT_BATCH_SIZE",
    # what a run's pages show
    "BatchRecord", "timed", "Diagnostic", "SystemSnapshot", "TrialRecord", "InPlaceDecision",
    "busy_timeline", "epoch_starts", "LOOP_TIME", "chrome_trace", "counting_text", "fmt", "shm_check",
    "speedup_text", "startup_text", "speedscope_document", "sampled_basis",
    # fast batches kept in windows (record/windows.py)
    "BatchLog", "BatchWindow", "windows_text", "latest_stretch",
    # a torchrun job's ranks
    "RankSummary", "JobView", "job_view", "summary_from_batches", "window_figures",
    "spends_most_in",
]
