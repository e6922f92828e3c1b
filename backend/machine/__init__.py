"""This machine: its GPUs (NVML) and host memory (psutil), sampled by one shared monitor thread.

The face: the panel and the CLI import these names from `tunedeck.backend.machine`, never its modules.
"""

from tunedeck.backend.machine.monitor import GpuSample, Monitor, Sample, shared_monitor

__all__ = [
    "GpuSample",
    "Monitor",
    "Sample",
    "shared_monitor",
]
