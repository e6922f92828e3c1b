"""A stand-in for pynvml with GPUs this machine does not have (tests only).

In a real run's processes too: TUNEDECK_NVML=<this file> makes the recipe's telemetry (backend/recipe/telemetry.py)
call nvml() here, which builds the GPUs TUNEDECK_FAKE_GPUS describes as JSON, by machine:
{"node-a": [{"name": ..., "total_mb": ..., "throttle": 8, ...}], "*": [...]} ("*": every other machine).

It exposes only names the real nvidia-ml-py module has (checked on construction), uses
the real module's exception classes, and returns the real module's value shapes, so
the monitor's code path is the one that runs on a GPU server.
"""

from __future__ import annotations

import json
import os
import socket
from types import SimpleNamespace

import pynvml


class FakeNvml:
    NVMLError = pynvml.NVMLError
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlClocksThrottleReasonHwSlowdown = pynvml.nvmlClocksThrottleReasonHwSlowdown
    nvmlClocksThrottleReasonHwThermalSlowdown = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    nvmlClocksThrottleReasonSwThermalSlowdown = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
    nvmlClocksThrottleReasonHwPowerBrakeSlowdown = pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown

    def __init__(self, gpus: list[dict], power_supported: bool = True):
        self.gpus = gpus
        self.power_supported = power_supported
        self.initialised = False
        for name in dir(self):
            if name.startswith(("nvml", "NVML")):
                assert hasattr(pynvml, name), f"pynvml has no {name}: the fake would hide a typo"

    def nvmlInit(self):
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle]["name"].encode()  # bytes, as older drivers return

    def nvmlDeviceGetMemoryInfo(self, handle):
        g = self.gpus[handle]
        return SimpleNamespace(
            total=g["total_mb"] * 2**20, used=g["used_mb"] * 2**20, free=(g["total_mb"] - g["used_mb"]) * 2**20
        )

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.gpus[handle]["util"], memory=0)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self.gpus[handle]["temp"]

    def nvmlDeviceGetPowerUsage(self, handle):
        if not self.power_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.gpus[handle]["power_w"] * 1000

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        if not self.power_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 700_000

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mb * 2**20) for pid, mb in self.gpus[handle].get("procs", [])]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self.gpus[handle].get("throttle", 0)  # a bit mask of pynvml.nvmlClocksThrottleReason*

    def nvmlDeviceGetClockInfo(self, handle, clock):
        assert clock == pynvml.NVML_CLOCK_SM
        return self.gpus[handle].get("sm_clock", 1980)

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        assert (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        return self.gpus[handle].get("ecc", 0)

    def nvmlEventSetCreate(self):
        return []

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        assert event_types == pynvml.nvmlEventTypeXidCriticalError
        event_set.extend((handle, xid) for xid in self.gpus[handle].get("xids", []))  # pending XIDs, once

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        if not event_set:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        handle, xid = event_set.pop(0)
        return SimpleNamespace(device=handle, eventData=xid, eventType=pynvml.nvmlEventTypeXidCriticalError)

    def nvmlEventSetFree(self, event_set):
        event_set.clear()


def nvml() -> FakeNvml:
    """The GPUs TUNEDECK_FAKE_GPUS gives this machine (SLURMD_NODENAME or the host name; "*": any other)."""
    machines = json.loads(os.environ.get("TUNEDECK_FAKE_GPUS") or "{}")
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return FakeNvml(machines.get(host, machines.get("*", [])))


def two_h100s(pid: int) -> FakeNvml:
    return FakeNvml(
        [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "total_mb": 81559,
                "used_mb": 40000,
                "util": 97,
                "temp": 64,
                "power_w": 512,
                "procs": [(pid, 39000)],
            },
            {"name": "NVIDIA H100 80GB HBM3", "total_mb": 81559, "used_mb": 500, "util": 0, "temp": 35, "power_w": 70},
        ]
    )
