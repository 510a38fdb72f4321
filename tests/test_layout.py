"""The package's shape: its parts import only the layers below theirs (docs/development.md,
"Layers"), the public API (engine/__init__.py) is complete, the dashboard uses only it and
dataloader_tuner.ui, the engine never imports the dashboard, no module imports another
through a cycle, and nothing imports the folders by their repository names."""

import ast
import re
import os
import tomllib

import dataloader_tuner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "dataloader_tuner"
FOLDERS = {"engine": PACKAGE, "dashboard": f"{PACKAGE}.dashboard"}


def test_all_lists_every_public_name_and_each_exists():
    public = {name for name, value in vars(dataloader_tuner).items()
              if not name.startswith("_") and not isinstance(value, type(dataloader_tuner))}
    assert public == set(dataloader_tuner.__all__), (public ^ set(dataloader_tuner.__all__))
    assert len(dataloader_tuner.__all__) == len(set(dataloader_tuner.__all__))  # none listed twice


def package_modules() -> dict[str, str]:
    """Every module of the package, by its dotted name, with its file."""
    found = {}
    for folder, package in FOLDERS.items():
        for directory, _, names in os.walk(os.path.join(ROOT, folder)):
            relative = os.path.relpath(directory, os.path.join(ROOT, folder))
            prefix = package if relative == "." else f"{package}.{relative.replace(os.sep, '.')}"
            for name in names:
                if name.endswith(".py"):
                    module = prefix if name == "__init__.py" else f"{prefix}.{name[:-3]}"
                    found[module] = os.path.join(directory, name)
    return found


def imports_of(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The package modules a module imports, at its top or inside functions (both can cycle:
    a deferred import hides a cycle rather than removing it)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:  # `from pkg import module` imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    modules = package_modules()
    return {module: imports_of(module, path, modules) for module, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), ignoring edges into a
    package's own __init__ (the public API re-exports its modules by design)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def edges(module: str) -> set[str]:
        return {target for target in graph[module] if target != PACKAGE}

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in edges(module):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_another_through_a_cycle():
    graph = import_graph()
    assert graph[f"{PACKAGE}.run.runner"]  # the scan does see imports
    assert cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, PACKAGE: set()}
    assert cycles(graph) == [["a", "b", "c"]]


# The package's parts, bottom to top (docs/development.md, "Layers"): a part imports only the
# parts of the layers below its own, at module level, inside functions or for type checking.
LAYERS = [
    {"errors", "access", "bulk_sql"},  # plain facts: errors, private files, SQLite in bulk
    {"config", "system"},  # a loader's settings; the machine
    {"record"},  # the per-batch rows and trial values, and how they cross a pipe
    {"protocol"},  # what the parent and the engine's child say to each other
    {"instrument"},  # probes inside the user's loader: timing, CPU, memory, GPU, stalls
    {"analyse"},  # figures from rows: metrics, diagnostics, results, ranks, traces
    {"settings", "store"},  # settings files; the run history (SQLite)
    {"tune"},  # the search's decisions, without a loader: plan, cost model, claim, picks
    {"run"},  # a run made and kept: recorder, sinks, the parent's view, the runner
    # the engine's child process (the target, the measuring loop, trials) and a user's training
    # job, watched and tuned in place: side by side, what both need lives below them
    {"child", "watcher"},
    {"__init__", "demo", "ui"},  # the public API; the demo dataset; what the dashboard shows
    {"lightning", "cli", "dashboard"},  # what users run
    {"__main__"},  # python -m dataloader_tuner: the CLI
]


def part_of(module: str) -> str:
    """``dataloader_tuner.tune.plan`` -> ``tune``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_violations(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Imports that go up the order or sideways between parts of one layer."""
    rank = {part: i for i, layer in enumerate(layers) for part in layer}
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            source_part, target_part = part_of(module), part_of(target)
            if source_part != target_part and rank[target_part] >= rank[source_part]:
                found.append(f"{module} -> {target}")
    return found


def test_every_part_imports_only_the_layers_below_its_own():
    """Also rules out a cycle between parts: one would need an import that goes up."""
    graph = import_graph()
    parts = {part_of(module) for module in graph}
    assert parts == set().union(*LAYERS), parts ^ set().union(*LAYERS)  # each part placed
    assert layer_violations(graph, LAYERS) == []


def test_the_layer_check_finds_an_import_that_goes_up():
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}, "p.a.z": set(), "p.c": {"p.b.y"}}
    assert layer_violations(graph, [{"a"}, {"b"}, {"c"}]) == ["p.a.x -> p.b.y"]
    assert layer_violations(graph, [{"a", "b"}, {"c"}]) == ["p.a.x -> p.b.y", "p.b.y -> p.a.z"]


def test_the_engine_never_imports_the_dashboard():
    dashboard = f"{PACKAGE}.dashboard"
    offenders = {module: sorted(t for t in targets if t.startswith(dashboard))
                 for module, targets in import_graph().items() if not module.startswith(dashboard)}
    assert not any(offenders.values()), offenders


def test_the_dashboard_imports_only_the_public_api_and_ui():
    graph = import_graph()
    allowed = {PACKAGE, f"{PACKAGE}.ui"}
    internal = {module: sorted(t for t in targets if not t.startswith(f"{PACKAGE}.dashboard"))
                for module, targets in graph.items() if module.startswith(f"{PACKAGE}.dashboard")}
    assert all(set(targets) <= allowed for targets in internal.values()), internal
    assert any(internal.values())  # the scan does see the dashboard's imports


