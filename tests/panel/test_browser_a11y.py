"""The page by keyboard, for a screen reader and in a narrow window (issue 31, item 8; app/keyboard.py), in
headless Chromium against a real `tunedeck ui` with one finished run: the skip link, tab bars and radio
groups as single tab stops moved by arrow keys, dropdowns that open only when asked, labels as names and
help as descriptions, named icon links, a focus outline at every stop, one column below 1100 px with a
memory table that keeps whole words, and axe-core (tests/panel/node_modules, fetched by `bash dev.sh test`)
on every tab at 1400 and 900 px. One panel and one page for the module."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import expect

from panel.browser import ARTIFACTS, EVENTS_TAP_JS, PanelServer, open_tab, settle, wait_file_text, wait_text
from tunedeck.app.form import element_id, section_id
from tunedeck.app.keyboard import SKIP_TEXT
from tunedeck.backend.runs.supervisor import write_status
from tunedeck.backend.spec import load_presets, spec_to_dict
from tunedeck.backend.spec.fields import FIELDS_BY_PATH, FORM_FIELDS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]

AXE = Path(__file__).parent / "node_modules" / "axe-core" / "axe.min.js"
TABS = ("Job", "Run", "GPUs", "Try · Evaluate · Export")
RUN_ID = "20260101-120000-a1b2c3"
RUN_TITLE = "Qwen/Qwen2.5-7B-Instruct · lora · ddp · 4xA100-80GB"


def finished_run(runs_dir: Path) -> None:
    """A run folder as a finished 3-step run leaves it: the Run tab shows its picker, charts and log."""
    folder = runs_dir / RUN_ID
    (folder / "logs").mkdir(parents=True)
    now = time.time()
    write_status(folder, {"run_id": RUN_ID, "state": "finished", "title": RUN_TITLE, "created_at": now - 60,
                          "started_at": now - 50, "ended_at": now - 10, "exit_code": 0, "error": None})  # fmt: skip
    (folder / "job.yaml").write_text(yaml.safe_dump(spec_to_dict(load_presets()["7b-lora-ddp"].build())))
    records = [{"event": "start", "world_size": 4, "max_steps": 3}]
    records += [{"event": "log", "step": s, "max_steps": 3, "loss": 3.0 / s, "time": now - 40 + s} for s in (1, 2, 3)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "logs" / "rank0.log").write_text("training...\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    finished_run(runs)
    server = PanelServer(runs, "--preset", "7b-lora-ddp")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(browser, server):
    """One page for the module (each test leaves it on the Job tab's Model section at 1400 px)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_init_script(EVENTS_TAP_JS)
    page = context.new_page()
    page.set_default_timeout(60_000)  # a loaded 2-core machine paints the first page slowly
    page.goto(server.url)
    page.wait_for_function("document.querySelector('#job-issues')?.innerText.trim()", timeout=120_000)  # painted
    page.wait_for_function("window.tunedeckKeyboard !== undefined")
    settle(page)
    yield page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "a11y-last.png"), full_page=True)
    context.close()


@pytest.fixture(autouse=True)
def at_rest(page):
    yield
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.keyboard.press("Escape")
    open_tab(page, "main-tabs", "Job")
    open_tab(page, "form-sections", "Model")


def focused(page) -> dict:
    return page.evaluate(
        """() => { const e = document.activeElement, block = e && e.closest('[id]');
                   return {tag: e.tagName, role: e.getAttribute('role'), text: (e.innerText || e.value || '').trim(),
                           id: e.id, in: block ? block.id : null}; }"""
    )


def from_the_top(page) -> None:
    """Where a person who just opened the page starts: focus on the document, none on a control."""
    page.evaluate("() => { document.activeElement?.blur(); window.scrollTo(0, 0); }")
    page.evaluate("() => { const b = document.body; b.tabIndex = -1; b.focus(); b.removeAttribute('tabindex'); }")


