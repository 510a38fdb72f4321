"""`pip install .` gives a training script outside this repository `watch` and the
`dataloader-tuner` command. Installed into a fresh virtual environment that sees this machine's
packages (torch, streamlit: nothing is downloaded for them; the build backend comes from PyPI)."""

import os
import shutil
import subprocess
import sys

import pytest

from .conftest import ROOT, dataset_path

pytestmark = pytest.mark.slow

SCRIPT = """
import sys
import torch
from torch.utils.data import DataLoader
from engine import watch

loader = watch(DataLoader(torch.arange(256).float().view(-1, 4), batch_size=8, num_workers=1),
               name="outside", db=sys.argv[1])
total = sum(int(batch.shape[0]) for batch in loader)
result = loader.close()
print(total, result.status, result.batches)
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    source = base / "source"  # only what the package is made of: the checkout stays clean
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    for package in ("engine", "dashboard"):
        shutil.copytree(os.path.join(ROOT, package), source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)],
                   check=True, timeout=120)
    python = str(env_dir / "bin" / "python")
    installed = subprocess.run([python, "-m", "pip", "install", "-q", str(source)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return env_dir


def test_a_script_outside_the_repository_imports_watch(venv, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(venv / "bin" / "python"), str(script), str(tmp_path / "h.db")],
                          cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["64", "ok", "8"]  # 64 samples in batches of 8
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import engine; print(engine.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=60)
    assert str(venv) in where.stdout  # the installed copy, not this checkout


def test_the_command_profiles_and_lists_runs(venv, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = str(venv / "bin" / "dataloader-tuner")
    db = str(tmp_path / "h.db")
    profiled = subprocess.run([command, "profile", dataset_path("small_map.py"), "--seconds", "1",
                               "--db", db], cwd=tmp_path, capture_output=True, text=True,
                              env=env, timeout=180)
    assert profiled.returncode == 0, profiled.stderr
    assert "samples/s" in profiled.stdout
    listed = subprocess.run([command, "runs", "--db", db], cwd=tmp_path, capture_output=True,
                            text=True, env=env, timeout=60)
    assert "profile" in listed.stdout and "ok" in listed.stdout
    usage = subprocess.run([command, "dashboard", "--help"], capture_output=True, text=True,
                           env=env, timeout=60)
    assert usage.returncode == 0 and "--port" in usage.stdout
