"""LoaderConfig: the DataLoader settings a user chooses, frozen and validated up front.

Validation mirrors the exclusivity rules DataLoader enforces in its constructor, but runs before
any worker starts and says how to fix the problem instead of only what is wrong.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from dataloader_tuner.errors import ConfigError

# Settings the tuner searches and that a settings file carries (JSON-serialisable values).
TUNABLE_KEYS = ("batch_size", "num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


def warmup_batches(num_workers: int, prefetch_factor: int) -> int:
    """Batches to skip before the steady-state clock starts.

    When the consumer first calls ``next()``, every worker is already producing: up to
    ``num_workers * prefetch_factor`` batches arrive back to back and would inflate the rate.
    Without workers only the first batch (imports, caches, lazy opens) is skipped.
    """
    return max(1, num_workers * prefetch_factor)


# Settings DataLoader takes only with worker processes, and their defaults.
WORKER_ONLY = {"prefetch_factor": None, "persistent_workers": False,
               "multiprocessing_context": None, "timeout": 0, "worker_threads": None,
               "keep_freed_memory": False}
# Settings of this tool's, not DataLoader keyword arguments: rendered into ones (snippet).
NOT_DATALOADER = ("worker_threads", "keep_freed_memory")


@dataclass(frozen=True)
class LoaderConfig:
    """What a user passes to ``DataLoader(dataset, ...)``.

    ``None`` for ``prefetch_factor`` means DataLoader's default (2 with workers). Object-valued
    settings (sampler, collate_fn, ...) are kept as objects; they are rendered by name in the
    code line and left out of JSON.
    """

    batch_size: int | None = 1
    shuffle: bool = False
    sampler: Any = None
    batch_sampler: Any = None
    num_workers: int = 0
    collate_fn: Callable | None = None
    pin_memory: bool = False
    drop_last: bool = False
    timeout: float = 0
    worker_init_fn: Callable | None = None
    multiprocessing_context: Any = None
    prefetch_factor: int | None = None
    persistent_workers: bool = False
    generator: Any = None
    in_order: bool = True
    # None: each library's thread pools as they start in a worker; 1: each limited to one
    # thread, by a worker_init_fn (instrument/threads.py's LimitThreads, around the user's own)
    worker_threads: int | None = None
    # True: each worker keeps the memory it frees for its next batch, by a worker_init_fn
    # (instrument/heap.py's KeepFreedMemory, around the user's own)
    keep_freed_memory: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(
                f"num_workers must be an integer >= 0, got {self.num_workers!r}. "
                "Use 0 to load in the main process.",
                type="invalid_settings",
            )
        if self.batch_size is not None and (
            not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise ConfigError(
                f"batch_size must be a positive integer or None, got {self.batch_size!r}.",
                type="invalid_settings",
            )
        if self.timeout < 0:
            raise ConfigError(
                f"timeout must be >= 0 seconds, got {self.timeout!r}.", type="invalid_settings"
            )
        if self.sampler is not None and self.shuffle:
            raise ConfigError(
                "sampler and shuffle=True cannot be used together: the sampler already decides "
                "the order. Drop shuffle=True, or drop the sampler and keep shuffle=True.",
                type="invalid_settings",
            )
        if self.batch_sampler is not None and (
            self.batch_size != 1 or self.shuffle or self.sampler is not None or self.drop_last
        ):
            raise ConfigError(
                "batch_sampler cannot be combined with batch_size, shuffle, sampler or drop_last: "
                "the batch sampler makes the batches. Leave those at their defaults "
                "(batch_size=1, shuffle=False, sampler=None, drop_last=False).",
                type="invalid_settings",
            )
        if self.num_workers == 0 and self.prefetch_factor is not None:
            raise ConfigError(
                "prefetch_factor only applies with worker processes (num_workers > 0). "
                "Set num_workers >= 1 or leave prefetch_factor unset.",
                type="invalid_settings",
            )
        if self.prefetch_factor is not None and (
            not isinstance(self.prefetch_factor, int) or self.prefetch_factor < 1
        ):
            raise ConfigError(
                f"prefetch_factor must be an integer >= 1, got {self.prefetch_factor!r}.",
                type="invalid_settings",
            )
        if self.num_workers == 0 and self.multiprocessing_context is not None:
            raise ConfigError(
                "multiprocessing_context only applies with worker processes (num_workers > 0): "
                "DataLoader refuses it without. Set num_workers >= 1 or leave it unset.",
                type="invalid_settings",
            )
        if self.num_workers == 0 and self.timeout:
            raise ConfigError(
                "timeout only applies with worker processes (num_workers > 0): DataLoader "
                "refuses it without. Set num_workers >= 1 or timeout=0.",
                type="invalid_settings",
            )
        if self.worker_threads not in (None, 1):
            raise ConfigError(
                f"worker_threads must be 1 (each worker's thread pools limited to one thread) "
                f"or None (left as the libraries start them), got {self.worker_threads!r}.",
                type="invalid_settings")
        if self.num_workers == 0 and self.worker_threads is not None:
            raise ConfigError(
                "worker_threads only applies with worker processes (num_workers > 0). "
                "Set num_workers >= 1 or leave worker_threads unset.", type="invalid_settings")
        if self.num_workers == 0 and self.keep_freed_memory:
            raise ConfigError(
                "keep_freed_memory only applies with worker processes (num_workers > 0). "
                "Set num_workers >= 1 or keep_freed_memory=False.", type="invalid_settings")
        if self.num_workers == 0 and self.persistent_workers:
            raise ConfigError(
                "persistent_workers=True needs worker processes (num_workers > 0). "
                "Set num_workers >= 1 or persistent_workers=False.",
                type="invalid_settings",
            )

    @property
    def tuned_key(self) -> tuple:
        """The settings the tuner varies, in ``TrialResult.key``'s order."""
        return (self.num_workers, self.prefetch_factor, self.persistent_workers, self.pin_memory)

    @property
    def warmup_batches(self) -> int:
        """Batches to skip before the steady-state clock starts (``warmup_batches``)."""
        return warmup_batches(self.num_workers, self.effective_prefetch_factor)

    @property
    def effective_prefetch_factor(self) -> int:
        """Batches each worker keeps in flight (0 without workers)."""
        if self.num_workers == 0:
            return 0
        return self.prefetch_factor if self.prefetch_factor is not None else 2

    def replace(self, **changes: Any) -> "LoaderConfig":
        """A copy with ``changes``; dropping workers also drops worker-only settings."""
        if changes.get("num_workers") == 0:
            for key, default in WORKER_ONLY.items():
                changes.setdefault(key, default)
        return dataclasses.replace(self, **changes)

    def to_kwargs(self, torch_version: str | None = None) -> dict:
        """Keyword arguments for ``DataLoader``: only settings that differ from its defaults.

        ``in_order`` exists from torch 2.6 on; it is left out for older versions.
        """
        defaults = LoaderConfig()
        kwargs = {}
        for field in dataclasses.fields(self):
            if field.name in NOT_DATALOADER:
                continue
            value = getattr(self, field.name)
            if value != getattr(defaults, field.name) or field.name in ("batch_size", "num_workers"):
                kwargs[field.name] = value
        if kwargs.get("batch_sampler") is not None:
            kwargs.pop("batch_size", None)  # DataLoader wants batch_size left at its default
        if torch_version is not None and not supports_in_order(torch_version):
            kwargs.pop("in_order", None)
        return kwargs

    def to_json_dict(self) -> dict:
        """The JSON-safe kwargs; objects (sampler, functions) are described by name."""
        out = {}
        for key, value in self.to_kwargs().items():
            out[key] = value if _is_json_scalar(value) else describe_object(value)
        if self.worker_threads is not None:
            out["worker_threads"] = self.worker_threads
        if self.keep_freed_memory:
            out["keep_freed_memory"] = True
        return out

    def snippet(self, dataset_name: str = "dataset", expressions: dict | None = None) -> str:
        """The ``DataLoader(...)`` line a user can paste into their training script.

        ``expressions`` names objects as the user's code makes them (``sampler`` ->
        ``"make_sampler(dataset)"``); other objects are named by their class or function."""
        expressions = expressions or {}
        rendered: dict[str, str] = {}
        for key, value in self.to_kwargs().items():
            if key in expressions and not _is_json_scalar(value):
                rendered[key] = expressions[key]
            else:
                rendered[key] = repr(value) if _is_json_scalar(value) else describe_object(value)
        # the user's own worker_init_fn runs inside these
        if self.keep_freed_memory:
            own = rendered.pop("worker_init_fn", "")
            rendered["worker_init_fn"] = f"dataloader_tuner.KeepFreedMemory({own})"
        if self.worker_threads == 1:
            own = rendered.pop("worker_init_fn", "")
            rendered["worker_init_fn"] = f"dataloader_tuner.LimitThreads({own})"
        parts = [dataset_name, *(f"{key}={text}" for key, text in rendered.items())]
        return f"DataLoader({', '.join(parts)})"

    @classmethod
    def from_settings(cls, settings: dict, base: "LoaderConfig | None" = None) -> "LoaderConfig":
        """Apply a settings dict (from a settings file or the tuner) over ``base``."""
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ConfigError(
                f"Unknown DataLoader setting(s): {', '.join(unknown)}. "
                f"Known: {', '.join(f.name for f in dataclasses.fields(cls))}.",
                type="invalid_settings",
            )
        return dataclasses.replace(base or cls(), **settings)


