"""The run half of the page with real demo runs (2 CPU ranks, DDP over gloo), in headless Chromium."""

from __future__ import annotations

import json
import re
import time

import pytest
from runs.helpers import PACED, processes_working_in, run_processes, still_alive, wait_for

from panel.browser import (
    ARTIFACTS,
    HeldEvent,
    PanelServer,
    event_index,
    event_indexes,
    field,
    fill,
    open_tab,
    plot_points,
    set_field,
    settle,
    stop_live_runs,
    text_of,
    wait_file_text,
    wait_text,
)

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(600)]  # real demo runs

LONG_RUN = 5000  # steps: long enough that the run is still going when the test stops it


@pytest.fixture(scope="module")
def server(tmp_path_factory, demo_home):
    # Every run here trains until the test stops it (or fails at once): paced, it leaves the CPU to the page.
    server = PanelServer(tmp_path_factory.mktemp("runs"), "--preset", "demo", env=dict([PACED]))
    yield server
    stop_live_runs(server.runs_dir)  # whatever failed
    server.stop()


def load(page, server):
    page.goto(server.url)
    page.wait_for_selector("#file-view .cm-content")
    wait_text(page, "#job-issues", "No problems")


def shown_run_id(page) -> str:
    return re.search(r"\d{8}-\d{6}-[0-9a-f]{6}", text_of(page, "#run-state")).group(0)


def loss_points(page) -> int:
    return plot_points(page, "loss-chart").get("this run loss", 0)


def log_hidden_below(page) -> int:
    """Pixels of the rank-0 log below its visible part (0: the newest line is in view)."""
    return page.evaluate(
        "() => { const t = document.querySelector('#run-log textarea');"
        " return Math.max(0, t.scrollHeight - t.scrollTop - t.clientHeight); }"
    )


def test_demo_run_grows_the_charts_and_log_then_stop_leaves_nothing_alive(page, server):
    load(page, server)
    open_tab(page, "form-sections", "Training")
    set_field(page, "training.max_steps", str(LONG_RUN))
    settle(page)  # Start runs what the page shows, so wait until the files show the new value
    wait_text(page, "#job-issues", "No problems")
    page.click("#start-run")
    wait_text(page, "#notice", "Started run")
    wait_text(page, "#run-state", "running", timeout=60_000)
    run_id = shown_run_id(page)
    # Before its first step the bar says what the run does and for how long, not only "step 0".
    starting = r"^step 0 · (importing the libraries|joining the other processes|loading the model) for \d+:\d\d"
    wait_for(lambda: re.search(starting, text_of(page, "#run-progress")), 60, 0.1, "the phase before step 1")
    page.screenshot(path=str(ARTIFACTS / "run-starting.png"))

    first = wait_for(lambda: loss_points(page) >= 2 and loss_points(page), 180, what="the first loss points")
    log_before = page.locator("#run-log textarea").input_value()
    later = wait_for(lambda: loss_points(page) > first + 2 and loss_points(page), 90, what="the loss chart to grow")
    assert later > first
    wait_for(lambda: len(page.locator("#run-log textarea").input_value()) > len(log_before), 30, what="new log lines")
    wait_for(lambda: log_hidden_below(page) <= 4, 10, what="the log to show its newest lines")
    facts = text_of(page, "#run-facts")
    assert "2 ranks · DDP" in facts and "of parameters trainable" in facts
    assert "ETA" in text_of(page, "#run-progress") and f"/{LONG_RUN}" in text_of(page, "#run-progress")
    # The bar moves between the tab's Gradio ticks (every 5 s): the stream opened for it follows the run.
    urls, seen = [], set()

    def sent(request):
        urls.append(request.url)

    page.on("request", sent)
    end = time.monotonic() + 4
    while time.monotonic() < end:
        seen.add(text_of(page, "#run-progress"))
        page.wait_for_timeout(100)
    page.remove_listener("request", sent)
    streams, ticks = sum("tunedeck/run-progress" in u for u in urls), sum("queue/join" in u for u in urls)
    assert len(seen) >= 4 and streams == 0 and ticks <= 2, (seen, streams, ticks)  # ticks alone: 1 at most
    assert set(plot_points(page, "metrics-chart")) >= {"learning rate", "grad norm", "tokens / s"}

    run_dir = server.runs_dir / run_id
    processes = run_processes(run_dir)  # the launcher and both ranks, while they run
    assert len(processes) >= 3
    # The end is shown when the stream says it, not at the next tick: the page presses the hidden refresh button.
    # The ticks are held meanwhile (a busy server), so that only the stream's refresh can show it.
    refresh, events = event_index(server.url, "click", "run-refresh"), []
    ticks_held = HeldEvent(page, event_indexes(server.url, "tick"))
    page.on("request", lambda r: "queue/join" in r.url and events.append(json.loads(r.post_data or "{}")))
    page.click("#stop-run")
    wait_text(page, "#run-state", "stopped", timeout=120_000)
    ticks_held.release()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "stopped"
    assert refresh in [e.get("fn_index") for e in events], "the stop was shown by a tick, not by the stream's refresh"
    wait_for(
        lambda: not still_alive(processes) and not processes_working_in(run_dir), 20, what="the run's processes to exit"
    )
    assert page.locator("#stop-run").is_disabled()


