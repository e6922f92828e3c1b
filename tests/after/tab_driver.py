"""Driving the Try · Evaluate · Export tab (for test_browser_after and make_screenshot_after)."""

from __future__ import annotations

from panel.browser import fill, open_tab, settle

TAB = "Try · Evaluate · Export"
PROMPT = ("Q: Add the numbers. 3 + 4", "A:")  # the demo's prompt-completion format, two lines


def open_after(page, server) -> None:
    page.set_default_timeout(
        120_000
    )  # a loaded CI machine paints the first page slowly; a wait costs nothing when fast
    page.goto(server.url)
    page.wait_for_selector("#main-tabs")
    open_tab(page, "main-tabs", TAB)
    page.wait_for_function(
        "id => (document.querySelector('#after-run input') || {}).value?.startsWith(id)", arg=server.run_id
    )
    settle(page)


def pick(page, elem_id: str, option: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.locator(f'#{elem_id} li[role=option][aria-label="{option}"]').click()


def ask(page, max_new_tokens: int = 16) -> None:
    box = page.locator("#after-max-new-tokens input")
    page.locator("#after-settings").get_by_text("Generation settings").click()
    fill(box, str(max_new_tokens))
    prompt = page.locator("#after-prompt textarea")
    prompt.click()
    prompt.press_sequentially(PROMPT[0])
    prompt.press("Enter")  # a new line (Shift+Enter would submit)
    prompt.press_sequentially(PROMPT[1])
    page.click("#after-ask")


def eval_losses(page) -> dict[str, float]:
    """{model: loss} of the rows of the evaluation table."""
    rows = [text.split() for text in page.locator("#after-eval-table [role=row]").all_inner_texts()]
    return {cells[0]: float(cells[1]) for cells in rows if cells and cells[0] != "model"}


def answer_of(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} textarea").input_value()
