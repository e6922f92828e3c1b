"""The panel's browser tests use the session's one Chromium and the `page` fixture (tests/conftest.py).

Every page records the events it sends and their results (browser.EVENTS_TAP_JS), for settle().
Every browser test saves a screenshot under test-artifacts/panel/ (git-ignored), passed or failed; in CI only a
failed one.
"""
