"""Honest fit and the dataset preview in the real page (headless Chromium, 1280 px wide).

One panel for the module; screenshots under test-artifacts/panel/ (conftest.py).
"""

from __future__ import annotations

import re
import shutil

import pytest
from estimate.gpu_runs import fake_gpu_run

from panel.browser import (
    ARTIFACTS,
    PanelServer,
    field,
    fill,
    open_tab,
    set_field,
    settle,
    show_file,
    text_of,
    wait_file_text,
    wait_text,
)
from tunedeck.backend.estimate import speed
from tunedeck.backend.estimate.memory_job import Job, input_values
from tunedeck.backend.spec.presets import resolve_spec as load_preset

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "demo")
    yield server
    server.stop()


def load(page, server):
    page.set_viewport_size({"width": 1280, "height": 1000})
    page.set_default_timeout(60_000)  # a busy 2-core machine
    page.goto(server.url)
    page.wait_for_selector("#file-view .cm-content")
    page.wait_for_function("document.querySelector('#global-batch').innerText.includes('Global batch')")


def gpu_box(page):
    return page.locator("#gpu-memory textarea, #gpu-memory input").first


def start_enabled(page) -> bool:
    return page.locator("#start-run").is_enabled()


def test_70b_qlora_on_24_gb_is_a_fit_error_and_applying_the_advice_clears_one(page, server):
    load(page, server)
    page.click("#preset-70b-qlora-zero3")
    # No GPU here: the preset's own machine (8x L40S, 48 GB) is put in the boxes, where it is advised as set.
    wait_text(page, "#notice", "Meant for 8x L40S (48 GB), 256 GB RAM")
    wait_text(page, "#recommendation", "Keep ZeRO-3")
    assert gpu_box(page).input_value() == "L40S"  # a GPU the speed table knows: its memory and its speed
    assert "Speed on L40S:" in text_of(page, "#recommendation")

    fill(gpu_box(page), "24")
    wait_text(page, "#job-issues", "the GPU has 24 GB")  # not an answer to a half-typed "2"
    issues = text_of(page, "#job-issues")
    assert "strategy.kind" in issues and "39.5 GB per GPU while loading" in issues and "at least 44 GB" in issues
    page.wait_for_function("document.querySelector('#start-run').disabled")
    assert not page.locator("#apply-recommendation").is_enabled()  # nothing fits 24 GB: no way out to apply
    page.screenshot(path=str(ARTIFACTS / "fit-70b-qlora-on-24gb.png"), full_page=True)

    # On its 48 GB GPUs, pick DDP from the table's list: every GPU would hold the whole 4-bit model and more.
    fill(gpu_box(page), "48")
    wait_text(page, "#recommendation", "Keep ZeRO-3")
    page.locator("#estimate-pick input").click()
    page.locator('#estimate-pick li[role=option][aria-label^="DDP"]').click()
    page.click("#apply-strategy")
    wait_text(page, "#notice", "Applied DDP")
    wait_text(page, "#job-issues", "does not fit")
    assert "use FSDP FULL_SHARD instead" in text_of(page, "#job-issues")
    page.wait_for_function("document.querySelector('#start-run').disabled")
    page.screenshot(path=str(ARTIFACTS / "fit-70b-qlora-ddp-on-48gb.png"), full_page=True)

    assert page.locator("#apply-recommendation").is_enabled()
    page.click("#apply-recommendation")
    wait_text(page, "#notice", "Applied FSDP FULL_SHARD")
    assert "load a 4-bit base on every rank" in text_of(page, "#notice")  # what Apply set beside the strategy
    wait_text(page, "#recommendation", "Keep FSDP FULL_SHARD")
    settle(page)
    assert "does not fit" not in text_of(page, "#job-issues")
    assert_only_the_no_gpu_warning(text_of(page, "#job-issues"))  # Apply left no warning behind
    page.wait_for_function("!document.querySelector('#start-run').disabled")


def assert_only_the_no_gpu_warning(issues: str) -> None:
    """No error, and no warning but the one every GPU job gets on this machine, which has no GPU (Start here
    would refuse it: the bundle runs elsewhere)."""
    assert "✗" not in issues, issues
    warnings = [line for line in issues.splitlines() if line.lstrip("- ").startswith("⚠") and "warning" not in line]
    assert all("no NVIDIA GPU found here" in line for line in warnings), issues