def test_reloading_the_page_reattaches_to_a_live_run(page, server):
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import resolve_spec, set_paths

    # Started outside the page (as `tunedeck train` would): the disk is the message bus.
    manager = RunManager(server.runs_dir)
    run_id = manager.start(set_paths(resolve_spec("demo"), {"training.max_steps": LONG_RUN}))
    try:
        page.goto(server.url)
        page.click("#tab-run-button")
        wait_text(page, "#run-state", run_id, timeout=30_000)
        wait_text(page, "#run-state", "running", timeout=60_000)
        before = wait_for(lambda: loss_points(page) >= 2 and loss_points(page), 180, what="loss points")

        page.reload()
        page.click("#tab-run-button")
        wait_text(page, "#run-state", run_id, timeout=30_000)
        assert "running" in text_of(page, "#run-state")
        wait_for(lambda: loss_points(page) >= before, 30, what="the reloaded chart to show the run so far")
        wait_for(lambda: loss_points(page) > before, 60, what="the reloaded chart to keep growing")
    finally:
        manager.stop(run_id, grace_s=20)
    wait_text(page, "#run-state", "stopped", timeout=120_000)


def test_past_runs_reopen_and_overlay_two_loss_curves(page, server):
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import resolve_spec, set_paths

    manager = RunManager(server.runs_dir)
    with_metrics = [r for r in manager.list_runs() if (manager.run_dir(r.run_id) / "metrics.jsonl").exists()]
    while len(with_metrics) < 2:  # when run alone: make two short runs
        run_id = manager.start(set_paths(resolve_spec("demo"), {"training.max_steps": 5}))
        manager.wait(run_id, timeout=180)
        with_metrics = [r for r in manager.list_runs() if (manager.run_dir(r.run_id) / "metrics.jsonl").exists()]
    older, newer = with_metrics[1].run_id, with_metrics[0].run_id

    page.goto(server.url)
    page.click("#tab-run-button")
    wait_text(page, "#runs-table", older)
    page.locator("#run-select input").click()
    page.locator(f'#run-select li[role=option]:has-text("{older}")').click()
    wait_text(page, "#run-state", older)
    wait_for(lambda: loss_points(page) > 0, 30, what="the reopened run's loss curve")
    wait_for(lambda: log_hidden_below(page) <= 4, 10, what="the reopened log to show its last lines")

    page.locator("#overlay-select input").click()
    page.locator(f'#overlay-select li[role=option]:has-text("{newer}")').click()
    traces = wait_for(
        lambda: any(newer in name for name in plot_points(page, "loss-chart")) and plot_points(page, "loss-chart"),
        30,
        what="the overlaid curve",
    )
    assert traces["this run loss"] > 0 and traces[f"{newer} loss"] > 0


