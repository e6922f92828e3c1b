"""Training phase: the peak on one GPU during a training step, term by term.

The peak on one GPU is modelled as the sum of these terms (each cites its source):
  weights, gradients, optimizer  model states of the trained weights (ZeRO paper §3, and
                                 DeepSpeed's estimate_zero{2,3}_model_states_mem_needs)
  adapter                        LoRA weights + gradients + optimizer states
  activations                    kept for the backward pass (Korthikanti et al. 2022,
                                 "Reducing Activation Recomputation", §4, redone for
                                 Llama-style blocks: RMSNorm, SwiGLU, GQA)
  logits                         the loss's tensors: TRL's fused LM head (tiles, what
                                 tunedeck runs) or materialized (tokens x vocab) logits
  gathered                       parameters all-gathered by ZeRO-3/FSDP, or held whole
  generation, generation_gathered  GRPO: what writing the answers holds beyond the step's
                                 activations and loss tensors (backend/memory_grpo.py)
  buckets                        gradient communication buffers (DDP, DeepSpeed)
  cuda_context, allocator        CUDA/NCCL context and caching-allocator overhead
The peak sits at the start of the backward pass: all activations and the loss's
tensors alive at once, on top of the model states. Bytes here; backend/memory.py adds up.
"""

from __future__ import annotations

from tunedeck.backend.memory_grpo import GENERATION_TERMS, add_generation
from tunedeck.backend.memory_job import (
    GIB,
    Job,
    frozen_base_params,
    largest_linear_params,
    quant_stats_bytes,
    quantized_bytes_per_param,
)

# PyTorch's caching allocator reserves more than it hands out (2 MiB segment rounding, freed
# activation blocks that fragment). Answer.AI's FSDP LoRA run on Llama-2 7B published both:
# 9.16 GiB allocated, 10.22 GiB reserved, a gap of 0.4 x the memory that changes within a step.
ALLOCATOR_FRACTION = 0.4


def train_phase(job: Job) -> tuple[dict[str, float], float, float, list[str]]:
    """(bytes per GPU per term, CPU RAM bytes per machine, NVMe bytes per machine, notes)."""
    terms: dict[str, float] = {}
    notes: list[str] = []
    states, (cpu, nvme) = trained_states(job, job.trainable_params)
    if job.method == "full":
        terms.update(states)
    else:
        terms["adapter"] = sum(states.values())
        base, stats = frozen_base_bytes(job, notes)
        if job.offload_params != "none":  # the frozen shards live in host memory (or on NVMe)
            moved = base * job.per_machine
            base = 0.0
            cpu, nvme = (cpu + moved, nvme) if job.offload_params == "cpu" else (cpu, nvme + moved)
        terms["weights"] = base + stats
    if "nvme" in (job.offload_optimizer, job.offload_params):
        cpu += 2 * GIB  # pinned staging buffers of DeepSpeed's asynchronous I/O swapper
    if job.full_reference and not job.precomputed_reference:
        # DPO and KTO (and GRPO with grpo.beta > 0) score each answer with a frozen reference copy of the base,
        # loaded and sharded as the model is (TRL's trainers; with adapters the reference is the base with the
        # adapters off: no copy). Scores computed before training need none: the model itself scores the rows
        # before its first step.
        terms["reference"] = frozen_base_bytes(job, notes)[0]
        notes.append(
            "the reference copy goes with grpo.beta=0 (no KL term)"
            if job.kl_reference
            else "the reference copy goes with preference.precompute_ref_log_probs=true (each row scored once "
            "before training)"
        )
    terms["activations"] = activation_bytes(job)
    if job.sequence_parallel > 1:
        notes.append(
            f"{job.sequence_parallel} GPUs per sequence (DeepSpeed Ulysses): activations and loss tensors are each "
            f"GPU's 1/{job.sequence_parallel} of a row, {job.tokens:,} tokens per micro batch"
        )
    terms["logits"] = logit_bytes(job)
    terms["gathered"] = gathered_bytes(job)
    terms["buckets"] = bucket_bytes(job)
    if job.objective == "grpo":
        add_generation(job, terms, notes)
    terms["cuda_context"] = job.device_overhead
    terms["allocator"] = ALLOCATOR_FRACTION * (
        terms["activations"] + terms["logits"] + terms["gathered"] + terms["buckets"]
        + sum(terms.get(key, 0.0) for key in GENERATION_TERMS)
    )  # fmt: skip
    return terms, cpu, nvme, notes


