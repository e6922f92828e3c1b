"""Validation: each rule fires on its combination, names the field and says the fix."""

from __future__ import annotations

import pytest

from tunedeck.backend.spec import resolve_spec
from tunedeck.backend.validate import describe_global_batch, has_errors, validate

from .conftest import PRESET_IDS

# (preset, overrides, level, field, words of the fix in the message)
CASES = [
    ("7b-lora-ddp", ["method=qlora"], "error", "quantization.bits", "quantization.bits=4"),
    ("7b-full-zero2", ["quantization.bits=4"], "error", "quantization.bits", "method=lora/qlora"),
    ("7b-lora-ddp", ["quantization.bits=4"], "warning", "method", "method=qlora"),
    (
        "70b-qlora-zero3",
        ["quantization.bnb_4bit_quant_storage=uint8"],
        "error",
        "quantization.bnb_4bit_quant_storage",
        "bnb_4bit_quant_storage=bfloat16",
    ),
    (
        "70b-qlora-fsdp",
        ["quantization.bnb_4bit_quant_storage=float16"],
        "error",
        "quantization.bnb_4bit_quant_storage",
        "bnb_4bit_quant_storage=bfloat16",
    ),
    ("70b-qlora-zero3", ["method=lora", "quantization.bits=8"], "error", "quantization.bits", "quantization.bits=4"),
    # Sharded QLoRA loads the model in the 4-bit storage dtype (PEFT's FSDP/DeepSpeed QLoRA docs)
    ("70b-qlora-zero3", ["model.dtype=float32"], "error", "model.dtype", "model.dtype=bfloat16"),
    ("70b-qlora-fsdp", ["model.dtype=float32"], "error", "model.dtype", "model.dtype=bfloat16"),
    (
        "70b-qlora-fsdp",
        ["strategy.fsdp_cpu_ram_efficient_loading=true"],
        "warning",
        "strategy.fsdp_cpu_ram_efficient_loading",
        "strategy.fsdp_cpu_ram_efficient_loading=false",
    ),
    (
        "7b-full-zero2",
        ["strategy.kind=fsdp"],
        "warning",
        "strategy.fsdp_activation_checkpointing",
        "training.gradient_checkpointing=false",
    ),
    (
        "70b-qlora-zero3",
        [
            "model.name_or_path=acme/unknown-70b",
            "strategy.offload_optimizer=nvme",
            "strategy.offload_params=nvme",
            "strategy.nvme_path=/nvme",
        ],
        "warning",
        "strategy.offload_params",
        "buffer_size",
    ),
    ("7b-full-zero2", ["strategy.offload_params=cpu"], "error", "strategy.offload_params", "strategy.kind=zero3"),
    ("7b-lora-ddp", ["strategy.offload_optimizer=cpu"], "error", "strategy.offload_optimizer", "strategy.kind=zero2"),
    (
        "7b-full-zero2",
        ["strategy.offload_optimizer=nvme", "strategy.nvme_path=/nvme"],
        "error",
        "strategy.offload_optimizer",
        "silently",
    ),
    ("70b-qlora-zero3", ["strategy.offload_optimizer=nvme"], "error", "strategy.nvme_path", "set strategy.nvme_path"),
    (
        "70b-qlora-zero3",
        ["strategy.offload_optimizer=nvme", "strategy.nvme_path=nvme"],
        "error",
        "strategy.nvme_path",
        "absolute path",
    ),
    (
        "70b-qlora-zero3",
        ["strategy.offload_params=cpu"],
        "warning",
        "strategy.offload_optimizer",
        "strategy.offload_optimizer=cpu",
    ),
    (
        "13b-lora-fsdp",
        ["strategy.offload_optimizer=cpu"],
        "error",
        "strategy.offload_optimizer",
        "strategy.offload_params=cpu",
    ),
    ("13b-lora-fsdp", ["strategy.offload_params=nvme"], "error", "strategy.offload_params", "zero3"),
    (
        "7b-full-zero2",
        ["strategy.offload_optimizer=cpu", "training.optim=adamw_bnb_8bit"],
        "warning",
        "training.optim",
        "training.optim=adamw_torch",
    ),
    (
        "13b-lora-fsdp",
        ["model.name_or_path=acme/unknown-model", "strategy.fsdp_transformer_layer_cls_to_wrap="],
        "error",
        "strategy.fsdp_transformer_layer_cls_to_wrap",
        "decoder layer class",
    ),
    (
        "13b-lora-fsdp",
        ["training.gradient_checkpointing=true"],
        "error",
        "training.gradient_checkpointing",
        "training.gradient_checkpointing=false",
    ),
    (
        "13b-lora-fsdp",
        ["strategy.fsdp_sharding_strategy=HYBRID_SHARD"],
        "warning",
        "strategy.fsdp_sharding_strategy",
        "FULL_SHARD",
    ),
    (
        "7b-full-zero2",
        ["strategy.fsdp_activation_checkpointing=true"],
        "warning",
        "strategy.fsdp_activation_checkpointing",
        "training.gradient_checkpointing",
    ),
    (
        "7b-lora-ddp",
        ["launch.num_machines=3", "launch.main_process_ip=10.0.0.1"],
        "error",
        "launch.num_processes",
        "multiple of launch.num_machines",
    ),
    # slurm.sbatch finds machine 0 itself: only launch.sh needs the address, at run time
    (
        "7b-lora-ddp",
        ["launch.num_machines=2", "launch.num_processes=8"],
        "warning",
        "launch.main_process_ip",
        "MAIN_PROCESS_IP=<address of machine 0>",
    ),
    ("7b-lora-ddp", ["launch.machine_rank=1"], "error", "launch.machine_rank", "below launch.num_machines"),
    ("7b-lora-ddp", ["launch.gpu_ids=0,1"], "error", "launch.gpu_ids", "4 GPUs"),
    ("7b-lora-ddp", ["launch.gpu_ids=0,1,2,3,4,5"], "warning", "launch.gpu_ids", "first ones are used"),
    ("7b-lora-ddp", ["launch.gpu_ids=gpu0"], "error", "launch.gpu_ids", "numbers such as 0,1,2,3"),
    ("7b-lora-ddp", ["training.precision=fp16"], "error", "training.precision", "training.precision=bf16"),
    ("7b-lora-ddp", ["model.dtype=float16"], "error", "training.precision", "model.dtype=bfloat16"),
    (
        "7b-lora-ddp",
        ["method=full", "model.dtype=float16", "training.precision=fp16", "training.learning_rate=2e-5"],
        "error",
        "model.dtype",
        "model.dtype=float32",
    ),
    ("7b-full-zero2", ["training.learning_rate=2e-4"], "warning", "training.learning_rate", "1e-5 to 2e-5"),
    ("7b-full-zero2", ["strategy.kind=ddp"], "warning", "model.dtype", "model.dtype=float32"),
    (
        "7b-full-zero2",
        ["strategy.kind=fsdp", "training.precision=fp32"],
        "warning",
        "model.dtype",
        "no fp32 master copy",
    ),
    (
        "7b-lora-ddp",
        ["model.name_or_path=mistralai/Mixtral-8x7B-v0.1"],
        "error",
        "lora.lora_dropout",
        "lora.lora_dropout=0",
    ),
    (
        "70b-qlora-zero3",
        ["training.precision=fp16", "model.dtype=float16"],
        "warning",
        "quantization.bnb_4bit_compute_dtype",
        "bnb_4bit_compute_dtype=float16",
    ),
    (
        "7b-lora-ddp",
        ["model.attn_implementation=flash_attention_2", "model.dtype=float32", "training.precision=fp32"],
        "warning",
        "model.attn_implementation",
        "attn_implementation=sdpa",
    ),
    (
        "demo",
        ["model.attn_implementation=flash_attention_2"],
        "error",
        "model.attn_implementation",
        "attn_implementation=sdpa",
    ),
    ("7b-lora-ddp", ["lora.target_modules=[]"], "error", "lora.target_modules", "all-linear"),
    (
        "7b-lora-ddp",
        ["model.name_or_path=microsoft/Phi-3-mini-4k-instruct", "lora.target_modules=q_proj,v_proj"],
        "error",
        "lora.target_modules",
        "qkv_proj",
    ),
    (
        "7b-lora-ddp",
        ["lora.target_modules=query_key_value"],
        "error",
        "lora.target_modules",
        "lora.target_modules=all-linear",
    ),
    ("7b-lora-ddp", ["lora.r=512", "lora.lora_alpha=1024"], "warning", "lora.r", "8-64"),
    ("7b-lora-ddp", ["lora.lora_alpha=1"], "warning", "lora.lora_alpha", "lora_alpha = 2 x r"),
    ("7b-lora-ddp", ["lora.lora_dropout=0.5"], "warning", "lora.lora_dropout", "0.0-0.1"),
    (
        "7b-lora-ddp",
        ["training.ddp_find_unused_parameters=true"],
        "warning",
        "training.ddp_find_unused_parameters",
        "=false",
    ),
    ("7b-lora-ddp", ["strategy.kind=zero3"], "warning", "strategy.kind", "strategy.kind=ddp"),
    (
        "7b-lora-ddp",
        ["training.per_device_train_batch_size=16", "training.gradient_accumulation_steps=1"],
        "warning",
        "training.per_device_train_batch_size",
        "gradient_accumulation_steps",
    ),
    ("7b-lora-ddp", ["training.eval_steps=10"], "warning", "training.eval_steps", "dataset.eval_split"),
    ("7b-lora-ddp", ["dataset.text_field=' '"], "error", "dataset.text_field", "give its name"),
    # Traps measured on CPU (docs/notes/cpu-distributed.md)
    (
        "demo",
        ["strategy.kind=fsdp", "strategy.fsdp_version=1"],
        "error",
        "strategy.fsdp_version",
        "strategy.fsdp_version=2",
    ),
    (
        "demo",
        ["strategy.kind=zero2", "training.precision=bf16", "model.dtype=bfloat16"],
        "error",
        "training.precision",
        "training.precision=fp32",
    ),
    (
        "demo",
        ["training.precision=fp16", "model.dtype=float16"],
        "error",
        "training.precision",
        "training.precision=fp32",
    ),
    ("demo", ["training.optim=paged_adamw_8bit"], "error", "training.optim", "training.optim=adamw_torch"),
    ("demo", ["launch.gpu_ids=0,1"], "warning", "launch.gpu_ids", "all"),
]


