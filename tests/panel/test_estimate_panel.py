"""The estimate beside the form, on its handler directly: the price box, and the boxes a preset sets.

The browser checks (tests/panel/test_browser_fit.py) drive the same through the page.
"""

from __future__ import annotations

import gradio as gr
import pytest

from tunedeck.app.estimate_panel import EstimatePanel, EstimateShown
from tunedeck.app.job_outputs import evaluate
from tunedeck.app.registry import Registry
from tunedeck.backend.machine.monitor import Monitor
from tunedeck.backend.spec import load_presets
from tunedeck.backend.spec.fields import values_from_spec

PRESETS = load_presets()


@pytest.fixture(scope="module")
def panel():
    with gr.Blocks():
        panel = EstimatePanel(Registry(), Monitor())  # the real pynvml: no GPU here
        panel.build_advice()
        panel.build_details()
    return panel


def shown_for(panel, preset: str, price: str, old: EstimateShown | None = None, gpu: str = "H100") -> dict:
    """What one job event sends to the estimate, for a preset's job with this price in its box."""
    got = {panel.gpu: gpu, panel.ram: "512", panel.price: price, panel.calibrate: False}
    got[panel.shown] = old or EstimateShown()
    result = evaluate(values_from_spec(PRESETS[preset].build()), **panel.context(got))
    return panel.update(result, got)


def test_the_cost_column_shows_once_a_price_is_given_and_the_speed_line_says_the_cost(panel):
    none = shown_for(panel, "13b-lora-fsdp", "")
    assert "Cost" not in none[panel.table]["headers"] and "per GPU-hour" not in none[panel.recommendation]
    priced = shown_for(panel, "13b-lora-fsdp", "2.5", old=none[panel.shown])
    headers = priced[panel.table]["headers"]
    assert headers[-1] == "Cost" and len(priced[panel.table]["column_widths"]) == len(headers)
    assert all(isinstance(row[-1], float) and row[-1] > 0 for row in priced[panel.table]["value"])
    assert "in all** at 2.5 per GPU-hour × 4 GPUs." in priced[panel.recommendation]
    # The bars and the strategy picked below the table stay as they are: only the speed and cost changed.
    assert panel.figure not in priced and panel.pick not in priced
    # Emptied again: the column goes.
    emptied = shown_for(panel, "13b-lora-fsdp", " ", old=priced[panel.shown])
    assert "Cost" not in emptied[panel.table]["headers"]


@pytest.mark.parametrize(
    ("typed", "says"),
    [("-3", r"\-3 is negative"), ("ten", "'ten' is not a number"), ("**2**", r"'\*\*2\*\*' is not a number")],
)  # the typed text shown as text, not as Markdown
def test_a_price_that_is_not_one_is_named_with_its_fix_and_the_estimate_stays(panel, typed, says):
    out = shown_for(panel, "13b-lora-fsdp", typed)
    text = out[panel.recommendation]
    assert text.startswith(f"✗ **Price per GPU-hour** (the box beside the GPU memory): {says}")
    assert "give the price of one GPU-hour, e.g. 2.5, or empty it." in text
    assert "Keep FSDP FULL_SHARD" in text and "Cost" not in out[panel.table]["headers"]  # the rest as without one


def test_the_demo_puts_this_machines_gpu_and_ram_back_after_a_gpu_preset(panel):
    got = {panel.gpu: panel.own_gpu_text, panel.ram: panel.own_ram_text}
    assert "the estimate below is for that machine" in panel.follow_preset(PRESETS["70b-qlora-zero3"], got)
    assert (got[panel.gpu], got[panel.ram]) == ("L40S", "256")  # no GPU here: the preset's machine
    said = panel.follow_preset(PRESETS["demo"], got)
    assert said == "Meant for **CPU only, 4 GB RAM**: the GPU and RAM boxes are this machine's again."
    assert (got[panel.gpu], got[panel.ram]) == (panel.own_gpu_text, panel.own_ram_text)
    assert panel.follow_preset(PRESETS["demo"], got) == "Meant for **CPU only, 4 GB RAM**."  # nothing to put back
