#!/usr/bin/env python3
"""Screenshot a navdoctor HTML report in headless Chromium (full page, after the charts are drawn).

    python bench/report_screenshots.py REPORT.html OUT.png [--width 1400] [--section ID]

--section ID shoots one section only (nd-verdict, nd-answer, nd-findings, nd-shares, nd-steps,
nd-timeline, nd-kernels-s, nd-memory, ...). Needs playwright (the `test` extra) and a Chromium: the system
one (tests/install-browser.sh installs Debian's `chromium`) or NAVDOCTOR_CHROMIUM=PATH. Made
for the docs' screenshots of the bundled workload's report (docs/report.md).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_path() -> str | None:
    for c in (os.environ.get("NAVDOCTOR_CHROMIUM"), shutil.which("chromium"),
              shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if c and os.path.exists(c):
            return c
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("out")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--section", help="the id of one section to shoot")
    a = p.parse_args()
    exe = chromium_path()
    if exe is None:
        print("no Chromium found (run tests/install-browser.sh as root, or set NAVDOCTOR_CHROMIUM)",
              file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=ARGS)
        page = browser.new_page(viewport={"width": a.width, "height": 900})
        page.goto(Path(a.report).resolve().as_uri())
        page.wait_for_function("document.body.dataset.charts !== undefined", timeout=60_000)
        if page.evaluate("document.body.dataset.charts") != "drawn":
            print("the charts were not drawn: " + page.inner_text("#nd-status"), file=sys.stderr)
        if a.section:
            page.add_style_tag(content="nav{position:static}")  # not over the section's top
            page.locator(f"#{a.section}").screenshot(path=a.out)
        else:
            page.screenshot(path=a.out, full_page=True)
        browser.close()
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