def list_open(page, elem_id: str) -> bool:
    """Whether a dropdown shows its options (as drawn, not only its aria-expanded)."""
    return page.evaluate(
        """id => { const box = document.querySelector('#' + id + ' input[role=combobox]');
                   const list = document.querySelector('#' + id + ' ul[role=listbox]');
                   return box.getAttribute('aria-expanded') === 'true' || !!(list && list.checkVisibility()); }""",
        elem_id,
    )


def wait_list(page, elem_id: str, shown: bool) -> None:
    page.wait_for_function(
        "([id, shown]) => !!document.querySelector('#' + id + ' ul[role=listbox]')?.checkVisibility() === shown",
        arg=[elem_id, shown],
    )


def test_tab_from_the_top_reaches_the_skip_link_then_the_first_field(page):
    from_the_top(page)
    page.keyboard.press("Tab")
    assert focused(page)["text"] == SKIP_TEXT
    box = page.get_by_role("link", name=SKIP_TEXT).bounding_box()
    assert box and box["y"] >= 0 and box["height"] > 10, box  # shown once focused
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement.closest('#field-model-name-or-path')")
    # Without it: the presets and uploads, then one stop per tab bar, then the field.
    from_the_top(page)
    stops = []
    while not stops or stops[-1]["in"] != "field-model-name-or-path":
        page.keyboard.press("Tab")
        stops.append(focused(page))
        assert len(stops) < 30, stops
    assert [s["text"] for s in stops[-3:-1]] == ["Job", "Model"], stops


