"""Loading the model is a phase of its own: what the estimate and the advisor say about it."""

from __future__ import annotations

import pytest

from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import GIB, Job, input_values
from tunedeck.backend.spec import JobSpec, load_presets, set_paths

PRESETS = load_presets()
QLORA_70B = ("70b-qlora-zero3", "70b-qlora-fsdp")


def whole_4bit_model_gb(spec: JobSpec) -> float:
    """The base in 4 bits: quantized linear weights, the rest (embeddings, lm_head, norms) in 16 bits."""
    arch = Job.from_values(input_values(spec)).arch
    return (arch.linear_params * 0.5 + (arch.num_parameters - arch.linear_params) * 2) / GIB


@pytest.mark.parametrize("preset", QLORA_70B)
def test_sharded_qlora_needs_the_whole_4bit_model_per_gpu_whatever_the_gpu_count(preset):
    spec = PRESETS[preset].build()
    loads, trains = [], []
    for world in (2, 8, 32):
        est = estimate(set_paths(spec, {"launch.num_processes": world}))
        assert est.phases["load"] >= whole_4bit_model_gb(spec) > 30  # about 32 GB for Llama-2-70B
        assert est.per_gpu_gb == max(est.phases.values())
        # On 2 GPUs a 72B's training step (its shard and the gathered embeddings) weighs about as much as the load.
        assert est.limiting_phase == "load" or world == 2
        loads.append(est.phases["load"])
        trains.append(est.phases["train"])
    assert loads[0] == pytest.approx(loads[-1])  # more GPUs do not help the load
    assert trains[0] > trains[-1]  # they do help training


@pytest.mark.parametrize("preset", QLORA_70B)
@pytest.mark.parametrize("gpu", [24, 40])
def test_70b_qlora_is_not_recommended_for_24_or_40_gb_cards(preset, gpu):
    advice = advise(PRESETS[preset].build(), gpu)
    assert not advice.current_fits and not any(o.fits for o in advice.options)
    rec = advice.recommendation
    assert rec.strategy is None and not rec.fits
    assert "to load the model" in rec.reason and "whatever the number of GPUs" in rec.reason
    assert rec.reason.endswith(".") and ". " not in rec.reason  # one sentence


def test_70b_qlora_fits_80_gb_cards():
    rec = advise(PRESETS["70b-qlora-zero3"].build(), 80).recommendation
    assert rec.fits and rec.estimate.per_gpu_gb <= 0.9 * 80


def test_the_reason_names_the_phase_that_decides():
    spec = set_paths(PRESETS["70b-qlora-fsdp"].build(), {"model.name_or_path": "01-ai/Yi-34B"})
    rec = advise(spec, 24).recommendation  # Yi-34B in 4 bits loads whole on every GPU: 20 GB, and trains in 12
    assert rec.strategy == "FSDP FULL_SHARD" and "of 24 GB per GPU while loading" in rec.reason
    spec = set_paths(JobSpec(), {"model.name_or_path": "meta-llama/Llama-2-13b-hf", "launch.num_processes": 8})
    rec = advise(spec, 80, cpu_mem_gb=64).recommendation  # 8 ranks x 24 GB of host RAM to load for DDP
    assert rec.strategy == "ZeRO-3" and "(DDP would need 194 GB of CPU RAM to load)" in rec.reason


def test_16bit_sharding_keeps_the_load_small_and_ddp_holds_the_whole_model():
    spec = set_paths(JobSpec(), {"model.name_or_path": "meta-llama/Llama-2-70b-hf", "launch.num_processes": 8})
    whole = Job.from_values(input_values(spec)).arch.num_parameters * 2 / GIB
    ddp = estimate(spec)
    zero3 = estimate(set_paths(spec, {"strategy.kind": "zero3"}))
    fsdp = estimate(set_paths(spec, {"strategy.kind": "fsdp"}))
    assert ddp.load_breakdown["weights"] == pytest.approx(whole)
    assert zero3.load_breakdown["weights"] == pytest.approx(whole / 8)
    assert fsdp.load_breakdown["weights"] == pytest.approx(whole / 8, rel=0.01)
    for sharded in (zero3, fsdp):
        assert sharded.limiting_phase == "train" and sharded.phases["load"] < whole / 4


def test_host_ram_while_loading_one_copy_per_rank_except_zero3():
    spec = set_paths(JobSpec(), {"model.name_or_path": "meta-llama/Llama-2-13b-hf", "launch.num_processes": 8})
    whole = Job.from_values(input_values(spec)).arch.num_parameters * 2 / GIB
    assert estimate(spec).load_cpu_gb == pytest.approx(8 * whole)  # DDP: every rank
    assert estimate(set_paths(spec, {"strategy.kind": "fsdp"})).load_cpu_gb == pytest.approx(8 * whole)
    assert estimate(set_paths(spec, {"strategy.kind": "zero3"})).load_cpu_gb == pytest.approx(whole)  # rank 0
    two_nodes = set_paths(spec, {"launch.num_machines": 2})
    assert estimate(two_nodes).load_cpu_gb == pytest.approx(4 * whole)  # per machine
    quantized = set_paths(spec, {"method": "qlora", "quantization.bits": 4})
    assert estimate(quantized).load_cpu_gb == 0  # streamed to the GPU, quantized there


def test_host_ram_while_loading_decides_what_fits():
    spec = set_paths(JobSpec(), {"model.name_or_path": "meta-llama/Llama-2-13b-hf", "launch.num_processes": 8})
    roomy, tight = advise(spec, 80, cpu_mem_gb=1024).options, advise(spec, 80, cpu_mem_gb=64).options
    assert next(o for o in roomy if o.strategy == "DDP").fits
    ddp = next(o for o in tight if o.strategy == "DDP")
    assert not ddp.fits and ddp.estimate.load_cpu_gb > 0.9 * 64 > ddp.estimate.cpu_gb
    assert next(o for o in tight if o.strategy == "ZeRO-3").fits  # rank 0 alone reads the checkpoint
