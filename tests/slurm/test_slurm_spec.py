"""launch.slurm.* in slurm.sbatch, and Slurm's own parsing of what tunedeck writes."""

from __future__ import annotations

import subprocess

import pytest

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.runs.slurm_jobs import expand_nodes
from tunedeck.backend.spec import SpecError, resolve_spec
from tunedeck.backend.validate import validate

FULL = [
    "launch.backend=slurm",
    "launch.num_machines=2",
    "launch.num_processes=16",
    "launch.use_cpu=false",
    "launch.slurm.partition=debug",
    "launch.slurm.time_limit=1-12:00:00",
    "launch.slurm.signal_before_s=600",
    "launch.slurm.cpus_per_task=2",
    "launch.slurm.mem=0",
    "launch.slurm.exclusive=false",
    "launch.slurm.requeue=true",
    "launch.slurm.extra_directives=['#SBATCH --comment=tunedeck', '#SBATCH --mail-type=END,FAIL']",
]


def header(spec) -> list[str]:
    return [line for line in render_bundle(spec)["slurm.sbatch"].splitlines() if line.startswith("#SBATCH")]


def test_every_slurm_field_reaches_the_header():
    lines = header(resolve_spec("demo", FULL))
    for expected in (
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=8",  # the processes per machine
        "#SBATCH --cpus-per-task=2",
        "#SBATCH --mem=0",
        "#SBATCH --partition=debug",
        "#SBATCH --time=1-12:00:00",
        "#SBATCH --signal=B:TERM@600",
        "#SBATCH --requeue",
        "#SBATCH --comment=tunedeck",
        "#SBATCH --mail-type=END,FAIL",
    ):
        assert expected in lines, (expected, lines)
    assert "#SBATCH --exclusive" not in lines
    defaults = header(resolve_spec("demo", ["launch.backend=slurm"]))
    assert "#SBATCH --exclusive" in defaults and "#SBATCH --no-requeue" in defaults
    assert not any(line.startswith(("#SBATCH --mem", "#SBATCH --time", "#SBATCH --partition")) for line in defaults)


@pytest.mark.parametrize(
    ("value", "seconds"), [("90", 5400), ("30:00", 1800), ("1:30:00", 5400), ("2-00:00:00", 172800), ("1-6", 108000)]
)
def test_slurm_time_formats(value, seconds):
    assert resolve_spec("demo", [f"launch.slurm.time_limit={value}"]).launch.slurm.time_limit_s() == seconds


@pytest.mark.parametrize(
    ("assignment", "field"),
    [
        ("launch.slurm.time_limit=soon", "launch.slurm.time_limit"),
        ("launch.slurm.mem=lots", "launch.slurm.mem"),
        ("launch.slurm.partition=gpu queue", "launch.slurm.partition"),
        ("launch.slurm.signal_before_s=5", "launch.slurm.signal_before_s"),
        ("launch.backend=kubernetes", "launch.backend"),
    ],
)
def test_bad_slurm_values_name_their_field(assignment, field):
    with pytest.raises(SpecError) as refused:
        resolve_spec("demo", [assignment])
    assert [p.field for p in refused.value.problems] == [field]


def test_main_process_ip_is_not_asked_for_on_slurm():
    two = ["launch.num_machines=2", "launch.num_processes=2"]
    local = {p.field for p in validate(resolve_spec("demo", two))}
    slurm = {p.field for p in validate(resolve_spec("demo", [*two, "launch.backend=slurm"]))}
    assert "launch.main_process_ip" in local and "launch.main_process_ip" not in slurm
    # Set anyway, it is named as ignored: Slurm's first node is the rendezvous host.
    ignored = validate(resolve_spec("demo", [*two, "launch.backend=slurm", "launch.main_process_ip=10.0.0.1"]))
    assert any(p.field == "launch.main_process_ip" and p.level == "warning" for p in ignored)


def test_node_lists_expand_like_scontrol():
    assert expand_nodes("n[0-1]") == ["n0", "n1"]
    assert expand_nodes("gpu[07-09,12],login1") == ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]
    assert expand_nodes("(null)") == [] and expand_nodes("") == []


@pytest.mark.slurm
def test_real_sbatch_accepts_the_header(slurm_cluster, tmp_path):
    spec = resolve_spec("demo", [line for line in FULL if "use_cpu" not in line and "num_processes" not in line])
    write_bundle(render_bundle(spec), tmp_path)
    done = subprocess.run(["sbatch", "--test-only", "slurm.sbatch"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "to start at" in done.stderr, done.stderr
