"""The first screen: the preset `tunedeck ui` opens on without --preset, and the line under the title.

This machine has no NVIDIA GPU (the real pynvml finds none); GPU machines are stood in for by the fake NVML
(panel/fake_nvml.py) with the RAM they would have.
"""

from __future__ import annotations

from panel.fake_nvml import FakeNvml
from tunedeck.app.first_screen import Here, first_preset, start_line
from tunedeck.app.job_tab import ordered_presets
from tunedeck.backend.estimate.hardware import machine_facts
from tunedeck.backend.machine.monitor import Monitor
from tunedeck.backend.spec import load_presets

PRESETS = load_presets()
ORDER = ordered_presets()  # the page's order of its preset buttons


def gpus(name: str, memory_mb: int, count: int, ram_gb: float) -> Here:
    one = {"name": name, "total_mb": memory_mb, "used_mb": 0, "util": 0, "temp": 40, "power_w": 0}
    monitor = Monitor(nvml=FakeNvml([one] * count))
    return Here(machine_facts(ram=ram_gb, monitor=monitor), monitor.gpu_count)


def test_without_a_gpu_the_page_opens_on_the_demo_and_says_press_start():
    here = Here.of(Monitor())  # the real pynvml: no GPU on this machine
    assert here.gpus == 0 and first_preset(ORDER, here).id == "demo"
    assert start_line(PRESETS["demo"], here) == (
        "**Start here:** press **▶ Start run** to train the tiny demo on this CPU and watch its loss fall (about a "
        "minute); then pick a preset or fill the forms for your own job."
    )
    # A GPU preset asked for by --preset on this machine: where it runs instead, and what runs here.
    line = start_line(PRESETS["7b-lora-ddp"], here)
    assert "meant for 4x RTX 4090 (24 GB), 128 GB RAM" in line and "no NVIDIA GPU" in line
    assert "download the bundle" in line and "**Demo (CPU)**" in line


def test_on_a_gpu_machine_the_page_opens_on_the_first_preset_that_runs_on_its_gpus():
    four_4090 = gpus("NVIDIA GeForce RTX 4090", 24564, 4, ram_gb=128)
    chosen = first_preset(ORDER, four_4090)
    assert chosen.id == "7b-lora-ddp"  # 4 processes on the 4 GPUs, and it fits 24 GB each
    assert start_line(chosen, four_4090).startswith(
        "**Start here:** 7B LoRA DDP runs on the 4x NVIDIA GeForce RTX 4090 here: check the model and the data"
    )
    # Two 80 GB GPUs: every GPU preset as written starts 4 or 8 processes, so none runs; the demo, which says so.
    two_a100 = gpus("NVIDIA A100-SXM4-80GB", 81920, 2, ram_gb=512)
    assert first_preset(ORDER, two_a100).id == "demo"
    assert "no preset runs as written on the 2x NVIDIA A100-SXM4-80GB here" in start_line(PRESETS["demo"], two_a100)
    # Eight GPUs, but too little RAM to load a 7B model on 4 ranks at once: the advisor's fit rule says no.
    starved = gpus("NVIDIA H100 80GB HBM3", 81559, 8, ram_gb=16)
    assert first_preset(ORDER, starved).id not in ("7b-lora-ddp", "7b-full-zero2")
