"""End to end in a real headless Chromium against a real Streamlit server and real runs.

The six steps a user takes: open (the demo starts), point at a module and Start/Stop, Tune,
Apply (verified before/after), History with a comparison, and the Perfetto trace export. Also:
a reload re-attaches to a running run and a second tab sees the same run.

Screenshots of each step go to ``test-artifacts/`` (and ``failure.png`` when a step fails).
"""

import json
import os
import time

import psutil
import pytest

from .browser import CHROMIUM_ARGS, CHROMIUM_PATH, free_port, start_server, stop_server
from .conftest import ROOT
from .test_watch import reap_orphans

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # a minute: not in the quick loop
ARTIFACTS = os.path.join(ROOT, "test-artifacts")
LONG = 150_000  # ms: a tune plus a verification on a busy 2-core machine


@pytest.fixture
def server(tmp_path):
    server = start_server(free_port(), str(tmp_path / "runs.sqlite"), autostart=True)
    yield server
    stop_server(server)


@pytest.fixture
def browser():
    if not os.path.exists(CHROMIUM_PATH):
        pytest.skip(f"no browser at {CHROMIUM_PATH}: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS)
        yield browser
        browser.close()
    reap_adopted_chromium()


def reap_adopted_chromium(timeout_s: float = 5.0) -> None:
    """Chromium's helpers (crashpad) outlive their parent. If an earlier test in this process
    started an engine run, this process is a child subreaper (runner.py) and adopts them;
    they are the browser's, not the product's, so the test harness reaps them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        adopted = []
        for proc in psutil.Process().children():
            try:
                if proc.name().startswith(("chrome", "chromium")):
                    adopted.append(proc)
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(proc.pid, 0)
            except (psutil.Error, ChildProcessError):
                pass
        if not adopted:
            return
        time.sleep(0.1)


class Steps:
    """A page plus the checks every step makes: no Streamlit exception, a screenshot."""

    def __init__(self, page) -> None:
        self.page = page
        os.makedirs(ARTIFACTS, exist_ok=True)

    def shot(self, name: str) -> None:
        self.page.screenshot(path=os.path.join(ARTIFACTS, f"{name}.png"), full_page=True)

    def no_exception(self) -> None:
        assert self.page.locator('[data-testid="stException"]').count() == 0, \
            self.page.locator('[data-testid="stException"]').first.inner_text()

    def set_number(self, label: str, value) -> None:
        box = self.page.get_by_role("spinbutton", name=label)
        box.fill(str(value))
        box.press("Enter")
        self.page.wait_for_timeout(600)  # the rerun that stores the value

    def charts_with_data(self, *names: str) -> None:
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        for name in names:
            chart = self.page.locator(".js-plotly-plot", has_text=name).first
            chart.wait_for(timeout=30_000)
            drawn = chart.locator(".scatterlayer .trace, .barlayer .trace")
            try:  # plotly draws its traces after the chart's frame: give it the time
                drawn.first.wait_for(timeout=10_000)
            except PlaywrightTimeout:
                pass
            assert drawn.count() > 0, f"chart '{name}' has no data"


def test_the_six_steps_in_a_real_browser(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1800})
    steps = Steps(page)
    try:
        # 1. The page opens on the demo dataset, and the demo starts by itself.
        page.goto(server.page())
        page.get_by_text("Found dataloader_tuner.demo.FeatureDataset").wait_for(timeout=60_000)
        page.get_by_text("Run 1", exact=False).first.wait_for(timeout=60_000)
        page.get_by_text("samples/s").first.wait_for(timeout=60_000)
        steps.charts_with_data("Batch latency", "Worker utilization", "GPU idle gaps")
        assert page.get_by_text("Pinned-memory transfer").count() > 0
        assert page.get_by_text("not measured").count() > 0  # no GPU here, and it says so
        steps.no_exception()
        steps.shot("1-live")

        # 2. Point at a module (attr form), Start a run; a reload and a second tab re-attach.
        target = page.get_by_role("textbox", name="Dataset module")
        target.fill("dataloader_tuner.demo:make_dataset")
        target.press("Enter")
        page.get_by_text("via make_dataset").wait_for(timeout=60_000)
        steps.set_number("num_workers", 2)
        steps.set_number("Run length (s)", 60)
        page.get_by_role("button", name="Start").click()
        page.get_by_text("Run 2", exact=False).first.wait_for(timeout=30_000)
        page.reload()
        page.get_by_text("Run 2", exact=False).first.wait_for(timeout=30_000)
        page.get_by_text("running", exact=True).first.wait_for(timeout=30_000)
        other = browser.new_page()
        other.goto(server.page())
        other.get_by_text("Run 2", exact=False).first.wait_for(timeout=60_000)
        other.close()
        page.get_by_role("button", name="Stop").click()
        page.get_by_text("stopped", exact=True).first.wait_for(timeout=30_000)
        steps.no_exception()

        # 3. Tune: a progress bar and a growing chart, then the recommendation card.
        steps.set_number("Tuning time limit (s)", 12)
        steps.set_number("Seconds per verification run", 2)
        page.get_by_role("button", name="Tune").click()
        page.get_by_text("Tuning:", exact=False).first.wait_for(timeout=60_000)
        page.get_by_text("Recommendation", exact=True).wait_for(timeout=LONG)
        steps.charts_with_data("Tune: throughput against num_workers")
        code = page.locator('[data-testid="stCode"]', has_text="num_workers=").first
        assert code.inner_text().startswith("DataLoader(dataset")
        steps.no_exception()
        steps.shot("3-recommendation")

        # 4. Apply: the controls change and a measured before/after comparison appears.
        page.get_by_role("button", name="Apply recommended settings").click()
        page.get_by_text("Applied", exact=False).first.wait_for(timeout=30_000)
        page.get_by_text("with the new settings", exact=False).wait_for(timeout=LONG)
        steps.charts_with_data("Throughput over time")
        steps.no_exception()
        steps.shot("4-applied")

        # 5. History: every run saved, two compared side by side.
        page.get_by_role("link", name="History").click()
        page.get_by_text("Run history").wait_for(timeout=30_000)
        page.get_by_text("Compare two runs").wait_for(timeout=30_000)
        steps.charts_with_data("Throughput over time", "Batch latency: distribution compared")
        steps.no_exception()
        steps.shot("5-history")

        # 6. Export a run as a Perfetto trace.
        with page.expect_download(timeout=30_000) as download:
            page.get_by_role("button", name="Download Perfetto trace").click()
        with open(download.value.path()) as f:
            events = json.load(f)["traceEvents"]
        assert any(e["name"] == "fetch" for e in events)
        assert any(e.get("name") == "process_name" for e in events)
        steps.no_exception()
    except BaseException:
        steps.shot("failure")
        print(server.log()[-5000:])
        raise


def test_a_watched_training_job_is_followed_live(tmp_path, browser):
    """A real training script, watched, writing to the server's history while the Training
    jobs page shows it live in a real browser."""
    import signal
    import subprocess
    import sys

    db = str(tmp_path / "runs.sqlite")
    server = start_server(free_port(), db)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    steps = Steps(page)
    page.goto(server.page("jobs"))  # opened before the job starts: it must appear by itself
    page.get_by_text("No watched jobs yet").wait_for(timeout=60_000)
    job = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "examples", "train_watched.py"), "--epochs", "200",
         "--step-ms", "5", "--db", db], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        # The run's own line (the runs table above is a canvas with hidden text for readers)
        page.locator('[data-testid="stMarkdown"]').filter(
            has_text="train_watched.py").filter(has_text="running").first.wait_for(timeout=60_000)
        page.locator('[data-testid="stMetric"]').first.wait_for(timeout=60_000)
        first = page.locator('[data-testid="stMarkdown"]').filter(
            has_text=" batches").first.inner_text()
        assert first.startswith("train"), first  # the job's first loader, not its "val"
        later, deadline = first, time.monotonic() + 15
        while later == first and time.monotonic() < deadline:  # it follows without a reload
            time.sleep(1)
            later = page.locator('[data-testid="stMarkdown"]').filter(
                has_text=" batches").first.inner_text()
        assert first != later, (first, later)
        # (waited for: a refresh redraws the charts, none there for a moment)
        page.locator(".js-plotly-plot").nth(2).wait_for(timeout=30_000)
        steps.no_exception()
        steps.shot("watched-job-live")
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        stop_server(server)
        reap_orphans()  # the killed job's workers, adopted here


def test_the_dashboard_opens_only_with_its_token_in_a_real_browser(tmp_path, browser):
    """Without the token, whichever page's address: the page that says how to get in, and the
    demo that would start by itself does not (no history made); with it, the dashboard, and
    a reload stays in. The server's own log never holds the token."""
    db = tmp_path / "history" / "runs.sqlite"
    server = start_server(free_port(), str(db), autostart=True,
                          log_path=str(tmp_path / "server.log"))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        for path in ("", "jobs", "history"):
            page.goto(f"{server.url}/{path}?token=wrong")
            page.get_by_text("opens only with its token").wait_for(timeout=60_000)
        page.goto(server.url)
        page.get_by_text("opens only with its token").wait_for(timeout=60_000)
        page.wait_for_timeout(2000)  # time enough for an autostart to begin, were it let in
        assert not db.parent.exists()
        page.goto(server.page())
        page.get_by_text("Found dataloader_tuner.demo.FeatureDataset").wait_for(timeout=60_000)
        page.get_by_role("link", name="Training jobs").click()
        page.get_by_text("No watched jobs yet").wait_for(timeout=60_000)
        page.reload()
        page.get_by_text("No watched jobs yet").wait_for(timeout=60_000)
        assert "opens only with its token" not in page.inner_text("body")
        assert server.token not in server.log()
    finally:
        page.close()
        stop_server(server)
