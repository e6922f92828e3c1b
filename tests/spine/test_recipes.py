"""What the maintained recipes do on real multi-GPU runs, in the generated files (docs/peer-configs.md).

Each file is checked by the library that reads it (DeepSpeed's config parser, TRL's SFTConfig, bash).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.spec import resolve_spec
from tunedeck.backend.validate import has_errors, validate

NVME = ["strategy.offload_optimizer=nvme", "strategy.offload_params=nvme", "strategy.nvme_path=/local_nvme"]


@pytest.mark.parametrize(
    "model, processes, buffer_size",
    [
        # DeepSpeed swaps ceil(numel / world) elements of a parameter through one buffer and asserts
        # "More elements ... than buffer size" beyond it. The largest parameter is the embedding.
        ("meta-llama/Llama-2-7b-hf", 1, 32000 * 4096),  # 131M > DeepSpeed's default 1e8
        ("meta-llama/Llama-2-7b-hf", 2, 100_000_000),  # 65.5M: the default fits
        ("meta-llama/Meta-Llama-3-8B", 2, 128256 * 4096 // 2),
        ("meta-llama/Meta-Llama-3-8B", 3, -(-128256 * 4096 // 3)),  # rounded up, never down
    ],
)
def test_nvme_parameter_buffers_hold_the_largest_partition(model, processes, buffer_size, export, check):
    spec = resolve_spec(
        "7b-full-zero2",
        ["strategy.kind=zero3", f"model.name_or_path={model}", f"launch.num_processes={processes}", *NVME],
    )
    assert not has_errors(validate(spec))
    zero = check(export(spec)).deepspeed_config.zero_config  # DeepSpeed read the key we wrote
    assert zero.offload_param.device == "nvme"
    assert zero.offload_param.buffer_size == buffer_size


def test_cpu_parameter_offload_has_no_swap_buffer():
    spec = resolve_spec("70b-qlora-zero3", ["strategy.offload_optimizer=cpu", "strategy.offload_params=cpu"])
    assert (
        "buffer_size" not in yaml.safe_load(render_bundle(spec)["ds_config.json"])["zero_optimization"]["offload_param"]
    )


@pytest.mark.parametrize(
    "preset", ["7b-lora-ddp", "7b-full-zero2", "13b-lora-fsdp", "70b-qlora-zero3", "70b-qlora-fsdp"]
)
def test_gpu_jobs_wait_for_tokenisation_and_tokenise_in_parallel(preset, export, check):
    # TRL tokenises on the main processes first while the other ranks wait in a barrier that gives up
    # after ddp_timeout (default 30 minutes); a large dataset outlasts it.
    args = check(export(resolve_spec(preset))).sft_config
    assert args.ddp_timeout == 3 * 3600
    assert args.ddp_timeout_delta.total_seconds() == 3 * 3600
    assert args.dataset_num_proc == 8


def test_cpu_bundles_keep_the_default_timeout_and_one_tokeniser(export, check):
    args = check(export(resolve_spec("demo"))).sft_config
    assert (args.ddp_timeout, args.dataset_num_proc) == (1800, None)
    lone = yaml.safe_load(render_bundle(resolve_spec("7b-lora-ddp", ["launch.num_processes=1"]))["training_args.yaml"])
    assert "ddp_timeout" not in lone  # one process never waits for another


# ---------------------------------------------------------------- several machines without an address


def _fake(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/usr/bin/env bash\n" + script)
    path.chmod(0o755)


@pytest.fixture
def two_machine_bundle(tmp_path):
    spec = resolve_spec("7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8"])
    assert not has_errors(validate(spec))  # Slurm finds machine 0 itself: exportable without an address
    bundle = tmp_path / "bundle"
    write_bundle(render_bundle(spec), bundle)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "accelerate", 'echo "accelerate $*"\n')
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ACCELERATE": str(bin_dir / "accelerate")}
    return bundle, bin_dir, env


def test_launch_sh_refuses_to_start_without_the_address_of_machine_0(two_machine_bundle):
    bundle, _, env = two_machine_bundle
    refused = subprocess.run(["bash", "launch.sh"], cwd=bundle, env=env, capture_output=True, text=True)
    assert refused.returncode == 2
    assert "set MAIN_PROCESS_IP=<address of machine 0>" in refused.stderr
    assert "accelerate" not in refused.stdout  # nothing half-launched
    ok = subprocess.run(
        ["bash", "launch.sh"],
        cwd=bundle,
        env={**env, "MAIN_PROCESS_IP": "10.0.0.7", "MACHINE_RANK": "1"},
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    assert "--machine_rank 1 --main_process_ip 10.0.0.7" in ok.stdout


def test_slurm_sbatch_gives_launch_sh_the_first_node_as_address(two_machine_bundle, tmp_path):
    bundle, bin_dir, env = two_machine_bundle
    # One write, as scontrol's buffered stdio makes it on a pipe (the SIGPIPE of later writes is slurm.py's concern).
    _fake(bin_dir, "scontrol", '[ "$1 $2" = "show hostnames" ] && /usr/bin/printf "gpu-node-a\\ngpu-node-b\\n"\n')
    # One task per node, as `srun --ntasks-per-node=1` runs it: here both nodes, one after the other.
    _fake(bin_dir, "srun", 'for id in 0 1; do SLURM_NODEID=$id bash -c "${@: -1}"; done\n')
    env = {**env, "SLURM_SUBMIT_DIR": str(bundle), "SLURM_JOB_NODELIST": "gpu-node-[a-b]"}
    result = subprocess.run(
        ["bash", str(bundle / "slurm.sbatch")], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "--machine_rank 0 --main_process_ip gpu-node-a" in result.stdout
    assert "--machine_rank 1 --main_process_ip gpu-node-a" in result.stdout


def test_two_machine_export_without_an_address_passes_the_libraries(export, check):
    result = check(export(resolve_spec("7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8"])))
    assert (result.launcher, result.num_processes, result.processes_per_machine) == ("multi_gpu", 8, 4)
