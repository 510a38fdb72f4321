"""Turn a target string into the user's Dataset and the module's optional extras.

A target is ``path/to/file.py[:attr]`` or ``pkg.module[:attr]`` (uvicorn style). ``attr`` may be
a dataset, a class constructible with no arguments, a zero-argument callable returning a dataset,
or a call with literal arguments, ``data.py:make_dataset(root="/data", split="train")`` (parsed
with ``ast.literal_eval``, never evaluated). Without ``attr`` we try, in order, ``make_dataset``,
``get_dataset``, ``dataset``, then the single Dataset subclass the module defines.

"Dataset" means what DataLoader accepts, duck-typed as DataLoader itself does: an
``IterableDataset`` subclass is iterable-style; anything else with ``__getitem__`` and
``__len__`` (a torch Dataset, an Arrow-backed table, a list) is map-style.

Importing the module runs the user's code, so this runs in the engine's child process, never in
the dashboard's server process.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from torch.utils.data import Dataset, IterableDataset

from dataloader_tuner.errors import TargetError
from dataloader_tuner.record.cards import type_name

DEFAULT_NAMES = ("make_dataset", "get_dataset", "dataset")
EXTRA_NAMES = ("collate_fn", "sampler", "batch_sampler", "train_step", "dataloader_kwargs",
               "worker_init_fn")
# Module-level factories for settings that need the dataset: called with it after it is built.
DATASET_FACTORIES = {"sampler": "make_sampler", "batch_sampler": "make_batch_sampler",
                     "collate_fn": "make_collate_fn"}
UNSET = object()  # the module does not define batch_size (None is a real value: self-batching)


@dataclass
class ResolvedTarget:
    """The user's dataset plus the module-level extras the engine uses when present."""

    target: str
    dataset: Any  # a torch Dataset or anything DataLoader accepts as one (see above)
    found_as: str  # how the dataset was found, for the user ("make_dataset()", ...)
    batch_size: Any = UNSET  # int, None (the dataset yields whole batches) or UNSET
    collate_fn: Callable | None = None
    sampler: Any = None
    batch_sampler: Any = None
    train_step: Callable | None = None
    dataloader_kwargs: dict | None = None  # the settings the user trains with today
    worker_init_fn: Callable | None = None
    # How the snippet should name objects that came from the module ("make_sampler(dataset)").
    expressions: dict = field(default_factory=dict)

    @property
    def is_iterable(self) -> bool:
        return isinstance(self.dataset, IterableDataset)

    @property
    def defines_batch_size(self) -> bool:
        return self.batch_size is not UNSET


_CALL = re.compile(r"^(?P<module>.+?):(?P<attr>[A-Za-z_]\w*)\s*\((?P<args>.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class Call:
    """Literal arguments for the target's factory: ``make_dataset(root="/data", split=2)``."""

    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs

    def render(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs]
        return f"({', '.join(parts)})"


def split_target(target: str) -> tuple[str, str | None]:
    """``'a/b.py:make'`` -> ``('a/b.py', 'make')``; a Windows drive colon is not a separator.
    A call's arguments stay on the attribute: ``'a.py:make(x=1)'`` -> ``('a.py', 'make(x=1)')``."""
    target = target.strip()
    if not target:
        raise TargetError(
            "No dataset target given. Pass path/to/data.py[:attr] or pkg.module[:attr].",
            type="target_empty",
        )
    call = _CALL.match(target)
    if call:
        return call["module"], f"{call['attr']}({call['args']})"
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
    if module_spec is None or module_spec.loader is None:  # not a file Python can import
        raise TargetError(
            f"{path} is not a Python module: point at a .py file that defines your Dataset.",
            type="target_not_found")
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


def parse_call(attr: str) -> tuple[str, Call | None]:
    """``'make(root="/d", n=2)'`` -> ``('make', Call(...))``; literals only, never evaluated."""
    name, paren, rest = attr.partition("(")
    if not paren:
        return attr, None
    name = name.strip()
    try:
        node = ast.parse(f"f({rest}", mode="eval").body
    except SyntaxError as exc:
        raise _bad_arguments(attr, name, f"not valid Python call syntax ({exc.msg})") from exc
    if not isinstance(node, ast.Call) or any(k.arg is None for k in node.keywords):
        raise _bad_arguments(attr, name, "only plain and name=value arguments are allowed")
    try:
        args = tuple(ast.literal_eval(a) for a in node.args)
        kwargs = tuple((k.arg, ast.literal_eval(k.value)) for k in node.keywords)
    except (ValueError, TypeError) as exc:  # TypeError: {[1]: 2}, an unhashable key
        culprit = next((ast.unparse(v) for v in [*node.args, *(k.value for k in node.keywords)]
                        if not _is_literal(v)), rest.rstrip(")"))
        raise _bad_arguments(attr, name, f"{culprit} is not a literal") from exc
    return name, Call(args, kwargs)


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError):
        return False


def _bad_arguments(attr: str, name: str, why: str) -> TargetError:
    return TargetError(
        f"Cannot read the arguments in '{attr}': {why}. Only literals are allowed (strings, "
        f"numbers, True/False/None, lists, dicts), e.g. {name}(root=\"/data\", split=\"train\").",
        type="target_bad_arguments",
    )


