"""The form as a person sees it, in headless Chromium against a real `tunedeck ui`: problems where
they are (an outline by computed style, a count on the section tab, a click that jumps to the
field), fields set for the person (QLoRA) and Fix buttons, readable text (WCAG AA) and tabs on
one line at 1280 px. One panel for the module."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from panel.browser import (
    PanelServer,
    choose,
    contrast_failures,
    field,
    open_tab,
    set_field,
    wait_no_errors,
    wait_text,
)
from tunedeck.app.form import section_id

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "7b-lora-ddp")
    yield server
    server.stop()


def load(page, server, width: int = 1440):
    page.set_viewport_size({"width": width, "height": 1000})
    page.set_default_timeout(60_000)  # a loaded 2-core machine paints the first page slowly
    page.goto(server.url)
    wait_no_errors(page, timeout=120_000)  # the page load's paint has arrived (the 7B job: a warning, no GPU here)


def tab(page, title_start: str):
    return page.locator("#form-sections [role=tablist] > button[role=tab]", has_text=title_start).first


OUTLINE_JS = """id => { const e = document.getElementById(id); if (!e) return null; const s = getComputedStyle(e);
                        return {style: s.outlineStyle, width: parseFloat(s.outlineWidth), color: s.outlineColor}; }"""


def outline(page, elem_id: str, drawn: bool) -> dict:
    """The field's outline as the browser draws it (computed style), once it is (not) drawn."""
    page.wait_for_function(
        f"id => {{ const o = ({OUTLINE_JS})(id); return o && (o.style !== 'none' && o.width > 0) === {str(drawn).lower()}; }}",
        arg=elem_id,
    )
    return page.evaluate(OUTLINE_JS, elem_id)


def test_an_invalid_value_is_outlined_at_its_field_with_its_message_and_counted_on_its_tab(page, server):
    load(page, server)
    open_tab(page, "form-sections", "LoRA/Quantization")
    outline(page, "field-lora-r", drawn=False)
    set_field(page, "lora.r", "0")
    wait_text(page, "#job-issues", "lora.r")
    drawn = outline(page, "field-lora-r", drawn=True)  # what shows, not only the class (Gradio 6 inputs: no border)
    assert drawn["style"] == "solid" and drawn["width"] >= 2 and drawn["color"] == "rgb(220, 38, 38)", drawn
    expect(page.locator("#field-lora-r .info-text")).to_contain_text("greater than or equal to 1")
    expect(tab(page, "LoRA")).to_have_text("LoRA/Quantization ✗1")
    expect(tab(page, "Training")).to_have_text("Training")
    set_field(page, "lora.r", "8")
    wait_no_errors(page)
    outline(page, "field-lora-r", drawn=False)
    expect(tab(page, "LoRA")).to_have_text("LoRA/Quantization")


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
    expect(tab(page, "Training")).to_have_text("Training ✗1")


def test_choosing_qlora_sets_4bit_nf4_says_so_and_shows_no_error(page, server):
    load(page, server)
    open_tab(page, "form-sections", "LoRA/Quantization")
    choose(page, "method", "qlora")
    wait_text(page, "#notice", "Set for you")
    assert "quantization.bits" in page.inner_text("#notice")
    expect(field(page, "quantization.bits")).to_have_value("4")
    wait_no_errors(page)
    expect(page.locator(".invalid")).to_have_count(0)
    expect(page.locator("#start-run")).to_be_enabled()
    # Sharded: the 4-bit storage and compute dtype follow the model's.
    open_tab(page, "form-sections", "Strategy")
    choose(page, "strategy.kind", "fsdp")
    wait_text(page, "#notice", "bnb_4bit_quant_storage")
    expect(page.locator("#start-run")).to_be_enabled()  # no error: 4-bit weights FSDP can shard
    assert "✗" not in page.inner_text("#job-issues")
    open_tab(page, "form-sections", "LoRA/Quantization")
    expect(field(page, "quantization.bnb_4bit_quant_storage")).to_have_value("bfloat16")


