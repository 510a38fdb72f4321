"""Only the person who started the dashboard drives it: the token (dataloader_tuner.access,
dashboard/token_gate.py), the dashboard command's choices, and the files the tool writes kept to
their owner."""

import argparse
import json
import os
import stat
import subprocess
import sys

import psutil
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from dataloader_tuner import RunStore
from dataloader_tuner.access import dashboard_url, tokens_match
from dataloader_tuner.cli.commands import dashboard as dashboard_cmd
from dataloader_tuner.dashboard import jobs as dashboard_jobs, token_gate
from dataloader_tuner.dashboard.shared import get_jobs
from dataloader_tuner.run import runner

from .conftest import ROOT

TOKEN = "s3cret-token-of-the-person-who-started-it"


@pytest.fixture
def locked_env(tmp_path, monkeypatch):
    """A dashboard that would start the demo run on first open, its history not made yet, and
    spies on every way in: inspecting a target, starting a child."""
    db = tmp_path / "history" / "runs.sqlite"
    monkeypatch.setenv("DLTUNER_DB", str(db))
    monkeypatch.setenv("DLTUNER_AUTOSTART", "1")
    monkeypatch.setenv("DLTUNER_TOKEN", TOKEN)
    monkeypatch.delenv("DLTUNER_NO_TOKEN", raising=False)
    monkeypatch.chdir(ROOT)
    calls: list[str] = []
    inspect = dashboard_jobs.inspect_target
    monkeypatch.setattr(dashboard_jobs, "inspect_target",
                        lambda *a, **k: calls.append("inspect") or inspect(*a, **k))
    starter = runner.child_starter
    monkeypatch.setattr(runner, "child_starter",
                        lambda *a, **k: calls.append("start") or starter(*a, **k))
    st.cache_resource.clear()
    yield db, calls
    get_jobs().stop_all()
    st.cache_resource.clear()


def open_app(token: str | None = None) -> AppTest:
    at = AppTest.from_file(os.path.join(ROOT, "app.py"), default_timeout=90)
    if token is not None:
        at.query_params["token"] = token
    return at.run()


def texts(at: AppTest) -> str:
    return " ".join(str(e.value) for kind in ("title", "markdown", "error", "caption", "info")
                    for e in getattr(at, kind))


@pytest.mark.parametrize("offered", [None, "wrong", TOKEN[:-1], TOKEN + "x"])
def test_without_the_token_a_session_gets_only_the_way_in(locked_env, offered):
    db, calls = locked_env
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    at = open_app(offered)
    assert not at.exception
    assert "opens only with its token" in texts(at)
    assert ("not this dashboard's" in texts(at)) == bool(offered)
    assert len(at.text_input) == 0 and len(at.button) == 0  # nothing to drive
    # Nothing inspected or started, no history made or read, no process started.
    assert calls == []
    assert not db.parent.exists()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children_before
    assert TOKEN not in texts(at)


def test_with_the_token_the_session_is_in_and_stays_in(locked_env, monkeypatch):
    db, calls = locked_env
    monkeypatch.setenv("DLTUNER_AUTOSTART", "0")
    at = open_app(TOKEN)
    assert not at.exception
    assert "opens only with its token" not in texts(at)
    assert len(at.text_input) > 0  # the live page: its target box
    assert "inspect" in calls and db.exists()  # the page went on: the target was inspected
    # A change of page clears the address's parameters: the session stays in, and the token
    # goes back into the address, so that a reload stays in too.
    at.query_params.clear()
    at.run()
    assert "opens only with its token" not in texts(at)
    assert at.query_params["token"] == TOKEN
    history = b"".join(p.read_bytes() for p in db.parent.iterdir())
    assert TOKEN.encode() not in history  # not written to the history


def test_a_server_started_without_a_token_makes_one_and_prints_its_address(locked_env,
                                                                          monkeypatch, capsys):
    db, calls = locked_env
    monkeypatch.delenv("DLTUNER_TOKEN")
    monkeypatch.setenv("DLTUNER_AUTOSTART", "0")
    monkeypatch.setattr(token_gate, "_made", None)
    at = open_app()
    assert "opens only with its token" in texts(at)
    printed = capsys.readouterr().err
    assert "DataLoader Tuner opens with its token: http://" in printed
    made = printed.rsplit("?token=", 1)[1].split()[0]
    assert len(made) >= 32 and made not in texts(at) and calls == []
    assert "opens only with its token" not in texts(open_app(made))


@pytest.mark.slow  # 1.8 s: a real server; the quick loop has two with the token
def test_no_token_opens_it_as_before(locked_env, monkeypatch):
    db, calls = locked_env
    monkeypatch.setenv("DLTUNER_NO_TOKEN", "1")
    monkeypatch.setenv("DLTUNER_AUTOSTART", "0")
    at = open_app()
    assert "opens only with its token" not in texts(at) and len(at.text_input) > 0


