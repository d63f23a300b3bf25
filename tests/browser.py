"""Headless Debian Chromium driven by Playwright, for the explain page's browser test.

Without Chromium, a test marked `@needs_chromium` is skipped on a developer's machine but FAILS
under CI (the environment variable CI set to a true value: "true", "1", "yes" or "on", as CI
services set it), where a silently skipped browser test would check less than the CI claims.

Also a command, to take the screenshot shown in the README from a page `specdec explain` wrote:

    .venv/bin/python tests/browser.py run.html docs/explain-screenshot.png --rounds 6
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Headless, and none of the background connections a closed network refuses.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


CHROMIUM_MISSING = "needs Debian's chromium (make test installs it)"


def under_ci() -> bool:
    """Whether the environment variable CI holds a true value ("true", "1", "yes", "on"; any case)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


def needs_chromium(test):
    """Decorator for a browser test. With Chromium: the test as it is. Without: skipped locally, and
    under CI replaced by a test that fails at once (before any fixture is set up) saying why."""
    import pytest

    if CHROMIUM is not None:
        return test
    if not under_ci():
        return pytest.mark.skip(reason=CHROMIUM_MISSING)(test)

    def fail():
        pytest.fail(f"{CHROMIUM_MISSING}; CI={os.environ.get('CI')!r}, and under CI the browser test must run, "
                    "not be skipped", pytrace=False)

    fail.__name__, fail.__qualname__, fail.__doc__ = test.__name__, test.__qualname__, test.__doc__
    return fail


def launch(playwright):
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed (make test installs Debian's package)")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)


def screenshot(page_file: Path, png: Path, rounds: int, width: int = 1280, height: int = 900) -> None:
    """Open the page, press → `rounds` times, save a screenshot of the whole page."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(page_file.resolve().as_uri())
        for _ in range(rounds):
            page.keyboard.press("ArrowRight")
        page.screenshot(path=str(png), full_page=True)
        browser.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    screenshot(args.page, args.png, args.rounds)
