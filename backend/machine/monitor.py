"""GPU and host monitor: a sampler thread reading NVML and psutil into a ring buffer.

One sample a second: per GPU utilisation, memory used/total, temperature, power and the
processes holding memory (NVML, through nvidia-ml-py's `pynvml`), plus CPU and RAM
(psutil). Without an NVIDIA GPU or driver, NVML fails to initialise; the monitor then
reports why in `gpu_error` and keeps sampling CPU and RAM.

The NVML module is a constructor argument so tests can stand in for a GPU this machine
does not have; everything else is the real code path.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import psutil

from tunedeck.backend.machine.nvml import load


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mb: float | None  # None when the driver does not report it (e.g. in containers)


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    utilization_pct: float | None
    memory_used_mb: float
    memory_total_mb: float
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    processes: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True)
class Sample:
    time: float
    cpu_percent: float
    ram_used_gb: float
    ram_total_gb: float
    gpus: tuple[GpuSample, ...] = field(default_factory=tuple)


class Monitor:
    """Samples every `interval_s` seconds into a ring buffer of `history` samples."""

    def __init__(self, interval_s: float = 1.0, history: int = 300, nvml: Any = None):
        self.interval_s = interval_s
        self._nvml = nvml if nvml is not None else load()  # held open while it samples: stop() shuts it down
        self._buffer: deque[Sample] = deque(maxlen=history)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handles: list = []
        self.gpu_error: str | None = None  # why there are no GPU readings, in words
        self._init_nvml()
        psutil.cpu_percent(interval=None)  # the first call only sets the baseline

    # ------------------------------------------------------------ NVML

    def _init_nvml(self) -> None:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            self._handles = []
            self.gpu_error = f"No NVIDIA GPU found: NVML is not available here ({exc})."
            return
        if not self._handles:
            self.gpu_error = "No NVIDIA GPU found: the NVIDIA driver reports 0 devices."

    def _optional(self, call, *args):
        """A reading some GPUs do not support (power on some boards): None instead of failing."""
        try:
            return call(*args)
        except self._nvml.NVMLError:
            return None

    def _read_gpu(self, index: int, handle) -> GpuSample:
        nvml = self._nvml
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):  # older bindings return bytes
            name = name.decode()
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        util = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        temp = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        limit_mw = self._optional(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        procs = self._optional(nvml.nvmlDeviceGetComputeRunningProcesses, handle) or []
        return GpuSample(
            index=index,
            name=str(name),
            utilization_pct=float(util.gpu) if util is not None else None,
            memory_used_mb=memory.used / 2**20,
            memory_total_mb=memory.total / 2**20,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power_mw / 1000 if power_mw is not None else None,
            power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
            processes=tuple(
                GpuProcess(pid=int(p.pid), used_mb=(p.usedGpuMemory / 2**20) if p.usedGpuMemory else None)
                for p in procs
            ),
        )

    # ------------------------------------------------------------ sampling

    def sample_once(self) -> Sample:
        gpus = []
        for index, handle in enumerate(self._handles):
            try:
                gpus.append(self._read_gpu(index, handle))
            except self._nvml.NVMLError as exc:  # a GPU that fell off the bus: say so, keep the others
                self.gpu_error = f"GPU {index} stopped answering NVML ({exc})."
        ram = psutil.virtual_memory()
        sample = Sample(
            time=time.time(),
            cpu_percent=psutil.cpu_percent(interval=None),
            ram_used_gb=(ram.total - ram.available) / 2**30,
            ram_total_gb=ram.total / 2**30,
            gpus=tuple(gpus),
        )
        with self._lock:
            self._buffer.append(sample)
        return sample

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception as exc:  # noqa: BLE001 - never let the sampler die silently; the page shows the reason
                self.gpu_error = f"monitor error: {exc}"
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def start(self) -> Monitor:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="tunedeck-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._handles:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass

    # ------------------------------------------------------------ readers

    def history(self) -> list[Sample]:
        with self._lock:
            return list(self._buffer)

    def latest(self) -> Sample | None:
        with self._lock:
            return self._buffer[-1] if self._buffer else None

    @property
    def gpu_count(self) -> int:
        return len(self._handles)

    def total_gpu_memory_gb(self) -> float | None:
        """Memory of the smallest GPU (what a per-GPU estimate must fit in), or None without GPUs."""
        sample = self.latest() or (self.sample_once() if self._handles else None)
        if sample is None or not sample.gpus:
            return None
        return min(g.memory_total_mb for g in sample.gpus) / 1024


_shared: Monitor | None = None
_shared_lock = threading.Lock()


def shared_monitor() -> Monitor:
    """The process-wide monitor, started on first use (one sampler thread per panel)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Monitor().start()
        return _shared
