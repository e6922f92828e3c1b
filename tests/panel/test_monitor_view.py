"""The GPU tab's content from real samples: no-GPU here, fake NVML GPUs, and a real rank process."""

from __future__ import annotations

import os
import subprocess
import sys

from panel.fake_nvml import two_h100s
from tunedeck.app.monitor_view import monitor_html, sparklines
from tunedeck.backend.machine.monitor import Monitor


def test_no_gpu_state_is_plain_and_host_is_still_shown():
    monitor = Monitor()
    html = monitor_html(monitor, monitor.sample_once())
    assert "No NVIDIA GPU found" in html and "CPU and RAM are still shown" in html
    assert "CPU" in html and "RAM" in html


def test_gpu_cards_name_the_rank_holding_memory():
    # A real process with a rank's environment, as accelerate launch starts them.
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, "RANK": "1"})
    try:
        monitor = Monitor(nvml=two_h100s(rank.pid))
        html = monitor_html(monitor, monitor.sample_once())
    finally:
        rank.kill()
        rank.wait()
    assert "No NVIDIA GPU" not in html
    assert html.count("NVIDIA H100 80GB HBM3") == 2
    assert "39.1 / 79.6 GB" in html and "512 W / 700 W" in html and "64 °C" in html
    assert f"pid {rank.pid} · rank 1" in html and "38.1 GB" in html


def test_sparklines_per_gpu():
    monitor = Monitor(nvml=two_h100s(os.getpid()))
    for _ in range(3):
        monitor.sample_once()
    names = [t.name for t in sparklines(monitor.history()).data]
    assert names == ["CPU %", "RAM %", "GPU 0 util %", "GPU 0 memory %", "GPU 1 util %", "GPU 1 memory %"]