def test_the_user_s_module_runs_without_the_token_in_its_environment(monkeypatch):
    """The engine child runs the user's code, which may log its environment where others read:
    the dashboard's environment reaches it less the token."""
    monkeypatch.setenv("DLTUNER_TOKEN", TOKEN)
    started = {}

    class Started(Exception):
        pass

    def popen(command, **kwargs):
        started.update(kwargs)
        raise Started  # nothing started: the environment it would have had is enough

    monkeypatch.setattr(runner.subprocess, "Popen", popen)
    with pytest.raises(Started):
        runner.EngineChild.start(None, subprocess.DEVNULL)  # type: ignore[arg-type]
    assert "DLTUNER_TOKEN" not in started["env"] and TOKEN not in str(started["env"])
    assert started["env"]["PATH"] == os.environ["PATH"]


def test_tokens_are_compared_whole():
    assert tokens_match(TOKEN, TOKEN)
    assert not tokens_match(TOKEN[:-1], TOKEN) and not tokens_match("", TOKEN)
    assert dashboard_url("127.0.0.1", 8501, "abc") == "http://127.0.0.1:8501/?token=abc"


def dashboard_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    dashboard_cmd.prepare_parser(parser)
    return parser.parse_args(list(argv))


def test_the_dashboard_command_prints_the_address_with_a_new_token_and_passes_it_unseen():
    first = dashboard_cmd.plan(dashboard_args(), {})
    second = dashboard_cmd.plan(dashboard_args(), {})
    assert isinstance(first, dashboard_cmd.Launch) and isinstance(second, dashboard_cmd.Launch)
    token = first.env["DLTUNER_TOKEN"]
    assert token != second.env["DLTUNER_TOKEN"] and len(token) >= 32
    assert f"http://127.0.0.1:8501/?token={token}" in first.said[-1]
    # Never on the command line: every user of the machine can read that (ps).
    assert not any(token in part for part in first.command)
    assert first.command[first.command.index("--server.address") + 1] == "127.0.0.1"
    given = dashboard_cmd.plan(dashboard_args("--token", "mine"), {})
    assert isinstance(given, dashboard_cmd.Launch) and given.env["DLTUNER_TOKEN"] == "mine"


def test_serving_beyond_this_machine_needs_the_token_and_says_what_it_exposes():
    refused = dashboard_cmd.plan(dashboard_args("--host", "0.0.0.0", "--no-token"), {})
    assert isinstance(refused, str) and "run code as you" in refused
    remote = dashboard_cmd.plan(dashboard_args("--host", "0.0.0.0"), {})
    assert isinstance(remote, dashboard_cmd.Launch)
    warning = " ".join(remote.said)
    assert "serving on 0.0.0.0" in warning and "run Python code as you" in warning
    assert "ssh -L 8501:127.0.0.1:8501" in warning
    open_to_all = dashboard_cmd.plan(dashboard_args("--no-token"), {"DLTUNER_TOKEN": "x"})
    assert isinstance(open_to_all, dashboard_cmd.Launch)
    assert open_to_all.env["DLTUNER_NO_TOKEN"] == "1" and "DLTUNER_TOKEN" not in open_to_all.env
    assert "Warning: --no-token" in open_to_all.said[0]
    assert "?token=" not in open_to_all.said[-1]


def test_the_command_refuses_no_token_beyond_this_machine_with_a_usage_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "dataloader_tuner", "dashboard", "--host",
                           "0.0.0.0", "--no-token"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 2 and "run code as you" in done.stderr


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_history_and_its_folder_are_their_owners_only(tmp_path):
    db = tmp_path / "new" / "runs.sqlite"
    store = RunStore(str(db))
    store.create_run("profile", "t.py", {})
    assert mode(db.parent) == 0o700 and mode(db) == 0o600
    for extra in ("-wal", "-shm"):  # SQLite's own files, made as the database is
        assert mode(str(db) + extra) == 0o600


def test_a_watched_jobs_history_and_settings_file_are_their_owners_only(tmp_path,
                                                                        monkeypatch):
    from .test_inplace import indices_loader, watch_leaping

    monkeypatch.chdir(tmp_path)
    db = tmp_path / "watched" / "runs.sqlite"
    watched = watch_leaping(indices_loader(0), name="mine", db=str(db), tune=True,
                            max_workers=1)
    for _ in range(3):
        for _batch in watched:
            pass
    watched.close()
    assert mode(db.parent) == 0o700 and mode(db) == 0o600
    assert mode(tmp_path / "dataloader-tuner-mine.json") == 0o600


@pytest.mark.slow  # a real profile run, then its trace
def test_a_trace_file_is_its_owners_only(tmp_path, db_path):
    done = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "profile", "examples/tiny_in_memory.py",
         "--seconds", "1", "--json", "--db", db_path],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    trace = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, "-m", "dataloader_tuner", "trace", str(run_id), "--out", str(trace),
         "--db", db_path], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stderr
    assert mode(trace) == 0o600