def zero_model_state_bytes(
    params: int, stage: int, dp: int, *, state_bytes: int = 8, implementation: str = "deepspeed"
) -> dict[str, float]:
    """Bytes per GPU of weights, gradients and optimizer for `params` trained parameters.

    Mixed precision with fp32 master weights, as ZeRO (Rajbhandari et al. 2019, §3.1) and
    DeepSpeed run it: 2 bytes of 16-bit weights, 2 of 16-bit gradients, K = 4 + state_bytes
    of optimizer (fp32 master copy + Adam's two fp32 moments: K = 12).
    implementation="paper": the paper's analysis (§5, Figure 1): stage 1 partitions the
      optimizer, 2 also the gradients, 3 also the weights, over `dp` ranks.
    implementation="deepspeed": what DeepSpeed's code keeps and its own estimators count
      (estimate_zero2_model_states_mem_needs: 2 + 18/N for stage 2;
      estimate_zero3_model_states_mem_needs: 18/N for stage 3): the optimizer step also
      needs an fp32 copy of the gradient partition, 4 bytes per parameter over N.
    """
    k = 4 + state_bytes
    n = dp
    if implementation == "paper" or stage == 0:
        weights = 2 if stage < 3 else 2 / n
        grads = 2 if stage < 2 else 2 / n
        return {
            "weights": weights * params,
            "gradients": grads * params,
            "optimizer": (k if stage == 0 else k / n) * params,
        }
    if implementation != "deepspeed":
        raise ValueError(f"implementation is 'paper' or 'deepspeed', not {implementation!r}")
    if stage == 1:  # whole 16-bit gradients, then an fp32 copy of this rank's partition
        return {"weights": 2 * params, "gradients": (2 + 4 / n) * params, "optimizer": k / n * params}
    if stage == 2:  # 16-bit gradient partition + its fp32 copy
        return {"weights": 2 * params, "gradients": 6 / n * params, "optimizer": k / n * params}
    # Stage 3: DeepSpeed's estimator counts 18 bytes/N (2 weights + 4 gradients + 12 optimizer).
    return {"weights": 2 / n * params, "gradients": 4 / n * params, "optimizer": k / n * params}


def _optimizer_state_bytes(optim: str, param_bytes: int) -> float:
    """Optimizer state per trained parameter (besides any master copy)."""
    if optim in ("adamw_bnb_8bit", "paged_adamw_8bit"):
        return 2.0  # two 8-bit moments (Dettmers et al. 2022, 8-bit optimizers)
    if optim == "paged_adamw_32bit":
        return 8.0
    if optim == "adafactor":
        return 0.0  # factored second moment: rows + columns, negligible next to the weights
    if optim == "sgd":
        return 0.0  # transformers' SGD has no momentum by default
    return 2.0 * param_bytes  # torch AdamW: exp_avg and exp_avg_sq, same dtype as the parameter


def trained_states(job: Job, params: int) -> tuple[dict[str, float], tuple[float, float]]:
    """weights/gradients/optimizer bytes per GPU of the trained parameters, and the
    (CPU RAM, NVMe) bytes per machine that offloading moves off the GPUs."""
    n = job.world
    if job.deepspeed:
        stage = job.zero_stage
        state = _optimizer_state_bytes(job.optim, 4)  # DeepSpeed runs the optimizer on fp32 partitions
        if job.precision in ("bf16", "fp16"):
            # fp32 master weights next to the 16-bit ones (ZeRO §3.1, DeepSpeed's estimators).
            states = zero_model_state_bytes(params, stage, n, state_bytes=int(state))
        else:  # fp32 training: the weights are their own master copy
            states = {
                "weights": 4 * params / (n if stage == 3 else 1),
                "gradients": 4 * params / (n if stage >= 2 else 1),
                "optimizer": state * params / n,
            }
        if job.offload_optimizer == "none":
            return states, (0.0, 0.0)
        # ZeRO-Offload (Ren et al. 2021): master weights, moments and fp32 gradients live in
        # host memory; the GPU keeps the 16-bit weights (DeepSpeed's estimators: 2P, or 2P/N).
        moved = states["optimizer"] + 4 * params / n
        states["optimizer"] = 0.0
        states["gradients"] = 2.0 * params if stage == 1 else 0.0
        if stage == 3 and job.offload_params != "none":
            moved_weights = states["weights"]
            states["weights"] = 0.0
        else:
            moved_weights = 0.0
        cpu = moved * (job.offload_optimizer == "cpu") + moved_weights * (job.offload_params == "cpu")
        nvme = moved * (job.offload_optimizer == "nvme") + moved_weights * (job.offload_params == "nvme")
        return states, (cpu * job.per_machine, nvme * job.per_machine)

    # DDP and FSDP: torch's optimizer on the parameters as they are stored.
    if job.method != "full":
        pbytes = 4  # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype=True)
    elif job.engine == "fsdp" and job.precision in ("bf16", "fp16"):
        pbytes = 4  # accelerate upcasts trainable parameters to fp32 under FSDP mixed precision
    else:
        pbytes = job.weight_bytes
    shards = job.shards if job.engine == "fsdp" else 1
    states = {
        "weights": pbytes * params / shards,
        "gradients": pbytes * params / shards,
        "optimizer": _optimizer_state_bytes(job.optim, pbytes) * params / shards,
    }
    if job.offload_params == "cpu":
        # FSDP CPU offload moves parameters, gradients and the optimizer step to the host.
        moved = sum(states.values()) * job.per_machine
        return dict.fromkeys(states, 0.0), (moved, 0.0)
    return states, (0.0, 0.0)


