"""The GPU/host sampler: the real no-GPU path here, and a fake NVML for GPUs this machine lacks."""

from __future__ import annotations

import os
import time

import pynvml

from panel.fake_nvml import FakeNvml, two_h100s
from tunedeck.backend.machine.monitor import Monitor


def test_without_a_gpu_the_monitor_says_so_and_still_samples_cpu_and_ram():
    monitor = Monitor()  # the real pynvml: this machine has no NVIDIA driver
    assert monitor.gpu_error and "No NVIDIA GPU found" in monitor.gpu_error
    sample = monitor.sample_once()
    assert sample.gpus == ()
    assert 0 < sample.ram_used_gb < sample.ram_total_gb
    assert 0 <= sample.cpu_percent <= 100
    assert monitor.total_gpu_memory_gb() is None


def test_reads_each_gpu_and_the_processes_holding_memory():
    monitor = Monitor(nvml=two_h100s(os.getpid()))
    assert monitor.gpu_error is None and monitor.gpu_count == 2
    gpu0, gpu1 = monitor.sample_once().gpus
    assert gpu0.name == "NVIDIA H100 80GB HBM3"
    assert gpu0.utilization_pct == 97 and gpu0.temperature_c == 64 and gpu0.power_w == 512
    assert round(gpu0.memory_total_mb) == 81559 and round(gpu0.memory_used_mb) == 40000
    assert [(p.pid, round(p.used_mb)) for p in gpu0.processes] == [(os.getpid(), 39000)]
    assert gpu1.processes == ()
    assert abs(monitor.total_gpu_memory_gb() - 81559 / 1024) < 1e-6


def test_unsupported_readings_become_blanks_not_failures():
    fake = FakeNvml(
        [{"name": "Tesla T4", "total_mb": 15360, "used_mb": 0, "util": 0, "temp": 40, "power_w": 0}],
        power_supported=False,
    )
    (gpu,) = Monitor(nvml=fake).sample_once().gpus
    assert gpu.power_w is None and gpu.power_limit_w is None and gpu.temperature_c == 40


def test_driver_without_devices_is_reported():
    assert "0 devices" in Monitor(nvml=FakeNvml([])).gpu_error


def test_sampler_thread_fills_a_bounded_ring_buffer():
    monitor = Monitor(interval_s=0.02, history=5, nvml=two_h100s(os.getpid())).start()
    try:
        deadline = time.monotonic() + 10
        while len(monitor.history()) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        history = monitor.history()
        assert len(history) == 5  # bounded: old samples dropped
        assert history == sorted(history, key=lambda s: s.time)
        assert monitor.latest() is history[-1]
    finally:
        monitor.stop()


def test_fake_only_offers_names_the_real_module_has():
    assert issubclass(FakeNvml.NVMLError, Exception) and FakeNvml.NVMLError is pynvml.NVMLError
