"""launch.env: variables for every rank (NCCL's network, the CUDA allocator ...), refused where they would do harm.

The run itself (the start record's `environment`, what rank 0 saw) is in tests/runs/test_launch_env.py;
hostile values exported by launch.sh in tests/hostile/test_shell_payloads.py.
"""

from __future__ import annotations

import subprocess

import pytest

from tunedeck.backend.render.launch import render_launch_sh
from tunedeck.backend.runs.launch import rank_env
from tunedeck.backend.spec import SpecError, resolve_spec
from tunedeck.backend.spec.fields import FIELDS_BY_PATH

NCCL = "NCCL_SOCKET_IFNAME=eth0, NCCL_IB_HCA=mlx5_0,mlx5_1, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
ENTRIES = ["NCCL_SOCKET_IFNAME=eth0", "NCCL_IB_HCA=mlx5_0,mlx5_1", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]


def test_the_forms_line_reads_as_entries_and_back():
    spec = resolve_spec("7b-lora-ddp", [f"launch.env={NCCL}"])
    assert spec.launch.env == ENTRIES  # a comma inside a value stays in it: an entry starts at ", NAME="
    field = FIELDS_BY_PATH["launch.env"]
    assert field.from_form(field.to_form(spec.launch.env)) == NCCL
    assert resolve_spec("7b-lora-ddp", [f"launch.env={field.to_form(spec.launch.env)}"]).launch.env == ENTRIES


@pytest.mark.parametrize(
    "entry, words",
    [
        ("NCCL_DEBUG", "is not NAME=VALUE"),
        ("2FAST=1", "is not NAME=VALUE"),
        ("RANK=3", "RANK is set by the launcher for each rank"),
        ("CUDA_VISIBLE_DEVICES=0,1", "choose the GPUs with launch.gpu_ids"),
        ("ACCELERATE_MIXED_PRECISION=fp16", "is set by the launcher"),
        ("HF_TOKEN=hf_abc", "HF_TOKEN looks like a secret"),
        ("WANDB_API_KEY=0123", "WANDB_API_KEY looks like a secret"),
        ("NCCL_DEBUG=INFO, NCCL_DEBUG=WARN", "item 2: NCCL_DEBUG is set twice"),
    ],
)
def test_refused_entries_say_why(entry, words):
    with pytest.raises(SpecError) as caught:
        resolve_spec("7b-lora-ddp", [f"launch.env={entry}"])
    assert "launch.env" in str(caught.value) and words in str(caught.value)


def test_launch_sh_exports_each_value_as_one_word(tmp_path):
    spec = resolve_spec("7b-lora-ddp", [f"launch.env={NCCL}, ODD=a b $HOME 'q'"])
    script = render_launch_sh(spec)
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_1\n" in script
    # What bash makes of the exports: each variable holds exactly the typed value
    exports = "\n".join(line for line in script.splitlines() if line.startswith("export "))
    shown = subprocess.run(
        ["bash", "-c", exports + '\nprintf "%s|" "$NCCL_IB_HCA" "$PYTORCH_CUDA_ALLOC_CONF" "$ODD"'],
        capture_output=True, text=True, check=True, env={"HOME": str(tmp_path)},
    ).stdout  # fmt: skip
    assert shown == "mlx5_0,mlx5_1|expandable_segments:True|a b $HOME 'q'|"
    # exported before the thread default, so a job's own OMP_NUM_THREADS wins over it
    assert script.index("export NCCL_SOCKET_IFNAME") < script.index("OMP_NUM_THREADS=$(")
    assert "launch.env" not in render_launch_sh(resolve_spec("7b-lora-ddp"))  # no empty block without any


def test_runs_started_here_get_the_same_variables_over_the_defaults():
    spec = resolve_spec("demo", ["launch.env=OMP_NUM_THREADS=2, NCCL_DEBUG=INFO"])
    env = rank_env(spec, gpus=None)
    assert env["NCCL_DEBUG"] == "INFO" and env["OMP_NUM_THREADS"] == "2"  # the job's, not the CPU default of 1
    assert rank_env(resolve_spec("demo"), gpus=None)["OMP_NUM_THREADS"] == "1"
