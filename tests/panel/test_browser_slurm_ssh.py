"""A Slurm run from the page, on the real local 2-node cluster, from a panel outside it: over SSH (issue 36).

The panel's PATH has no sbatch (only ssh): the login node is OpenSSH's real server on 127.0.0.1
(tests/slurm/login_node.py: a key made for the test, its host key pinned), whose sessions reach the
local 2-node cluster (tests/slurm/local_cluster.py). One run tells the story (the CI budget: a
submission from a panel beside sbatch goes through the same RunManager calls, and the CLI's Slurm
tests in tests/slurm/test_slurm_runs.py submit there): the form names the login node, Start uploads
the run folder, checks a node's environment there (launch.slurm.preflight) and submits it while a
blocking job holds one of the two nodes (queued, with Slurm's reason),
the blocker cancelled (running on n0 and n1, the loss curve and rank 0's log, mirrored by appended
bytes), the GPUs tab showing each node's GPUs live from the run's telemetry (the fake NVML of
tests/panel/fake_nvml.py on each node, n1's GPU throttled: a warning naming it there, on the state
line and in `tunedeck runs show`), the panel restarted mid-run (it re-attaches), the login node lost
mid-run ("cannot reach", never a failed run; training goes on) and back (the panel re-attaches and
every record arrives), then Stop (a checkpoint there, no job, no process) and the checkpoint fetched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from runs.helpers import PACED, processes_working_in, tunedeck, wait_for

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
# Each node's GPUs for the run's telemetry, set for the ranks by launch.env: n1's is throttled.
FAKE_GPUS = {
    "TUNEDECK_NVML": str(Path(__file__).with_name("fake_nvml.py")),
    "TUNEDECK_FAKE_GPUS": json.dumps({"n1": [{**H100, "throttle": 8}], "*": [H100]}),
    "TUNEDECK_TELEMETRY_S": "1",
}
THROTTLED = "GPU 0 on n1 is throttled (hardware slowdown)"


def records(run_dir: Path) -> int:
    """Lines rank 0 has written to metrics.jsonl (read while it writes: a last line may be half written)."""
    return (run_dir / "metrics.jsonl").read_text().count("\n")


def outside_the_cluster(folder: Path) -> dict[str, str]:
    """A PATH with this environment's Python and OpenSSH's client, and no Slurm command."""
    folder.mkdir(exist_ok=True)
    (folder / "ssh").symlink_to("/usr/bin/ssh")
    return {"PATH": f"{Path(sys.executable).parent}:{folder}"}


def test_slurm_run_from_the_page_over_ssh_queues_runs_reattaches_survives_a_lost_link_and_stops(
    page, slurm_cluster, login_node, shared_runs_dir, demo_home, tmp_path
):
    runs, there = tmp_path / "runs", shared_runs_dir / "ssh-remote"
    outside = outside_the_cluster(tmp_path / "bin")
    server = PanelServer(runs, "--preset", "demo", env=outside)
    blocker = subprocess.run(
        # One node held: the 2-node run waits, and the node check before submit (one srun) gets the other one.
        ["sbatch", "--parsable", "--nodes=1", "--exclusive", "--output=/dev/null", "--wrap", "sleep 600"],
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
        for path, value in {**login_node.spec_values(), "launch.slurm.ssh.runs_dir": str(there)}.items():
            set_field(page, path, str(value))
        # The nodes' own environment: this venv (on a real cluster, a module load or a venv of the cluster's); the
        # ranks paced, as they train until the test stops them (runs/helpers.py: PACED).
        nodes_env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", **FAKE_GPUS, PACED[0]: PACED[1]}
        set_field(page, "launch.env", ", ".join(f"{name}={value}" for name, value in nodes_env.items()))
        open_tab(page, "form-sections", "Training")
        set_field(page, "training.max_steps", "5000")
        settle(page)
        wait_file_text(page, "host: 127.0.0.1")
        page.click("#start-run")
        wait_text(page, "#notice", "Started run", timeout=60_000)
        run_id = re.search(r"\d{8}-\d{6}-[0-9a-f]{6}", text_of(page, "#notice")).group(0)
        remote_dir = there / run_id

        # Queued behind the blocker, with Slurm's state and reason, read over SSH.
        wait_text(page, "#run-state", "PENDING (", timeout=60_000)
        assert re.search(r"PENDING \((Resources|Priority|Nodes)", text_of(page, "#run-state"))
        job_id = re.search(r"Slurm job (\d+)", text_of(page, "#run-state")).group(1)
        assert (remote_dir / "slurm.sbatch").is_file()  # the bundle went to the login node's runs folder
        # Before the submission, the node check ran there: the nodes' python (launch.env's PATH) has the stack.
        checked = json.loads((runs / run_id / "preflight_nodes.json").read_text())
        assert checked["report"]["node"] in ("n0", "n1") and checked["report"]["missing"] == {}, checked
        assert not [p for p in checked["problems"] if p["level"] == "error"], checked

        subprocess.run(["scancel", blocker], check=True)
        wait_text(page, "#run-state", "on n0, n1", timeout=120_000)
        wait_for(lambda: loss_points(page) >= 2, 300, 1, "the first loss points")
        wait_for(lambda: page.locator("#run-log textarea").input_value().strip(), 60, 1, "the rank-0 log")

        # Each node's GPUs, live from the run's telemetry (mirrored from the cluster like every record).
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
        server = PanelServer(runs, "--preset", "demo", env=outside)
        page.goto(server.url)
        page.click("#tab-run-button")
        wait_text(page, "#run-state", run_id, timeout=30_000)
        wait_text(page, "#run-state", "running", timeout=30_000)
        before = wait_for(lambda: loss_points(page), 60, 1, "the chart after the restart")
        wait_for(lambda: loss_points(page) > before, 120, 1, "the chart to keep growing")

        # The login node is lost: the page says so and keeps the run running; the job trains on.
        login_node.cut()
        try:
            wait_text(page, "#run-state", "cannot reach 127.0.0.1 since", timeout=60_000)
            assert "running" in text_of(page, "#run-state") and "failed" not in text_of(page, "#run-state")
            page.screenshot(path=str(ARTIFACTS / "run-ssh-unreachable.png"))
            records_then = records(remote_dir)
            wait_for(lambda: records(remote_dir) > records_then + 3, 120, 1, "training to go on there")
        finally:
            login_node.restore()
        # Back: the panel re-attaches by itself and the mirror catches up, every record in order.
        wait_for(lambda: "cannot reach" not in text_of(page, "#run-state"), 60, 1, "the panel to re-attach")
        before = loss_points(page)
        wait_for(lambda: loss_points(page) > before, 120, 1, "the chart to keep growing")
        mirrored = (runs / run_id / "metrics.jsonl").read_text()
        assert mirrored.endswith("\n") and (remote_dir / "metrics.jsonl").read_text().startswith(mirrored)

        # Stop: the ranks save a checkpoint there and exit; no job is left, no process of the run.
        page.click("#stop-run")
        wait_text(page, "#run-state", "stopped", timeout=180_000)
        assert list((remote_dir / "output").glob("checkpoint-*")), "Stop saves a checkpoint"
        wait_for(lambda: squeue(job_id) == "", 60, 1, "the job to leave the queue")
        wait_for(lambda: not processes_working_in(remote_dir), 30, 1, "no process of the run")
        mirrored = (runs / run_id / "metrics.jsonl").read_text()
        assert mirrored == (remote_dir / "metrics.jsonl").read_text()  # the end record too: nothing lost

        # The weights stayed there; the stop's checkpoint comes on demand, for Try, Evaluate and merge here.
        checkpoint = max((remote_dir / "output").glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        assert not (runs / run_id / "output" / checkpoint.name).exists()
        step = checkpoint.name.split("-")[1]
        fetched = subprocess.run(
            [
                Path(sys.executable).parent / "tunedeck",
                "runs",
                "fetch",
                run_id,
                "--checkpoint",
                step,
                "--runs-dir",
                runs,
            ],
            capture_output=True,
            text=True,
            env={**os.environ, **outside},
        )
        assert fetched.returncode == 0, fetched.stderr
        assert (runs / run_id / "output" / checkpoint.name / "adapter_model.safetensors").is_file(), fetched.stdout
    finally:
        subprocess.run(["scancel", blocker], check=False)
        slurm_cluster.cancel_all()
        server.stop()