def resolve(target: str) -> ResolvedTarget:
    """Import the target's module and build the Dataset it names, then the module's extras
    (a ``make_sampler(dataset)``-style factory is called with the dataset)."""
    module_spec, attr = split_target(target)
    module = load_module(module_spec)
    if attr is not None:
        name, call = parse_call(attr)
        if not hasattr(module, name):
            raise TargetError(
                f"{module_spec} has no attribute '{name}'. "
                f"Available names: {', '.join(_public_names(module)) or '(none)'}.",
                type="target_attr_missing",
            )
        dataset, found_as = _build(getattr(module, name), name, call), attr
    else:
        dataset, found_as = _find_default(module, module_spec)
    extras = {name: getattr(module, name, None) for name in EXTRA_NAMES}
    expressions = {name: name for name in ("collate_fn", "sampler", "batch_sampler",
                                           "worker_init_fn") if extras[name] is not None}
    for key, factory in DATASET_FACTORIES.items():
        if key != "collate_fn" and isinstance(dataset, IterableDataset):
            continue  # DataLoader takes no sampler with an iterable (settings.py says so)
        made = _from_factory(module, key, factory, dataset)
        if made is not None:
            extras[key], expressions[key] = made
    return ResolvedTarget(target=target, dataset=dataset, found_as=found_as,
                          batch_size=getattr(module, "batch_size", UNSET),
                          expressions=expressions, **extras)


def _from_factory(module: ModuleType, key: str, factory: str, dataset: Any
                  ) -> tuple[Any, str] | None:
    """A sampler (or batch sampler, or collate function) built from the dataset: the module's
    ``make_sampler(dataset)``, or a ``sampler`` that is a function of the dataset rather than a
    sampler itself."""
    func, name = getattr(module, factory, None), factory
    value = getattr(module, key, None)
    if func is None and key != "collate_fn" and _is_dataset_function(value):
        func, name = value, key
    if func is None:
        return None
    try:
        return func(dataset), f"{name}(dataset)"
    except Exception as exc:  # noqa: BLE001 - the user's factory
        raise TargetError(
            f"{name}(dataset) raised {type(exc).__name__}: {exc}",
            details="".join(traceback.format_exception(exc)),
            type="target_factory_error",
        ) from exc


def _is_dataset_function(value: Any) -> bool:
    """A plain function or class to call with the dataset, not a sampler instance."""
    return callable(value) and not hasattr(value, "__iter__") and (
        inspect.isfunction(value) or inspect.isclass(value))


def _find_default(module: ModuleType, where: str) -> tuple[Any, str]:
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


def dataset_problem(obj: Any) -> str | None:
    """Why DataLoader would refuse ``obj`` as a dataset, or None when it accepts it.

    DataLoader's own rule: an ``IterableDataset`` subclass is iterable-style, everything else is
    map-style and is indexed by a sampler, which needs ``__getitem__`` and ``__len__``.
    """
    if isinstance(obj, IterableDataset) or isinstance(obj, Dataset):
        return None
    if isinstance(obj, type):
        return "is a class, not an instance"
    has_items, has_len = hasattr(obj, "__getitem__"), hasattr(obj, "__len__")
    if has_items and has_len:
        return None
    if hasattr(obj, "__iter__") or hasattr(obj, "__next__"):
        return ("is iterable but not a torch IterableDataset; DataLoader treats such objects as "
                "map-style and indexes them, which needs __getitem__ and __len__. Wrap it: "
                "class Stream(IterableDataset): def __iter__(self): return iter(source)")
    missing = " and ".join(n for n, ok in (("__getitem__", has_items), ("__len__", has_len))
                           if not ok)
    return f"has no {missing}, which DataLoader needs to index a map-style dataset"


def _build(obj: Any, name: str, call: Call | None = None) -> Any:
    """A dataset is used as is; a class or a factory is called (with the target's literal
    arguments, if any)."""
    if call is None and not isinstance(obj, type) and dataset_problem(obj) is None:
        return obj
    if not callable(obj):
        problem = dataset_problem(obj)
        raise TargetError(
            f"'{name}' is a {type_name(obj)}, which cannot be used as a dataset: it "
            f"{problem}." if problem else
            f"'{name}' is a {type_name(obj)}, not a function or class, so it takes no "
            f"arguments: point at {name} without them, or at a factory.",
            type="target_not_dataset",
        )
    args, kwargs = (call.args, dict(call.kwargs)) if call else ((), {})
    shown = f"{name}{call.render()}" if call else f"{name}()"
    try:
        result = obj(*args, **kwargs)
    except TypeError as exc:
        if call is None and _needs_arguments(obj):
            raise TargetError(
                f"'{name}' needs arguments ({exc}). Pass them in the target, e.g. "
                f"data.py:{name}(root=\"/data\"), or point at a zero-argument factory.",
                details=traceback.format_exc(),
                type="target_factory_error",
            ) from exc
        raise _factory_failure(exc, shown) from exc
    except BaseException as exc:  # noqa: BLE001
        raise _factory_failure(exc, shown) from exc
    problem = dataset_problem(result)
    if problem is not None:
        raise TargetError(
            f"'{shown}' returned a {type_name(result)}, which DataLoader cannot load: it "
            f"{problem}.",
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


def _factory_failure(exc: BaseException, shown: str) -> TargetError:
    return TargetError(
        f"Building the dataset with '{shown}' raised {type(exc).__name__}: {exc}",
        details="".join(traceback.format_exception(exc)),
        type="target_factory_error",
    )


def _public_names(module: ModuleType) -> list[str]:
    return sorted(n for n in vars(module) if not n.startswith("_"))[:20]
