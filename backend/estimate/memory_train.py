"""Training phase: the peak on one GPU during a training step, term by term.

The peak on one GPU is modelled as the sum of these terms (each cites its source):
  weights, gradients, optimizer  model states of the trained weights (ZeRO paper §3, and
                                 DeepSpeed's estimate_zero{2,3}_model_states_mem_needs)
  adapter                        LoRA weights + gradients + optimizer states
  activations, logits            what the step keeps for its backward pass, and the loss's
                                 tensors (backend/estimate/memory_activations.py)
  gathered                       parameters all-gathered by ZeRO-3/FSDP, or held whole
  generation, generation_gathered  GRPO: what writing the answers holds beyond the step's
                                 activations and loss tensors (backend/estimate/memory_grpo.py)
  buckets                        gradient communication buffers (DDP, DeepSpeed)
  cuda_context, allocator        CUDA/NCCL context and caching-allocator overhead
                                 (backend/estimate/memory_allocator.py: the only constants fitted on
                                 measurements, by bench/fit_memory.py)
The peak is the larger of two moments of the backward pass (memory_activations.step_peak): the loss's
backward, with every kept activation and the loss's tensors, or the first layer's, recomputed
beside what the loop still holds of the loss and with the next layer gathered, on top of the
model states. Bytes here; backend/estimate/memory.py adds up.
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_activations import logit_bytes, step_peak
from tunedeck.backend.estimate.memory_allocator import FITTED, AllocatorConstants, allocator_bytes
from tunedeck.backend.estimate.memory_grpo import GENERATION_TERMS, add_generation
from tunedeck.backend.estimate.memory_job import (
    _DTYPE_BYTES,
    GIB,
    Job,
    frozen_base_params,
    quant_stats_bytes,
    quantized_bytes_per_param,
)


def train_phase(job: Job, allocator: AllocatorConstants = FITTED) -> tuple[dict[str, float], float, float, list[str]]:
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
    gathered_at_loss, gathered = gathered_bytes(job, at_loss=True), gathered_bytes(job)
    terms["activations"], layer_peaks = step_peak(job, gathered - gathered_at_loss)
    if job.sequence_parallel > 1:
        notes.append(
            f"{job.sequence_parallel} GPUs per sequence (DeepSpeed Ulysses): activations and loss tensors are each "
            f"GPU's 1/{job.sequence_parallel} of a row, {job.tokens:,} tokens per micro batch"
        )
    terms["logits"] = logit_bytes(job)
    terms["gathered"] = gathered if layer_peaks else gathered_at_loss
    terms["buckets"] = bucket_bytes(job)
    if job.objective == "grpo":
        add_generation(job, terms, notes)
    if grads_freed_each_step(job):
        # The optimizer's zero_grad(set_to_none=True) (transformers' Trainer, torchtune, LitGPT, Answer.AI) leaves no
        # gradient when the next step's loss backward starts; they come back layer by layer as the activations go,
        # so the peak holds the larger of the two (full fine-tuning, one micro batch per step, torch's optimizer).
        terms["gradients"] = max(0.0, terms["gradients"] - terms["activations"] - terms["logits"])
    terms["cuda_context"] = job.device_overhead
    step = terms["activations"] + terms["logits"] + sum(terms.get(key, 0.0) for key in GENERATION_TERMS)
    terms["allocator"] = allocator_bytes(job, step, terms["logits"], terms["gathered"] + terms["buckets"], allocator)
    return terms, cpu, nvme, notes


def grads_freed_each_step(job: Job) -> bool:
    """Whether no gradient of the trained weights is alive when a step's backward starts: torch's optimizer (not
    DeepSpeed's, whose gradient partitions persist), one micro batch per optimizer step (accumulated gradients live
    across micro batches) and the gradients on the GPU."""
    return job.method == "full" and not job.layout.is_deepspeed and job.grad_accum == 1 and job.offload_params == "none"


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
    if job.layout.is_deepspeed:
        stage = job.layout.zero_stage or 0  # (a DeepSpeed layout always has its stage)
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
        pbytes = job.software.adapter_bytes  # PEFT keeps adapter weights in fp32 (autocast_adapter_dtype=True)
    elif job.layout.is_fsdp and job.precision in ("bf16", "fp16") and not job.software.pure_bf16:
        pbytes = 4  # accelerate upcasts trainable parameters to fp32 under FSDP mixed precision
    else:
        pbytes = job.weight_bytes
    shards = job.shards if job.layout.is_fsdp else 1
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
    if job.layout.gathers_per_layer:
        if job.bits and job.quant_storage == "uint8":
            notes.append("quantized weights stored as uint8 cannot be sharded: every GPU holds the whole base")
            return params, stats
        return params / job.shards, stats
    return params, stats  # DDP/ZeRO-1/2 replicate it; SHARD_GRAD_OP holds it whole from forward to backward


def unit_bytes(job: Job) -> float:
    """One decoder layer's weights as all-gathered for compute (16-bit, or still 4-bit)."""
    arch = job.arch
    linear = sum(w.numel for w in arch.layer_weights if w.is_linear)
    other = arch.layer_params - linear
    compute = job.compute_bytes
    per_linear = quantized_bytes_per_param(job) if job.bits else compute
    adapter = job.trainable_params / arch.num_hidden_layers * compute if job.method != "full" else 0
    return linear * per_linear + other * compute + adapter


