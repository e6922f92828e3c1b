"""Property: every spec either gets a validation error, or yields files the libraries accept.

Random specs mix every choice that changes the generated files (method, quantization,
strategy, offload, FSDP knobs, precision, machines, CPU or GPU, ...). A spec without
errors is rendered, then checked by accelerate, TRL and DeepSpeed (backend/render/bundle_check.py),
and must launch the distributed type and process count it asked for.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS, STRATEGIES
from tunedeck.backend.render import render_bundle, write_bundle
from tunedeck.backend.spec import JobSpec, set_paths, spec_to_yaml
from tunedeck.backend.validate import has_errors, validate

DTYPES = ["bfloat16", "float16", "float32"]


def mostly(usual, *others):
    """Mostly the coherent choice, sometimes another: about half the specs pass validation."""
    return st.sampled_from([usual] * 8 + list(others))


@st.composite
def specs(draw) -> JobSpec:
    method = draw(st.sampled_from(["full", "lora", "qlora"]))
    kind = draw(st.sampled_from(list(STRATEGIES)))
    use_cpu = draw(mostly(False, True, True, True))
    precision = draw(mostly("fp32" if use_cpu else "bf16", "bf16", "fp16", "fp32"))
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[precision]
    model_dtype = draw(mostly(dtype, *DTYPES))
    bits = draw(mostly({"qlora": 4, "lora": None, "full": None}[method], None, 4, 8))
    machines = draw(mostly(1, 2))
    per_machine = draw(st.sampled_from([1, 2, 4, 8]))
    total = draw(mostly(machines * per_machine, machines * per_machine + 1))
    deep = kind.startswith("zero")
    offload_optimizer = draw(mostly("none", "cpu", "nvme"))
    offload_params = draw(mostly("none", "cpu", "nvme"))
    assignments = {
        "model.name_or_path": draw(
            st.sampled_from(
                [
                    "meta-llama/Llama-2-7b-hf",
                    "meta-llama/Llama-2-13b-hf",
                    "meta-llama/Llama-2-70b-hf",
                    "acme/unknown-7b",
                ]
            )
        ),
        "model.dtype": model_dtype,
        "model.attn_implementation": draw(mostly("sdpa", "eager", "flash_attention_2")),
        "method": method,
        "lora.r": draw(st.sampled_from([4, 16, 64])),
        "quantization.bits": bits,
        "quantization.bnb_4bit_compute_dtype": draw(mostly(model_dtype, *DTYPES)),
        "quantization.bnb_4bit_quant_storage": draw(
            mostly(model_dtype if model_dtype != "float32" else "uint8", "uint8", "bfloat16")
        ),
        "dataset.format": draw(st.sampled_from(list(DATASET_FORMATS))),
        "dataset.eval_split": draw(st.sampled_from([None, "test"])),
        "dataset.max_seq_length": draw(st.sampled_from([128, 2048])),
        "dataset.packing": draw(st.booleans()),
        "dataset.assistant_only_loss": draw(st.booleans()),
        "training.group_by_length": draw(st.booleans()),
        "training.dataloader_num_workers": draw(st.sampled_from([0, 2])),
        "training.torch_compile": draw(st.booleans()),
        "training.optim": draw(mostly("adamw_torch_fused", "adamw_torch")),
        "training.per_device_train_batch_size": draw(st.integers(1, 8)),
        "training.gradient_accumulation_steps": draw(st.integers(1, 16)),
        "training.gradient_checkpointing": draw(st.booleans()),
        "training.precision": precision,
        "training.learning_rate": 2e-5 if method == "full" else 2e-4,
        "training.max_steps": draw(st.sampled_from([-1, 50])),
        "training.max_grad_norm": draw(st.sampled_from([0.0, 1.0])),
        "strategy.kind": kind,
        "strategy.offload_optimizer": offload_optimizer if deep else draw(mostly("none", "cpu")),
        "strategy.offload_params": offload_params if kind in ("zero3", "fsdp") else draw(mostly("none", "cpu")),
        "strategy.nvme_path": draw(mostly("/local_nvme", None, "relative/nvme")),
        "strategy.overlap_comm": draw(st.booleans()),
        "strategy.reduce_bucket_size": draw(st.sampled_from(["auto", 50_000_000])),
        "strategy.fsdp_version": draw(st.sampled_from([1, 2])),
        "strategy.fsdp_sharding_strategy": draw(st.sampled_from(["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"])),
        "strategy.fsdp_transformer_layer_cls_to_wrap": draw(st.sampled_from([None, "LlamaDecoderLayer"])),
        "strategy.fsdp_activation_checkpointing": draw(st.booleans()),
        "strategy.fsdp_state_dict_type": draw(st.sampled_from(["FULL_STATE_DICT", "SHARDED_STATE_DICT"])),
        "launch.num_machines": machines,
        "launch.num_processes": total,
        "launch.machine_rank": draw(mostly(0, machines)),
        "launch.main_process_ip": draw(mostly("10.0.0.1", None)),
        "launch.gpu_ids": draw(mostly("all", "0,1")),
        "launch.use_cpu": use_cpu,
    }
    return set_paths(JobSpec(), assignments)


EXPECTED_TYPE = {"ddp": "MULTI_GPU", "zero1": "DEEPSPEED", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp": "FSDP"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(spec=specs())
def test_every_spec_is_refused_or_accepted_by_the_libraries(spec, check):
    problems = validate(spec)
    if has_errors(problems):
        event("refused by validation")
        assert all(p.field and p.message for p in problems)
        return
    event(f"accepted: {spec.strategy.kind}{' cpu' if spec.launch.use_cpu else ''}")
    note(spec_to_yaml(spec))
    with tempfile.TemporaryDirectory() as folder:
        write_bundle(render_bundle(spec), Path(folder))
        result = check(folder)
    expected = EXPECTED_TYPE[spec.strategy.kind]
    if expected == "MULTI_GPU" and spec.launch.num_processes == 1:
        expected = "NO"
    assert result.distributed_type == expected
    assert result.num_processes == spec.launch.num_processes
    assert result.processes_per_machine == spec.launch.processes_per_machine
    if spec.strategy.is_deepspeed:
        assert result.zero_stage == spec.strategy.zero_stage
        assert result.deepspeed_config.train_batch_size * spec.launch.num_processes == spec.global_batch_size