def test_ui_lists_every_name_it_gathers():
    from dataloader_tuner import ui

    gathered = {name for name in vars(ui) if not name.startswith("_")}
    assert gathered == set(ui.__all__), gathered ^ set(ui.__all__)
    assert not set(ui.__all__) & set(dataloader_tuner.__all__)  # each name in one place


def test_nothing_imports_the_folders_by_their_repository_names():
    """`engine` and `dashboard` are folder names only: a training repository has its own."""
    offenders = []
    for folder in ("engine", "dashboard", "tests", "bench", "examples"):
        for directory, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in (n for n in names if n.endswith(".py")):
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                if "syntax_error" in name:  # a fixture that must not parse
                    continue
                for node in ast.walk(ast.parse(source)):
                    names_used = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                                  and node.level == 0 else [a.name for a in node.names]
                                  if isinstance(node, ast.Import) else [])
                    offenders += [f"{path}: {n}" for n in names_used
                                  if n.split(".")[0] in FOLDERS]
    assert offenders == []


def test_every_package_folder_is_in_the_wheel():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    folders = {module for module, path in package_modules().items()
               if path.endswith("__init__.py")}
    assert listed == folders


NOTE = re.compile(r"NOTE \[ ([^\]\n]+) \]")


def test_every_note_referred_to_by_name_is_written_once():
    """A comment that says "NOTE [ name ]" points at one block that starts with that line."""
    defined: dict[str, int] = {}
    referred: set[str] = set()
    for path in package_modules().values():
        for line in open(path, encoding="utf-8"):
            for name in NOTE.findall(line):
                if line.strip() == f"NOTE [ {name} ]":
                    defined[name] = defined.get(name, 0) + 1
                else:
                    referred.add(name)
    assert defined and all(count == 1 for count in defined.values()), defined
    assert referred <= set(defined), referred - set(defined)


MAX_MODULE_LINES = 400
# Longer than that, and why (docs/development.md, "Habits"): keep this list short, and split a
# module by idea before it grows past its allowance.
LONGER_MODULES = {
    # the parent's side of one engine child: started as a subreaper, its events read, stopped
    # and reaped on every path (errors, Ctrl-C, a hung child): one lifecycle, read in order
    "dataloader_tuner.run.runner": 420,
    # watch() and the watched loader: one object wiring the probes, the recorder, the checks,
    # tuning in place and the shutdown, each of which lives in the watcher's other modules
    "dataloader_tuner.watcher.loader": 420,
    # what runs in the user's workers on every batch (the timed dataset, sampler and collate)
    # over state they share across a fork: two NOTEs of why
    "dataloader_tuner.instrument.probes": 470,
    # the stack sampler in every process: 88 of its lines are the three NOTEs on signals, the
    # sampler's own cost and what a look reads
    "dataloader_tuner.instrument.sampler": 470,
}
MAX_INSTANCE_ATTRIBUTES = 15
# Over the limit, and why (docs/development.md, "Habits"): keep this list short.
LARGER_CLASSES = {
    # a fold of a run's event stream: one attribute per kind of event it keeps
    "dataloader_tuner.run.live.LiveRun": 21,
    # the measuring thread's queues (rows or columns, events, gaps, copies, workers) and the
    # writer's state (with the windows of fast rows it writes)
    "dataloader_tuner.run.recorder.Recorder": 21,
}


def instance_attributes(path: str) -> dict[str, set[str]]:
    """Each class of a module: the ``self.x`` its methods assign."""
    with open(path) as f:
        tree = ast.parse(f.read())
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            found[node.name] = {
                target.attr for target in ast.walk(node)
                if isinstance(target, ast.Attribute) and isinstance(target.ctx, ast.Store)
                and isinstance(target.value, ast.Name) and target.value.id == "self"}
    return found


def test_no_module_is_longer_than_a_newcomer_reads_at_once():
    with_lines = {}
    for module, path in package_modules().items():
        with open(path) as f:
            with_lines[module] = sum(1 for _ in f)
    assert with_lines[f"{PACKAGE}.watcher.loader"] > 100  # the count does read the files
    assert {m: n for m, n in with_lines.items()
            if n > LONGER_MODULES.get(m, MAX_MODULE_LINES)} == {}
    assert set(LONGER_MODULES) <= set(with_lines)  # (a module moved: its allowance goes too)


def test_no_class_holds_more_than_a_few_things():
    sizes = {f"{module}.{cls}": len(attrs) for module, path in package_modules().items()
             for cls, attrs in instance_attributes(path).items()}
    assert sizes[f"{PACKAGE}.watcher.loader.WatchedLoader"] > 5  # the count does see them
    over = {name: n for name, n in sizes.items()
            if n > LARGER_CLASSES.get(name, MAX_INSTANCE_ATTRIBUTES)}
    assert over == {}


def test_the_scripts_outside_the_package_import_what_exists():
    """bench/, scripts/ and examples/ run by hand, not in the suite: a name they import that
    moved fails here, not in the next person's benchmark."""
    import importlib

    missing, seen = [], 0
    for folder in ("bench", "scripts", "examples"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(ROOT, folder, name)) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.split(".")[0] == PACKAGE):
                    continue
                seen += 1
                module = importlib.import_module(node.module)
                missing += [f"{folder}/{name}: {node.module}.{alias.name}" for alias in node.names
                            if not hasattr(module, alias.name)
                            and f"{node.module}.{alias.name}" not in package_modules()]
    assert seen > 20  # the scan does see their imports
    assert missing == []