def test_a_failing_run_shows_its_error_lines(page, server):
    load(page, server)
    open_tab(page, "form-sections", "Dataset")
    set_field(page, "dataset.path", "/nonexistent/train.jsonl")
    # A missing data file is found as it is named, before Start (which would refuse it): Start waits.
    wait_text(page, "#job-issues", "Dataset (dataset.path): /nonexistent/train.jsonl does not exist")
    assert page.locator("#start-run").is_disabled()
    load(page, server)
    open_tab(page, "form-sections", "Dataset")
    set_field(page, "dataset.split", "validation")
    settle(page)
    wait_text(page, "#job-issues", "No problems")  # only the run can find out
    page.click("#start-run")
    wait_text(page, "#run-state", "failed", timeout=120_000)
    error = page.locator("#run-error")
    error.wait_for(state="visible")
    assert 'Unknown split "validation"' in error.inner_text()
    assert "Traceback (most recent call last)" not in page.inner_text("#notice")


def test_a_refused_start_says_why_and_launches_nothing(page, server):
    load(page, server)
    before = {p.name for p in server.runs_dir.iterdir()}
    page.click("#preset-7b-lora-ddp")  # 4 GPUs: this machine has none
    wait_text(page, "#notice", "7B LoRA DDP")
    page.click("#start-run")
    wait_text(page, "#notice", "no NVIDIA GPU found", timeout=30_000)
    assert "launch.use_cpu" in page.inner_text("#notice")
    assert {p.name for p in server.runs_dir.iterdir()} == before


def test_start_refuses_while_the_files_shown_are_not_the_forms(page, server):
    from tunedeck.backend.runs.manager import RunManager

    load(page, server)
    before = {p.name for p in server.runs_dir.iterdir()}
    open_tab(page, "form-sections", "Training")
    edit = HeldEvent(page, event_index(server.url, "input", "field-training-max-steps"))  # every field's edits
    field(page, "training.max_steps").fill("3")  # its files are still on their way
    edit.wait_held()
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url.rstrip("/"))
    page.evaluate("navigator.clipboard.writeText('0.004')")
    rate = field(page, "training.learning_rate")
    rate.click()
    rate.press("ControlOrMeta+a")
    rate.press("ControlOrMeta+v")  # pasted, and Start pressed at once
    page.click("#start-run")
    wait_text(page, "#notice", "Not started", timeout=30_000)
    notice = page.inner_text("#notice")
    assert "Max steps (training.max_steps" in notice and "Learning rate (training.learning_rate" in notice, notice
    assert "press Start again" in notice
    assert {p.name for p in server.runs_dir.iterdir()} == before
    assert field(page, "training.max_steps").input_value() == "3"  # nothing lost

    # The page brings the files up to date at once, though the edits themselves are still on their way:
    # the second press runs (it used to refuse for as long as an edit had not arrived).
    page.locator("#file-tabs label", has_text="training_args.yaml").click()
    wait_file_text(page, "max_steps: 3")
    wait_file_text(page, "learning_rate: 0.004")
    page.click("#start-run")
    wait_text(page, "#notice", "Started run", timeout=30_000)
    edit.release()
    run_id = re.search(r"\d{8}-\d{6}-[0-9a-f]{6}", text_of(page, "#notice")).group(0)
    RunManager(server.runs_dir).wait(run_id, timeout=180)
    args = (server.runs_dir / run_id / "training_args.yaml").read_text()
    assert "max_steps: 3" in args and "learning_rate: 0.004" in args


