"""What watching a run in the panel costs the run, and how fast a new metrics record reaches the page.

1. Training through the panel vs bare: the demo started with the page's Start button (panel
   process, detached supervisor, the page open in headless Chromium, ticking and polling,
   the panel tailing metrics.jsonl and the rank-0 log), then the very same bundle (the run
   folder's generated files, copied) run bare with `bash launch.sh`; alternating, `--repeats`
   times each. Training steps per second from each run's metrics.jsonl (first logged step to last).
2. Streaming latency: a run folder the page follows receives synthetic metrics records, one at
   a time at random moments; for each, the time from its write to the page showing its step
   (the progress line "step N/..."), p50 and p95 over `--samples`.
3. The panel's resident memory while a run trains (the highest sample, one a second).
4. Where the cost goes: the cores the panel process and Chromium kept busy while a run trained.

    .venv/bin/python bench/bench_panel.py [--repeats 2] [--samples 50] [--steps 300] [--tab run|job|gpus] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the browser tests' panel server and page helpers

from panel.browser import (  # noqa: E402
    CHROMIUM,
    CHROMIUM_FLAGS,
    EVENTS_TAP_JS,
    PanelServer,
    open_tab,
    set_field,
    settle,
    wait_text,
)

from tunedeck.backend.runs.manager import RUN_ID_PATTERN  # noqa: E402
from tunedeck.backend.runs.records import read_records  # noqa: E402
from tunedeck.backend.runs.supervisor import process_identity, write_status  # noqa: E402

BUNDLE_FILES = ("job.yaml", "accelerate_config.yaml", "training_args.yaml", "train_sft.py", "launch.sh")
PROGRESS_JS = "([s, t]) => { const e = document.querySelector(s); return !!e && e.innerText.includes(t); }"


def steps_per_s(run_dir: Path) -> float:
    logs = [
        r
        for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if r.get("event") == "log" and "loss" in r
    ]
    first, last = logs[0], logs[-1]
    return (last["step"] - first["step"]) / (last["time"] - first["time"])


class RssSampler(threading.Thread):
    """The highest resident memory of one process, sampled every second while running."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        import psutil

        self.process, self.peak, self.stopped = psutil.Process(pid), 0, threading.Event()

    def run(self):
        while not self.stopped.wait(1.0):
            self.peak = max(self.peak, self.process.memory_info().rss)


def cpu_seconds(panel_pid: int) -> dict[str, float]:
    """CPU seconds used so far by the panel process itself (not its runs) and by all of Chromium's processes."""
    import psutil

    times = psutil.Process(panel_pid).cpu_times()
    browser = 0.0
    for proc in psutil.process_iter(["name", "cpu_times"]):
        if "chrom" in (proc.info["name"] or "") and proc.info["cpu_times"] is not None:
            browser += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return {"panel": times.user + times.system, "browser": browser, "wall": time.monotonic()}


