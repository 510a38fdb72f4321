"""`pip install .` into a fresh virtual environment gives a training repository one import name,
`dataloader_tuner`, even when the repository has its own `engine.py` and `dashboard.py` (as
DETR's, DeiT's and torchvision's references do): `watch` works, `python -m dataloader_tuner
profile` works and the `dataloader-tuner dashboard` command serves.

The environment is made without the machine's packages and given this interpreter's
site-packages through a .pth file (torch, streamlit: nothing downloaded for them; the build
backend comes from PyPI). That works whether the tests run in a virtualenv or the system Python:
a `--system-site-packages` venv made from a venv would see the system's packages, not the
venv's torch."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request

import pytest

from .conftest import ROOT, dataset_path

pytestmark = pytest.mark.slow

USER_ENGINE = 'WHO = "the repository own engine.py"\n'
USER_DASHBOARD = 'WHO = "the repository own dashboard.py"\n'
TRAIN = """
import sys
import torch
from torch.utils.data import DataLoader

import dashboard
import engine
from dataloader_tuner import watch

assert "own engine" in engine.WHO and "own dashboard" in dashboard.WHO
loader = watch(DataLoader(torch.arange(256).float().view(-1, 4), batch_size=8, num_workers=1),
               name="outside", db=sys.argv[1])
total = sum(int(batch.shape[0]) for batch in loader)
result = loader.close()
print(total, result.status, result.batches)
"""


def site_packages(env_dir) -> str:
    done = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


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
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    with open(os.path.join(site_packages(env_dir), "_tests_outer.pth"), "w") as f:
        f.write("\n".join(sorted(ours)) + "\n")  # plain paths: their own .pth files stay unread
    installed = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                                str(source)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-2000:]
    return env_dir


@pytest.fixture
def training_repo(tmp_path):
    """A training repository with its own engine.py and dashboard.py beside its script."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "engine.py").write_text(USER_ENGINE)
    (repo / "dashboard.py").write_text(USER_DASHBOARD)
    (repo / "main.py").write_text(TRAIN)
    shutil.copy(dataset_path("small_map.py"), repo / "data.py")
    return repo


def clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DLTUNER_DB")}


def test_the_wheel_holds_one_import_name(venv):
    site = site_packages(venv)
    info = next(name for name in os.listdir(site) if name.startswith("dataloader_tuner-"))
    with open(os.path.join(site, info, "top_level.txt")) as f:
        assert f.read().split() == ["dataloader_tuner"]
    with open(os.path.join(site, info, "RECORD")) as f:
        tops = {line.split(",")[0].split("/")[0] for line in f if not line.startswith("..")}
    assert tops == {"dataloader_tuner", info}
    assert not os.path.exists(os.path.join(site, "engine"))
    assert not os.path.exists(os.path.join(site, "dashboard"))


def test_a_repository_with_its_own_engine_py_trains_watched(venv, training_repo):
    done = subprocess.run([str(venv / "bin" / "python"), "main.py", "h.db"], cwd=training_repo,
                          capture_output=True, text=True, env=clean_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["64", "ok", "8"]  # 64 samples in batches of 8
    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import dataloader_tuner; print(dataloader_tuner.__file__)"],
                           cwd=training_repo, capture_output=True, text=True, env=clean_env(),
                           timeout=60)
    assert str(venv) in where.stdout  # the installed copy, not this checkout


def test_python_m_profiles_from_the_repository(venv, training_repo):
    db = str(training_repo / "h.db")
    profiled = subprocess.run([str(venv / "bin" / "python"), "-m", "dataloader_tuner", "profile",
                               "data.py", "--seconds", "1", "--db", db], cwd=training_repo,
                              capture_output=True, text=True, env=clean_env(), timeout=180)
    assert profiled.returncode == 0, profiled.stderr
    assert "samples/s" in profiled.stdout
    listed = subprocess.run([str(venv / "bin" / "dataloader-tuner"), "runs", "--db", db],
                            cwd=training_repo, capture_output=True, text=True, env=clean_env(),
                            timeout=60)
    assert "profile" in listed.stdout and "ok" in listed.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_dashboard_command_serves_from_the_repository(venv, training_repo):
    port = free_port()
    server = subprocess.Popen([str(venv / "bin" / "dataloader-tuner"), "dashboard", "--port",
                               str(port), "--db", str(training_repo / "h.db")],
                              cwd=training_repo, env=clean_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, health = time.monotonic() + 90, None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                            timeout=2) as answer:
                    health = answer.read().decode()
                    break
            except OSError:
                time.sleep(0.5)
        assert health == "ok", server.stdout.read().decode() if server.poll() is not None else ""
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as page:
            assert page.status == 200 and b"<html" in page.read().lower()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        said = server.stdout.read().decode()
        server.stdout.close()
    # The address to open carries the token the dashboard opens with (dataloader_tuner.access).
    assert f"http://127.0.0.1:{port}/?token=" in said, said
