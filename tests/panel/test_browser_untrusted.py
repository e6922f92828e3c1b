"""Text from a run, a job, a data file, a model or an error is shown as text in every surface of the page (issue 32).

One panel over two run folders written with hostile text wherever a run carries text (tests/panel/hostile_runs.py),
one page per tab. A script in the page records every element added to it, however briefly (the Try tab's loading
line is on screen for a moment): none may be an image from the payload, a form, an input of the payload's form, a
script, a link or source on evil.example, or carry an onerror handler, and the browser asks nothing of evil.example
or of the payload's `src=x`. Each surface then reads the payload literally. Before issue 32 a custom reward's file
name drew a form in the Run tab's facts line, error toasts drew the data file's name as HTML, and Markdown escaped
with html.escape still drew its links and images.
"""

from __future__ import annotations

import json
import re

import pytest

from panel.browser import PanelServer, fill, open_tab, set_field, settle, text_of, wait_text
from panel.hostile_runs import (
    DATA_NAME,
    GRPO_RUN,
    HOSTILE,
    IMG,
    IN_A_NAME,
    LORA_RUN,
    MARKDOWN,
    NAME,
    PLOTTED,
    REWARD_FILE,
    grpo_run,
    lora_run,
)
from tunedeck.app.untrusted_text import as_info

# The Try tab starts two model workers (torch and transformers imported in each).
pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

# Every element added to the page, checked as it comes: what the payloads would draw if read as HTML or Markdown.
WATCH_JS = r"""
(() => {
  const drawn = [], texts = new Set();
  window.__drawn = drawn;
  window.__texts = texts;
  const bad = el => {
    const tag = el.localName;
    if (tag === "form" || tag === "iframe" || (tag === "input" && el.name === "t")) return true;
    if (tag === "script" && /alert|evil/.test(el.textContent)) return true;
    if (tag === "img" && el.getAttribute("src") === "x") return true;
    for (const attr of el.attributes || []) {
      if (attr.name === "onerror") return true;
      if (/(^|:)(href|src|action)$/.test(attr.name) && attr.value.includes("evil")) return true;
    }
    return false;
  };
  const check = el => { if (bad(el)) drawn.push(`#${(el.closest("[id]") || {}).id}: ${el.outerHTML.slice(0, 200)}`); };
  new MutationObserver(records => {
    for (const record of records) {
      if (record.type === "attributes") check(record.target);
      for (const node of record.addedNodes) {
        if (node.nodeType !== 1) continue;
        check(node);
        node.querySelectorAll("*").forEach(check);
      }
    }
    const status = document.querySelector("#after-status");  // the loading line is shown for a moment only
    if (status && status.innerText.includes("loading")) texts.add(status.innerText);
  }).observe(document, {subtree: true, childList: true, characterData: true, attributes: true,
                        attributeFilter: ["src", "href", "action", "onerror"]});
})();
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_home):
    runs_dir = tmp_path_factory.mktemp("hostile") / "runs"
    runs_dir.mkdir()
    grpo_run(runs_dir)
    server = PanelServer(runs_dir)
    server.data, server.base = lora_run(runs_dir, demo_home)
    yield server
    server.stop()


@pytest.fixture
def watched(page):
    """The page, watched; after the test, nothing of the payloads was drawn or fetched."""
    asked = []
    page.context.route(re.compile(r"evil\.example|/x$"), lambda route: (asked.append(route.request.url), route.abort()))
    page.add_init_script(WATCH_JS)
    page.set_default_timeout(60_000)
    yield page
    assert page.evaluate("window.__drawn") == [], "the page drew markup from the payloads"
    assert asked == [], "the page fetched an address from the payloads"


def literal(page, selector: str) -> str:
    """A Markdown output's text as a person reads it, spaces as one."""
    return " ".join(text_of(page, selector).split())


def pick(page, elem_id: str, label: str) -> None:
    page.locator(f"#{elem_id} input").click()
    page.locator(f"#{elem_id} li[role=option]", has_text=label).first.click()


def test_a_runs_title_name_rewards_answers_and_phases_read_as_text_in_the_run_tab(watched, server):
    page = watched
    page.goto(server.url)
    page.click("#tab-run-button")
    wait_text(page, "#runs-table", GRPO_RUN)
    page.locator("#run-select input").click()
    options = page.locator("#run-select li[role=option]").all_inner_texts()
    assert any(NAME in option for option in options), options  # the picker names a run by its name
    page.locator(f'#run-select li[role=option][aria-label*="{GRPO_RUN} · "]').click()
    wait_text(page, "#run-facts", "GRPO, rewards")
    settle(page)
    assert f"rewards: exact_answer, {REWARD_FILE}:score" in literal(page, "#run-facts")  # the form drawn in the probe
    state = literal(page, "#run-state")
    assert NAME in state and HOSTILE in state  # its name and its title (status.json)
    assert f"before step 1: 0:05 (importing the libraries 0:01, {HOSTILE} 0:04)" in literal(page, "#run-summary")
    answers = literal(page, "#run-answers")
    assert f"Q: {HOSTILE}" in answers and PLOTTED in answers and HOSTILE in answers.split(PLOTTED, 1)[1]
    legend = page.locator("#loss-chart .legendtext").all_text_contents()
    assert PLOTTED in legend, legend  # Plotly drew its <b> and its <a href> before
    table = page.locator("#runs-table").inner_text()
    assert NAME in table and HOSTILE in table  # a table's cells were text already
    # Another run overlaid: what its job set differently, its model's path among it.
    pick(page, "overlay-select", LORA_RUN)
    wait_text(page, "#run-compared", "Overlaid run")
    assert str(server.base) in literal(page, "#run-compared")