def cores_used(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Cores the panel and the browser kept busy on average between two cpu_seconds() readings."""
    wall = after["wall"] - before["wall"]
    return {who: (after[who] - before[who]) / wall for who in ("panel", "browser")}


def train_through_panel(page, server: PanelServer, rss: RssSampler, timeout_s: float, tab: str) -> tuple[Path, dict]:
    """The run's folder, and the cores the panel and Chromium used while `tab` was in view and the run trained."""
    before = {p.name for p in server.runs_dir.iterdir()}
    page.click("#tab-job-button")  # Start is on the Job tab; the page shows the Run tab once a run starts
    page.click("#start-run")
    wait_text(page, "#notice", "Started run", timeout=60_000)
    wait_text(page, "#run-state", "running", timeout=120_000)
    rss.peak = max(rss.peak, rss.process.memory_info().rss)
    if tab != "run":  # the page stays open on that tab, the Run tab is not drawn; back to it at the end
        page.click(f"#tab-{tab}-button")
        start = cpu_seconds(server.proc.pid)
        wait_for_end(server.runs_dir, timeout_s)
        cores = cores_used(start, cpu_seconds(server.proc.pid))
        page.click("#tab-run-button")
    else:
        start = cpu_seconds(server.proc.pid)
    # Checked once a second, as a person glances at it: a check on every animation frame (Playwright's default)
    # would itself take CPU from the ranks and be counted against the panel.
    page.wait_for_function(PROGRESS_JS, arg=["#run-state", "finished"], polling=1000, timeout=timeout_s * 1000)
    if tab == "run":
        cores = cores_used(start, cpu_seconds(server.proc.pid))
    (run_dir,) = [p for p in server.runs_dir.iterdir() if p.name not in before and RUN_ID_PATTERN.match(p.name)]
    return run_dir, cores


def wait_for_end(runs_dir: Path, timeout_s: float) -> None:
    """Until the newest run's metrics.jsonl has its end record, read from disk without the page."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        newest = max(runs_dir.glob("*/metrics.jsonl"), key=lambda p: p.parent.name, default=None)
        if newest is not None and read_records(newest.parent).end is not None:
            return
        time.sleep(1)
    raise SystemExit("the run through the panel did not end in time")


def train_bare(run_dir: Path, folder: Path, timeout_s: float) -> Path:
    folder.mkdir(parents=True)
    for name in BUNDLE_FILES:
        shutil.copy2(run_dir / name, folder / name)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    result = subprocess.run(
        ["bash", "launch.sh"], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if result.returncode != 0:
        raise SystemExit(f"the bare run failed (exit {result.returncode}):\n{result.stderr[-3000:]}")
    return folder


def streaming_latency(page, runs_dir: Path, template: Path, samples: int) -> list[float]:
    """Seconds from a metrics record's write to the page showing it, for `samples` records."""
    run_dir = runs_dir / f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(time.time() + 60))}-fa57fa"  # the newest
    run_dir.mkdir()
    status = json.loads((template / "status.json").read_text())  # live, as far as the panel can tell: this process
    write_status(run_dir, {**status, "state": "running", "ended_at": None, "exit_code": None,
                           "supervisor": process_identity(os.getpid())})  # fmt: skip
    shutil.copy2(template / "job.yaml", run_dir / "job.yaml")
    start = (template / "metrics.jsonl").read_text().splitlines()[0]  # the start record: what the run got
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text(start + "\n")
    total = samples + 1
    page.reload()  # a new page follows the newest run: this one
    page.click("#tab-run-button")
    page.wait_for_function(PROGRESS_JS, arg=["#run-state", run_dir.name], timeout=120_000)
    rng, latencies = random.Random(14), []
    for step in range(1, total):
        time.sleep(rng.uniform(0.1, 1.2))  # at random moments against the page's polling
        record = {"event": "log", "time": time.time(), "step": step, "max_steps": total, "loss": 2.0 - step / total}
        written = time.monotonic()
        with open(metrics, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        page.wait_for_function(
            PROGRESS_JS, arg=["#run-progress", f"step {step}/{total}"], polling="raf", timeout=30_000
        )
        latencies.append(time.monotonic() - written)
    return latencies


def start_panel(runs_dir: Path, attempts: int = 3) -> PanelServer:
    """The panel on the demo preset. Gradio gives up when its own first request to localhost is slow
    ('localhost is not accessible'), which happens on a machine busy with other work: try again."""
    for attempt in range(attempts):
        server = PanelServer(runs_dir, "--preset", "demo", wait=False)
        try:
            server.wait_ready()
            time.sleep(2)  # Gradio's own localhost check comes after the server answers
            if server.proc.poll() is None:
                return server
        except RuntimeError:
            if attempt == attempts - 1:
                raise
        server.stop()
    raise SystemExit(f"the panel did not start:\n{server.log()[-3000:]}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="runs each way, alternating (default 2)")
    parser.add_argument("--samples", type=int, default=50, help="metrics records timed into the page (default 50)")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each demo run (default 300)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per training run")
    parser.add_argument(
        "--tab", choices=("run", "job", "gpus"), default="run",
        help="the tab the page shows while a run trains: run (its charts drawn, default), job (nothing drawn) "
        "or gpus (the host's gauges)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="bench-panel-"))
    runs_dir = work / "runs"
    runs_dir.mkdir()
    server = start_panel(runs_dir)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            context = browser.new_context(viewport={"width": 1440, "height": 1000})
            context.add_init_script(EVENTS_TAP_JS)  # for settle(): every response the page asked for arrived
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(server.url)
            page.wait_for_selector("#file-view .cm-content", timeout=180_000)  # a busy machine: the first load is slow
            wait_text(page, "#job-issues", "No problems", timeout=60_000)
            if args.steps != 600:  # the demo preset's max_steps
                open_tab(page, "form-sections", "Training")
                set_field(page, "training.max_steps", str(args.steps))
                settle(page)
            rss = RssSampler(server.proc.pid)
            rss.start()
            panel, bare, cores, template = [], [], [], None
            for repeat in range(args.repeats):
                template, used = train_through_panel(page, server, rss, args.timeout, args.tab)
                cores.append(used)
                panel.append(steps_per_s(template))
                bare.append(steps_per_s(train_bare(template, work / f"bare-{repeat}", args.timeout)))
            rss.stopped.set()
            latencies = streaming_latency(page, runs_dir, template, args.samples)
            browser.close()
    except BaseException:
        print(f"the panel's log:\n{server.log()[-3000:]}", file=sys.stderr)
        raise
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "repeats": args.repeats,
        "tab": args.tab,
        "steps": args.steps,
        "panel_steps_per_s": panel,
        "bare_steps_per_s": bare,
        "steps_per_s_ratio": statistics.mean(panel) / statistics.mean(bare),
        "latency_samples": len(latencies),
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p95_s": percentile(latencies, 0.95),
        "panel_rss_mib": rss.peak / 2**20,
        # While a run trained through the panel with --tab in view: the cores the panel and Chromium kept busy.
        "panel_cpu_cores": statistics.mean(c["panel"] for c in cores),
        "browser_cpu_cores": statistics.mean(c["browser"] for c in cores),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
