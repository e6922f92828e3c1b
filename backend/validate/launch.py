"""Validation rules of where a job runs: CPU processes (traps measured on CPU, and what this
machine can hold), and processes, machines and GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import psutil

from tunedeck.backend.spec import JobSpec
from tunedeck.backend.spec.problem import Problem, error, warning
from tunedeck.backend.spec.skypilot import accelerator_counts

# ---------------------------------------------------------------- CPU traps (measured)


def cpu(spec: JobSpec) -> Iterator[Problem]:
    if not spec.launch.use_cpu:
        return
    layout, precision = spec.layout, spec.training.precision
    if layout.is_fsdp and layout.fsdp_version == 1:
        # FSDP2 runs on CPU ranks: train_sft.py hands accelerate's FSDP2 path the gloo ranks (accelerate
        # alone would fall back to DDP). FSDP1 cannot: PyTorch needs an accelerator device for it.
        yield error(
            "strategy.fsdp_version",
            "FSDP1 cannot run on CPU (PyTorch: 'FSDP needs a non-CPU accelerator device'; accelerate silently "
            "falls back to plain DDP): set strategy.fsdp_version=2, which runs on CPU processes, or use GPUs.",
            {"strategy.fsdp_version": 2},
        )
    if layout.is_fsdp and layout.offload_params == "cpu":
        # Measured: FSDP2's CPUOffloadPolicy pins host memory, which torch refuses without an accelerator.
        yield error(
            "strategy.offload_params",
            "FSDP's CPU offload pins host memory, which needs a GPU ('Cannot access accelerator device when none is "
            "available'): set strategy.offload_params=none and strategy.offload_optimizer=none on CPU processes, "
            "whose weights are in host memory already.",
            {"strategy.offload_params": "none", "strategy.offload_optimizer": "none"},
        )
    if spec.strategy.is_deepspeed and precision != "fp32":
        yield error(
            "training.precision",
            f"DeepSpeed on CPU refuses {precision} ('Your setup doesn't support bf16/gpu'): set training.precision=fp32.",
            {"training.precision": "fp32"},
        )
    elif precision == "fp16":
        yield error(
            "training.precision",
            "fp16 mixed precision needs a GPU: set training.precision=fp32 (or bf16) on CPU.",
            {"training.precision": "fp32"},
        )
    if spec.training.optim in ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit"):
        yield error(
            "training.optim",
            f"{spec.training.optim} is a bitsandbytes GPU optimizer: set training.optim=adamw_torch_fused on CPU.",
            {"training.optim": "adamw_torch_fused"},
        )


# ---------------------------------------------------------------- CPU processes on this machine

# Every CPU rank is a whole Python process with the training stack imported: 530 MiB of RSS
# measured on this project's machine (torch, transformers, trl, peft, accelerate, datasets),
# before the model and the data.
CPU_RANK_BYTES = 530 * 2**20


def cpu_processes(spec: JobSpec) -> Iterator[Problem]:
    """A CPU job is checked against the machine it is set up on, where it most likely runs.

    Up to one rank per core the ranks run side by side (launch.sh gives each cores/ranks
    threads), so the demo's 2 processes on 2 cores pass. More ranks than cores only take
    turns: a warning. More ranks than the RAM can hold cannot start at all (65,536 processes
    on a 2-core machine would exhaust it): an error.
    """
    launch = spec.launch
    if not launch.use_cpu:
        return
    ranks, ram = launch.processes_per_machine, psutil.virtual_memory().total
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # as nproc
    if ranks * CPU_RANK_BYTES > ram:
        most = max(1, ram // CPU_RANK_BYTES)
        yield error(
            "launch.num_processes",
            f"{ranks:,} CPU processes per machine need over {ranks * CPU_RANK_BYTES / 2**30:,.0f} GiB of RAM (each "
            f"imports the training stack, about 530 MiB) and this machine has {ram / 2**30:.0f} GiB: set "
            f"launch.num_processes to at most {most * launch.num_machines}; {cores * launch.num_machines} "
            f"(one per core) trains fastest.",
        )
    elif ranks > cores:
        yield warning(
            "launch.num_processes",
            f"{ranks} CPU processes per machine take turns on this machine's {cores} cores rather than run side by "
            f"side: launch.num_processes={cores * launch.num_machines} (one per core) uses the cores as well with less "
            "memory (raise training.gradient_accumulation_steps to keep the global batch).",
        )


# ---------------------------------------------------------------- launch


def launch(spec: JobSpec) -> Iterator[Problem]:
    launch = spec.launch
    if launch.num_processes % launch.num_machines:
        yield error(
            "launch.num_processes",
            f"{launch.num_processes} processes cannot be spread evenly over {launch.num_machines} machines: "
            f"make launch.num_processes (the total) a multiple of launch.num_machines, e.g. "
            f"{launch.num_machines * max(1, launch.num_processes // launch.num_machines)}.",
        )
    if launch.machine_rank >= launch.num_machines:
        yield error(
            "launch.machine_rank",
            f"machine ranks run from 0 to {launch.num_machines - 1}: set launch.machine_rank below launch.num_machines.",
        )
    if launch.num_machines > 1 and not launch.main_process_ip and launch.backend == "local":
        # Not an error: slurm.sbatch finds machine 0 itself, and launch.sh reads MAIN_PROCESS_IP at run time.
        yield warning(
            "launch.main_process_ip",
            "no address of machine 0: slurm.sbatch finds it, but `bash launch.sh` on each machine needs "
            "MAIN_PROCESS_IP=<address of machine 0>; or set launch.main_process_ip (e.g. 10.0.0.1).",
        )
    if not launch.use_cpu and launch.gpu_ids != "all":
        ids = [part for part in launch.gpu_ids.split(",") if part]
        if not all(part.isdigit() for part in ids):
            yield error("launch.gpu_ids", f"{launch.gpu_ids!r} is not a GPU list: use all, or numbers such as 0,1,2,3.")
        elif len(ids) < launch.processes_per_machine:
            yield error(
                "launch.gpu_ids",
                f"{len(ids)} GPU(s) listed for {launch.processes_per_machine} processes per machine: list "
                f"{launch.processes_per_machine} GPUs, or set launch.gpu_ids=all, or lower launch.num_processes.",
            )
        elif len(ids) > launch.processes_per_machine:
            yield warning(
                "launch.gpu_ids",
                f"{len(ids)} GPUs listed but only {launch.processes_per_machine} processes per machine: the first ones are used.",
            )


# ---------------------------------------------------------------- the Slurm nodes' environment

# Images of the other runtime: enroot's REGISTRY#IMAGE spelling, Apptainer's SIF files and URI schemes.
APPTAINER_SCHEMES = ("docker://", "library://", "oras://", "shub://", "docker-archive:")


def slurm_environment(spec: JobSpec) -> Iterator[Problem]:
    if spec.launch.backend != "slurm":
        return  # the fields warn as ignored settings (validate.ignored_settings)
    container = spec.launch.slurm.container
    field, image = "launch.slurm.container.image", container.image
    if not image:
        return  # the runtime and mounts without an image warn as ignored settings (spec/applies.py)
    if container.runtime == "apptainer" and "#" in image:
        registry, _, rest = image.partition("#")
        yield error(
            field,
            f"{image!r} is enroot's spelling (REGISTRY#IMAGE), which Apptainer does not read: write "
            f"docker://{registry}/{rest}, or set launch.slurm.container.runtime=pyxis.",
            {field: f"docker://{registry}/{rest}"},
        )
    if container.runtime == "pyxis" and image.endswith(".sif"):
        yield error(
            field,
            f"{image!r} is an Apptainer image (SIF), which pyxis cannot run: set launch.slurm.container.runtime="
            "apptainer, or give a registry image or an enroot .sqsh file.",
            {"launch.slurm.container.runtime": "apptainer"},
        )
    elif container.runtime == "pyxis" and image.startswith(APPTAINER_SCHEMES):
        scheme, _, rest = image.partition("://")
        yield warning(
            field,
            f"pyxis names registry images REGISTRY#IMAGE:TAG (e.g. nvcr.io#nvidia/pytorch:24.05-py3), not {scheme}://: "
            f"write {rest.replace('/', '#', 1) if '.' in rest.split('/')[0] else rest}, or set "
            "launch.slurm.container.runtime=apptainer.",
        )


# ---------------------------------------------------------------- SkyPilot's resources


def skypilot(spec: JobSpec) -> Iterator[Problem]:
    """Each node gets the job's processes per machine in GPUs (sky.yaml's accelerators): a count given with a GPU
    type must say the same, or SkyPilot would start nodes the launch config does not fit."""
    if spec.launch.backend != "skypilot" or spec.launch.use_cpu:
        return  # the fields warn as ignored settings (spec/applies.py); sky.yaml writes the count itself
    field, per_node = "launch.skypilot.accelerators", spec.launch.processes_per_machine
    wrong = [f"{name}:{count}" for name, count in accelerator_counts(spec.launch.skypilot.accelerators) if count]
    wrong = [item for item in wrong if int(item.rsplit(":", 1)[1]) != per_node]
    if wrong:
        fixed = [name for name, _ in accelerator_counts(spec.launch.skypilot.accelerators)]
        yield error(
            field,
            f"{', '.join(wrong)} asks for another number of GPUs per node than the job's {per_node} processes per "
            f"machine (launch.num_processes / launch.num_machines): give the GPU type alone, and sky.yaml asks for "
            f"{per_node} of it per node, or change launch.num_processes.",
            {field: fixed},
        )
    if not spec.launch.skypilot.accelerators:
        yield error(field, "name a GPU type for the nodes, e.g. H100 (or set launch.use_cpu for CPU nodes).")
