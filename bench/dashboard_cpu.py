"""What streaming a live run costs the Streamlit server, as % of one core.

Starts a real server (`streamlit run app.py`) and a real headless Chromium on the Live page,
presses Start, and measures the server process's own CPU time (not the engine's child processes)
over a window while the run streams. Target: under 15 % of one core.

    python bench/dashboard_cpu.py [--target examples/cpu_bound.py] [--workers 2] [--seconds 20]
                                  [--tabs 1]

Needs Debian's chromium at /usr/bin/chromium and the playwright package (requirements-test.txt).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import psutil

IDLE_S = 8.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.browser import (  # noqa: E402
    CHROMIUM_ARGS,
    CHROMIUM_PATH,
    free_port,
    start_server,
    stop_server,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="examples/cpu_bound.py")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="measured window")
    parser.add_argument("--tabs", type=int, default=1, help="browser tabs watching the run")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(free_port(), os.path.join(tmp, "runs.sqlite"))
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM_PATH, args=CHROMIUM_ARGS)
                pages = [browser.new_page() for _ in range(args.tabs)]
                for page in pages:
                    page.goto(server.page())
                first = pages[0]
                first.get_by_text("Found ", exact=False).first.wait_for(timeout=60000)
                target = first.get_by_role("textbox", name="Dataset module")
                target.fill(args.target)
                target.press("Enter")
                first.get_by_text("Found ", exact=False).first.wait_for(timeout=60000)
                box = first.get_by_role("spinbutton", name="num_workers")
                box.fill(str(args.workers))
                box.press("Enter")
                box = first.get_by_role("spinbutton", name="Run length (s)")
                box.fill(str(args.seconds + 20))
                box.press("Enter")
                time.sleep(3.0)
                proc = psutil.Process(server.process.pid)
                idle_before, idle_wall0 = proc.cpu_times(), time.monotonic()
                time.sleep(IDLE_S)
                idle_after, idle_wall = proc.cpu_times(), time.monotonic() - idle_wall0
                first.get_by_role("button", name="Start").click()
                first.get_by_text("samples/s").first.wait_for(timeout=60000)
                time.sleep(5.0)  # past start-up and the first redraws
                before, wall0 = proc.cpu_times(), time.monotonic()
                time.sleep(args.seconds)
                after, wall = proc.cpu_times(), time.monotonic() - wall0
                body = first.inner_text("body")
                browser.close()
        finally:
            stop_server(server)
    cpu = (after.user - before.user) + (after.system - before.system)
    share = 100.0 * cpu / wall
    idle_cpu = (idle_after.user - idle_before.user) + (idle_after.system - idle_before.system)
    batches = [line for line in body.splitlines() if "batches in" in line]
    print(f"target {args.target}, num_workers={args.workers}, {args.tabs} tab(s)")
    print(f"  {batches[0] if batches else 'no batch count on the page'}")
    print(f"server CPU while streaming: {cpu:.2f} s over {wall:.1f} s = {share:.1f}% of one core "
          f"(target < 15%)")
    print(f"server CPU idle, page open, no run: {100.0 * idle_cpu / idle_wall:.1f}% of one core")


if __name__ == "__main__":
    main()
