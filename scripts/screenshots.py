"""Retake the documentation's screenshots from today's dashboard, on the built-in demo.

    python scripts/screenshots.py [--out docs]

Starts a real Streamlit server (its own run history in a temporary folder) and headless
Chromium (Debian's, at /usr/bin/chromium), as tests/test_browser.py does; writes
``live-view.png`` (the Live page once the demo has streamed for a while: README.md) and
``recommendation.png`` (the same page after **Tune**: docs/dashboard.md). Takes about two
minutes on a 2-core machine; run it on a quiet one, the pictures show measured figures.
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs"), help="folder for the PNGs")
    args = parser.parse_args()
    if not os.path.exists(CHROMIUM_PATH):
        raise SystemExit(f"no browser at {CHROMIUM_PATH}: apt-get install -y chromium")
    take(args.out)
    print(f"wrote live-view.png and recommendation.png in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