def test_a_models_path_a_data_files_name_and_a_hub_error_read_as_text_in_the_try_tab(watched, server):
    page = watched
    page.goto(server.url)
    page.wait_for_selector("#main-tabs")
    open_tab(page, "main-tabs", "Try · Evaluate · Export")
    page.wait_for_function(
        "id => (document.querySelector('#after-run input') || {}).value?.startsWith(id)", arg=LORA_RUN
    )
    settle(page)
    assert IN_A_NAME in page.locator("#after-run input").input_value()  # the run's title, in its picker
    # The evaluation saved in eval.json: the data it read and the device it ran on; a model named with markup.
    status = literal(page, "#after-eval-status")
    assert f"last evaluated on {server.data} on {IMG}" in status and f"⚠ {DATA_NAME}.jsonl is the run's" in status
    page.locator("#after-eval-chart .xtick").first.wait_for()
    assert PLOTTED in page.locator("#after-eval-chart .xtick").all_text_contents()
    page.click("#after-example")
    wait_text(page, "#after-example-note", "example")
    assert f"a training row (the model has seen it) of {DATA_NAME}.jsonl" in literal(page, "#after-example-note")
    # Answering loads the base model: the loading line names its path, then its error is the answer.
    pick(page, "after-compare", "no comparison")
    page.click("#after-ask")
    answer = page.locator("#after-answer textarea")
    page.wait_for_function("() => document.querySelector('#after-answer textarea').value.includes('[error')",
                           timeout=240_000)  # fmt: skip
    assert f"cannot load the base model {server.base}" in answer.input_value()  # a text box: text already
    loading = " ".join(" ".join(page.evaluate("[...window.__texts]")).split())
    assert f"loading: loading the base model {server.base} on cpu" in loading, loading
    # Merging loads it too, in a worker of its own: its error comes as a toast, which Gradio draws as HTML.
    fill(page.locator("#after-merge-name textarea, #after-merge-name input").first, "fresh")
    page.click("#after-merge")
    toast = page.locator("[data-testid=toast-text]").first
    toast.wait_for(timeout=240_000)
    assert f"cannot load the base model {server.base}" in " ".join(toast.inner_text().split())
    # Export: the Hub's refusal quotes the repo id typed (the folder "model" holds a merged model's config.json).
    fill(page.locator("#after-merge-name textarea, #after-merge-name input").first, "model")
    fill(page.locator("#after-repo-id textarea, #after-repo-id input").first, IMG)
    page.click("#after-push")
    wait_text(page, "#after-merge-status", "Hub repo id")
    assert IMG in literal(page, "#after-merge-status")


def test_a_job_files_keys_a_data_files_columns_and_typed_text_read_as_text_in_the_job_tab(watched, server, tmp_path):
    page = watched
    page.goto(server.url)
    page.wait_for_selector("#file-view .cm-content")
    settle(page)
    spec = tmp_path / "job.yaml"
    key = f"{IMG}[c](http://evil.example)"  # a key is shown up to 60 characters
    spec.write_text(f"model:\n  name_or_path: m\n  '{key}': 1\n")
    with page.expect_file_chooser() as chooser:
        page.click("#upload-job")
    chooser.value.set_files(str(spec))
    wait_text(page, "#notice", "was not loaded")
    assert f"model.{key}: unknown field" in literal(page, "#notice")
    data = tmp_path / "columns.jsonl"
    data.write_text(json.dumps({IMG: "x", "y": "z"}) + "\n")
    with page.expect_file_chooser() as chooser:
        page.click("#upload-data")
    chooser.value.set_files(str(data))
    wait_text(page, "#notice", "Uploaded")
    assert f"Its columns ({IMG}, y)" in literal(page, "#notice")
    # Typed text, quoted back: the GPU box, the price box, the sweep's values, a model that is not there.
    fill(page.locator("#gpu-price input"), MARKDOWN)
    wait_text(page, "#recommendation", "Price per GPU-hour")
    assert f"'{MARKDOWN[:39]}" in literal(page, "#recommendation")
    page.click("#sweep")
    fill(page.locator("#sweep-vary textarea"), f"training.learning_rate={IMG},{MARKDOWN.replace(',', ' ')}")
    wait_text(page, "#sweep-preview", "2 runs")
    assert f"learning_rate={IMG}" in literal(page, "#sweep-preview")
    set_field(page, "model.name_or_path", f"./{IN_A_NAME}")
    wait_text(page, "#job-issues", "does not exist", timeout=30_000)
    assert IN_A_NAME in literal(page, "#job-issues")
    # The field's own line under its label is no Markdown: its link is broken, its ` and * are look-alikes.
    info = page.locator("#field-model-name-or-path .info-text").inner_text()
    assert as_info(f"./{IN_A_NAME} does not exist") in info, info
    settle(page)
