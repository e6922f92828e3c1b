"""What each preset's run must prove in its start record (what the run got, read from the live objects), and the
check of it: the smoke run of each preset (test_smoke_presets.py) and the demo objectives' learning runs
(test_dpo.py, test_kto.py, test_grpo.py, test_reference_free.py) assert it of the run they made."""

from __future__ import annotations


def deepspeed(stage: int):
    return {"distributed_type": "DEEPSPEED", "zero_stage": stage, "model_class": "DeepSpeedEngine", "fsdp": False}


FSDP2 = {
    "distributed_type": "FSDP",
    "zero_stage": None,
    "fsdp": True,
    "fsdp_version": 2,
    "model_class": "FSDPPeftModelForCausalLM",
}
DDP = {"distributed_type": "MULTI_CPU", "zero_stage": None, "fsdp": False, "model_class": "DistributedDataParallel"}
ONE_DTYPE = {"frozen_dtypes": {"bfloat16": 21}}  # sharded QLoRA: no fp32 copy of the frozen weights

# What each preset's start record must say. A new preset needs its line here.
PROOF = {
    "70b-qlora-zero3": {**deepspeed(3), **ONE_DTYPE, "method": "qlora"},
    # Qwen2.5 adds q/k/v biases: 3 more frozen bf16 tensors in each of the 2 layers.
    "70b-qlora-fsdp": {**FSDP2, "frozen_dtypes": {"bfloat16": 27}, "method": "qlora"},
    "13b-lora-fsdp": {**FSDP2, "method": "lora"},
    "7b-full-zero2": {**deepspeed(2), "method": "full"},
    "7b-lora-ddp": {**DDP, "method": "lora"},
    "demo": {**DDP, "method": "lora"},
    "demo-dpo": {**DDP, "method": "lora", "objective": "dpo", "reference": "adapters off"},
    "demo-kto": {**DDP, "method": "lora", "objective": "kto", "reference": "adapters off"},
    "demo-grpo": {**DDP, "method": "lora", "objective": "grpo", "reference": None},
    "demo-orpo": {**DDP, "method": "lora", "objective": "orpo", "reference": None},
    "demo-simpo": {**DDP, "method": "lora", "objective": "simpo", "reference": None},
}


def assert_proves(preset: str, start: dict) -> None:
    """The start record of a 2-rank run of `preset` on one machine says what PROOF says of it."""
    assert preset in PROOF, f"add what the {preset} preset's runs must prove to PROOF (tests/runs/preset_proof.py)"
    assert start["world_size"] == 2 and len(start["nodes"]) == 2 and len(set(start["nodes"])) == 1
    assert start["gate"] == {"passed": True, "problems": []}
    for key, value in PROOF[preset].items():
        assert start[key] == value, f"{preset}: {key} is {start[key]!r}, expected {value!r}"
    quantized = start["quantized_modules"].get("Linear4bit", 0)
    assert (quantized > 0) == (start["method"] == "qlora"), start["quantized_modules"]
    if start["method"] == "full":
        assert start["trainable_params"] == start["total_params"]
    else:
        assert 0 < start["trainable_params"] < start["total_params"]
