"""The estimator's behaviour and the advisor's choices, as a user of the panel or CLI sees them."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tunedeck.backend.estimate.advisor import advise
from tunedeck.backend.estimate.gpu_fit import gpu_memory_gb
from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import EstimateError
from tunedeck.backend.spec import JobSpec, load_presets, set_paths
from tunedeck.backend.validate import validate

PRESETS = load_presets()


def job(**settings) -> JobSpec:
    return set_paths(JobSpec(), {k.replace("__", "."): v for k, v in settings.items()})


# ---------------------------------------------------------------- strategies are real jobs


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_strategy_estimate_is_the_estimate_of_the_job_it_describes(preset):
    spec = PRESETS[preset].build()
    for option in advise(spec, 80).options:
        applied = set_paths(spec, option.changes)  # the panel's one-click apply
        assert estimate(applied).per_gpu_gb == pytest.approx(option.estimate.per_gpu_gb), option.strategy
        errors = [p for p in validate(applied) if p.level == "error" and p.field != "strategy.nvme_path"]
        assert not errors, f"{preset} -> {option.strategy}: {errors}"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_exactly_one_option_is_the_job_as_given(preset):
    spec = PRESETS[preset].build()
    current = [o for o in advise(spec, 80).options if o.current]
    assert len(current) == 1
    assert current[0].estimate.per_gpu_gb == pytest.approx(estimate(spec).per_gpu_gb)


# ---------------------------------------------------------------- the terms move the right way


def test_sharding_shrinks_with_more_gpus_and_replication_does_not():
    base = dict(method="full", model__name_or_path="meta-llama/Llama-2-13b-hf")
    zero3 = [estimate(job(**base, strategy__kind="zero3", launch__num_processes=n)).per_gpu_gb for n in (2, 4, 8, 16)]
    assert zero3 == sorted(zero3, reverse=True) and zero3[0] > 2 * zero3[-1]
    ddp = [estimate(job(**base, strategy__kind="ddp", launch__num_processes=n)).breakdown["weights"] for n in (2, 8)]
    assert ddp[0] == ddp[1]


def test_activations_grow_with_tokens_and_checkpointing_cuts_them():
    short = estimate(job(dataset__max_seq_length=1024)).breakdown["activations"]
    long = estimate(job(dataset__max_seq_length=4096)).breakdown["activations"]
    batch = estimate(job(dataset__max_seq_length=1024, training__per_device_train_batch_size=4)).breakdown[
        "activations"
    ]
    assert long == pytest.approx(4 * short, rel=0.05) and batch == pytest.approx(long, rel=0.05)
    stored = estimate(job(training__gradient_checkpointing=False)).breakdown["activations"]
    checkpointed = estimate(job(training__gradient_checkpointing=True)).breakdown["activations"]
    assert stored > 5 * checkpointed


def test_eager_attention_keeps_the_score_matrix():
    sdpa = estimate(job(training__gradient_checkpointing=False)).breakdown["activations"]
    eager = estimate(job(training__gradient_checkpointing=False, model__attn_implementation="eager")).breakdown[
        "activations"
    ]
    assert eager > 2 * sdpa


def test_quantization_shrinks_the_frozen_base():
    lora = estimate(job(method="lora")).breakdown["weights"]
    nf4 = estimate(job(method="qlora", quantization__bits=4, quantization__bnb_4bit_use_double_quant=False)).breakdown[
        "weights"
    ]
    nf4_dq = estimate(job(method="qlora", quantization__bits=4)).breakdown["weights"]
    int8 = estimate(job(method="lora", quantization__bits=8)).breakdown["weights"]
    assert nf4_dq < nf4 < int8 < lora
    assert 3.0 < lora / nf4_dq < 4.0  # embeddings and lm_head stay 16-bit


def test_lora_trains_far_fewer_parameters_than_full_fine_tuning():
    full = estimate(job(method="full", strategy__kind="zero2", launch__num_processes=8))
    lora = estimate(job(method="lora"))
    assert lora.trainable_params < 0.01 * full.trainable_params
    assert full.breakdown["optimizer"] > 10 * lora.breakdown["adapter"]


def test_offload_trades_gpu_memory_for_host_memory():
    on_gpu = estimate(job(method="full", strategy__kind="zero2", launch__num_processes=4))
    offloaded = estimate(
        job(method="full", strategy__kind="zero2", strategy__offload_optimizer="cpu", launch__num_processes=4)
    )
    assert offloaded.per_gpu_gb < on_gpu.per_gpu_gb and offloaded.cpu_gb > 0 == on_gpu.cpu_gb


def test_the_fused_loss_of_trl_needs_less_than_materialized_logits():
    spec = job(model__name_or_path="meta-llama/Meta-Llama-3-8B", dataset__max_seq_length=8192)
    fused = estimate(spec).breakdown["logits"]
    materialized = estimate(spec, loss="materialized").breakdown["logits"]
    assert materialized > 10 * fused  # 8192 x 128256 vocabulary entries in fp32 and bf16


def test_unknown_model_is_a_clear_error_naming_the_field():
    with pytest.raises(EstimateError) as info:
        estimate(job(model__name_or_path="someone/unknown-7b"))
    assert info.value.field == "model.name_or_path" and "config.json" in str(info.value)


# ---------------------------------------------------------------- the advisor


def test_lora_on_big_gpus_keeps_ddp():
    advice = advise(PRESETS["7b-lora-ddp"].build(), 80).recommendation
    assert advice.strategy == "DDP" and advice.changes == {} and "as set" in advice.reason


def test_full_7b_fine_tuning_prefers_zero2():
    spec = set_paths(PRESETS["7b-full-zero2"].build(), {"strategy.kind": "zero3"})
    advice = advise(spec, 80).recommendation
    assert advice.strategy == "ZeRO-2" and advice.changes == {"strategy.kind": "zero2"}


def test_full_70b_needs_its_weights_sharded_then_offloaded():
    spec = job(
        method="full", model__name_or_path="meta-llama/Llama-2-70b-hf", launch__num_processes=8, strategy__kind="zero2"
    )
    assert advise(spec, 80).recommendation.changes["strategy.kind"] in ("zero3", "fsdp")
    small = advise(spec, 24).recommendation
    assert small.changes.get("strategy.offload_optimizer") == "cpu" or small.changes.get("method") == "qlora"


def test_offload_before_quantizing_and_qlora_only_when_nothing_else_fits():
    spec = job(model__name_or_path="01-ai/Yi-34B", launch__num_processes=2)  # LoRA, DDP
    plenty_of_ram = advise(spec, 24, cpu_mem_gb=512).recommendation
    assert plenty_of_ram.changes.get("strategy.offload_params") == "cpu" and "method" not in plenty_of_ram.changes
    # Too little host RAM to load the 16-bit model on both ranks and offload it: quantize.
    advice = advise(spec, 24, cpu_mem_gb=96).recommendation
    assert advice.fits and advice.changes["method"] == "qlora"
    others = [o for o in advise(spec, 24, cpu_mem_gb=96).options if "QLoRA" not in o.strategy]
    assert [o.strategy for o in others if o.fits] == ["ZeRO-3 + NVMe offload"]  # no NVMe disk named: not advised
    with_disk = advise(set_paths(spec, {"strategy.nvme_path": "/local_nvme"}), 24, cpu_mem_gb=96).recommendation
    assert with_disk.strategy == "ZeRO-3 + NVMe offload" and "NVMe" in with_disk.reason


def test_nothing_fits_says_what_to_change():
    spec = job(model__name_or_path="meta-llama/Llama-2-70b-hf", method="full", dataset__max_seq_length=32768)
    advice = advise(spec, 16).recommendation
    assert advice.strategy is None and not advice.fits and advice.changes == {}
    assert "dataset.max_seq_length" in advice.reason


def test_the_advice_follows_the_gpu_memory_and_the_model():
    spec = PRESETS["13b-lora-fsdp"].build()
    big, small = advise(spec, 80).recommendation, advise(spec, 24).recommendation
    assert big.strategy == "DDP" and small.strategy != "DDP"
    other_model = advise(set_paths(spec, {"model.name_or_path": "Qwen/Qwen2.5-0.5B"}), 24).recommendation
    assert other_model.strategy == "DDP"
    assert len({big.reason, small.reason, other_model.reason}) == 3


def test_reason_is_one_sentence_with_numbers():
    for preset in PRESETS.values():
        for gpu in (16, 24, 80):
            reason = advise(preset.build(), gpu).recommendation.reason
            assert (reason.endswith(".") and reason.count(". ") == 0 and "GB" in reason) or "MB" in reason


@pytest.mark.parametrize(
    "text,expected", [("80", 80.0), ("24GB", 24.0), ("A100-80GB", 80.0), ("rtx 4090", 24.0), (40, 40.0)]
)
def test_gpu_memory_accepts_sizes_and_names(text, expected):
    assert gpu_memory_gb(text) == expected


@pytest.mark.parametrize("text", ["banana", "0", "-5", "99999"])
def test_gpu_memory_rejects_nonsense(text):
    with pytest.raises(ValueError):
        gpu_memory_gb(text)


# ---------------------------------------------------------------- cheap enough for every form change


def test_one_estimate_takes_well_under_10_ms():
    spec = PRESETS["70b-qlora-zero3"].build()
    estimate(spec)
    n = 200
    start = time.perf_counter()
    for _ in range(n):
        estimate(spec)
    assert (time.perf_counter() - start) / n < 0.010


def test_the_estimator_and_its_view_import_no_training_stack():
    code = (
        "import sys, tunedeck.backend.estimate.memory, tunedeck.backend.estimate.advisor, tunedeck.app.estimate_view; "
        "print([m for m in ('torch','transformers','trl','peft','deepspeed','bitsandbytes') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
