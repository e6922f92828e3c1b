"""NEFTune noise (training.neftune_noise_alpha) and rank-stabilised LoRA (lora.use_rslora): what the files get and
what validation says (tests/runs/test_training_runs.py trains with both and reads them off the live model)."""

from __future__ import annotations

import yaml

from tunedeck.backend.render import render_bundle
from tunedeck.backend.spec import resolve_spec
from tunedeck.backend.validate import validate


def args_of(preset: str, *overrides: str) -> dict:
    return yaml.safe_load(render_bundle(resolve_spec(preset, list(overrides)))["training_args.yaml"])


def problems_of(preset: str, field: str, *overrides: str) -> list[tuple[str, str]]:
    return [(p.level, p.message) for p in validate(resolve_spec(preset, list(overrides))) if p.field == field]


def test_neftune_reaches_sftconfig_for_supervised_fine_tuning_only():
    assert args_of("7b-lora-ddp", "training.neftune_noise_alpha=5")["neftune_noise_alpha"] == 5
    assert args_of("7b-lora-ddp")["neftune_noise_alpha"] is None
    assert "neftune_noise_alpha" not in args_of("demo-dpo", "training.neftune_noise_alpha=5")
    ((level, message),) = problems_of("demo-dpo", "training.neftune_noise_alpha", "training.neftune_noise_alpha=5")
    assert level == "warning" and "applies only with objective=sft" in message


def test_neftune_on_packed_rows_says_its_noise_is_weaker():
    ((level, message),) = problems_of("7b-lora-ddp", "training.neftune_noise_alpha", "training.neftune_noise_alpha=5")
    assert level == "warning" and "packed rows hold several examples" in message and "dataset.packing=false" in message
    unpacked = ["training.neftune_noise_alpha=5", "dataset.packing=false"]
    assert problems_of("7b-lora-ddp", "training.neftune_noise_alpha", *unpacked) == []


def test_rslora_reaches_the_adapter_config_and_its_scale_is_checked_by_sqrt_r():
    job = yaml.safe_load(render_bundle(resolve_spec("7b-lora-ddp", ["lora.use_rslora=true"]))["job.yaml"])
    assert job["lora"]["use_rslora"] is True  # train_sft.py passes the section to PEFT's LoraConfig whole
    high = ["lora.r=64", "lora.lora_alpha=128"]
    assert problems_of("7b-lora-ddp", "lora.lora_alpha", *high) == []  # 128 / 64 = 2
    ((level, message),) = problems_of("7b-lora-ddp", "lora.lora_alpha", *high, "lora.use_rslora=true")
    assert level == "warning" and message.startswith("lora_alpha/sqrt(r) = 16 scales the update oddly")
    assert "lora_alpha = 2 x sqrt(r) = 16" in message
    assert (
        problems_of("7b-lora-ddp", "lora.lora_alpha", "lora.r=64", "lora.lora_alpha=16", "lora.use_rslora=true") == []
    )