def test_gpu_tab_shows_the_no_gpu_state_and_host_gauges(page, server):
    page.goto(server.url)
    page.click("#tab-gpus-button")
    wait_text(page, "#gpu-monitor", "No NVIDIA GPU found", timeout=20_000)
    gauges = text_of(page, "#gpu-monitor")
    assert "CPU" in gauges and "RAM" in gauges and "GB" in gauges
    wait_for(lambda: len(plot_points(page, "monitor-sparklines")) >= 2, 20, what="CPU and RAM sparklines")


# Counts the frames the page asks the browser for (installed before the page's own scripts).
FRAME_COUNTER_JS = """(() => {
  const frame = window.requestAnimationFrame.bind(window);
  window.__frames = 0;
  window.requestAnimationFrame = (callback) => { window.__frames++; return frame(callback); };
})()"""


def frames_asked(page, seconds: float) -> int:
    page.evaluate("() => { window.__frames = 0 }")
    time.sleep(seconds)
    return page.evaluate("() => window.__frames")


def test_a_page_left_open_asks_for_no_frames_while_nothing_changes(page, server):
    """Gradio's loading tracker left a requestAnimationFrame loop running for good: 60 frames a second on
    every tab, a tenth of a core (app/idle_costs.py)."""
    page.add_init_script(FRAME_COUNTER_JS)
    load(page, server)
    # Once the page's own transitions end (a few seconds), nothing asks for frames; before, 60 a second for good.
    wait_for(lambda: frames_asked(page, 1.0) <= 2, 30, what="the idle page to stop asking for frames")


def test_queue_waits_for_the_run_ahead_and_stop_takes_it_out_of_the_queue(page, server):
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.spec import resolve_spec, set_paths

    manager = RunManager(server.runs_dir)
    ahead = manager.start(set_paths(resolve_spec("demo"), {"training.max_steps": LONG_RUN}))
    try:
        load(page, server)
        page.click("#queue-run")
        wait_text(page, "#run-state", f"waits for run {ahead} to end", timeout=30_000)
        line = text_of(page, "#run-state")
        assert "queued" in line and "it starts by itself once that run has ended" in line, line
        queued = shown_run_id(page)
        assert manager.status(queued).state == "queued"
        page.click("#stop-run")
        wait_text(page, "#run-state", "stopped", timeout=30_000)
        assert manager.status(queued).pid is None  # taken out of the queue before it ever launched
        assert manager.status(ahead).state == "running"
    finally:
        manager.stop(ahead, grace_s=20)
        manager.wait(ahead, timeout=120)  # ended before the next test queues anything


def test_a_sweep_from_the_page_queues_one_named_run_per_value(page, server):
    from tunedeck.backend.runs.manager import RunManager
    from tunedeck.backend.runs.notes import read_notes

    load(page, server)
    page.click("#sweep")  # its fold
    fill(page.locator("#sweep-vary textarea"), "training.learning_rate=1e-3,abc")
    page.click("#queue-sweep")
    wait_text(page, "#notice", "Not started")  # one bad value queues nothing
    assert "[learning_rate=abc]" in text_of(page, "#notice")
    manager = RunManager(server.runs_dir)
    before = {run.run_id for run in manager.list_runs()}

    fill(page.locator("#sweep-vary textarea"), "training.learning_rate=1e-3,3e-3")
    wait_text(page, "#sweep-preview", "2 runs, queued one after another: learning_rate=1e-3, learning_rate=3e-3")
    page.click("#queue-sweep")
    wait_text(page, "#notice", "Started a sweep of 2 runs, each after the one before")
    named = {read_notes(server.runs_dir / r).name: r for r in {run.run_id for run in manager.list_runs()} - before}
    first, second = named.pop("learning_rate=1e-3"), named.pop("learning_rate=3e-3")
    try:
        wait_text(page, "#run-state", first, timeout=30_000)  # the Run tab follows the first
        status = manager.status(second)
        assert first in status.waits_for and status.state == "queued"  # (and any run still live here before it)
    finally:
        stop_live_runs(server.runs_dir)