def frozen_base_bytes(job: Job, notes: list) -> tuple[float, float]:
    """(parameter bytes that sharding and offload act on, replicated statistics) per GPU."""
    params, stats = frozen_base_params(job), quant_stats_bytes(job)
    if job.zero_stage == 3 or (job.engine == "fsdp" and job.fsdp_sharding != "SHARD_GRAD_OP"):
        if job.bits and job.quant_storage == "uint8":
            notes.append("quantized weights stored as uint8 cannot be sharded: every GPU holds the whole base")
            return params, stats
        return params / job.shards, stats
    return params, stats  # DDP/ZeRO-1/2 replicate it; SHARD_GRAD_OP holds it whole from forward to backward


def _per_layer_activation_bytes(job: Job) -> float:
    """Bytes kept per token by one decoder layer for its backward pass.

    Korthikanti et al. (2022, §4.1) count 34sbh + 5as^2b for a GPT layer in 16-bit. The same
    bookkeeping for a Llama-style layer as transformers runs it:
      RMSNorm upcasts to fp32: its fp32 input, the normalised 16-bit value and the scaled output
      attention: q, k, v and the output kept by the kernel, plus o_proj's input; eager attention
      also keeps the fp32 softmax and its 16-bit copy (the 5as/h term, which SDPA/flash avoid)
      SwiGLU MLP: gate, silu(gate), up and their product (4 x intermediate)
      LoRA: each adapter's dropout output and mask (none when dropout is 0)
    """
    arch, a = job.arch, job.act_bytes
    h, q, kv = arch.hidden_size, arch.q_size, arch.kv_size
    norm = arch.norms_per_layer * (4 + 2 * a) * h
    if job.attn == "flash_attention_2":
        attention = a * (q + 2 * kv + q) + a * q  # q, k, v (GQA-sized), output, o_proj input
    else:
        attention = a * (4 * q) + a * q  # SDPA: k and v repeated to all heads (repeat_kv)
    if job.attn == "eager":
        # fp32 softmax of the scores and its 16-bit copy: a row of seq_len per head per token
        attention += (4 + a) * arch.num_attention_heads * job.seq_len
    i = arch.intermediate_size
    k = arch.num_experts_per_tok or 1
    mlp = k * 4 * a * i + (2 * a * h * k if arch.num_local_experts else 0)
    lora = 0.0
    if job.method != "full":
        for w in arch.adapted_weights(job.lora_targets):
            if job.lora_dropout > 0 and w.is_linear:
                lora += (a + 1) * w.in_features  # dropout output + its boolean mask
            lora += a * job.lora_r * w.lora_rank_multiplier  # lora_A output, kept by lora_B
    return norm + attention + mlp + lora


def activation_bytes(job: Job) -> float:
    """Activations at the memory peak, beyond the loss's tensors (see _logit_bytes).

    Without checkpointing every layer's activations are alive when the loss backward runs.
    With checkpointing each layer keeps only its input; one layer is recomputed at a time,
    but only after the loss's vocabulary-sized tensors are freed: the peak is the larger of
    the two moments, so the recomputed layer adds only what exceeds the loss's tensors.
    """
    arch, a, t = job.arch, job.act_bytes, job.tokens
    per_layer = _per_layer_activation_bytes(job) * t
    final_norm = (4 + 2 * a) * arch.hidden_size * t
    # Backward working set: gradients of the widest intermediate and of the hidden state.
    working = a * (2 * arch.intermediate_size * (arch.num_experts_per_tok or 1) + 2 * arch.hidden_size) * t
    if job.bits:  # bitsandbytes dequantizes one weight to the compute dtype for each matmul
        working += a * largest_linear_params(job)
    if job.sequence_parallel > 1:
        # Ulysses: job.tokens is already this GPU's slice of the sequence, so every term above is 1/N of the
        # row's. Its all-to-alls add one layer's send and receive copies of q, k, v (and of the attention
        # output on the way back): about 2 x (q + 2 kv) values per local token, some 5-10% of the rest.
        working += 2 * a * (arch.q_size + 2 * arch.kv_size) * t
    if not job.checkpointing:
        return arch.num_hidden_layers * per_layer + final_norm + max(0.0, working - logit_bytes(job))
    inputs = arch.num_hidden_layers * a * arch.hidden_size * t
    return inputs + final_norm + max(0.0, per_layer + working - logit_bytes(job))