def test_a_fix_button_applies_its_fix_and_clears_its_problem(page, server):
    load(page, server)
    open_tab(page, "form-sections", "Training")
    field(page, "training.ddp_find_unused_parameters").check()  # LoRA under DDP: a warning with one fix
    wait_text(page, "#job-issues", "ddp_find_unused_parameters")
    button = page.locator("#job-fixes button", has_text="training.ddp_find_unused_parameters=false")
    expect(button).to_be_visible()
    expect(tab(page, "Training")).to_have_text("Training ⚠1")
    drawn = outline(page, "field-training-ddp-find-unused-parameters", drawn=True)  # a warning is outlined too
    assert drawn["style"] == "solid" and drawn["width"] >= 2, drawn
    button.click()
    wait_text(page, "#notice", "Fixed")
    wait_no_errors(page)
    expect(field(page, "training.ddp_find_unused_parameters")).not_to_be_checked()
    expect(page.locator("#job-fixes")).to_be_hidden()
    expect(page.locator("#start-run")).to_be_enabled()


def test_rows_cut_at_a_short_max_seq_length_are_a_warning_whose_fix_clears_it(page, server):
    load(page, server)
    page.click("#preset-demo")
    wait_text(page, "#notice", "Loaded preset")
    page.locator("#dataset-preview-section").get_by_text("Dataset preview").first.click()
    # Measured by itself once the demo's data is the job's (a subprocess: imports take seconds on 2 cores).
    wait_text(page, "#dataset-preview", "64 (0 rows truncated)", timeout=120_000)
    open_tab(page, "form-sections", "Dataset")
    set_field(page, "dataset.max_seq_length", "12")
    wait_text(page, "#job-issues", "rows measured")  # no new measurement: the same rows, read for 12 tokens
    issues = page.inner_text("#job-issues")
    assert "2,000 of 2,000 rows measured (100%) are longer than max_seq_length (12 tokens)" in issues
    assert "the completion, the only part the loss is computed on, is cut away whole in" in issues
    assert "Set it to 24 to keep 95% of rows whole (p95: 18 tokens)" in issues
    wait_text(page, "#dataset-preview", "12 (2,000 rows truncated: the answer cut away whole in")
    button = page.locator("#job-fixes button", has_text="dataset.max_seq_length=24")
    expect(button).to_be_visible()
    expect(tab(page, "Dataset")).to_have_text("Dataset ⚠1")
    button.click()
    wait_text(page, "#notice", "Fixed")
    wait_text(page, "#dataset-preview", "24 (0 rows truncated)")
    expect(page.locator("#job-issues")).not_to_contain_text("rows measured")
    expect(field(page, "dataset.max_seq_length")).to_have_value("24")
    expect(tab(page, "Dataset")).to_have_text("Dataset")


def test_every_text_of_the_job_tab_meets_wcag_aa_contrast(page, server):
    load(page, server)
    open_tab(page, "form-sections", "LoRA/Quantization")
    set_field(page, "lora.r", "0")  # an error's message and outline are part of what must read well
    wait_text(page, "#job-issues", "lora.r")
    outline(page, "field-lora-r", drawn=True)
    checked, failures = 0, []
    for section in ("Model", "Dataset", "LoRA/Quantization", "Strategy", "Training", "Hardware/Launch"):
        tab(page, section).click()  # by its start: a tab with problems reads "LoRA/Quantization ✗1"
        page.locator(f"#{section_id(section)} .block").first.wait_for()
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
    expect(tab(page, "LoRA")).to_have_text("LoRA/Quantization ✗1")
    expect(tab(page, "Training")).to_have_text("Training ✗1")
    tops = page.evaluate(
        "[...document.querySelectorAll('#form-sections [role=tablist] > button[role=tab]')]"
        ".filter(b => b.offsetParent).map(b => [b.innerText, Math.round(b.getBoundingClientRect().top)])"
    )
    assert len(tops) == 6 and len({top for _, top in tops}) == 1, tops
    assert not page.locator("#form-sections .overflow-menu > button").is_visible()


def test_the_rewards_tab_shows_for_grpo_only(page, server):
    load(page, server)
    rewards = tab(page, "Rewards")
    expect(rewards).to_have_count(0)  # an SFT job's form has no GRPO fields: no tab for them
    open_tab(page, "form-sections", "Training")
    choose(page, "objective", "grpo")
    wait_text(page, "#job-issues", "dataset.format")  # GRPO learns from prompts: the format's fix is offered
    expect(rewards).to_be_visible()
    open_tab(page, "form-sections", "Rewards")
    expect(field(page, "grpo.rewards")).to_have_value("exact_answer")
    expect(field(page, "grpo.num_generations")).to_have_value("8")
    open_tab(page, "form-sections", "Training")
    choose(page, "objective", "sft")
    wait_no_errors(page)
    expect(rewards).to_have_count(0)
