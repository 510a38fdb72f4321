"""Retake the documentation's screenshots from today's dashboard, on the built-in demo.

    python scripts/screenshots.py [--out docs]

Starts a real Streamlit server (its own run history in a temporary folder) and headless
Chromium (Debian's, at /usr/bin/chromium), as tests/test_browser.py does; writes
``live-view.png`` (the Live page once the demo has streamed for a while: README.md),
``recommendation.png`` (the same page after **Tune**: docs/dashboard.md) and
``where-time-goes.png`` (a JPEG folder's profile on the History page: docs/profile.md) and
``ceiling.png`` (a tune of an ImageFolder pipeline: docs/ceiling.md); ``--only where`` or
``--only ceiling`` takes one alone. Takes about two minutes on a 2-core machine; run it on a quiet
one, the pictures show measured figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.browser import (CHROMIUM_ARGS, CHROMIUM_PATH, free_port,  # noqa: E402
                           start_server, stop_server)

WIDTH = 1400
STREAM_S = 12  # the demo streams this long before the live view is taken


def set_number(page, label: str, value: float) -> None:
    box = page.get_by_role("spinbutton", name=label)
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_timeout(600)  # the rerun that stores the value


def take(out: str) -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        server = start_server(free_port(), os.path.join(folder, "runs.sqlite"), autostart=True)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": WIDTH, "height": 1560})
                page.goto(server.page())
                page.get_by_text("samples/s").first.wait_for(timeout=90_000)
                time.sleep(STREAM_S)
                page.screenshot(path=os.path.join(out, "live-view.png"))
                page.set_viewport_size({"width": WIDTH, "height": 1400})
                tune = page.get_by_role("button", name="Tune")
                deadline = time.monotonic() + 120
                while not tune.is_enabled() and time.monotonic() < deadline:
                    time.sleep(1)  # the demo's run ends first: Tune waits for it
                set_number(page, "Seconds per verification run", 2)
                tune.click()
                page.get_by_text("Recommendation", exact=True).wait_for(timeout=300_000)
                page.get_by_text("Recommendation", exact=True).scroll_into_view_if_needed()
                page.wait_for_timeout(2000)  # plotly draws after the card
                page.screenshot(path=os.path.join(out, "recommendation.png"))
                browser.close()
        finally:
            stop_server(server)


def take_where(out: str) -> None:
    """A profile of the JPEG folder at 2 persistent workers, saved, then shown on the History
    page with its "Where the time goes" opened."""
    from playwright.sync_api import sync_playwright

    from dataloader_tuner.run.runner import RunRequest, run_to_completion
    from dataloader_tuner.store import RunStore

    with tempfile.TemporaryDirectory() as folder:
        db = os.path.join(folder, "runs.sqlite")
        for _ in range(2):  # the History page compares two runs
            run_to_completion(RunRequest(
                target=os.path.join(ROOT, "tests", "real", "jpeg_folder.py"), seconds=6.0,
                settings={"num_workers": 2, "persistent_workers": True}), RunStore(db))
        server = start_server(free_port(), db)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": WIDTH, "height": 1800})
                page.goto(server.page("history"))
                page.get_by_text("Where the time goes").first.wait_for(timeout=90_000)
                page.get_by_text("Where the time goes").first.click()
                page.get_by_text("Where the loader's time goes").first.wait_for(timeout=30_000)
                page.get_by_text("Where the time goes").first.scroll_into_view_if_needed()
                page.wait_for_timeout(2500)  # plotly draws after the expander opens
                page.screenshot(path=os.path.join(out, "where-time-goes.png"))
                browser.close()
        finally:
            stop_server(server)


def take_ceiling(out: str) -> None:
    """A tune of the ImageFolder + Compose pipeline on the Live page: the ceiling's sentence,
    the what-if chart (the cache measured, filled) and the fixes named."""
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        server = start_server(free_port(), os.path.join(folder, "runs.sqlite"))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": WIDTH, "height": 1500})
                page.goto(server.page())
                target = page.get_by_role("textbox", name="Dataset module")
                target.fill(os.path.join(ROOT, "tests", "real", "imagefolder_compose.py"))
                target.press("Enter")
                page.get_by_text("via make_dataset").wait_for(timeout=90_000)
                page.get_by_role("button", name="Tune").click()
                chart = page.get_by_text("What would raise the ceiling").first
                chart.wait_for(timeout=600_000)
                page.get_by_text("Below its ceiling").or_(
                    page.get_by_text("At its ceiling")).first.scroll_into_view_if_needed()
                page.mouse.move(WIDTH * 0.6, 700)  # over the page's own scrolling area
                page.mouse.wheel(0, 700)  # the sentence near the top, the fixes below
                page.wait_for_timeout(2500)  # plotly draws after the card
                page.screenshot(path=os.path.join(out, "ceiling.png"))
                browser.close()
        finally:
            stop_server(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"), help="folder for the PNGs")
    parser.add_argument("--only", choices=("where", "ceiling"),
                        help="only where-time-goes.png, or only ceiling.png")
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM_PATH):
        raise SystemExit(f"no browser at {CHROMIUM_PATH}: apt-get install -y chromium")
    if args.only is None:
        take(args.out)
    if args.only in (None, "where"):
        take_where(args.out)
    if args.only in (None, "ceiling"):
        take_ceiling(args.out)
    print(f"wrote the screenshots in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