def logit_bytes(job: Job) -> float:
    """The loss's tensors at the start of backward."""
    arch, a, t = job.arch, job.act_bytes, job.tokens
    if job.loss == "materialized":
        # transformers' ForCausalLMLoss upcasts the 16-bit logits to fp32 and cross_entropy keeps
        # its fp32 log-softmax; its backward adds two fp32 tensors (gradients of the
        # log-softmax and of the logits) while the 16-bit logits are still referenced.
        per_token = a + 4 + 4 + 4 + (2 * a if arch.final_logit_softcapping else 0)
        return t * arch.vocab_size * per_token
    # TRL's ChunkedLogProbFunction (trl/kernels/chunked_logprob.py): one tile of at most
    # 4096 tokens x 32768 vocabulary entries in the compute dtype, an fp32 gradient of the
    # hidden states and its cast back; a trained lm_head also gets a whole fp32 gradient.
    tile = min(t, 4096) * min(arch.vocab_size, 32768) * a
    hidden_grad = t * arch.hidden_size * (4 + a)
    head_grad = arch.embedding_params * (4 + job.weight_bytes) if job.method == "full" else 0
    return tile + hidden_grad + head_grad


def unit_bytes(job: Job) -> float:
    """One decoder layer's weights as all-gathered for compute (16-bit, or still 4-bit)."""
    arch = job.arch
    linear = sum(w.numel for w in arch.layer_weights if w.is_linear)
    other = arch.layer_params - linear
    compute = job.compute_bytes
    per_linear = quantized_bytes_per_param(job) if job.bits else compute
    adapter = job.trainable_params / arch.num_hidden_layers * compute if job.method != "full" else 0
    return linear * per_linear + other * compute + adapter


def gathered_bytes(job: Job) -> float:
    arch = job.arch
    compute = job.compute_bytes
    if job.zero_stage == 3:
        # DeepSpeed's estimator: the largest layer lives gathered in 16 bits, with its 16-bit
        # gradient when it trains (4 bytes per parameter).
        return (4 if job.method == "full" else 2) * arch.largest_layer_params
    if job.engine != "fsdp":
        return 0.0
    root = (arch.embedding_params + arch.head_params + arch.hidden_size) * (
        compute if job.method == "full" or not job.bits else job.weight_bytes
    )
    trained_grad = 4 * (job.trainable_params / arch.num_hidden_layers)  # one unit's unsharded fp32 gradient
    if job.method == "full" and job.fsdp_sharding == "SHARD_GRAD_OP":
        # Weights are not resharded after forward: every layer stays gathered until its backward.
        return arch.num_hidden_layers * unit_bytes(job) + root + trained_grad
    if job.method != "full" and job.fsdp_sharding == "SHARD_GRAD_OP":
        return root + trained_grad  # the frozen base is already counted whole under weights
    # FULL_SHARD / HYBRID_SHARD: the layer being computed and the prefetched next one; the root
    # unit (embeddings, lm_head) stays gathered through forward and backward.
    return 2 * unit_bytes(job) + root + trained_grad


def bucket_bytes(job: Job) -> float:
    if job.world == 1 and job.engine == "ddp":
        return 0.0
    if job.engine == "ddp":
        # DDP's reducer copies gradients into flat buckets as large as all trained gradients
        # (gradient_as_bucket_view is off in accelerate).
        grad_bytes = 4 if job.method != "full" else job.weight_bytes
        return job.trainable_params * grad_bytes
    if job.deepspeed:
        # The reduce bucket in 16-bit, doubled when communication overlaps the backward pass;
        # ZeRO-3 also prefetches the next parameters into a bucket.
        prefetch = 2 * job.prefetch_bucket if job.zero_stage == 3 else 0
        return (2 if job.overlap_comm else 1) * job.reduce_bucket * 2 + prefetch
    return 0.0
