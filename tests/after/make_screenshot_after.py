"""Regenerate the screenshot (docs/after-training.md) of the Try · Evaluate · Export tab (not a test).

    .venv/bin/python tests/after/make_screenshot_after.py     # writes docs/screenshot-after.png

Trains the demo (about a minute on CPU), starts `tunedeck ui` on its runs folder, answers a
held-out example with the adapter beside the base model and the data's answer, evaluates 16 examples and merges in bfloat16.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from panel.browser import CHROMIUM, CHROMIUM_FLAGS, EVENTS_TAP_JS, PanelServer, fill, wait_text  # noqa: E402

from after.helpers import train_demo  # noqa: E402
from after.tab_driver import open_after  # noqa: E402

WIDTH = 1440


def main() -> int:
    from PIL import Image
    from playwright.sync_api import sync_playwright

    out = REPO / "docs" / "screenshot-after.png"
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        runs_dir, run_id = train_demo(Path(tmp) / "runs", {})
        server = PanelServer(runs_dir)
        server.run_id = run_id
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": WIDTH, "height": 1000}, device_scale_factor=1)
            page.add_init_script(EVENTS_TAP_JS)
            open_after(page, server)
            page.click("#after-example")  # a held-out row, the data's answer beside the adapter's and the base's
            wait_text(page, "#after-example-note", "held-out row")
            page.click("#after-ask")
            wait_text(page, "#after-status", "the data's answer", timeout=300_000)
            fill(page.locator("#after-eval-limit input"), "16")
            page.click("#after-evaluate")
            wait_text(page, "#after-eval-table", "final", timeout=300_000)
            page.click("#after-merge")
            wait_text(page, "#after-merge-status", "saved to", timeout=300_000)
            wait_text(page, "#after-serve", "vllm serve")
            page.wait_for_timeout(1500)
            page.screenshot(path=str(out), full_page=True)
            browser.close()
        finally:
            server.stop()
    image = Image.open(out)
    image.convert("P", palette=Image.Palette.ADAPTIVE, colors=256).save(out, optimize=True)  # a third of the bytes
    print(f"wrote {out} ({image.width}x{image.height})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