@pytest.mark.parametrize("preset, overrides, level, field, fix", CASES, ids=[",".join(c[1]) for c in CASES])
def test_rule_names_the_field_and_the_fix(preset, overrides, level, field, fix):
    problems = validate(resolve_spec(preset, overrides))
    matching = [p for p in problems if p.field == field and p.level == level]
    assert matching, f"expected a {level} on {field}, got {problems}"
    assert any(fix in p.message for p in matching), matching


@pytest.mark.parametrize(
    "overrides",
    [
        [],  # ZeRO-2 keeps fp32 master weights
        ["strategy.kind=fsdp"],  # accelerate upcasts FSDP's trainable weights under mixed precision
        ["strategy.kind=ddp", "model.dtype=float32"],  # autocast over fp32 weights
    ],
)
def test_full_fine_tuning_with_a_master_copy_is_not_warned_about_16bit_updates(overrides):
    problems = validate(resolve_spec("7b-full-zero2", overrides))
    assert not [p for p in problems if p.field == "model.dtype"], problems


@pytest.mark.parametrize(
    "preset, overrides",
    [
        (
            "7b-full-zero2",
            [
                "strategy.kind=fsdp",
                "strategy.fsdp_activation_checkpointing=true",
                "training.gradient_checkpointing=false",
            ],
        ),
        (
            "13b-lora-fsdp",
            ["training.gradient_checkpointing=true", "strategy.fsdp_activation_checkpointing=false"],
        ),  # adapters: PEFT's own recipe
        # (the 4-bit storage dtype goes back to its default too: set without 4 bits, it is ignored and warned about)
        (
            "70b-qlora-fsdp",
            [
                "quantization.bits=null",
                "quantization.bnb_4bit_quant_storage=uint8",
                "method=lora",
                "strategy.fsdp_cpu_ram_efficient_loading=true",
            ],
        ),
        (
            "70b-qlora-zero3",
            ["strategy.offload_optimizer=nvme", "strategy.offload_params=nvme", "strategy.nvme_path=/nvme"],
        ),
        ("7b-lora-ddp", ["launch.num_machines=2", "launch.num_processes=8", "launch.main_process_ip=10.0.0.1"]),
    ],
)
def test_the_recipes_way_is_not_warned_about(preset, overrides):
    problems = validate(resolve_spec(preset, overrides))
    assert not [p for p in problems if p.field not in ("strategy.kind", "strategy.offload_optimizer")], problems