def test_a_tab_bar_is_one_tab_stop_and_arrow_keys_choose_the_tab(page):
    page.locator("#tab-job-button").focus()
    page.keyboard.press("Tab")
    assert focused(page)["id"] == "section-model-button"  # not Run, GPUs, ...: they are arrow keys away
    page.keyboard.press("ArrowRight")
    assert focused(page)["id"] == "section-dataset-button"
    expect(page.locator("#section-dataset-button")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#field-dataset-path")).to_be_visible()
    page.keyboard.press("End")
    expect(page.locator("#section-hardware-launch-button")).to_be_focused()
    expect(page.locator("#section-hardware-launch-button")).to_have_attribute("aria-selected", "true")
    page.keyboard.press("ArrowRight")  # round to the first
    expect(page.locator("#section-model-button")).to_be_focused()
    page.keyboard.press("Shift+Tab")
    assert focused(page)["id"] == "tab-job-button"
    page.keyboard.press("ArrowRight")
    expect(page.locator("#tab-run-button")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#run-select")).to_be_visible()
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#tab-job-button")).to_have_attribute("aria-selected", "true")


def test_a_radio_group_is_one_tab_stop_and_arrow_keys_choose_the_option(page):
    page.locator("#file-tabs input[value='job.yaml']").focus()
    page.keyboard.press("Tab")  # past the group, to the code viewer's download link
    assert focused(page)["in"] == "file-view", focused(page)
    page.keyboard.press("Shift+Tab")
    assert focused(page)["text"] == "job.yaml" or page.evaluate("document.activeElement.value") == "job.yaml"
    page.keyboard.press("ArrowRight")
    expect(page.locator("#file-tabs input[value='accelerate_config.yaml']")).to_be_checked()
    expect(page.locator("#file-view [data-testid=block-label]")).to_have_text("accelerate_config.yaml")
    wait_file_text(page, "distributed_type")  # the server drew the chosen file
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#file-view [data-testid=block-label]")).to_have_text("job.yaml")


def test_a_dropdown_opens_only_when_asked_and_closes_when_left(page):
    dtype = element_id("model.dtype")
    box = page.locator(f"#{dtype} input[role=combobox]")
    page.locator(f"#{element_id('model.name_or_path')} input").focus()
    page.keyboard.press("Tab")
    expect(box).to_be_focused()
    page.wait_for_timeout(300)
    assert not list_open(page, dtype)  # focus alone opens nothing
    for opener in ("Enter", " ", "ArrowDown"):
        page.keyboard.press(opener)
        wait_list(page, dtype, shown=True)
        page.keyboard.press("Escape")
        wait_list(page, dtype, shown=False)
    page.keyboard.press("ArrowDown")  # open, on the chosen option
    page.keyboard.press("ArrowDown")  # the next one
    active = page.locator(f"#{dtype} li[role=option].active")
    expect(active).not_to_have_attribute("aria-label", "bfloat16")
    chosen = active.get_attribute("aria-label")
    page.keyboard.press("Enter")
    expect(box).to_have_value(chosen)
    expect(box).to_be_focused()  # Gradio blurs it: the focus stays where the person is
    expect(box).to_have_attribute("aria-expanded", "false")
    wait_list(page, dtype, shown=False)  # once its fade-out ends
    settle(page)
    wait_file_text(page, f"dtype: {chosen}")
    box.click()  # a click opens the field the keyboard is on
    wait_list(page, dtype, shown=True)
    page.keyboard.press("Tab")  # leaving it closes it: no list left floating under the field
    page.wait_for_timeout(500)
    assert not list_open(page, dtype)
    expect(page.locator("ul[role=listbox]:visible")).to_have_count(0)
    box.click()  # a click opens it, as ever
    wait_list(page, dtype, shown=True)
    page.locator(f"#{dtype} li[role=option][aria-label=bfloat16]").click()
    expect(box).to_have_value("bfloat16")
    settle(page)


def test_fields_are_named_by_their_labels_and_described_by_their_help(page):
    checked = 0
    for title in ("Model", "LoRA/Quantization", "Training"):
        open_tab(page, "form-sections", title)
        for field in FORM_FIELDS:
            box = page.locator(f"#{element_id(field.path)}").locator("input, textarea").first
            if field.section != title or not box.is_visible():
                continue
            expect(box).to_have_accessible_name(field.label)
            expect(box).to_have_accessible_description(re.compile("^" + re.escape(field.help[:40])))
            checked += 1
    assert checked >= 10, checked
    # A problem is the description, and the field says it is invalid.
    open_tab(page, "form-sections", "LoRA/Quantization")
    rank = page.locator(f"#{element_id('lora.r')} input")
    rank.fill("0")
    wait_text(page, "#job-issues", "lora.r")
    expect(rank).to_have_attribute("aria-invalid", "true")
    expect(rank).to_have_accessible_description(re.compile("greater than or equal to 1"))
    expect(rank).to_have_accessible_name(FIELDS_BY_PATH["lora.r"].label)
    rank.fill("16")
    page.wait_for_function("!document.querySelector('#job-issues').innerText.includes('lora.r')")
    expect(rank).not_to_have_attribute("aria-invalid", "true")


def test_the_code_viewer_names_its_download_and_copy(page):
    download = page.get_by_role("link", name="Download job.yaml")
    expect(download).to_be_visible()
    expect(download.locator("button")).to_have_attribute("tabindex", "-1")  # one stop, the link
    expect(page.get_by_role("button", name="Copy job.yaml")).to_be_visible()
    expect(page.get_by_role("region", name="job.yaml (read only)")).to_have_attribute("tabindex", "0")


def walk(page, panel: str, limit: int = 120) -> list[dict]:
    """Tab from a tab's own button through its panel: each stop in it, with the outline drawn around it."""
    page.locator(f"#{panel}-button").focus()
    stops: list[dict] = []
    for _ in range(limit):
        page.keyboard.press("Tab")
        stop = page.evaluate(
            """panel => { const e = document.activeElement, s = getComputedStyle(e), block = e.closest('[id]');
                          return {inside: !!e.closest('#' + panel), in: block && block.id,
                                  what: e.tagName + ' ' + (e.getAttribute('aria-label') || e.innerText || e.value || '').trim().slice(0, 40),
                                  outline: s.outlineStyle, width: parseFloat(s.outlineWidth)}; }""",
            panel,
        )
        if stop["inside"]:
            stops.append(stop)
        elif stops or not stop["in"] or not stop["in"].endswith("-button"):
            return stops  # past the panel (the other tabs' buttons come first where a tab bar is many stops)
    raise AssertionError(f"more than {limit} tab stops in #{panel}")


def test_every_control_draws_a_focus_outline(page):
    walked = {}
    for title, panel in zip(TABS, ("tab-job", "tab-run", "tab-gpus", "tab-after")):
        open_tab(page, "main-tabs", title)
        walked[title] = walk(page, panel)  # the GPUs tab of a machine without one has no control
        faint = [s for s in walked[title] if s["outline"] in ("none", "hidden") or s["width"] < 2]
        assert not faint, (title, faint)
    assert len(walked["Job"]) > 20 and len(walked["Run"]) > 5 and len(walked[TABS[-1]]) > 10, walked
    open_tab(page, "main-tabs", "Job")
    page.locator(f"#{element_id('model.name_or_path')} input").focus()
    page.keyboard.press("Tab")  # the dropdown, by keyboard: outlined and closed
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(
        path=str(ARTIFACTS / "a11y-focused-dropdown.png"), clip={"x": 0, "y": 0, "width": 1400, "height": 700}
    )


def test_below_1100_px_the_job_tab_is_one_column_with_whole_words_and_a_full_row_run_picker(page):
    def box(selector: str) -> dict:
        return page.locator(selector).first.bounding_box()

    form, status = box("#form-sections"), box("#job-issues")
    assert status["x"] > form["x"] + form["width"] - 1  # wide: side by side
    page.set_viewport_size({"width": 900, "height": 1000})
    page.wait_for_timeout(300)
    form, status = box("#form-sections"), box("#job-issues")
    assert status["y"] >= form["y"] + form["height"] and abs(status["x"] - form["x"]) < 30, (form, status)
    broken = page.evaluate(BROKEN_WORDS_JS, "#estimate-table [role=gridcell], #estimate-table th")
    assert not broken, broken
    assert page.evaluate(
        "() => { const w = document.querySelector('#estimate-table .table-wrap'); return w.scrollWidth > w.clientWidth; }"
    )
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "a11y-job-900.png"), full_page=True)
    open_tab(page, "main-tabs", "Run")
    page.wait_for_function(f"() => document.querySelector('#run-select input').value.includes('{RUN_ID}')")
    picker, stop, row = box("#run-select"), box("#stop-run"), box("#tab-run")
    assert picker["width"] > row["width"] * 0.9 and stop["y"] >= picker["y"] + picker["height"], (picker, stop, row)
    assert page.evaluate(
        "() => { const i = document.querySelector('#run-select input'); return i.scrollWidth <= i.clientWidth; }"
    )
    page.screenshot(path=str(ARTIFACTS / "a11y-run-900.png"), full_page=True)


