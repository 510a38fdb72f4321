"""DataLoader Tuner's engine: run a user's Dataset in a real DataLoader and measure it.

No Streamlit here: the dashboard, the CLI and tests all drive the engine through this API.
"""

from .config import LoaderConfig
from .settings import load_settings
from .errors import ConfigError, EngineError, RunError, TargetError
from .runner import RunHandle, RunRequest, RunState, run_to_completion
from .store import RunStore, default_db_path

__all__ = [
    "ConfigError",
    "EngineError",
    "LoaderConfig",
    "RunError",
    "RunHandle",
    "RunRequest",
    "RunState",
    "RunStore",
    "TargetError",
    "default_db_path",
    "load_settings",
    "run_to_completion",
]
