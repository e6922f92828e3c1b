"""Resume on another machine shape (`tunedeck runs resume ID --num-processes N [--num-machines M]`): the job that
continues a run on a different number of processes keeps its global batch, re-solving gradient accumulation.

global batch = per-device batch x data-parallel processes x gradient accumulation steps. On N processes the
accumulation becomes global / (per-device x data-parallel size on N); a global batch it does not divide is said,
with the batch sizes that would. Every optimizer step then sees the same rows as before: accelerate hands the
processes consecutive batches of one sampler, so 2 processes x 1 accumulation step and 1 process x 2 steps
take the same two batches in the same order.

What loads on another shape: a DDP checkpoint holds the whole optimizer state (optimizer.pt), which any number of
processes loads as it is (an RNG state per rank that is missing is started anew, and the Trainer says so). A ZeRO
checkpoint holds one optimizer shard per process: the recipe converts it into DeepSpeed's universal checkpoint and
loads that (backend/recipe/reshard.py). An FSDP checkpoint is torch distributed checkpoint, which reshards as it
loads. What each resumed run got back (optimizer step, schedule position, data position) is in its start record
and checked by its sanity gate (backend/recipe/restore.py). Refused: a ZeRO optimizer offloaded to NVMe, whose
state is kept per process outside the checkpoint's shards.
"""

from __future__ import annotations

from typing import NamedTuple

from tunedeck.backend.runs.manager import RunError
from tunedeck.backend.spec import JobSpec, SpecError, set_paths


class Shape(NamedTuple):
    """The machine shape a resumed run asks for; None: as the run was."""

    num_processes: int | None = None
    num_machines: int | None = None


AS_IT_WAS = Shape()


def reshaped(job: JobSpec, num_processes: int | None, num_machines: int | None) -> tuple[JobSpec, str]:
    """(the job on the new shape with the same global batch, a sentence on what changed); RunError says why not.
    None for both: the job as it is, and ""."""
    if num_processes is None and num_machines is None:
        return job, ""
    launch = job.launch
    machines = num_machines or launch.num_machines
    processes = num_processes or launch.num_processes
    if processes % machines:
        raise RunError(f"--num-processes {processes} does not divide over {machines} machines: give each the same")
    if processes == launch.num_processes and machines == launch.num_machines:
        return job, ""
    try:
        spec = set_paths(job, {"launch.num_processes": processes, "launch.num_machines": machines})
    except SpecError as exc:
        raise RunError(f"the job on {processes} processes is not valid: {exc}") from None
    if spec.data_parallel_size != job.data_parallel_size and job.strategy.offload_optimizer == "nvme":
        raise RunError(
            "a ZeRO checkpoint whose optimizer state is offloaded to NVMe is kept per process and loads only on the "
            f"{job.data_parallel_size} processes it was saved on: resume it on {launch.num_processes}"
        )
    per_step = spec.training.per_device_train_batch_size * spec.data_parallel_size
    wanted = job.global_batch_size
    if wanted % per_step:
        dp, rows = spec.data_parallel_size, spec.training.per_device_train_batch_size
        if wanted % dp:
            raise RunError(
                f"the global batch of {wanted} rows does not divide over {dp} processes: resume on a number of "
                f"processes that divides {wanted}"
            )
        raise RunError(
            f"the global batch of {wanted} rows is {wanted // dp} per process on {dp}, which {rows} rows per step "
            f"(training.per_device_train_batch_size) does not divide: set it to a divisor of {wanted // dp}"
        )
    accumulation = wanted // per_step
    spec = set_paths(spec, {"training.gradient_accumulation_steps": accumulation})
    said = (
        f"on {processes} process{'es' * (processes > 1)} ({machines} machine{'s' * (machines > 1)}) instead of "
        f"{launch.num_processes}, "
        f"gradient accumulation {job.training.gradient_accumulation_steps} → {accumulation}: the global batch stays "
        f"{wanted}"
    )
    return spec, said