def test_rows_too_long_for_one_gpu_get_the_gpus_per_sequence_that_fit(page, server):
    """64k-token rows of a 7B LoRA job fit no A100-80GB alone: the advice is 2 GPUs per sequence, applied in one click."""
    load(page, server)
    page.click("#preset-7b-lora-ddp")
    wait_text(page, "#notice", "Meant for 4x RTX 4090")
    wait_text(page, "#recommendation", "Keep DDP")
    settle(page)  # the preset's machine is in the GPU box before a person types over it
    fill(gpu_box(page), "80")
    wait_text(page, "#recommendation", "on A100-80GB")
    open_tab(page, "form-sections", "Dataset")
    set_field(page, "dataset.max_seq_length", "65536")
    wait_text(page, "#job-issues", "does not fit")
    wait_text(page, "#recommendation", "2 GPUs per sequence")
    assert "rows of 65,536 tokens" in text_of(page, "#recommendation")
    page.click("#apply-recommendation")
    wait_text(page, "#notice", "Applied ZeRO-3 + 2 GPUs/sequence")
    settle(page)
    assert "does not fit" not in text_of(page, "#job-issues")
    page.wait_for_function("!document.querySelector('#start-run').disabled")
    assert_only_the_no_gpu_warning(text_of(page, "#job-issues"))  # nor the advice to use DDP for a small LoRA base
    page.locator("#form-sections [role=tablist] > button[role=tab]", has_text="Strategy").first.click()
    assert field(page, "strategy.sequence_parallel").input_value() == "2"
    batch = text_of(page, "#global-batch")
    assert "Global batch: 16" in batch and "2 sequence groups (4 processes, 2 GPUs per sequence)" in batch
    show_file(page, "accelerate_config.yaml")
    wait_file_text(page, "parallelism_config_sp_size: 2")
    page.screenshot(path=str(ARTIFACTS / "ulysses-64k-rows.png"), full_page=True)


def test_the_estimate_table_reads_at_1280_px(page, server):
    load(page, server)
    page.click("#preset-13b-lora-fsdp")
    wait_text(page, "#recommendation", "Keep FSDP FULL_SHARD")
    page.wait_for_selector("#estimate-chart .js-plotly-plot")
    wait_text(page, "#estimate-order", "Speed")
    headers = page.locator("#estimate-table thead th")
    heights = [h.bounding_box()["height"] for h in headers.all() if h.is_visible()]
    assert heights and max(heights) < 70  # at most two lines each, not a letter per line
    largest = page.locator("#estimate-table thead th", has_text="Largest term").first
    assert largest.is_visible() and largest.evaluate("e => e.scrollWidth <= e.clientWidth + 1")
    table = page.inner_text("#estimate-table")
    assert all(name in table for name in ("FSDP FULL_SHARD (current, ★ recommended)", "ZeRO-3 + NVMe offload", "DDP"))
    page.locator("#estimate-section").screenshot(path=str(ARTIFACTS / "estimate-table-1280.png"))


def price_box(page):
    return page.locator("#gpu-price textarea, #gpu-price input").first


def table_headers(page) -> list[str]:
    return [" ".join(h.split()) for h in page.locator("#estimate-table thead th").all_inner_texts()]