def describe_object(value: Any) -> str:
    """A readable name for a sampler, function or context in a code line or JSON document."""
    if isinstance(value, str):
        return repr(value)
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    if not callable(value) or isinstance(value, type):
        return f"{name}(...)" if not hasattr(value, "__qualname__") else name
    return name


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def supports_in_order(torch_version: str) -> bool:
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 6)


@dataclass(frozen=True)
class TunedSettings:
    """The settings a tune decides, one value wherever they cross parts: each step of the
    in-place search and a node's plans (tune/in_place.py, tune/node.py), the settings the
    companions of a trial run (child/companions.py), a chosen setting made a settings file.
    The rest of a LoaderConfig stays the user's. (At the JSON edges, a recommendation's and a
    run request's settings are DataLoader keyword documents, where a key left out and a key
    set to None differ: ``prefetch_factor=None`` must be said with 0 workers.)"""

    num_workers: int
    prefetch_factor: int | None = None  # None: DataLoader's default (2) with workers
    persistent_workers: bool = False
    pin_memory: bool = False
    in_order: bool = True
    worker_threads: int | None = None  # 1: each worker's pools limited to one thread
    keep_freed_memory: bool = False

    @classmethod
    def of(cls, config: LoaderConfig) -> "TunedSettings":
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    def applied_to(self, config: LoaderConfig) -> LoaderConfig:
        """``config`` with these settings."""
        return config.replace(**dataclasses.asdict(self))

    @property
    def warmup_batches(self) -> int:
        """Batches that come back to back from the prefetch after a switch: not timed."""
        return warmup_batches(self.num_workers, self.prefetch_factor or 2)

    def workers_and_prefetch(self) -> dict[str, Any]:
        """What the in-place search changes, as its documents write it (the job's other
        settings stay its own there)."""
        return {"num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor}
