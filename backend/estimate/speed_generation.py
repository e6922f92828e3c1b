"""GRPO's generation in the step time: the seconds one GPU spends writing its answers before each step.

TRL's GRPOTrainer writes per_device_train_batch_size x gradient_accumulation_steps answers per GPU at once
(steps_per_generation defaults to gradient_accumulation_steps), once per optimizer step, through transformers'
generate: a prefill of the prompts, then one decode step per answer token, up to grpo.max_completion_length.
  prefill   compute-bound: counted in the step's compute (backend/spec/flops.py's OBJECTIVE_PASSES counts GRPO's
            generation as one forward a token; backend/estimate/speed.py keeps the prompt's share of it there)
  decode    each step reads every weight once for all the answers, and the KV cache so far: memory-bound while
            the answers are few (bytes / HBM bandwidth), compute-bound when they are many (FLOPs / peak): the larger
  gathers   ZeRO-3 gathers the whole model once for generation (GRPOConfig.ds3_gather_for_generation, TRL's
            default); FSDP's FULL_SHARD and HYBRID_SHARD gather every layer again for every decode step (TRL's
            summon_full_params has recurse=False): a decode step takes at least that gather's time
The decode figure is the datasheet's bound: transformers' generate launches each layer's kernels from Python for
every token, so a small model or a short prompt writes slower than its bandwidth allows.
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_grpo import generation_weight_bytes
from tunedeck.backend.estimate.memory_job import Job, frozen_base_params
from tunedeck.backend.spec import flops

# HBM (device memory) bandwidth in TB/s per GPU, keyed by flops.GPU_TABLE's key; each from the NVIDIA datasheet or
# architecture whitepaper that the GPU's GPU_TABLE row cites (its source, the last field):
# H200 and H200 NVL 4.8; H100 SXM 3.35, H100 NVL 3.9, H100 PCIe 2.0 (the H100 page); A100 40GB 1.555 and 80GB SXM
# 2.039 (A100 datasheet); A10G 0.6 (AWS's A10G datasheet); A10 0.6; L40S and L40 0.864; L4 0.3; RTX 4090 1.008 and
# RTX 6000 Ada 0.96 (Ada architecture whitepaper); RTX 3090 0.936 (GA102 whitepaper); RTX A6000 0.768 (datasheet);
# V100 0.9 (SXM2, 16 and 32 GB); T4 0.32.
HBM_TBPS = {
    "H200 NVL": 4.8, "H200": 4.8, "H100 NVL": 3.9, "H100 PCIe": 2.0, "H100": 3.35,
    "A100-40GB": 1.555, "A100-80GB": 2.039, "A10G": 0.6, "A10": 0.6, "L40S": 0.864, "L40": 0.864, "L4": 0.3,
    "RTX 4090": 1.008, "RTX 3090": 0.936, "RTX 6000 Ada": 0.96, "A6000": 0.768,
    "V100-16GB": 0.9, "V100": 0.9, "T4": 0.32,
}  # fmt: skip


def hbm_bytes_per_s(gpu: str | None) -> float | None:
    """Bytes/s of a GPU_TABLE key's device memory, or None for a GPU the table lacks."""
    tbps = HBM_TBPS.get(gpu) if gpu else None
    return tbps * 1e12 if tbps else None


def decode_bytes_per_step(job: Job) -> float:
    """Bytes one decode step reads: every weight once (generate batches the answers), and the KV cache of every
    answer at its average length while it is written (prompt + half the answer)."""
    arch = job.arch
    kv_per_token = 2 * arch.num_hidden_layers * arch.kv_size * job.act_bytes
    context = job.prompt_len + job.completion_len / 2
    return generation_weight_bytes(job) + job.generation_rows * context * kv_per_token


def decode_flops_per_step(job: Job) -> float:
    """FLOPs of one decode step: a forward of one token per answer over its average context."""
    context = job.prompt_len + job.completion_len / 2
    forward = flops.arch_flops_per_token(job.arch, 0, int(context), True, False)[0] / 3
    return job.generation_rows * forward


def generation_seconds(
    job: Job, gpu: str | None, flops_per_s: float, gather_s_per_byte: float, host_bytes_per_s: float
) -> tuple[float, list[str]]:
    """(seconds per optimizer step one GPU spends decoding its answers, notes); the prefill is in the step's compute.

    gpu: a GPU_TABLE key; flops_per_s: the peak x the efficiency; gather_s_per_byte: seconds per byte of an
    all-gather over the ranks the weights are sharded on (0 with one); host_bytes_per_s: GPU<->host rate, for
    weights offloaded to the CPU."""
    hbm = hbm_bytes_per_s(gpu)
    if hbm is None:
        return 0.0, [f"no memory bandwidth known for {gpu}: GRPO's generation is not in the step time"]
    steps = job.completion_len
    per_step = max(decode_bytes_per_step(job) / hbm, decode_flops_per_step(job) / flops_per_s)
    notes: list[str] = []
    gathered = frozen_base_params(job) if job.method == "qlora" else job.arch.num_parameters * job.compute_bytes
    once = 0.0
    if job.layout.is_zero3:
        once = gathered * gather_s_per_byte  # the whole model, once per generation
        if job.offload_params != "none":
            once += gathered / host_bytes_per_s
    elif job.layout.is_fsdp and job.layout.gathers_per_layer and gather_s_per_byte:
        gather = gathered * gather_s_per_byte  # every layer gathered again for each token written
        if gather > per_step:
            notes.append(
                f"FSDP gathers every layer again for each token GRPO writes ({gather * 1e3:.0f} ms a token): "
                "ZeRO-3 gathers the model once per generation, DDP not at all"
            )
        per_step = max(per_step, gather)
    return steps * per_step + once, notes