def test_a_price_per_gpu_hour_fills_the_cost_column_and_a_bad_one_says_what_the_box_takes(page, server):
    load(page, server)
    ram_box = page.locator("#host-ram textarea, #host-ram input").first
    own = gpu_box(page).input_value(), ram_box.input_value()  # this machine's, on a fresh page
    page.click("#preset-7b-lora-ddp")
    wait_text(page, "#notice", "Meant for 4x RTX 4090")
    wait_text(page, "#recommendation", "Speed on RTX 4090:")
    settle(page)
    assert "Cost" not in table_headers(page)  # no price: no empty column
    fill(price_box(page), "2.5")  # a scripted fill, as a paste or autofill makes
    wait_text(page, "#recommendation", "at 2.5 per GPU-hour × 4 GPUs")
    page.wait_for_function(
        "[...document.querySelectorAll('#estimate-table thead th')].some(h => h.innerText.trim() === 'Cost')"
    )
    cost = float(re.search(r"about ([\d,.]+) in all", text_of(page, "#recommendation")).group(1).replace(",", ""))
    assert cost > 0
    page.locator("#estimate-section").screenshot(path=str(ARTIFACTS / "estimate-with-price.png"))

    price_box(page).press("Control+a")
    price_box(page).press("Delete")  # a deletion reaches the page too (app/text_edits.py)
    price_box(page).type("-3")
    wait_text(page, "#recommendation", "Price per GPU-hour")
    said = text_of(page, "#recommendation")
    assert "-3 is negative: give the price of one GPU-hour, e.g. 2.5, or empty it." in said
    assert "Keep DDP" in said  # the estimate stays
    page.wait_for_function(
        "![...document.querySelectorAll('#estimate-table thead th')].some(h => h.innerText.trim() === 'Cost')"
    )

    # The demo is meant for this machine: the GPU and RAM boxes the GPU preset set are this machine's again.
    page.click("#preset-demo")
    wait_text(page, "#notice", "the GPU and RAM boxes are this machine's again")
    settle(page)
    assert (gpu_box(page).input_value(), ram_box.input_value()) == own != ("RTX 4090", "128")


def test_your_runs_on_this_gpu_correct_the_speed_when_ticked(page, server):
    """A finished A100 run that went 25% faster than predicted: the estimate says so and, ticked, predicts 1.25x."""
    spec = load_preset("7b-lora-ddp")
    predicted = speed.predict(
        Job.from_values(input_values(spec)), speed.Hardware.named("A100-80GB"), speed.schedule_of(spec, None)
    ).tokens_per_s_per_gpu
    run_dir = fake_gpu_run(server.runs_dir, "20260101-000000-abcdef", spec, predicted * 1.25, 20.0)
    try:
        load(page, server)
        page.click("#preset-7b-lora-ddp")
        wait_text(page, "#notice", "Loaded preset")
        fill(gpu_box(page), "A100-80GB")
        wait_text(page, "#recommendation", "Speed on A100-80GB:")  # named, no longer the assumed GPU
        wait_text(page, "#recommendation", "Your last run on A100-80GB was +25% vs prediction")
        assert "Tick Correct the speed by my runs" in text_of(page, "#recommendation")
        before = speed_line(page)
        page.locator("#calibrate-speed input").check()
        wait_text(page, "#recommendation", "corrected by 1.25x")
        after = speed_line(page)
        assert after / before == pytest.approx(1.25, rel=0.01)  # LoRA DDP is all compute: the whole factor
        page.locator("#recommendation").screenshot(path=str(ARTIFACTS / "calibrated-speed.png"))
    finally:
        shutil.rmtree(run_dir)


def speed_line(page) -> float:
    """Tokens/s per GPU of the job as set, from the recommendation's speed line."""
    text = text_of(page, "#recommendation")
    found = re.search(r"Speed on [^:]+: ([\d,]+) tokens/s per GPU", text)
    assert found, repr(text)
    return float(found.group(1).replace(",", ""))


@pytest.mark.integration  # the preview runs `tunedeck preview --json` in a subprocess
def test_the_demo_dataset_preview_shows_its_lengths(page, server):
    load(page, server)
    page.click("#preset-demo")
    wait_text(page, "#notice", "Loaded preset")
    page.locator("#dataset-preview-section").get_by_text("Dataset preview").first.click()
    page.click("#preview-dataset")
    wait_text(page, "#dataset-preview", "rows measured", timeout=240_000)
    text = text_of(page, "#dataset-preview")
    assert "2,000 of 2,000 rows measured" in text and "tokenizer of" in text
    assert "p50 · p95 · max" in text and "64 (0 rows truncated)" in text
    assert "Row 1 as the model sees it" in text and "Q:" in text and "</s>" in text
    wait_text(page, "#dataset-preview", "as the estimate assumes")  # the demo packs: blocks are max_seq_length long
    page.locator("#dataset-preview-section").screenshot(path=str(ARTIFACTS / "dataset-preview-demo.png"))
