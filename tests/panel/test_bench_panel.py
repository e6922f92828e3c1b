"""bench/bench_panel.py at a tiny size: a run through the panel and a bare one, latency samples, the panel's RSS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.browser, pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]


def test_panel_bench_reports_overhead_latency_and_memory(tmp_path, demo_home):
    report_path = tmp_path / "report.json"
    command = [sys.executable, str(REPO / "bench" / "bench_panel.py"), "--repeats", "1", "--samples", "5"]
    result = subprocess.run(
        [*command, "--steps", "6", "--json", str(report_path)], capture_output=True, text=True, timeout=540
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert len(report["panel_steps_per_s"]) == len(report["bare_steps_per_s"]) == 1
    assert report["steps_per_s_ratio"] > 0
    assert report["latency_samples"] == 5 and 0 < report["latency_p50_s"] <= report["latency_p95_s"] < 30
    assert 50 < report["panel_rss_mib"] < 4096  # a Python process with gradio loaded, not torch
