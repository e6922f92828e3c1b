"""The node check (backend/runs/preflight_nodes.py) on the real local 2-node Slurm cluster: a real srun on one
node, after the job's setup lines, imports the training stack.

With setup lines that put this venv first, the node finds the stack at requirements.txt's versions; with
setup lines that activate a bare venv, Start names what is missing on the node, under the field to fix,
and nothing reaches Slurm: no job, no run folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tunedeck.backend.render import render_bundle, requirements, write_bundle
from tunedeck.backend.runs.preflight_nodes import check_nodes
from tunedeck.backend.spec import resolve_spec
from tunedeck.tests.hostile.helpers import error_fields

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.timeout(300)]
TUNEDECK = str(Path(sys.executable).parent / "tunedeck")
SLURM = ["--set", "launch.backend=slurm"]


def test_the_node_finds_this_venvs_stack(slurm_cluster, shared_runs_dir):
    setup = f"export PATH={Path(sys.executable).parent}:$PATH"
    spec = resolve_spec("demo", [*SLURM[1:], f"launch.slurm.setup=[{setup!r}]"])
    run_dir = shared_runs_dir / "node-check"
    write_bundle(render_bundle(spec), run_dir)
    problems, report = check_nodes(spec, str(run_dir), dict(os.environ))
    assert [p for p in problems if p.level == "error"] == [], (problems, report)
    assert report["node"] in ("n0", "n1") and report["python"].startswith(str(Path(sys.executable).parent))
    assert (
        report["packages"]["torch"].split("+")[0] == requirements.tested_versions()["torch"] and report["missing"] == {}
    )


def test_a_missing_stack_is_named_and_nothing_is_submitted(slurm_cluster, shared_runs_dir):
    bare = shared_runs_dir / "bare-venv"
    venv.create(bare, with_pip=False)  # a python3 without the training stack
    runs = shared_runs_dir / "refused"
    done = subprocess.run(
        [
            TUNEDECK,
            "train",
            "demo",
            "--runs-dir",
            str(runs),
            *SLURM,
            "--set",
            f"launch.slurm.setup=source {bare}/bin/activate",
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert error_fields(done.stderr) == ["launch.slurm.setup"], done.stderr
    assert "missing torch, transformers, trl" in done.stderr and f"({bare}/bin/python3)" in done.stderr
    assert "install requirements.txt's versions into that environment" in done.stderr
    jobs = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=True).stdout.split()
    assert not [name for name in jobs if name.startswith("tunedeck-") and name != "tunedeck-preflight"], jobs
    assert [p.name for p in runs.iterdir() if p.is_dir()] == []  # the written run folder is removed with the refusal


def test_over_ssh_the_login_node_checks_and_a_refusal_leaves_nothing_there(
    slurm_cluster, login_node, shared_runs_dir, tmp_path
):
    from tunedeck.backend.runs import RunError, RunManager

    bare = shared_runs_dir / "bare-venv-ssh"
    venv.create(bare, with_pip=False)
    there = shared_runs_dir / "ssh-refused"
    values = {**login_node.spec_values(), "launch.slurm.ssh.runs_dir": str(there)}
    spec = resolve_spec(
        "demo", [*SLURM[1:], f"launch.slurm.setup=source {bare}/bin/activate", *(f"{k}={v}" for k, v in values.items())]
    )
    runs = tmp_path / "runs"
    with pytest.raises(RunError) as refused:
        RunManager(runs).start(spec)
    said = str(refused.value)
    assert "launch.slurm.setup" in said and "missing torch, transformers, trl" in said, said
    assert f"({bare}/bin/python3)" in said, said  # the node's python, reached through the login node
    assert [p.name for p in runs.iterdir() if p.is_dir()] == []  # nothing here
    assert not there.exists() or [p.name for p in there.iterdir()] == []  # and nothing on the login node
    jobs = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, check=True).stdout.split()
    assert not [name for name in jobs if name.startswith("tunedeck-") and name != "tunedeck-preflight"], jobs