# Words (runs of letters between spaces or hyphens) whose letters lie on more than one line.
BROKEN_WORDS_JS = """selector => {
  const broken = [];
  for (const cell of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node; (node = walker.nextNode());) {
      for (const m of node.textContent.matchAll(/[^\\s-]+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}"""


def test_axe_finds_nothing_serious_on_any_tab_at_1400_and_900_px(page):
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: `bash dev.sh test` fetches it (npm install --prefix tests/panel axe-core)")
    page.add_script_tag(path=str(AXE))
    found = {}
    for width in (1400, 900):
        page.set_viewport_size({"width": width, "height": 1000})
        for title in TABS:
            open_tab(page, "main-tabs", title)
            settle(page)
            violations = page.evaluate(
                """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
                     .filter(v => v.impact === 'serious' || v.impact === 'critical')
                     .map(v => v.id + ' (' + v.impact + '): ' + v.help + ' at ' + v.nodes.map(n => n.target.join(' ')).slice(0, 3).join(', '))"""
            )
            if violations:
                found[f"{title} at {width} px"] = violations
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"a11y-{width}-{section_id(title)}.png"), full_page=True)
    assert not found, json.dumps(found, indent=1, ensure_ascii=False)


def test_the_fixing_costs_an_idle_page_nothing(page):
    page.wait_for_timeout(1000)
    before = page.evaluate("({...window.tunedeckKeyboard})")
    page.wait_for_timeout(3000)  # the Job tab at rest: no timer, no event
    after = page.evaluate("({...window.tunedeckKeyboard})")
    assert after["passes"] == before["passes"], (before, after)
    assert before["ms"] / max(before["passes"], 1) < 20, before  # a pass after a change: about 1 ms here
