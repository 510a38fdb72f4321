"""Turn a target string into the user's Dataset and the module's optional extras.

A target is ``path/to/file.py[:attr]`` or ``pkg.module[:attr]`` (uvicorn style). ``attr`` may be
a Dataset instance, a Dataset subclass constructible with no arguments, or a zero-argument
callable returning a Dataset. Without ``attr`` we try, in order, ``make_dataset``,
``get_dataset``, ``dataset``, then the single Dataset subclass the module defines.

Importing the module runs the user's code, so this runs in the engine's child process, never in
the dashboard's server process.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from torch.utils.data import Dataset, IterableDataset

from .errors import TargetError

DEFAULT_NAMES = ("make_dataset", "get_dataset", "dataset")
EXTRA_NAMES = ("batch_size", "collate_fn", "sampler", "train_step", "dataloader_kwargs",
               "worker_init_fn")


@dataclass
class ResolvedTarget:
    """The user's dataset plus the module-level extras the engine uses when present."""

    target: str
    dataset: Dataset
    found_as: str  # how the dataset was found, for the user ("make_dataset()", ...)
    batch_size: int | None = None
    collate_fn: Callable | None = None
    sampler: Any = None
    train_step: Callable | None = None
    dataloader_kwargs: dict | None = None  # the settings the user trains with today
    worker_init_fn: Callable | None = None

    @property
    def is_iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)


def split_target(target: str) -> tuple[str, str | None]:
    """``'a/b.py:make'`` -> ``('a/b.py', 'make')``; a Windows drive colon is not a separator."""
    target = target.strip()
    if not target:
        raise TargetError(
            "No dataset target given. Pass path/to/data.py[:attr] or pkg.module[:attr].",
            type="target_empty",
        )
    head, sep, tail = target.rpartition(":")
    if sep and tail and "/" not in tail and "\\" not in tail and len(head) > 1:
        return head, tail
    return target, None


def load_module(spec: str) -> ModuleType:
    """Import a file path or a dotted module name, turning every failure into a headline."""
    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        return _load_file(spec)
    return _import_dotted(spec)


def _load_file(path: str) -> ModuleType:
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise TargetError(
            f"Dataset file not found: {path}. Check the path (it is relative to "
            f"{os.getcwd()}).",
            type="target_not_found",
        )
    # Registered under its own name (as `python file.py` would import a sibling) so that
    # spawn-started workers can re-import it to unpickle the dataset; prefixed on a clash.
    name = os.path.splitext(os.path.basename(path))[0]
    if name in sys.modules or not name.isidentifier():
        name = "_dltuner_user_" + "".join(c if c.isalnum() else "_" for c in name)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    # The file's own folder goes on sys.path so its sibling imports work as in a script, and
    # the module is registered so worker processes can unpickle classes defined in it.
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, even SystemExit
        sys.modules.pop(name, None)
        raise _import_failure(exc, path) from exc
    return module


def _import_dotted(name: str) -> ModuleType:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise TargetError(
                f"Module not found: {name}. Pass a file path (path/to/data.py) or a module "
                f"importable from {os.getcwd()}.",
                details=traceback.format_exc(),
                type="target_not_found",
            ) from exc
        raise _import_failure(exc, name) from exc
    except BaseException as exc:  # noqa: BLE001
        raise _import_failure(exc, name) from exc


def _import_failure(exc: BaseException, where: str) -> TargetError:
    details = "".join(traceback.format_exception(exc))
    if isinstance(exc, SyntaxError):
        return TargetError(
            f"Syntax error in {exc.filename} line {exc.lineno}: {exc.msg}. Fix the file and "
            "try again.",
            details=details,
            type="target_syntax_error",
        )
    if isinstance(exc, ModuleNotFoundError):
        return TargetError(
            f"Importing {where} failed: it imports '{exc.name}', which is not installed. "
            f"Install it (pip install {exc.name}) in the environment running the tuner.",
            details=details,
            type="target_import_error",
        )
    return TargetError(
        f"Importing {where} raised {type(exc).__name__}: {exc}",
        details=details,
        type="target_import_error",
    )


def resolve(target: str) -> ResolvedTarget:
    """Import the target's module and build the Dataset it names."""
    module_spec, attr = split_target(target)
    module = load_module(module_spec)
    if attr is not None:
        if not hasattr(module, attr):
            raise TargetError(
                f"{module_spec} has no attribute '{attr}'. "
                f"Available names: {', '.join(_public_names(module)) or '(none)'}.",
                type="target_attr_missing",
            )
        dataset, found_as = _build(getattr(module, attr), attr), attr
    else:
        dataset, found_as = _find_default(module, module_spec)
    return ResolvedTarget(
        target=target,
        dataset=dataset,
        found_as=found_as,
        **{name: getattr(module, name, None) for name in EXTRA_NAMES},
    )


def _find_default(module: ModuleType, where: str) -> tuple[Dataset, str]:
    for name in DEFAULT_NAMES:
        if hasattr(module, name):
            return _build(getattr(module, name), name), name
    classes = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, Dataset)
        and obj.__module__ == module.__name__
    ]
    if len(classes) == 1:
        return _build(classes[0], classes[0].__name__), classes[0].__name__
    tried = ", ".join(DEFAULT_NAMES)
    if not classes:
        raise TargetError(
            f"Nothing dataset-like found in {where}: tried {tried}, then a Dataset subclass "
            "defined in the module. Name one explicitly: "
            f"{where}:your_factory_or_class.",
            type="target_no_dataset",
        )
    names = ", ".join(sorted(cls.__name__ for cls in classes))
    raise TargetError(
        f"{where} defines several Dataset classes ({names}) and none of {tried}. "
        f"Pick one: {where}:{sorted(cls.__name__ for cls in classes)[0]}.",
        type="target_ambiguous",
    )


def _build(obj: Any, name: str) -> Dataset:
    """An instance is used as is; a class or a factory is called with no arguments."""
    if isinstance(obj, Dataset):
        return obj
    if not callable(obj):
        raise TargetError(
            f"'{name}' is a {type(obj).__name__}, not a Dataset, a Dataset class or a "
            "function returning one.",
            type="target_not_dataset",
        )
    try:
        result = obj()
    except TypeError as exc:
        if _needs_arguments(obj):
            raise TargetError(
                f"'{name}' needs arguments ({exc}). Point at a zero-argument factory, e.g. "
                f"def make_dataset(): return {name}(...).",
                details=traceback.format_exc(),
                type="target_factory_error",
            ) from exc
        raise _factory_failure(exc, name) from exc
    except BaseException as exc:  # noqa: BLE001
        raise _factory_failure(exc, name) from exc
    if not isinstance(result, Dataset):
        raise TargetError(
            f"'{name}()' returned a {type(result).__name__}, not a torch Dataset. Return a "
            "torch.utils.data.Dataset or IterableDataset.",
            type="target_not_dataset",
        )
    return result


def _needs_arguments(obj: Any) -> bool:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return False
    return any(
        p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        for p in signature.parameters.values()
    )


def _factory_failure(exc: BaseException, name: str) -> TargetError:
    return TargetError(
        f"Building the dataset with '{name}' raised {type(exc).__name__}: {exc}",
        details="".join(traceback.format_exception(exc)),
        type="target_factory_error",
    )


def _public_names(module: ModuleType) -> list[str]:
    return sorted(n for n in vars(module) if not n.startswith("_"))[:20]
