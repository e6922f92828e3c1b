"""NVML (nvidia-ml-py's `pynvml`) opened, read and closed in one place, for everything that asks this machine
about its NVIDIA GPUs: the monitor's samples (backend/machine/monitor.py), Start's GPU check
(backend/runs/preflight.py), where Try and Evaluate load a model (backend/after/worker_device.py) and the GPU
bench scripts (bench/gpu_smoke_check.py), which thereby read the GPUs the way the panel does.

`nvml`: the pynvml module, or a stand-in with the same names (tests/panel/fake_nvml.py) for GPUs this machine
does not have. Without the library or a driver every reading is empty, never an error: a CPU machine is a
machine with no GPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

GIB = 2**30


def load() -> Any:
    """The pynvml module (ImportError without nvidia-ml-py)."""
    import pynvml

    return pynvml


@contextmanager
def opened(nvml: Any = None) -> Iterator[Any]:
    """NVML initialised for the block, shut down after; None inside when there is no library or no driver."""
    try:
        nvml = load() if nvml is None else nvml
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - ImportError, pynvml.NVMLError (no driver) and its library-not-found subclass
        nvml = None
    if nvml is None:
        yield None
        return
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


@dataclass(frozen=True)
class GpuMemory:
    index: int
    free_gb: float
    total_gb: float


def gpu_indices(nvml: Any = None) -> list[int]:
    """Indices of this machine's NVIDIA GPUs, or [] without a GPU or driver."""
    with opened(nvml) as session:
        return [] if session is None else list(range(session.nvmlDeviceGetCount()))


def gpu_memory(nvml: Any = None) -> list[GpuMemory]:
    """Free and total memory of every GPU (GiB), or [] without a GPU or driver."""
    with opened(nvml) as session:
        if session is None:
            return []
        found = []
        for index in range(session.nvmlDeviceGetCount()):
            info = session.nvmlDeviceGetMemoryInfo(session.nvmlDeviceGetHandleByIndex(index))
            found.append(GpuMemory(index, info.free / GIB, info.total / GIB))
        return found
