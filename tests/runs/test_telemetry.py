"""Telemetry from every machine (issue 35, part 1): the recipe's sampler (backend/recipe/telemetry.py) on the fake
GPUs of tests/panel/fake_nvml.py, loaded as a run loads it (TUNEDECK_NVML), and the reader that turns the machines'
files into lines and warnings (backend/runs/telemetry.py). A real 2-node Slurm run's telemetry, seen in the page and
in `tunedeck runs show`: tests/panel/test_browser_slurm_ssh.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tunedeck.backend.recipe.telemetry import GpuReader, TelemetrySampler, load_nvml
from tunedeck.backend.runs.telemetry import RunTelemetry, machine_line, missing_machines, telemetry_warnings

FAKE_NVML = Path(__file__).parents[1] / "panel" / "fake_nvml.py"
H100 = {"name": "NVIDIA H100 80GB HBM3", "total_mb": 81559, "used_mb": 40000, "util": 97, "temp": 64, "power_w": 512}


@pytest.fixture
def fake_gpus(monkeypatch):
    def use(machines: dict) -> None:
        monkeypatch.setenv("TUNEDECK_NVML", str(FAKE_NVML))
        monkeypatch.setenv("TUNEDECK_FAKE_GPUS", json.dumps(machines))

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("SLURMD_NODENAME", "node-a")
    return use


def test_each_reading_holds_the_gpus_this_machines_processes_may_use_and_its_host(tmp_path, fake_gpus, monkeypatch):
    fake_gpus({"node-a": [{**H100, "throttle": 8 | 4, "ecc": 2, "xids": [79], "sm_clock": 1410}, H100, H100]})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,2")  # as Slurm and the launcher set it
    sampler, gpus = TelemetrySampler(tmp_path), GpuReader(load_nvml())
    sampler.path.parent.mkdir()
    first, second = sampler.sample(gpus), sampler.sample(gpus)
    assert first["host"] == "node-a" and sampler.path == tmp_path / "telemetry" / "node-a.jsonl"
    assert [g["index"] for g in first["gpus"]] == [0, 2] and first["gpu_error"] is None
    gpu = first["gpus"][0]
    assert gpu["throttle"] == ["hardware slowdown"]  # power capping (4) under load is normal: not said
    assert (gpu["ecc_uncorrected"], gpu["xids"], gpu["sm_clock_mhz"], gpu["util_pct"]) == (2, [79], 1410, 97.0)
    assert second["gpus"][0]["xids"] == []  # an XID arrives once, as NVML's event does
    assert first["ram_total_gb"] > 0 and first["disk_free_gb"] > 0
    assert [json.loads(line)["time"] for line in sampler.path.read_text().splitlines()] == [
        first["time"],
        second["time"],
    ]


def test_a_machine_without_nvml_still_reports_its_host_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEDECK_NVML", str(tmp_path / "missing.py"))  # no stand-in, and pynvml is not asked
    (tmp_path / "telemetry").mkdir()
    reading = TelemetrySampler(tmp_path).sample(GpuReader(load_nvml()))
    assert reading["gpus"] == [] and reading["gpu_error"] == "no NVML library (nvidia-ml-py) in this environment"
    assert reading["cpu_percent"] >= 0 and reading["ram_used_gb"] > 0


def test_only_the_first_process_on_a_machine_samples(tmp_path, fake_gpus, monkeypatch):
    fake_gpus({"*": [H100]})
    monkeypatch.setenv("LOCAL_RANK", "1")
    TelemetrySampler(tmp_path, interval_s=0.05).start().stop()
    assert not (tmp_path / "telemetry").exists()
    monkeypatch.setenv("LOCAL_RANK", "0")
    sampler = TelemetrySampler(tmp_path, interval_s=0.05).start()
    sampler.stop()
    assert json.loads(sampler.path.read_text().splitlines()[0])["gpus"][0]["name"] == H100["name"]


def reading(host: str, *utils: float, **gpu) -> dict:
    gpus = [
        {"index": i, "name": "NVIDIA H100", "util_pct": u, "memory_used_mb": 40960, "memory_total_mb": 81920}
        for i, u in enumerate(utils)
    ]
    gpus[0].update(gpu)
    return {
        "host": host,
        "cpu_percent": 12.0,
        "ram_used_gb": 9.5,
        "ram_total_gb": 23.5,
        "disk_free_gb": 51.6,
        "gpus": gpus,
    }


def write(run_dir: Path, *readings: dict) -> None:
    (run_dir / "telemetry").mkdir(exist_ok=True)
    for r in readings:
        with open(run_dir / "telemetry" / f"{r['host']}.jsonl", "a") as f:
            f.write(json.dumps(r) + "\n")


def test_each_machine_is_a_line_and_what_to_look_at_names_its_host_and_gpu(tmp_path):
    telemetry = RunTelemetry(tmp_path)
    assert telemetry.read() is False and telemetry.listed() == []
    write(tmp_path, reading("node-b", 95, 96, throttle=["hardware thermal slowdown"]), reading("node-a", 97, 98))
    assert telemetry.read() is True
    a, b = telemetry.listed()
    assert machine_line(a) == (
        "node-a · 2 x NVIDIA H100 · util 97% 98% · memory 40.0 + 40.0 of 80.0 GB each · CPU 12% · RAM 9.5 of 23.5 GB "
        "· 51.6 GB free"
    )
    assert telemetry_warnings([a, b]) == ["⚠ GPU 0 on node-b is throttled (hardware thermal slowdown)"]
    assert missing_machines([a, b], 2) is None and missing_machines([a, b], 1) is None
    assert missing_machines([a], 2) == (
        "1 of 2 machines report here: the others have not written yet, or keep a run folder of their own (their "
        "readings are in its telemetry/<host>.jsonl)"
    )
    write(tmp_path, reading("node-a", 97, 98, ecc_uncorrected=3, xids=[48]), reading("node-a", 97, 98))
    assert telemetry.read() is True and telemetry.read() is False  # only what the files gained
    assert telemetry_warnings(telemetry.listed()) == [
        "⚠ GPU 0 on node-a reported XID 48",  # seen once, kept: the reading after it has none
        "⚠ GPU 0 on node-b is throttled (hardware thermal slowdown)",
    ]


def test_a_gpu_idle_while_the_others_work_is_named_and_a_run_idle_everywhere_is_not(tmp_path):
    write(tmp_path, *[reading("node-a", 97, 98) for _ in range(3)], *[reading("node-b", 96, 2) for _ in range(2)])
    telemetry = RunTelemetry(tmp_path)
    telemetry.read()
    assert telemetry_warnings(telemetry.listed()) == []  # two idle readings: not yet
    write(tmp_path, reading("node-b", 96, 3))
    telemetry.read()
    assert telemetry_warnings(telemetry.listed()) == [
        "⚠ GPU 1 on node-b idles (3%) while the run's other GPUs work (median 96%)"
    ]
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    write(quiet, *[reading("node-a", 1, 2) for _ in range(3)])  # loading, saving, evaluating: all idle together
    (idle := RunTelemetry(quiet)).read()
    assert telemetry_warnings(idle.listed()) == []
    write(quiet, {"host": "node-c", "cpu_percent": 5.0, "gpus": [], "gpu_error": "NVML is not available here"})
    idle.read()
    assert machine_line(idle.listed()[1]) == "node-c · no GPU readings (NVML is not available here) · CPU 5%"
