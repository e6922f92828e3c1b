"""What the Run tab costs the browser and the panel while a run is live, without training noise.

A synthetic live run (a run folder owned by this process, as a supervisor would own it) gets
metrics records 15 times a second and rank-0 log lines as the demo writes them; the panel shows
it on the Run tab in headless Chromium. Reported: the cores Chromium (all its processes) and the
panel process used over each window. `--panel-env PYTHONPATH=DIR` runs the panel from another
checkout (DIR/tunedeck a link to it) for a side-by-side comparison; `--age-min M` shows a run
that started M minutes ago (its records since then written first); `--profile F` writes Chrome's
CPU profile of the last window (open it in Chrome's DevTools).

    .venv/bin/python bench/bench_run_tab.py [--secs 30] [--windows 2] [--age-min 0] [--panel-env K=V] [--profile F]
        [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # the browser tests' panel server and page helpers
sys.path.insert(0, str(REPO / "bench"))

from bench_panel import cores_used, cpu_seconds  # noqa: E402
from panel.browser import CHROMIUM, CHROMIUM_FLAGS, PanelServer, wait_text  # noqa: E402

from tunedeck.backend.runs.folder import rank_log  # noqa: E402
from tunedeck.backend.runs.supervisor import process_identity, write_status  # noqa: E402

STEPS = 1_000_000  # the run never ends while measured
RECORD_EVERY_S = 1 / 15  # the demo's pace on this machine


def live_run(runs_dir: Path, stop: threading.Event, age_s: float = 0) -> str:
    """A run folder the panel takes for live (its supervisor: this process), written to until `stop`; started
    `age_s` ago, with the records of those seconds already written."""
    export = runs_dir.parent / "export"
    tunedeck = Path(sys.executable).parent / "tunedeck"
    subprocess.run([str(tunedeck), "export", "demo", "-o", str(export)], check=True, capture_output=True)
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-be0c4a"
    run_dir = runs_dir / run_id
    run_dir.mkdir()
    (run_dir / "job.yaml").write_text((export / "job.yaml").read_text())
    now = time.time()
    start = now - age_s
    write_status(run_dir, {"run_id": run_id, "state": "running", "title": "demo · lora · ddp · 2xCPU",
                           "created_at": start, "started_at": start, "ended_at": None, "exit_code": None,
                           "error": None, "gpu_ids": None, "supervisor": process_identity(os.getpid()),
                           "launcher": None})  # fmt: skip
    metrics, log = run_dir / "metrics.jsonl", run_dir / rank_log(0)
    past = int(age_s / RECORD_EVERY_S)
    lines = [{"event": "start", "time": start, "world_size": 2, "max_steps": STEPS}]
    lines += [record(step, start + step * RECORD_EVERY_S) for step in range(1, past + 1)]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    log.parent.mkdir(parents=True, exist_ok=True)

    def write() -> None:
        step = past
        with open(metrics, "a") as m, open(log, "a") as lg:
            while not stop.wait(RECORD_EVERY_S):
                step += 1
                logged = record(step, time.time())
                m.write(json.dumps(logged) + "\n")
                m.flush()
                lg.write(f"\r{step}/{STEPS} [00:10<01:00, 15.00it/s]")  # a progress bar rewriting its line
                if step % 50 == 0:
                    lg.write(f"\n{{'loss': {logged['loss']:.4f}, 'step': {step}}}\n")
                lg.flush()

    threading.Thread(target=write, daemon=True).start()
    return run_id


def record(step: int, at: float) -> dict:
    loss = 3 / (1 + step / 300)
    return {"event": "log", "time": at, "step": step, "max_steps": STEPS, "loss": loss, "learning_rate": 1e-4,
            "grad_norm": 1.0, "tokens_per_second": 5000.0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--secs", type=float, default=30, help="seconds per window (default 30)")
    parser.add_argument("--windows", type=int, default=2, help="windows measured one after another (default 2)")
    parser.add_argument("--age-min", type=float, default=0, help="the run started this long ago (default 0)")
    parser.add_argument("--panel-env", action="append", default=[], metavar="K=V", help="the panel's environment")
    parser.add_argument("--profile", type=Path, help="write Chrome's CPU profile of the last window here")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    stop, windows = threading.Event(), []
    with tempfile.TemporaryDirectory() as tmp:
        runs_dir = Path(tmp) / "runs"
        runs_dir.mkdir()
        server = PanelServer(runs_dir, "--preset", "demo", env=dict(kv.split("=", 1) for kv in args.panel_env))
        try:
            run_id = live_run(runs_dir, stop, 60 * args.age_min)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(server.url)
                page.click("#tab-run-button")
                wait_text(page, "#run-state", run_id, timeout=60_000)
                time.sleep(5)  # past the first full draw
                for window in range(args.windows):
                    profiling = args.profile and window == args.windows - 1
                    if profiling:
                        cdp = page.context.new_cdp_session(page)
                        cdp.send("Profiler.enable")
                        cdp.send("Profiler.start")
                    before = cpu_seconds(server.proc.pid)
                    time.sleep(args.secs)
                    windows.append(cores_used(before, cpu_seconds(server.proc.pid)))
                    if profiling:
                        args.profile.write_text(json.dumps(cdp.send("Profiler.stop")["profile"]))
                    print(f"window {window + 1}: Chromium {windows[-1]['browser']:.3f} cores, "
                          f"panel {windows[-1]['panel']:.3f} cores", file=sys.stderr)  # fmt: skip
                browser.close()
        finally:
            stop.set()
            server.stop()
    report = {
        "secs": args.secs,
        "age_min": args.age_min,
        "panel_env": args.panel_env,
        "browser_cores": [w["browser"] for w in windows],
        "panel_cores": [w["panel"] for w in windows],
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
