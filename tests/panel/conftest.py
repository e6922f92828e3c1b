"""Fixtures for the panel's browser tests: one Chromium per session, a screenshot after every test.

Every page records the events it sends and their results (browser.EVENTS_TAP_JS), for settle().

Every browser test saves a screenshot under test-artifacts/panel/ (git-ignored), passed or failed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from panel.browser import ARTIFACTS, CHROMIUM, CHROMIUM_FLAGS, EVENTS_TAP_JS


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (bash dev.sh test does)")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, request):
    context = browser.new_context(viewport={"width": 1600, "height": 1200}, accept_downloads=True)
    context.add_init_script(EVENTS_TAP_JS)  # so a test can settle(page): wait for every response it asked for
    page = context.new_page()
    page.set_default_timeout(20_000)
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    try:
        page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    finally:
        context.close()
