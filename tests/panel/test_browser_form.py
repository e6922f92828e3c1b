"""The form as a person sees it, in headless Chromium against a real `tunedeck ui`: problems where
they are (an outline by computed style, a count on the section tab, a click that jumps to the
field), fields set for the person (QLoRA) and Fix buttons, readable text (WCAG AA) and tabs on
one line at 1280 px. One panel for the module."""

from __future__ import annotations

import pytest

from panel.browser import PanelServer, choose, contrast_failures, field, open_tab, set_field, settle, wait_text

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "7b-lora-ddp")
    yield server
    server.stop()


def load(page, server, width: int = 1440):
    page.set_viewport_size({"width": width, "height": 1000})
    page.set_default_timeout(60_000)  # a loaded 2-core CI machine paints the first page slowly
    page.goto(server.url)
    page.wait_for_selector("#file-view .cm-content")
    page.wait_for_function("document.querySelector('#global-batch').innerText.includes('Global batch')")
    settle(page)


def tab_label(page, title_start: str) -> str:
    return page.locator("#form-sections [role=tablist] > button[role=tab]", has_text=title_start).first.inner_text()


def outline(page, elem_id: str) -> dict:
    return page.evaluate(
        """id => { const s = getComputedStyle(document.getElementById(id));
                   return {style: s.outlineStyle, width: parseFloat(s.outlineWidth), color: s.outlineColor}; }""",
        elem_id,
    )


def test_an_invalid_value_is_outlined_at_its_field_with_its_message_and_counted_on_its_tab(page, server):
    load(page, server)
    open_tab(page, "form-sections", "LoRA/Quantization")
    assert outline(page, "field-lora-r")["style"] == "none"
    set_field(page, "lora.r", "0")
    wait_text(page, "#job-issues", "lora.r")
    settle(page)
    drawn = outline(page, "field-lora-r")  # what shows, not only the class (Gradio 6 inputs have no border)
    assert drawn["style"] == "solid" and drawn["width"] >= 2 and drawn["color"] == "rgb(220, 38, 38)", drawn
    assert "greater than or equal to 1" in page.inner_text("#field-lora-r .info-text")
    assert tab_label(page, "LoRA") == "LoRA/Quantization ✗1"
    assert tab_label(page, "Training") == "Training"
    set_field(page, "lora.r", "8")
    wait_text(page, "#job-issues", "No problems")
    settle(page)
    assert outline(page, "field-lora-r")["style"] == "none"
    assert tab_label(page, "LoRA") == "LoRA/Quantization"


def test_clicking_a_problem_opens_its_tab_and_advanced_fold_and_focuses_the_field(page, server):
    load(page, server)
    open_tab(page, "form-sections", "Training")
    set_field(page, "training.seed", "-1")  # Advanced: folded again once another tab is shown
    wait_text(page, "#job-issues", "training.seed")
    open_tab(page, "form-sections", "Model")
    page.locator("#field-model-name-or-path").wait_for(state="visible")
    page.locator('#job-issues a[href="#field-training-seed"]').click()
    page.wait_for_function("document.activeElement && document.activeElement.closest('#field-training-seed')")
    assert page.locator("#section-training-button").get_attribute("aria-selected") == "true"
    assert page.locator("#field-training-seed").is_visible()
    top = page.evaluate("document.getElementById('field-training-seed').getBoundingClientRect().top")
    assert 0 <= top < page.viewport_size["height"], top  # scrolled into view
    assert tab_label(page, "Training") == "Training ✗1"


def test_choosing_qlora_sets_4bit_nf4_says_so_and_shows_no_error(page, server):
    load(page, server)
    open_tab(page, "form-sections", "LoRA/Quantization")
    choose(page, "method", "qlora")
    wait_text(page, "#notice", "Set for you")
    settle(page)
    assert "quantization.bits" in page.inner_text("#notice")
    assert field(page, "quantization.bits").input_value() == "4"
    assert "error" not in page.inner_text("#job-issues")
    assert page.locator(".invalid").count() == 0
    assert page.locator("#start-run").is_enabled()
    # Sharded: the 4-bit storage and compute dtype follow the model's.
    open_tab(page, "form-sections", "Strategy")
    choose(page, "strategy.kind", "fsdp")
    wait_text(page, "#notice", "bnb_4bit_quant_storage")
    settle(page)
    assert "✗" not in page.inner_text("#job-issues")
    open_tab(page, "form-sections", "LoRA/Quantization")
    assert field(page, "quantization.bnb_4bit_quant_storage").input_value() == "bfloat16"


def test_a_fix_button_applies_its_fix_and_clears_its_problem(page, server):
    load(page, server)
    open_tab(page, "form-sections", "Training")
    field(page, "training.ddp_find_unused_parameters").check()  # LoRA under DDP: a warning with one fix
    wait_text(page, "#job-issues", "ddp_find_unused_parameters")
    settle(page)
    button = page.locator("#job-fixes button", has_text="training.ddp_find_unused_parameters=false")
    assert button.is_visible()
    assert tab_label(page, "Training") == "Training ⚠1"
    drawn = outline(page, "field-training-ddp-find-unused-parameters")
    assert drawn["style"] == "solid" and drawn["width"] >= 2, drawn  # a warning is outlined too
    button.click()
    wait_text(page, "#notice", "Fixed")
    wait_text(page, "#job-issues", "No problems")
    settle(page)
    assert not field(page, "training.ddp_find_unused_parameters").is_checked()
    assert not page.locator("#job-fixes").is_visible()
    assert page.locator("#start-run").is_enabled()  # the files shown are the fixed job's (Start's digest)


def test_every_text_of_the_job_tab_meets_wcag_aa_contrast(page, server):
    load(page, server)
    open_tab(page, "form-sections", "LoRA/Quantization")
    set_field(page, "lora.r", "0")  # an error's message and outline are part of what must read well
    wait_text(page, "#job-issues", "lora.r")
    settle(page)
    checked, failures = 0, []
    for section in ("Model", "Dataset", "LoRA/Quantization", "Strategy", "Training", "Hardware/Launch"):
        open_tab(page, "form-sections", section)
        settle(page)
        count, found = contrast_failures(page)
        checked, failures = checked + count, failures + found
    assert checked > 300, checked  # the walk saw the page's text
    assert not failures, "\n".join(str(f) for f in failures[:20])


def test_section_tabs_fit_on_one_line_at_1280_px_even_with_counts(page, server):
    load(page, server, width=1280)
    open_tab(page, "form-sections", "Training")
    set_field(page, "training.seed", "-1")
    open_tab(page, "form-sections", "LoRA/Quantization")
    set_field(page, "lora.r", "0")
    wait_text(page, "#form-sections [role=tablist]", "✗1")
    settle(page)
    tops = page.evaluate(
        "[...document.querySelectorAll('#form-sections [role=tablist] > button[role=tab]')]"
        ".filter(b => b.offsetParent).map(b => [b.innerText, Math.round(b.getBoundingClientRect().top)])"
    )
    assert len(tops) == 6 and len({top for _, top in tops}) == 1, tops
    assert not page.locator("#form-sections .overflow-menu > button").is_visible()
