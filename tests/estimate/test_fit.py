"""Honest fit: a job that exceeds its GPUs or host RAM is a problem, the same in `tunedeck validate` and the page."""

from __future__ import annotations

import pytest
from panel.fake_nvml import FakeNvml

from tunedeck.app.estimate_panel import EstimatePanel
from tunedeck.app.job_outputs import evaluate
from tunedeck.app.registry import Registry
from tunedeck.backend.cli import main
from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.fit import fit_problems
from tunedeck.backend.estimate.hardware import DEFAULT_GPU_GB, MachineValueError, machine_facts
from tunedeck.backend.machine.monitor import Monitor
from tunedeck.backend.spec import resolve_spec, set_paths
from tunedeck.backend.spec.fields import values_from_spec

QLORA_70B_DDP = ["strategy.kind=ddp", "quantization.bnb_4bit_quant_storage=uint8"]


def cli_fit(spec_id: str, overrides: list[str], gpu: str, ram: str | None, capsys) -> tuple[int, list[str]]:
    """(exit code, the fit lines) of `tunedeck validate` as a user runs it."""
    argv = ["validate", spec_id, "--gpu-mem", gpu, *(["--cpu-mem", ram] if ram else [])]
    for item in overrides:
        argv += ["--set", item]
    code = main(argv)
    lines = capsys.readouterr().err.splitlines()
    return code, [line for line in lines if "The job as set" in line]


def page_fit(spec_id: str, overrides: list[str], gpu: str, ram: str | None) -> tuple[bool, list[str]]:
    """(Start enabled, the fit lines) of the page's evaluation for the same job and boxes."""
    result = evaluate(values_from_spec(resolve_spec(spec_id, overrides)), gpu, ram or "")
    lines = [f"{p.level}: {p.field}: {p.message}" for p in result.issues if "The job as set" in p.message]
    return not result.has_errors, lines


@pytest.mark.parametrize(
    ("spec_id", "overrides", "gpu", "ram", "level"),
    [
        ("70b-qlora-zero3", [], "24", "256", "error"),  # loading alone needs ~40 GB on every GPU
        ("70b-qlora-zero3", [*QLORA_70B_DDP, "dataset.max_seq_length=4096"], "L40S", None, "error"),
        ("70b-qlora-zero3", QLORA_70B_DDP, "50", None, "warning"),  # 49 of 50 GB: within the estimate's margin
        ("7b-lora-ddp", [], "80", "16", "error"),  # 4 ranks load the whole 7B checkpoint into host RAM
        ("70b-qlora-zero3", [], "80", "512", None),
    ],
)
def test_validate_and_the_page_agree_on_fit(spec_id, overrides, gpu, ram, level, capsys):
    code, cli_lines = cli_fit(spec_id, overrides, gpu, ram, capsys)
    startable, page_lines = page_fit(spec_id, overrides, gpu, ram)
    assert cli_lines == page_lines
    if level is None:
        assert cli_lines == [] and code == 0 and startable
        return
    assert len(cli_lines) == 1 and cli_lines[0].startswith(f"{level}: strategy.kind: The job as set")
    assert (code == 2) == (level == "error") and startable == (level != "error")


def test_the_way_out_is_the_advisors_and_applying_it_clears_the_error():
    spec = resolve_spec("70b-qlora-zero3", [*QLORA_70B_DDP, "dataset.max_seq_length=4096"])
    advice = advise(spec, 48)
    (problem,) = fit_problems(spec, advice)
    assert problem.level == "error" and problem.fix == advice.recommendation.changes
    assert problem.fix["strategy.kind"] == "fsdp" and "use FSDP FULL_SHARD instead" in problem.message
    fixed = set_paths(spec, problem.fix)
    assert fit_problems(fixed, advise(fixed, 48)) == []


def test_nothing_fits_says_why_and_offers_no_fix():
    spec = resolve_spec("70b-qlora-zero3")
    (problem,) = fit_problems(spec, advise(spec, 24))
    assert problem.level == "error" and problem.fix is None
    assert "needs 39.5 GB per GPU while loading" in problem.message and "at least 44 GB" in problem.message


def test_cpu_jobs_are_left_to_the_cpu_rules():
    spec = resolve_spec("demo")
    assert fit_problems(spec, advise(spec, 0.001)) == []


def test_machine_facts_from_nvml_and_psutil_or_given():
    t4 = FakeNvml([{"name": "Tesla T4", "total_mb": 15360, "used_mb": 0, "util": 0, "temp": 40, "power_w": 0}])
    with_gpu = machine_facts(monitor=Monitor(nvml=t4))
    assert with_gpu.has_gpu and with_gpu.gpu_mem_gb == 15 and "NVML" in with_gpu.gpu_source
    assert with_gpu.ram_gb is not None and with_gpu.ram_gb > 0.5  # psutil: the job runs here
    assert with_gpu.gpu_name == "Tesla T4"
    here = machine_facts()  # the real pynvml: this machine has no NVIDIA GPU
    assert not here.has_gpu and here.gpu_mem_gb == DEFAULT_GPU_GB and here.ram_gb is None
    assert here.gpu_name is None
    given = machine_facts("RTX 4090", 64)
    assert (given.gpu_mem_gb, given.ram_gb, given.gpu_source, given.ram_source) == (24, 64, "given", "given")
    with pytest.raises(MachineValueError) as bad:
        machine_facts("banana")
    assert bad.value.which == "gpu" and "give its memory in GB" in str(bad.value)
    with pytest.raises(MachineValueError) as bad:
        machine_facts(None, float("nan"))
    assert bad.value.which == "ram"


def test_the_page_predicts_speed_on_this_machines_gpu_until_another_is_typed():
    """On an H100 server the GPU box starts at its size and the speed is the H100's (bench/gpu_check_nvml.py
    runs the same on a real GPU); another size or model in the box is predicted as typed."""
    h100 = FakeNvml([{"name": "NVIDIA H100 80GB HBM3", "total_mb": 81559, "used_mb": 0, "util": 0, "temp": 40,
                      "power_w": 0}])  # fmt: skip
    panel = EstimatePanel(Registry(), Monitor(nvml=h100))
    assert panel.own_gpu_text == "80" and panel.hardware("80").gpu == "H100"
    assert panel.hardware(" 80 ").source != "assumed"
    assert panel.hardware("RTX 4090").gpu == "RTX 4090"
    assert panel.hardware("24").source == "assumed"  # a size alone names no GPU: the speed line says assumed
    cpu_only = EstimatePanel(Registry(), Monitor())  # the real pynvml: no GPU here
    assert cpu_only.hardware(cpu_only.own_gpu_text).source == "assumed"