def gathered_bytes(job: Job, at_loss: bool = False) -> float:
    """Parameters all-gathered (or held whole) beyond this GPU's shard while a layer's backward runs; `at_loss`:
    while the loss's backward runs, before FSDP's pre-backward hook on the logits prefetches the last layer
    (FULL_SHARD and HYBRID_SHARD reshard every layer after its forward: only the root unit is whole then)."""
    arch = job.arch
    compute = job.compute_bytes
    if job.layout.is_zero3:
        # DeepSpeed's estimator: the largest layer lives gathered in 16 bits, with its 16-bit
        # gradient when it trains (4 bytes per parameter). Its runtime keeps more where the forward turns into the
        # backward: PartitionedParameterCoordinator releases no parameter that is used again within
        # stage3_max_reuse_distance elements (default 1e9), and with the loss's backward next, the last layers and
        # lm_head are (deepspeed/runtime/zero/partitioned_param_coordinator.py: __params_to_release).
        estimator = (4 if job.method == "full" else 2) * arch.largest_layer_params
        if job.bits and job.quant_storage == "uint8":
            return estimator  # not sharded: every GPU holds the whole base (frozen_base_bytes)
        stored = frozen_base_params(job) if job.method != "full" else arch.num_parameters * compute
        element = _DTYPE_BYTES[job.quant_storage] if job.bits else compute  # 4-bit pairs packed in the storage dtype
        return max(estimator, min(job.reuse_distance * element, stored))
    if not job.layout.is_fsdp:
        return 0.0
    root = job.root_unit_bytes
    trained_grad = 4 * (job.trainable_params / arch.num_hidden_layers)  # one unit's unsharded fp32 gradient
    if job.method == "full" and job.layout.keeps_gathered:
        # Weights are not resharded after forward: every layer stays gathered until its backward.
        return arch.num_hidden_layers * unit_bytes(job) + root + trained_grad
    if job.method != "full" and job.layout.keeps_gathered:
        return root + trained_grad  # the frozen base is already counted whole under weights
    # FULL_SHARD / HYBRID_SHARD: the layer being computed and the prefetched next one; the root
    # unit (embeddings, lm_head) stays gathered through forward and backward.
    if at_loss:
        return root
    return 2 * unit_bytes(job) + root + trained_grad


def bucket_bytes(job: Job) -> float:
    if job.layout.wrapper == "none":
        return 0.0
    if job.layout.is_ddp:
        # DDP's reducer copies gradients into flat buckets as large as all trained gradients
        # (gradient_as_bucket_view is off in accelerate).
        grad_bytes = 4 if job.method != "full" else job.weight_bytes
        return job.trainable_params * grad_bytes
    if job.layout.is_deepspeed:
        # The reduce bucket in 16-bit, doubled when communication overlaps the backward pass;
        # ZeRO-3 also prefetches the next parameters into a bucket.
        prefetch = 2 * job.prefetch_bucket if job.layout.is_zero3 else 0
        return (2 if job.overlap_comm else 1) * job.reduce_bucket * 2 + prefetch
    return 0.0
