"""Telemetry from every machine of a run: the first process on each machine samples its GPUs (NVML) and the host
(psutil) every few seconds into telemetry/<host>.jsonl in the run folder, one JSON object a line:

    {"time", "host", "rank", "cpu_percent", "ram_used_gb", "ram_total_gb", "disk_free_gb",
     "gpus": [{"index", "name", "util_pct", "memory_used_mb", "memory_total_mb", "power_w", "temp_c",
               "sm_clock_mhz", "throttle": ["hw_slowdown", ...], "ecc_uncorrected", "xids": [79]}],
     "gpu_error"}

A machine without NVIDIA GPUs or driver writes its host readings with "gpus": [] and says why in gpu_error. Each
GPU reading some boards do not support is null. The GPUs listed are those this machine's processes may use
(CUDA_VISIBLE_DEVICES, as Slurm and the launcher set it; every GPU when it names none). Where every machine writes to a
shared run folder (one machine, Slurm), tunedeck reads every machine's file; a machine with a folder of its own
keeps its file there.

TUNEDECK_NVML names a Python file whose nvml() returns a stand-in for pynvml (the tests' fake GPUs): the same
sampling code then runs end to end on a machine without GPUs. TUNEDECK_TELEMETRY_S sets the interval (default 5 s).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from .ranks import global_rank, node_name
from .records import TELEMETRY_DIR

NVML_ENV = "TUNEDECK_NVML"
INTERVAL_ENV = "TUNEDECK_TELEMETRY_S"
INTERVAL_S = 5.0

# NVML's clock event reasons that slow a GPU down against its will (power capping under load is normal, not these)
THROTTLES = {
    "nvmlClocksThrottleReasonHwSlowdown": "hardware slowdown",
    "nvmlClocksThrottleReasonHwThermalSlowdown": "hardware thermal slowdown",
    "nvmlClocksThrottleReasonSwThermalSlowdown": "software thermal slowdown",
    "nvmlClocksThrottleReasonHwPowerBrakeSlowdown": "power brake",
}


def load_nvml() -> Any:
    """pynvml, or the stand-in TUNEDECK_NVML names; None without either."""
    path = os.environ.get(NVML_ENV, "").strip()
    try:
        if path:
            spec = importlib.util.spec_from_file_location("tunedeck_nvml_stand_in", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module.nvml()
        import pynvml

        return pynvml
    except Exception:  # noqa: BLE001 - no library, a broken stand-in: host readings only, said in gpu_error
        return None


class GpuReader:
    """This machine's GPUs through NVML: opened once, read each sample, closed at the end."""

    def __init__(self, nvml: Any):
        self.nvml: Any = nvml
        self.handles: list[tuple[int, Any]] = []
        self.error: str | None = None  # why there are no (or fewer) GPU readings, in words
        self._events: Any = None
        if nvml is None:
            self.error = "no NVML library (nvidia-ml-py) in this environment"
            return
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - NVMLError: no driver, no GPU
            self.nvml, self.error = None, f"NVML is not available here ({exc})"
            return
        self.handles = [(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in visible(count)]
        if not self.handles:
            self.error = "the NVIDIA driver reports no GPU for this process"
        self._watch_xids()

    def _watch_xids(self) -> None:
        """XID errors arrive as NVML events: registered once, drained at each sample."""
        nvml = self.nvml
        with contextlib.suppress(Exception):  # not supported on this board or driver: no XIDs, the rest stays
            events = nvml.nvmlEventSetCreate()
            for _, handle in self.handles:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, events)
            self._events = events

    def _optional(self, call, *args):
        try:
            return call(*args)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: this reading is not there
            return None

    def _xids(self) -> dict[int, list[int]]:
        found: dict[int, list[int]] = {}
        if self._events is None:
            return found
        for _ in range(64):  # what arrived since the last sample; a timeout of 0 says there is no more
            try:
                event = self.nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: none waiting
                break
            index = next((i for i, h in self.handles if h == event.device), None)
            if index is not None:
                found.setdefault(index, []).append(int(event.eventData))
        return found

    def read(self) -> list[dict]:
        nvml, gpus, xids = self.nvml, [], self._xids()
        for index, handle in self.handles:
            try:
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                name = nvml.nvmlDeviceGetName(handle)
            except Exception as exc:  # noqa: BLE001 - a GPU that fell off the bus: said, the others read
                self.error = f"GPU {index} stopped answering NVML ({exc})"
                continue
            util = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
            power = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
            reasons = self._optional(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
            ecc = self._optional(
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC,
            )
            gpus.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "util_pct": float(util.gpu) if util is not None else None,
                    "memory_used_mb": round(memory.used / 2**20, 1),
                    "memory_total_mb": round(memory.total / 2**20, 1),
                    "power_w": power / 1000 if power is not None else None,
                    "temp_c": self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
                    "sm_clock_mhz": self._optional(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
                    "throttle": [] if reasons is None else throttle_names(nvml, int(reasons)),
                    "ecc_uncorrected": int(ecc) if ecc is not None else None,
                    "xids": xids.get(index, []),
                }
            )
        return gpus

    def close(self) -> None:
        if self.nvml is None:
            return
        with contextlib.suppress(Exception):
            if self._events is not None:
                self.nvml.nvmlEventSetFree(self._events)
            self.nvml.nvmlShutdown()


def visible(count: int) -> list[int]:
    """The GPU indices this process may use: CUDA_VISIBLE_DEVICES's numbers; every GPU when it is unset, empty (a
    CPU run: the machine's GPUs as they are) or names GPUs by UUID."""
    listed = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if part.strip()]
    if not listed or not all(part.isdigit() for part in listed):
        return list(range(count))
    return [int(part) for part in listed if int(part) < count]


def throttle_names(nvml: Any, reasons: int) -> list[str]:
    return [said for name, said in THROTTLES.items() if reasons & int(getattr(nvml, name, 0))]


def host_reading(run_dir: Path) -> dict:
    import psutil

    ram = psutil.virtual_memory()
    try:
        disk_free = shutil.disk_usage(run_dir).free / 2**30
    except OSError:
        disk_free = None
    return {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "ram_used_gb": round((ram.total - ram.available) / 2**30, 2),
        "ram_total_gb": round(ram.total / 2**30, 2),
        "disk_free_gb": round(disk_free, 2) if disk_free is not None else None,
    }


class TelemetrySampler:
    """The sampling thread of the first process on a machine (LOCAL_RANK 0); the other processes start none."""

    def __init__(self, run_dir: Path, interval_s: float | None = None):
        self.run_dir = run_dir
        self.interval_s = interval_s or float(os.environ.get(INTERVAL_ENV) or INTERVAL_S)
        self.host = node_name()
        self.path = run_dir / TELEMETRY_DIR / f"{self.host}.jsonl"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> TelemetrySampler:
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return self
        self._thread = threading.Thread(target=self._loop, name="tunedeck-telemetry", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        import psutil

        psutil.cpu_percent(interval=None)  # the first call sets the baseline
        gpus = GpuReader(load_nvml())
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                self.sample(gpus)
                if self._stop.wait(self.interval_s):
                    break
        except OSError:
            pass  # a full or vanished disk: telemetry is a view, never a reason to stop training
        finally:
            gpus.close()

    def sample(self, gpus: GpuReader) -> dict:
        record = {"time": time.time(), "host": self.host, "rank": global_rank(), **host_reading(self.run_dir)}
        record["gpus"] = gpus.read()
        record["gpu_error"] = gpus.error
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
