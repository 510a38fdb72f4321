"""The engine's public API (engine/__init__.py) is complete, and the dashboard uses only it."""

import ast
import os

import engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_all_lists_every_public_name_and_each_exists():
    public = {name for name, value in vars(engine).items()
              if not name.startswith("_") and not isinstance(value, type(engine))}
    assert public == set(engine.__all__), (public ^ set(engine.__all__))
    assert len(engine.__all__) == len(set(engine.__all__))  # none listed twice


def engine_imports(path: str) -> list[str]:
    """The engine modules a file imports: 'engine' for the API, 'engine.x.y' for internals."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [name for name in found if name == "engine" or name.startswith("engine.")]


def test_the_dashboard_imports_only_the_public_api():
    files = [os.path.join(ROOT, "app.py")] + [
        os.path.join(ROOT, "dashboard", name)
        for name in sorted(os.listdir(os.path.join(ROOT, "dashboard"))) if name.endswith(".py")]
    internal = {os.path.relpath(path, ROOT): [m for m in engine_imports(path) if m != "engine"]
                for path in files}
    assert not any(internal.values()), internal
    assert any(engine_imports(path) for path in files)  # the scan does see its imports
