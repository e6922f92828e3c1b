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


def test_one_nvml_helper_reads_the_gpus_for_start_and_placement_and_shuts_down():
    from tunedeck.backend.after import worker_device
    from tunedeck.backend.machine.nvml import gpu_indices, gpu_memory
    from tunedeck.backend.runs import preflight

    fake = two_h100s(os.getpid())
    assert gpu_indices(fake) == [0, 1] and not fake.initialised  # what it opened, it shut down
    memory = gpu_memory(fake)
    assert [(round(g.total_gb * 1024), round(g.free_gb * 1024)) for g in memory] == [(81559, 41559), (81559, 81059)]
    assert worker_device._free_gb(fake) == {g.index: g.free_gb for g in memory}  # Try/Evaluate's placement
    assert preflight.gpu_indices is gpu_indices  # Start's GPU check, and bench/gpu_smoke_check.py through it
    assert gpu_indices() == [] and gpu_memory() == []  # the real pynvml: no driver on this machine
