"""Which tensors meet at the training step's peak: the loss's backward or a layer's, gradients, gathered parameters,
dequantized weights, and what the caching allocator keeps beside them (backend/estimate/memory_activations.py,
memory_train.py, memory_allocator.py)."""

from __future__ import annotations

import pytest

from tunedeck.backend.estimate.memory import estimate
from tunedeck.backend.estimate.memory_job import GIB, Job, dequant_bytes_per_param, input_values
from tunedeck.backend.spec import JobSpec, set_paths


def job(**settings) -> JobSpec:
    return set_paths(JobSpec(), {"model.name_or_path": "meta-llama/Llama-2-7b-hf", **settings})


def test_gradients_freed_by_the_optimizer_are_not_beside_the_next_losss_activations():
    """zero_grad(set_to_none=True) leaves no gradient when a step's backward starts; they return layer by layer as
    the activations go. Accumulated over micro batches they stay: the whole gradient counts."""
    full = {"method": "full", "strategy.kind": "fsdp", "launch.num_processes": 8, "dataset.max_seq_length": 4096}
    one = estimate(job(**full, **{"training.gradient_accumulation_steps": 1})).breakdown
    accumulated = estimate(job(**full, **{"training.gradient_accumulation_steps": 8})).breakdown
    assert accumulated["gradients"] * GIB == pytest.approx(4 * 6_738_415_616 / 8, rel=1e-6)  # fp32, sharded
    assert one["gradients"] == pytest.approx(max(0.0, accumulated["gradients"] - one["activations"] - one["logits"]))
    assert one["gradients"] < accumulated["gradients"]
    # DeepSpeed keeps its gradient partitions whatever the accumulation.
    zero2 = {**full, "strategy.kind": "zero2"}
    assert (
        estimate(job(**zero2, **{"training.gradient_accumulation_steps": 1})).breakdown["gradients"]
        == estimate(job(**zero2)).breakdown["gradients"]
    )


def test_fsdp_gathers_only_the_root_unit_while_the_loss_backward_runs():
    """With materialised logits the loss's backward is the peak, before FSDP prefetches the last layer: the root
    unit (embeddings, lm_head) alone is gathered. TRL's chunked loss peaks in a layer's backward with two units."""
    spec = job(**{"strategy.kind": "fsdp", "launch.num_processes": 2, "dataset.max_seq_length": 8192})
    at_loss = estimate(spec, loss="materialized").breakdown["gathered"] * GIB
    root = (32000 * 4096 * 2 + 4096) * 2
    assert at_loss == pytest.approx(root)
    assert estimate(spec).breakdown["gathered"] * GIB > root + 2 * 200_000_000 * 2  # two decoder layers more


def test_a_4_bit_matmul_holds_its_dequantized_weight_and_the_cast():
    def per_param(**settings) -> int:
        spec = job(**{"method": "qlora", "quantization.bits": 4, **settings})
        return dequant_bytes_per_param(Job.from_values(input_values(spec)))

    assert per_param() == 2  # a bf16 quant state, bf16 compute: dequantize_4bit's output is used as it is
    assert per_param(**{"quantization.bnb_4bit_compute_dtype": "float32"}) == 2 + 4  # then cast to fp32
    litgpt = job(**{"method": "qlora", "quantization.bits": 4})
    assert dequant_bytes_per_param(Job.from_values(input_values(litgpt, software="litgpt-2023"))) == 2 + 2


def test_rows_padded_per_batch_reserve_more_beside_materialised_logits():
    """Changing shapes fragment the allocator's cache of the step's largest blocks, the vocabulary-sized ones;
    TRL's chunked loss never makes them, so packing barely matters to tunedeck's own estimate."""
    packed, padded = job(**{"dataset.packing": True}), job(**{"dataset.packing": False})
    materialized = [estimate(s, loss="materialized").breakdown["allocator"] for s in (packed, padded)]
    assert materialized[1] > materialized[0] + 0.5
    fused = [estimate(s).per_gpu_gb for s in (packed, padded)]
    assert fused[0] < fused[1] < 1.03 * fused[0]
