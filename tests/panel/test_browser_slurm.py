"""A Slurm run from the page, on the real local 2-node cluster (tests/slurm/local_cluster.py).

One run serves the whole story: Where to run = slurm, Start while a blocking job holds both
nodes (queued, with Slurm's reason), the blocker cancelled (running on n0 and n1, live curves
and the rank-0 log), the GPUs tab showing each node's GPUs live from the run's telemetry (the
fake NVML of tests/panel/fake_nvml.py on each node, n1's GPU throttled: a warning naming it there,
on the state line and in `tunedeck runs show`), the panel restarted mid-run (it re-attaches),
then Stop (a checkpoint, no job in squeue, no process of the run left).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from runs.helpers import processes_working_in, tunedeck, wait_for

from panel.browser import (
    ARTIFACTS,
    PanelServer,
    choose,
    free_port,
    open_tab,
    plot_points,
    set_field,
    settle,
    text_of,
    wait_file_text,
    wait_text,
)

pytestmark = [pytest.mark.slurm, pytest.mark.browser, pytest.mark.integration, pytest.mark.timeout(900)]


def loss_points(page) -> int:
    return plot_points(page, "loss-chart").get("this run loss", 0)


def squeue(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()


H100 = {"name": "NVIDIA H100 80GB HBM3", "total_mb": 81559, "used_mb": 40000, "util": 97, "temp": 64, "power_w": 512}
# Each node's GPUs for the run's telemetry (sbatch passes the panel's environment to the job): n1's is throttled.
FAKE_GPUS = {
    "TUNEDECK_NVML": str(Path(__file__).with_name("fake_nvml.py")),
    "TUNEDECK_FAKE_GPUS": json.dumps({"n1": [{**H100, "throttle": 8}], "*": [H100]}),
    "TUNEDECK_TELEMETRY_S": "1",
}
THROTTLED = "GPU 0 on n1 is throttled (hardware slowdown)"


def test_slurm_run_from_the_page_queues_runs_reattaches_and_stops(page, slurm_cluster, shared_runs_dir, demo_home):
    runs = shared_runs_dir / "panel"
    runs.mkdir(exist_ok=True)
    server = PanelServer(runs, "--preset", "demo", env=FAKE_GPUS)
    blocker = subprocess.run(
        ["sbatch", "--parsable", "--nodes=2", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        page.goto(server.url)
        page.wait_for_selector("#file-view .cm-content", timeout=90_000)
        open_tab(page, "form-sections", "Hardware/Launch")
        choose(page, "launch.backend", "slurm")
        set_field(page, "launch.num_machines", "2")
        set_field(page, "launch.num_processes", "2")
        set_field(page, "launch.main_process_port", str(free_port()))  # both "nodes" are this machine
        open_tab(page, "form-sections", "Training")
        set_field(page, "training.max_steps", "5000")
        settle(page)
        wait_file_text(page, "backend: slurm")
        page.click("#start-run")
        wait_text(page, "#notice", "Started run", timeout=60_000)
        run_id = re.search(r"\d{8}-\d{6}-[0-9a-f]{6}", text_of(page, "#notice")).group(0)

        # Queued behind the blocker, with Slurm's state and reason.
        wait_text(page, "#run-state", "queued", timeout=30_000)
        wait_text(page, "#run-state", "PENDING (", timeout=30_000)
        assert re.search(r"PENDING \((Resources|Priority|Nodes)", text_of(page, "#run-state")), text_of(
            page, "#run-state"
        )
        job_id = re.search(r"Slurm job (\d+)", text_of(page, "#run-state")).group(1)

        subprocess.run(["scancel", blocker], check=True)
        wait_text(page, "#run-state", "running", timeout=120_000)
        wait_text(page, "#run-state", "on n0, n1", timeout=30_000)
        wait_for(lambda: loss_points(page) >= 2, 300, 1, "the first loss points")
        wait_for(lambda: page.locator("#run-log textarea").input_value().strip(), 60, 1, "the rank-0 log")

        page.click("#tab-gpus-button")
        wait_text(page, "#gpu-monitor", f"Slurm job {job_id} (run {run_id}) on n0, n1", timeout=30_000)
        wait_text(page, "#gpu-monitor", THROTTLED, timeout=30_000)
        for node in ("n0", "n1"):
            card = text_of(page, f"#machine-{node}")
            assert "GPU 0 · NVIDIA H100 80GB HBM3" in card and "97%" in card and "39.1 / 79.6 GB" in card, card
        page.screenshot(path=str(ARTIFACTS / "gpus-tab-slurm-nodes.png"))
        shown = tunedeck("runs", "show", run_id, "--runs-dir", runs)
        machines = [line for line in shown.stdout.splitlines() if line.startswith("machine ")]
        assert [line.split()[1] for line in machines] == ["n0", "n1"], shown.stdout
        assert all("1 x NVIDIA H100 80GB HBM3 · util 97%" in line for line in machines), machines
        assert f"warning  ⚠ {THROTTLED}" in shown.stdout, shown.stdout
        assert re.search(r"^network  measured [\d.]+ GB/s between machines; the estimate assumed", shown.stdout, re.M)
        page.click("#tab-run-button")
        wait_text(page, "#run-state", THROTTLED, timeout=30_000)
        wait_text(page, "#run-facts", "network: measured", timeout=30_000)  # beside the link the estimate assumed
        assert " GB/s between machines; the estimate assumed " in text_of(page, "#run-facts")

        # The panel restarted mid-run finds the run where it is.
        server.stop()
        server = PanelServer(runs, "--preset", "demo")
        page.goto(server.url)
        page.click("#tab-run-button")
        wait_text(page, "#run-state", run_id, timeout=30_000)
        wait_text(page, "#run-state", "running", timeout=30_000)
        before = wait_for(lambda: loss_points(page), 60, 1, "the chart after the restart")
        wait_for(lambda: loss_points(page) > before, 120, 1, "the chart to keep growing")

        # Stop: the ranks save a checkpoint and exit; nothing is left in the queue or on the machine.
        page.click("#stop-run")
        wait_text(page, "#run-state", "stopped", timeout=180_000)
        run_dir = runs / run_id
        assert list((run_dir / "output").glob("checkpoint-*")), "Stop saves a checkpoint"
        wait_for(lambda: squeue(job_id) == "", 60, 1, "the job to leave the queue")
        wait_for(lambda: not processes_working_in(run_dir), 30, 1, "no process of the run")
    finally:
        subprocess.run(["scancel", blocker], check=False)
        slurm_cluster.cancel_all()
        server.stop()