@pytest.mark.parametrize(
    "model, targets",
    [
        ("meta-llama/Llama-2-7b-hf", "q_proj,v_proj"),
        ("meta-llama/Llama-2-7b-hf", "model.layers.0.self_attn.q_proj"),  # a full path matches by its end
        ("meta-llama/Llama-2-7b-hf", "lm_head,nonexistent"),  # one match is enough for PEFT
        ("microsoft/Phi-3-mini-4k-instruct", "qkv_proj,o_proj"),
        ("acme/unknown-7b", "anything"),  # an unknown architecture is not second-guessed
    ],
)
def test_target_modules_that_exist_are_accepted(model, targets):
    problems = validate(resolve_spec("7b-lora-ddp", [f"model.name_or_path={model}", f"lora.target_modules={targets}"]))
    assert not [p for p in problems if p.field == "lora.target_modules"], problems


@pytest.mark.parametrize("preset", PRESET_IDS)
def test_presets_have_no_errors_and_no_warnings(preset):
    assert validate(resolve_spec(preset)) == []


def test_errors_come_first_and_has_errors():
    problems = validate(resolve_spec("7b-lora-ddp", ["training.ddp_find_unused_parameters=true", "method=qlora"]))
    assert [p.level for p in problems] == ["error", "warning"]
    assert has_errors(problems)
    assert not has_errors([p for p in problems if p.level == "warning"])


def test_global_batch_is_stated():
    spec = resolve_spec("70b-qlora-zero3", ["training.per_device_train_batch_size=2"])
    assert spec.global_batch_size == 2 * 8 * 8
    assert describe_global_batch(spec) == "global batch 128 = 2 per device x 8 processes x 8 accumulation steps"
