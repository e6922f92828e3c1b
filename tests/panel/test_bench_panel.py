"""bench/bench_panel.py at a tiny size: a run through the panel and a bare one, latency samples, RSS, cores."""

from __future__ import annotations

import pytest
from runs.helpers import run_bench

pytestmark = [
    pytest.mark.bench,
    pytest.mark.browser,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(600),
]


@pytest.mark.parametrize("tab", ["run", "job"])
def test_panel_bench_reports_overhead_latency_and_memory(tmp_path, demo_home, tab):
    args = ["--repeats", "1", "--samples", "5", "--steps", "6", "--tab", tab]
    report, _ = run_bench("bench_panel.py", *args, folder=tmp_path)
    assert report["tab"] == tab
    assert len(report["panel_steps_per_s"]) == len(report["bare_steps_per_s"]) == 1
    assert report["steps_per_s_ratio"] > 0
    assert report["latency_samples"] == 5 and 0 < report["latency_p50_s"] <= report["latency_p95_s"] < 30
    assert 50 < report["panel_rss_mib"] < 4096  # a Python process with gradio loaded, not torch
    assert 0 < report["panel_cpu_cores"] < 2 and 0 < report["browser_cpu_cores"] < 2  # where the cost goes


def test_run_tab_bench_reports_the_cores_a_live_run_tab_costs(tmp_path, demo_home):
    """bench/bench_run_tab.py: a synthetic live run on the Run tab (started 2 minutes ago, its 1,800 records
    written first), and the CPU of Chromium and the panel."""
    report, stderr = run_bench("bench_run_tab.py", "--secs", "3", "--windows", "2", "--age-min", "2", folder=tmp_path)
    assert report["age_min"] == 2 and len(report["browser_cores"]) == len(report["panel_cores"]) == 2, stderr
    assert all(0 < cores < 2 for cores in report["browser_cores"] + report["panel_cores"])  # a live page works
