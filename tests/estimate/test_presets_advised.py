"""Each preset is what the advisor recommends on the hardware the preset says it is meant for."""

from __future__ import annotations

import pytest

from tunedeck.backend.data.demo import ensure_demo_if_used
from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.fit import fit_problems
from tunedeck.backend.estimate.gpu_fit import gpu_memory_gb
from tunedeck.backend.spec.catalog import lookup
from tunedeck.backend.spec.presets import load_presets

PRESETS = load_presets()


@pytest.mark.parametrize("preset_id", sorted(PRESETS))
def test_the_advisor_recommends_the_preset_on_its_own_hardware(preset_id):
    preset = PRESETS[preset_id]
    hw, spec = preset.hardware, preset.build()
    assert hw is not None, f"{preset_id}: say which machine it is meant for (hardware:)"
    assert hw.gpus == (0 if spec.launch.use_cpu else spec.launch.num_processes)
    ensure_demo_if_used(spec)
    gpu = gpu_memory_gb(hw.gpu) if hw.gpu else 80
    assert hw.gpu_mem_gb in (None, gpu)
    advice = advise(spec, gpu, cpu_mem_gb=hw.ram_gb)
    assert advice.recommendation.changes == {}, advice.recommendation.reason  # "Keep <its strategy>"
    assert next(o for o in advice.options if o.current).strategy == advice.recommendation.strategy
    assert fit_problems(spec, advice) == []


@pytest.mark.parametrize("preset_id", ["13b-lora-fsdp", "70b-qlora-zero3", "70b-qlora-fsdp"])
def test_sharded_presets_are_not_told_to_use_ddp_on_their_hardware(preset_id):
    preset = PRESETS[preset_id]
    advice = advise(preset.build(), preset.hardware.gpu_mem_gb, cpu_mem_gb=preset.hardware.ram_gb)
    assert advice.recommendation.strategy != "DDP"
    assert not advice.options[0].fits  # DDP itself would not fit there: that is why the preset shards


def test_gpu_presets_use_current_models_and_their_wrap_class():
    for preset in PRESETS.values():
        spec = preset.build()
        assert "Llama-2" not in spec.model.name_or_path
        if spec.strategy.kind == "fsdp":
            assert spec.strategy.fsdp_transformer_layer_cls_to_wrap == lookup(spec.model.name_or_path).decoder_layer_cls
    assert PRESETS["7b-lora-ddp"].hardware.label == "4x RTX 4090 (24 GB), 128 GB RAM"
    assert PRESETS["demo"].hardware.label == "CPU only, 4 GB RAM"
