"""GRPO's generation in the training phase: what one GPU holds while the model writes its answers.

TRL's GRPOTrainer (1.16, _prepare_inputs) writes a whole generation batch before the step's forward and backward:
per_device_train_batch_size x steps_per_generation answers per GPU (steps_per_generation defaults to
gradient_accumulation_steps), all at once through transformers' generate (_generate_and_score_completions).
While it writes, one GPU holds, besides the model states:
  KV cache   the keys and values of every layer for every answer, prompt and answer so far, in the compute dtype
             (transformers' DynamicCache): rows x (prompt + answer) x 2 x layers x kv_heads x head_dim x bytes
  decode     one decode step's logits: the last position's rows x vocab in the compute dtype, generate's fp32 copy,
             the temperature-scaled scores and the sampling probabilities (3 x 4 bytes); or the prompts' prefill,
             one layer at a time without gradients, when that is larger
  gathered   ZeRO-3: unwrap_model_for_generation (trl/models/utils.py) gathers every parameter for the whole
             generation (deepspeed.zero.GatheredParameters; GRPOConfig.ds3_gather_for_generation=True, TRL's
             default); the GPU's own shard is counted under weights already. FSDP gathers only the root unit
             (summon_full_params with recurse=False under FSDP 1, nothing under FSDP 2) and each layer as it
             computes, as in training: nothing more than the gathered parameters term.
None of it outlives generate(): the step's activations and loss tensors come after, in the memory it freed
(PyTorch's caching allocator hands the freed blocks out again). The training phase's peak is the larger of the two
moments, so the terms count what generation needs beyond the step's activations and loss tensors, shared between
them in proportion to their sizes; a note gives the whole figures.
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_job import GIB, Job, frozen_base_params, quant_stats_bytes

# The terms generation adds to the training phase (backend/estimate/memory.py names them).
GENERATION_TERMS = ("generation", "generation_gathered")


def kv_cache_bytes(job: Job) -> float:
    """Keys and values of the answers written at once, each at its longest (prompt + max_completion_length)."""
    arch = job.arch
    return job.generation_rows * job.seq_len * 2 * arch.num_hidden_layers * arch.kv_size * job.act_bytes


def decode_bytes(job: Job) -> float:
    """The larger of one decode step's vocabulary-sized tensors and the prompts' prefill through one layer."""
    arch, a, rows = job.arch, job.act_bytes, job.generation_rows
    logits = rows * arch.vocab_size * (a + 3 * 4)
    # Prefill without gradients: one layer's widest intermediates (gate, up and their product) and the hidden
    # states in and out, for every prompt token at once.
    experts = arch.num_experts_per_tok or 1
    prefill = rows * job.prompt_len * a * (3 * arch.intermediate_size * experts + 2 * arch.hidden_size)
    return max(logits, prefill)


def generation_weight_bytes(job: Job) -> float:
    """The whole model as generation computes with it: the trained 16-bit (or fp32) weights of a full fine-tune,
    the base as loaded (4-bit under QLoRA) otherwise (the adapters are small beside it)."""
    if job.method == "full":
        return job.arch.num_parameters * (2 if job.precision in ("bf16", "fp16") else 4)
    return frozen_base_params(job) + quant_stats_bytes(job)


def gathered_for_generation(job: Job, terms: dict[str, float]) -> float:
    """ZeRO-3 (GRPOConfig.ds3_gather_for_generation, default True): the whole model less what the GPU already holds
    (its shard, counted under weights; none when the parameters are offloaded)."""
    if not job.layout.is_zero3:
        return 0.0
    return max(0.0, generation_weight_bytes(job) - terms.get("weights", 0.0))


def add_generation(job: Job, terms: dict[str, float], notes: list[str]) -> None:
    """GENERATION_TERMS into the training phase's terms (after activations and logits), and a note."""
    parts = {"generation": kv_cache_bytes(job) + decode_bytes(job)}
    parts["generation_gathered"] = gathered_for_generation(job, terms)
    held = sum(parts.values())
    step = terms["activations"] + terms["logits"]
    beyond = max(0.0, held - step)
    for key, value in parts.items():
        terms[key] = value * beyond / held if held else 0.0
    gathered = parts["generation_gathered"]
    also = f" and {gathered / GIB:.1f} GB of weights gathered (ZeRO-3)" if gathered else ""
    counted = (
        f": the generation terms count the {beyond / GIB:.1f} GB beyond those" if beyond else ": no more at the peak"
    )
    notes.append(
        f"GRPO writes {job.generation_rows} answers at once per GPU (batch x gradient accumulation) before each step:"
        f" {parts['generation'] / GIB:.1f} GB of KV cache and decode tensors{also}, freed before the step's "
        f"activations and loss tensors ({step / GIB:.1f} GB){counted}"
    )
