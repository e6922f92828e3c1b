"""The Try · Evaluate · Export tab in headless Chromium, over a copy of the session's trained demo run.

One panel for the module, with a short worker idle timeout; the tests run in order. The last one
has a panel of its own with a shorter one still, which it stops. Worker processes are the panel's
children running tunedeck.backend.after.worker.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import psutil
import pytest
import yaml
from panel.browser import EVENTS_TAP_JS, PanelServer, code_text, fill, plot_points, settle, text_of, wait_text
from runs.helpers import wait_for

from .helpers import gone
from .ollama_standin import OllamaStandIn
from .tab_driver import answer_of, ask, eval_losses, open_after, pick

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]

IDLE_S = 30  # the module panel's worker idle timeout (TUNEDECK_WORKER_IDLE_S): above any pause of its tests
# The idle test's own panel: its test waits this long for a worker to end by itself (it waited IDLE_S, 20 s more).
SHORT_IDLE_S = 10


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_run):
    """A panel over a runs folder holding a copy of the demo run (so this module's eval.json and merges are its own)."""
    runs_dir, run_id = demo_run
    mine = tmp_path_factory.mktemp("after-panel") / "runs"
    shutil.copytree(runs_dir / run_id, mine / run_id, ignore=shutil.ignore_patterns("merged", "eval.json"))
    # A closed tab is noticed at the next heartbeat (Gradio's default: 15 s).
    server = PanelServer(mine, env={"TUNEDECK_WORKER_IDLE_S": str(IDLE_S), "GRADIO_HEARTBEAT_INTERVAL": "2"})
    server.run_id = run_id
    yield server
    server.stop()


# Counts the streamed updates the page receives (process_generating messages on Gradio's SSE stream).
GENERATING_TAP_JS = r"""
(() => {
  window.__generating = 0;
  const original = window.fetch;
  window.fetch = async (...args) => {
    const response = await original(...args);
    const url = String((args[0] && args[0].url) || args[0]);
    if (url.includes("/queue/data") && (response.headers.get("content-type") || "").includes("event-stream")) {
      const reader = response.clone().body.getReader(), decoder = new TextDecoder();
      (async () => {
        for (;;) {
          const {value, done} = await reader.read().catch(() => ({done: true}));
          if (done) return;
          window.__generating += (decoder.decode(value, {stream: true}).match(/"process_generating"/g) || []).length;
        }
      })();
    }
    return response;
  };
})();
"""


def workers(server) -> list[int]:
    """Pids of the panel's live worker processes."""
    found = []
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "tunedeck.backend.after.worker" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return sorted(found)


def torch_loaded(pid: int) -> bool:
    """Whether the process has torch's libraries mapped (import torch loads libtorch*.so)."""
    with open(f"/proc/{pid}/maps") as maps:
        return "libtorch" in maps.read()


def test_try_streams_the_adapter_and_the_base_side_by_side_and_release_ends_their_workers(page, server):
    page.add_init_script(GENERATING_TAP_JS)
    open_after(page, server)
    assert page.locator("#after-weights input").input_value() == "final adapter"
    assert page.locator("#after-compare input").input_value() == "the base model"
    ask(page, max_new_tokens=24)
    wait_text(page, "#after-status", "the final adapter on cpu", timeout=240_000)
    wait_for(lambda: answer_of(page, "after-compare-answer"), 60, what="the answers")
    settle(page)
    tuned, base = answer_of(page, "after-answer"), answer_of(page, "after-compare-answer")
    assert tuned.strip()[:1].isdigit(), tuned  # the adapter learned the demo's answer format
    assert base and base != tuned
    # Streamed: the status lines, then an update per generated piece (the base rambles on for 24 tokens).
    assert page.evaluate("window.__generating") > 10
    assert "the base model alone on cpu" in page.locator("#after-status").inner_text()

    pids = workers(server)
    assert len(pids) == 2  # one per loaded model
    page.click("#after-release")
    wait_text(page, "#after-status", "released 2 models")
    wait_for(lambda: all(gone(p) for p in pids), 30, what="the released workers to end")
    assert not torch_loaded(server.proc.pid)


def test_an_example_from_the_data_fills_the_prompt_and_its_answer_is_judged(page, server, demo_home):
    open_after(page, server)
    pick(page, "after-compare", "no comparison")
    page.click("#after-example")
    wait_text(page, "#after-example-note", "a held-out row of eval.jsonl")
    expected = page.locator("#after-expected textarea")
    expected.wait_for(state="visible")
    prompt = page.locator("#after-prompt textarea").input_value()
    rows = [json.loads(line) for line in (demo_home / "data" / "eval.jsonl").read_text().splitlines()]
    assert {"prompt": prompt, "completion": expected.input_value()} in rows  # the row's prompt, its answer beside
    page.click("#after-ask")
    wait_text(page, "#after-status", "the data's answer", timeout=240_000)  # "✓ the data's answer" or "✗ not ..."
    status = page.locator("#after-status").inner_text()
    assert status.startswith("the final adapter on cpu: ") and " tokens" in status, status

    # An edited prompt has no known answer: the data's answer goes, and the next answer is not judged.
    fill(page.locator("#after-prompt textarea"), "Q: Add the numbers. 3 + 4\nA:")
    page.click("#after-ask")
    expected.wait_for(state="hidden")
    wait_text(page, "#after-status", "ended at", timeout=120_000)
    assert "the data's answer" not in page.locator("#after-status").inner_text()
    assert not page.locator("#after-example-note").inner_text().strip()
    page.click("#after-release")
    wait_text(page, "#after-status", "released")


def test_evaluate_shows_the_table_benchmarks_and_forgetting_and_saves_eval_json(page, server, tmp_path):
    open_after(page, server)
    assert "not evaluated yet" in page.locator("#after-eval-status").inner_text()
    fill(page.locator("#after-eval-limit input"), "8")
    fill(
        page.locator("#after-eval-tasks textarea, #after-eval-tasks input").first, "demo_arith"
    )  # 20 questions: the default slice
    page.locator("#after-eval-forgetting input").check()
    page.click("#after-evaluate")
    wait_text(page, "#after-eval-table", "final", timeout=240_000)
    settle(page)
    loss = eval_losses(page)
    assert list(loss) == ["base", "final"] and loss["final"] < loss["base"]
    points = plot_points(page, "after-eval-chart")
    assert {k: points.get(k) for k in ("loss", "ROUGE-L", "general-text loss", "demo_arith (exact_match)")} == {
        "loss": 2,
        "ROUGE-L": 2,
        "general-text loss": 2,
        "demo_arith (exact_match)": 2,
    }
    saved = json.loads((server.runs_dir / server.run_id / "eval.json").read_text())
    assert set(saved["results"]) == {"base", "final"}

    # The harness's score and the general-text loss of each model: a column each, and the verdict in the status.
    results = saved["results"]
    scores = [results[m]["benchmarks"]["demo_arith"] for m in ("base", "final")]
    # The default slice; that the adapter scores higher is test_benchmarks' (on all 131 questions: on 20 the
    # adapter's 1 in 7 is 0 of 20 about one time in 20).
    assert scores[0]["samples"] == scores[1]["samples"] == 20
    table = page.locator("#after-eval-table [role=row]")
    header, *rows = [table.nth(i).locator("th, [role=gridcell]").all_inner_texts() for i in range(table.count())]
    header = [cell.strip() for cell in header]
    rows = [[cell.strip() for cell in row] for row in rows]
    score_at, loss_at = header.index("demo_arith"), header.index("general-text loss")
    text_losses = [results[m]["general_text"]["loss"] for m in ("base", "final")]
    assert [float(row[score_at]) for row in rows] == [round(score["score"], 4) for score in scores]
    assert [float(row[loss_at]) for row in rows] == [round(text_loss, 4) for text_loss in text_losses]
    wait_text(page, "#after-eval-status", "final: general-text loss")
    assert f"{text_losses[0]:.2f} → {text_losses[1]:.2f}" in page.locator("#after-eval-status").inner_text()

    # Each answer, the base's beside the adapter's and the data's; filtered; downloaded whole.
    wait_text(page, "#after-answers-note", "8 examples · the data's answer exactly")
    rows = page.locator("#after-answers [role=row]").all_inner_texts()
    assert len(rows) == 9 and "✗" in " ".join(rows)  # a header and 8 rows; the base gets them wrong
    page.locator("#after-answers-show").get_by_text("where the models' answers differ").click()
    wait_text(page, "#after-answers-note", "of 8 examples where the models' answers differ")
    with page.expect_download() as download:
        page.click("#after-answers-file")
    lines = [json.loads(line) for line in open(download.value.path())]
    assert len(lines) == 8 and set(lines[0]["answers"]) == {"base", "final"}

    # A row of the answers, clicked, is in the Try box with the data's answer beside it.
    row = page.locator("#after-answers [role=row]").nth(1)
    number = int(row.locator("[role=gridcell]").first.inner_text().strip())
    row.locator("[role=gridcell]").nth(3).click()  # the base's answer: any cell of the row takes it
    wait_text(page, "#after-example-note", f"example {number} of 8, a held-out row of eval.jsonl")
    assert page.locator("#after-prompt textarea").input_value() == lines[number - 1]["prompt"]
    assert page.locator("#after-expected textarea").input_value() == lines[number - 1]["expected"]

    open_after(page, server)  # reopened: the table is read back from eval.json
    wait_text(page, "#after-eval-table", "final")
    assert eval_losses(page) == loss

    # A general-text file that is not text: said in the status line, in the page's words, before a worker starts.
    (tmp_path / "scan.txt").write_bytes(b"\xff\xfe\x00\x81" * 64)
    page.locator("#after-eval-general-text input[type=file]").set_input_files(str(tmp_path / "scan.txt"))
    page.click("#after-evaluate")
    wait_text(page, "#after-eval-status", "General text: scan.txt cannot be read")
    assert "clear the box for the built-in sample" in page.locator("#after-eval-status").inner_text()


def test_evaluate_says_in_its_status_line_what_to_do_without_held_out_rows(page, server, tmp_path):
    """Issue 31: Evaluate on a run without held-out data failed in a fading toast in the CLI's words while its
    status line showed a GPU warning. A copy of the demo run, trained (as its job now says) on a file alone."""
    run_id = "20000101-000000-00000a"  # older than the demo run: the page still opens on that one
    data = tmp_path / "own" / "train.jsonl"
    data.parent.mkdir()
    shutil.copy(server.runs_dir / server.run_id / "job.yaml", tmp_path / "job.yaml")
    job = yaml.safe_load((tmp_path / "job.yaml").read_text())
    shutil.copy(job["dataset"]["path"], data)
    folder = server.runs_dir / run_id
    shutil.copytree(server.runs_dir / server.run_id, folder, ignore=shutil.ignore_patterns("merged", "eval*"))
    (folder / "job.yaml").write_text(yaml.safe_dump({**job, "dataset": {**job["dataset"], "path": str(data)}}))
    status = json.loads((folder / "status.json").read_text())
    (folder / "status.json").write_text(json.dumps({**status, "run_id": run_id}))

    open_after(page, server)
    page.locator("#after-run input").click()
    page.locator(f'#after-run li[role=option][aria-label^="{run_id}"]').click()
    settle(page)  # the pick's own answer (it says "not evaluated yet") comes before Evaluate's, as a person waits
    wait_text(page, "#after-eval-status", "not evaluated yet")
    page.click("#after-evaluate")
    wait_text(page, "#after-eval-status", "This run kept no held-out rows")
    said = page.locator("#after-eval-status").inner_text()
    assert "Upload an evaluation file in the box above" in said and "Evaluate on training rows" in said
    assert "--data" not in said and not page.locator(".toast-body").count()  # the page's words, no toast
    page.evaluate("document.querySelector('#after-eval-title').scrollIntoView()")
    page.screenshot(path="/tmp/after-eval-no-data.png")

    page.locator("#after-eval-data input[type=file]").set_input_files(str(data))  # the training file itself
    wait_text(page, "#after-eval-status", "train.jsonl is the run's training file")
    assert "the model trained on these rows" in page.locator("#after-eval-status").inner_text()

    fill(page.locator("#after-training-rows input"), "4")
    page.click("#after-evaluate-training")  # 4 rows of the training file, kept under the run folder
    wait_text(page, "#after-eval-table", "training-rows-4.jsonl", timeout=240_000)
    wait_text(page, "#after-eval-status", "training-rows-4.jsonl holds rows sampled from the run's training file")
    assert len((folder / "eval-data" / "training-rows-4.jsonl").read_text().splitlines()) == 4
    page.screenshot(path="/tmp/after-eval-training-rows.png")


def test_prompts_alone_are_answered_and_a_row_goes_to_try_without_a_datas_answer(page, server, demo_home, tmp_path):
    rows = [json.loads(line) for line in (demo_home / "data" / "eval.jsonl").read_text().splitlines()[:4]]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    open_after(page, server)
    page.locator("#after-eval-data input[type=file]").set_input_files(str(prompts))
    page.click("#after-evaluate")
    wait_text(page, "#after-answers-note", "4 examples · prompts without answers in the data", timeout=240_000)
    settle(page)
    table = [text.split("\t") for text in page.locator("#after-eval-table [role=row]").all_inner_texts()]
    assert any("prompts.jsonl" in " ".join(cells) for cells in table), table
    # Kept in the runs folder (the page's upload folder goes with the panel): eval.json names it for good.
    data = json.loads((server.runs_dir / server.run_id / "eval.json").read_text())["results"]["final"]["data"]
    assert Path(data).parent.parent == server.runs_dir / "datasets" and Path(data).read_bytes() == prompts.read_bytes()
    wait_text(page, "#after-eval-status", f"last evaluated on {data}")
    answers = page.locator("#after-answers [role=row]").all_inner_texts()
    assert len(answers) == 5 and "✗" not in " ".join(answers) and "✓" not in " ".join(answers)

    page.locator("#after-answers [role=row]").nth(2).locator("[role=gridcell]").nth(1).click()
    wait_text(page, "#after-example-note", "example 2 of 4, a held-out row of prompts.jsonl · the data has no answer")
    assert page.locator("#after-prompt textarea").input_value() == rows[1]["prompt"]
    assert not page.locator("#after-expected").is_visible()  # no data's answer to show, nor to judge by


def test_merge_writes_the_folder_under_the_run_and_shows_its_path_and_serve_sh(page, server):
    open_after(page, server)
    assert not page.locator("#after-serve").is_visible()  # no serve.sh before a merge wrote one
    pick(page, "after-merge-dtype", "float32")
    fill(page.locator("#after-merge-name textarea, #after-merge-name input").first, "from-page")
    page.click("#after-merge")
    out = server.runs_dir.resolve() / server.run_id / "merged" / "from-page"
    wait_text(page, "#after-merge-status", f"saved to {out}", timeout=240_000)
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    wait_text(page, "#after-serve", "vllm serve")
    # the export check ran after it (the box is ticked by default): the merged folder answers as the adapter does
    wait_text(page, "#after-merge-status", "✓ from-page: 24/24 answers identical after export")

    fill(page.locator("#after-merge-name textarea, #after-merge-name input").first, "../../escape")
    page.click("#after-merge")
    wait_text(page, "body", "merge name: use letters")
    assert not (server.runs_dir / "escape").exists()


def ollama_host(page):
    return page.locator("#after-ollama-host textarea, #after-ollama-host input").first


def test_gguf_export_shows_a_bar_then_its_files_and_the_modelfile_and_creates_it_in_ollama(page, server, tmp_path):
    open_after(page, server)
    assert not page.locator("#after-modelfile").is_visible()  # no Modelfile before an export wrote one
    fill(ollama_host(page), "http://127.0.0.1:9")  # nothing listens there
    fill(page.locator("#after-merge-name textarea, #after-merge-name input").first, "for-ollama")
    page.locator("#after-gguf-quants label", has_text="f16").click()  # with the default q4_k_m
    page.evaluate(
        """() => { window.__bars = []; new MutationObserver(() => {
            const text = document.querySelector('#after-gguf-status').innerText;
            if (text.includes('▰') || text.includes('▱')) window.__bars.push(text); })
          .observe(document.querySelector('#after-gguf-status'), {childList: true, subtree: true, characterData: true}); }"""
    )
    page.click("#after-export-gguf")
    out = server.runs_dir.resolve() / server.run_id / "gguf" / "for-ollama"
    wait_text(page, "#after-gguf-status", f"saved to {out}", timeout=240_000)
    bars = page.evaluate("window.__bars")
    assert any("quantizing to q4_k_m" in bar and "▱" in bar for bar in bars), bars  # the steps as a bar
    status = text_of(page, "#after-gguf-status")
    for quant in ("f16", "q4_k_m"):
        size = (out / f"for-ollama-{quant}.gguf").stat().st_size / 2**20
        assert f"for-ollama-{quant}.gguf · {size:.1f} MiB · {quant} · the run's chat template · stops at </s>" in status
    assert f"cd {out} && ollama create tunedeck-{server.run_id} -f Modelfile" in status
    assert any("held-out prompts" in bar for bar in bars), bars  # then the export check, in the same bar
    for quant in ("f16", "q4_k_m"):  # llama.cpp answers as the adapter does, quantized to 4 bits too
        assert f"✓ for-ollama-{quant}.gguf: 24/24 answers identical after export" in status
    wait_text(page, "#after-modelfile", "FROM ./for-ollama-q4_k_m.gguf")
    assert code_text(page, "after-modelfile").splitlines() == (out / "Modelfile").read_text().splitlines()

    # No Ollama server at the address given: said, and no Create button. One there: Create sends the export to it.
    wait_text(page, "#after-ollama-status", "No Ollama server answers at http://127.0.0.1:9")
    assert not page.locator("#after-ollama-create").is_visible()
    standin = OllamaStandIn(tmp_path / "blobs")
    try:
        fill(ollama_host(page), standin.url)
        ollama_host(page).press("Enter")
        wait_text(page, "#after-ollama-status", f"Ollama answers at {standin.url} (0 models)")
        page.click("#after-ollama-create")
        name = f"tunedeck-{server.run_id}"
        wait_text(page, "#after-ollama-status", f"✓ created {name} in Ollama at {standin.url}", timeout=120_000)
        assert f"ollama run {name}" in text_of(page, "#after-ollama-status")
        request = standin.models[name]["request"]
        digest = request["files"]["for-ollama-q4_k_m.gguf"]  # the Modelfile's FROM
        assert standin.blob(digest).read_bytes() == (out / "for-ollama-q4_k_m.gguf").read_bytes()
        assert f'TEMPLATE """{request["template"]}"""' in (out / "Modelfile").read_text()
    finally:
        standin.close()

    page.locator("#after-export-gguf").click()  # the same name again: refused, the export kept
    wait_text(page, "body", "already holds an export; choose another name")
    assert (out / "for-ollama-q4_k_m.gguf").is_file()


def test_workers_end_when_the_tab_closes_after_idle_timeout_and_with_the_panel(browser, server):
    # Steps 2 and 3 on a panel of their own over the same runs folder, whose workers end after SHORT_IDLE_S idle;
    # it boots while step 1 runs on the module's panel.
    short = PanelServer(
        server.runs_dir, env={"TUNEDECK_WORKER_IDLE_S": str(SHORT_IDLE_S), "GRADIO_HEARTBEAT_INTERVAL": "2"}, wait=False
    )
    short.run_id = server.run_id

    def fresh_page():
        context = browser.new_context(viewport={"width": 1440, "height": 1000})
        context.add_init_script(EVENTS_TAP_JS)  # for settle()
        return context, context.new_page()

    def ask_alone(page, panel):
        open_after(page, panel)
        pick(page, "after-compare", "no comparison")
        ask(page, max_new_tokens=4)
        wait_text(page, "#after-status", "the final adapter on cpu", timeout=240_000)
        return wait_for(lambda: workers(panel), 30, what="a worker")

    try:
        context, page = fresh_page()  # 1. the browser tab closes: its model goes, before its idle timeout could end it
        pids = ask_alone(page, server)
        context.close()
        wait_for(lambda: all(gone(p) for p in pids), IDLE_S - 5, what="the worker of a closed tab to end")

        short.wait_ready()
        context, page = fresh_page()  # 2. nobody asks for SHORT_IDLE_S: the worker ends by itself
        pids = ask_alone(page, short)
        started = time.monotonic()
        wait_for(lambda: all(gone(p) for p in pids), SHORT_IDLE_S + 30, what="the idle worker to end")
        assert time.monotonic() - started >= SHORT_IDLE_S - 3  # ended by its timeout, not at once

        page.click("#after-ask")  # 3. the same prompt again: the model loads again; the panel exits: no orphan
        pids = wait_for(
            lambda: workers(short),
            120,
            what=lambda: f"a worker loaded again; the status line says {text_of(page, '#after-status')!r}",
        )
        wait_text(page, "#after-status", "the final adapter on cpu", timeout=240_000)
        assert not torch_loaded(short.proc.pid)
        # Still loaded, its tab still open, when the panel exits: the exit is what ends them.
        assert not any(gone(p) for p in pids)
        short.stop()
        wait_for(lambda: all(gone(p) for p in pids), 30, what="the workers to end with the panel")
        context.close()
    finally:
        short.stop()
