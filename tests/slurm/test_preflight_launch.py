"""Preflight of where a job runs (backend/runs/preflight_launch.py): each problem names its field and
the fix, before anything starts or is submitted."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tunedeck.tests.hostile.helpers import error_fields

TUNEDECK = str(Path(sys.executable).parent / "tunedeck")
TWO_MACHINES = ["--set", "launch.num_machines=2", "--set", "launch.num_processes=2"]


def train(runs: Path, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [TUNEDECK, "train", "demo", "--runs-dir", str(runs), *sets], capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow  # the console script in a subprocess
def test_unresolvable_rendezvous_host_is_named_before_start(tmp_path):
    done = train(tmp_path / "runs", *TWO_MACHINES, "--set", "launch.main_process_ip=no-such-node.invalid")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "launch.main_process_ip" in error_fields(done.stderr)
    assert "'no-such-node.invalid' does not resolve here" in done.stderr
    assert not any((tmp_path / "runs").iterdir())


@pytest.mark.slow
def test_rendezvous_port_in_use_on_machine_zero_is_named(tmp_path):
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = train(
            tmp_path / "runs",
            *TWO_MACHINES,
            "--set",
            "launch.main_process_ip=127.0.0.1",
            "--set",
            f"launch.main_process_port={port}",
        )
    assert done.returncode == 2 and "launch.main_process_port" in error_fields(done.stderr), done.stderr
    assert f"port {port} is already in use" in done.stderr


@pytest.mark.slurm
@pytest.mark.slow
def test_full_disk_is_named_before_submission(slurm_cluster, shared_runs_dir, small_disk):
    disk = small_disk("1m")  # the demo keeps 2 checkpoints of about 1 MiB each
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    done = train(
        shared_runs_dir / "full", "--set", "launch.backend=slurm", *TWO_MACHINES, "--set", f"output_dir={disk}/out"
    )
    assert done.returncode == 2 and "output_dir" in error_fields(done.stderr), done.stdout + done.stderr
    assert f"{disk} has" in done.stderr and "lower training.save_total_limit" in done.stderr
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before
    assert not (shared_runs_dir / "full").exists() or not any((shared_runs_dir / "full").iterdir())


def test_node_local_runs_folder_is_a_named_warning_for_slurm(tmp_path):
    from tunedeck.backend.runs.preflight import preflight
    from tunedeck.backend.spec import resolve_spec

    spec = resolve_spec("demo", ["launch.backend=slurm"])
    named = {(p.level, p.field) for p in preflight(spec, Path("/tmp/runs"))}
    assert ("warning", "--runs-dir") in named
    local = resolve_spec("demo")
    assert "--runs-dir" not in {p.field for p in preflight(local, Path("/tmp/runs"))}  # a local run may use /tmp
