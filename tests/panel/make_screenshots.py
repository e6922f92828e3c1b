"""Regenerate the screenshots of the panel on the demo preset, in README.md and docs/ (not a test).

    .venv/bin/python tests/panel/make_screenshots.py      # docs/screenshot.png, -run, -grpo and -ulysses

Starts `tunedeck ui --preset demo` on a fresh runs folder, photographs the Job tab,
runs the demo to its end from the page, and photographs the Run tab; then the same for the
Demo GRPO preset's Run tab (its reward chart and what the model writes); then the advice for a 7B LoRA
job's 64k-token rows on A100-80GB (2 GPUs per sequence), applied.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from panel.browser import CHROMIUM, CHROMIUM_FLAGS, PanelServer, wait_text  # noqa: E402


def main() -> int:
    from playwright.sync_api import sync_playwright

    docs = REPO / "docs"
    docs.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        with panel_page(p, Path(tmp) / "runs", "demo") as page:
            page.wait_for_selector("#estimate-chart .js-plotly-plot")
            # The whole Job tab in one tall viewport: a full-page shot of a short one catches the code view's
            # line numbers before CodeMirror has drawn the lines it had kept out of view (they no longer match).
            height = page.evaluate("() => document.documentElement.scrollHeight")
            page.set_viewport_size({"width": 1440, "height": height})
            page.wait_for_timeout(1000)
            page.screenshot(path=str(docs / "screenshot.png"), full_page=True)
            page.set_viewport_size({"width": 1440, "height": 1000})
            run_to_the_end(page)
            page.screenshot(path=str(docs / "screenshot-run.png"))
        # The Demo GRPO preset trained from the page: its Run tab, charts and answers, in one tall shot.
        with panel_page(p, Path(tmp) / "runs-grpo", "demo-grpo") as page:
            run_to_the_end(page)
            wait_text(page, "#run-answers", "What the model writes")
            page.locator("#run-answers").scroll_into_view_if_needed()
            page.screenshot(path=str(docs / "screenshot-grpo.png"), full_page=True)
        with panel_page(p, Path(tmp) / "runs-ulysses", "demo") as page:
            ulysses_advice(page, docs / "screenshot-ulysses.png")
    print(docs / "screenshot.png", docs / "screenshot-run.png", docs / "screenshot-grpo.png")
    return 0


def ulysses_advice(page, path: Path) -> None:
    """7B LoRA with 64k-token rows on A100-80GB: the advice (2 GPUs per sequence) applied, the form and files."""
    from panel.browser import fill, open_tab, set_field, wait_no_errors

    page.set_viewport_size({"width": 1280, "height": 1100})
    page.click("#preset-7b-lora-ddp")
    wait_text(page, "#notice", "Meant for 4x RTX 4090")
    page.wait_for_timeout(2000)  # the preset's machine lands in the GPU box before we type over it
    fill(page.locator("#gpu-memory textarea, #gpu-memory input").first, "80")
    wait_text(page, "#recommendation", "on A100-80GB")
    open_tab(page, "form-sections", "Dataset")
    set_field(page, "dataset.max_seq_length", "65536")
    wait_text(page, "#recommendation", "2 GPUs per sequence")
    page.click("#apply-recommendation")
    wait_text(page, "#notice", "Applied ZeRO-3 + 2 GPUs/sequence")
    wait_no_errors(page)
    page.locator("#form-sections [role=tablist] > button[role=tab]", has_text="Strategy").first.click()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(path), clip={"x": 0, "y": 150, "width": 1280, "height": 930})


@contextlib.contextmanager
def panel_page(p, runs_dir: Path, preset: str):
    """`tunedeck ui --preset PRESET` on a fresh runs folder, and a Chromium page on it once its estimate is drawn."""
    server = PanelServer(runs_dir, "--preset", preset)
    try:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1440, "height": 1000}, device_scale_factor=1)
        page.goto(server.url)
        wait_text(page, "#recommendation", "GB per GPU")
        yield page
        browser.close()
    finally:
        server.stop()


def run_to_the_end(page) -> None:
    page.click("#start-run")
    wait_text(page, "#run-state", "finished", timeout=300_000)
    page.wait_for_timeout(1500)


if __name__ == "__main__":
    raise SystemExit(main())
