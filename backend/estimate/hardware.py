"""The machine a job is checked against: GPU memory per GPU and host RAM per machine.

One function for the page and the CLI (`tunedeck validate`, `tunedeck estimate`), so both say
the same about whether a job fits. The facts come from NVML and psutil through the monitor
(backend/machine/monitor.py); a value given by hand (`--gpu-mem`, `--cpu-mem`, the page's boxes) wins.

Host RAM is this machine's only when NVIDIA GPUs are here (the job would run here). On a machine
without GPUs a GPU job runs elsewhere, so its GPU size is assumed (DEFAULT_GPU_GB) and host RAM
is not checked unless it is given. A CPU job (the demo) is not told apart: the estimator models
GPU memory, not a CPU job's RAM, so there is nothing of its own to check yet.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_GPU_GB = 80.0  # the common data-centre GPU (A100/H100 80GB) when this machine has none


class MachineValueError(ValueError):
    """A GPU size or RAM given by hand that is not one; `which` is "gpu" or "ram"."""

    def __init__(self, which: str, message: str):
        super().__init__(message)
        self.which = which


@dataclass(frozen=True)
class Machine:
    gpu_mem_gb: float  # memory of the smallest GPU: what a per-GPU estimate must fit in
    gpu_source: str  # where that number came from, in words
    ram_gb: float | None  # host RAM per machine, None when not checked
    ram_source: str
    has_gpu: bool  # NVML found a GPU here
    gpu_name: str | None = None  # the smallest GPU's NVML name ("NVIDIA H100 80GB HBM3"), None without one


def machine_facts(gpu: str | float | None = None, ram: float | None = None, *, monitor=None) -> Machine:
    """This machine's GPU and RAM (NVML and psutil via `monitor`), each overridden when given.

    `gpu` is '24', 'A100-80GB' or 'RTX 4090' (advisor.gpu_memory_gb); `ram` is in GB. A value
    that is not one raises MachineValueError saying what is accepted.
    """
    from tunedeck.backend.estimate.gpu_fit import gpu_memory_gb
    from tunedeck.backend.machine.monitor import Monitor

    given_gpu = None
    if gpu is not None and str(gpu).strip():
        try:
            given_gpu = gpu_memory_gb(gpu)
        except ValueError as exc:
            raise MachineValueError("gpu", str(exc)) from None
    if ram is not None and not 0 < ram < float("inf"):  # also nan, which every comparison would let "fit"
        raise MachineValueError("ram", f"{ram:g} GB of RAM: give the RAM of one machine in GB, e.g. 256")
    own = monitor is None
    monitor = monitor or Monitor(history=1)
    try:
        detected = monitor.total_gpu_memory_gb()
        sample = monitor.latest() or monitor.sample_once()
    finally:
        if own:
            monitor.stop()
    has_gpu = detected is not None
    if given_gpu is not None:
        gpu_gb, gpu_source = given_gpu, "given"
    elif has_gpu:
        gpu_gb, gpu_source = detected, "this machine's smallest GPU (NVML)"
    else:
        gpu_gb, gpu_source = DEFAULT_GPU_GB, f"no NVIDIA GPU here, {DEFAULT_GPU_GB:g} GB assumed"
    if ram is not None:
        ram_gb, ram_source = float(ram), "given"
    elif has_gpu:
        ram_gb, ram_source = sample.ram_total_gb, "this machine's RAM (psutil)"
    else:
        ram_gb, ram_source = None, "not checked: no GPU here, so a GPU job runs on another machine; give its RAM"
    smallest = min(sample.gpus, key=lambda g: g.memory_total_mb, default=None)
    return Machine(gpu_gb, gpu_source, ram_gb, ram_source, has_gpu, smallest.name if smallest else None)
