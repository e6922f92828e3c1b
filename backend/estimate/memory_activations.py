"""Activations and the loss's tensors: what a training step keeps for its backward pass, per GPU.

Shared by the training phase (backend/estimate/memory_train.py) and GRPO's generation terms. Bytes here.
The per-layer terms follow what autograd saves, not every tensor a backward could use; bench/memory_probe.py
measures them on CPU at toy scale (a transformers Llama with PEFT adapters) and prints them beside these formulas.
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_job import Job, dequant_bytes_per_param, largest_linear_params


def _per_layer_activation_bytes(job: Job) -> float:
    """Bytes kept per token by one decoder layer for its backward pass.

    Korthikanti et al. (2022, §4.1) count 34sbh + 5as^2b for a GPT layer in 16-bit, every tensor a backward could
    use. Autograd keeps less: a product keeps an input only to compute the other input's gradient, so a frozen weight
    (the whole base under LoRA and QLoRA) keeps nothing of its input (PyTorch's codegen saves mm's `self` only when
    `mat2` needs a gradient; bitsandbytes' MatMul4Bit keeps only the packed weight). For a Llama-style layer as
    transformers runs it:
      RMSNorm: its fp32 input (the norm upcasts); the 16-bit normalised value too when the norm's weight trains
      attention: q, k, v and the output, kept by the kernel (SDPA repeats k and v to every head: repeat_kv); eager
        attention also keeps the fp32 softmax and its 16-bit copy (the 5as/h term, which SDPA/flash avoid)
      SwiGLU MLP: gate, silu(gate) and up; their product only when down_proj's weight trains
      trained weights' inputs: full fine-tuning keeps the input of q/k/v (one tensor), of gate/up (one) and of
        down_proj (o_proj's is the attention output, already kept); each LoRA adapter keeps its own 16-bit copy of
        its input (PEFT casts to the fp32 adapter, autocast back for lora_A), the dropout's 1-byte mask when
        lora_dropout > 0, and lora_A's output
    Measured on this machine with bench/memory_probe.py (a transformers Llama and PEFT on CPU, every saved tensor
    counted once): 44.5h bytes per token in a LoRA (q, v; dropout 0.05) layer under bf16 autocast, 36.5h without
    dropout, 45.6h in a full fine-tune's layer; the CPU's dropout keeps a 4-byte mask where CUDA keeps 1 byte.
    """
    arch, a, software = job.arch, job.act_bytes, job.software
    h, q, kv, i = arch.hidden_size, arch.q_size, arch.kv_size, arch.intermediate_size
    trains_base = job.method == "full"
    norm = (
        arch.norms_per_layer
        * (software.norm_input_bytes + software.norm_mean_input_bytes + (a if trains_base else 0))
        * h
    )
    if job.attn == "flash_attention_2":
        attention = a * (q + 2 * kv + q)  # q, k, v (GQA-sized), output
    else:
        attention = a * (4 * q)  # SDPA: k and v repeated to all heads (repeat_kv)
    if job.attn == "eager":
        # fp32 softmax of the scores and its 16-bit copy: a row of seq_len per head per token
        attention += (4 + a) * arch.num_attention_heads * job.seq_len
    k = arch.num_experts_per_tok or 1
    mlp = k * 3 * a * i + (2 * a * h * k if arch.num_local_experts else 0)
    distinct_inputs = a * (2 * h + k * i)  # q/k/v's, gate/up's and down_proj's inputs
    if trains_base:
        return norm + attention + mlp + distinct_inputs
    adapters = _adapter_bytes(job)
    if job.bits and software.keeps_4bit_inputs:
        adapters += distinct_inputs  # bitsandbytes < 0.43.2 kept every 4-bit linear's input
    return norm + attention + mlp + adapters


def _adapter_bytes(job: Job) -> float:
    """What the LoRA adapters of one layer keep per token: each its 16-bit input (PEFT casts to the fp32 adapter,
    autocast back for lora_A; pure-bf16 stacks keep the dropout's output), the dropout's 1-byte mask when
    lora_dropout > 0, and lora_A's output."""
    arch, a, r = job.arch, job.act_bytes, job.lora_r
    adapted = arch.adapted_weights(job.lora_targets)
    total = 0.0
    if job.software.fused_qkv_lora:
        # LitGPT: attention keeps the whole qkv output through v's view, one dropout serves every adapted part of
        # the fused projection, and zero_pad keeps the adapters' 16-bit update (bench/memory_probe.py).
        qkv = [w for w in adapted if w.name in ("q_proj", "k_proj", "v_proj")]
        if qkv:
            total += a * (arch.q_size + arch.kv_size) + (a + (1 if job.lora_dropout > 0 else 0)) * arch.hidden_size
            total += sum(a * (w.out_features + r) for w in qkv)
        adapted = [w for w in adapted if w not in qkv]
    for w in adapted:
        mask = w.in_features if job.lora_dropout > 0 and w.is_linear else 0
        total += a * (w.in_features + r * w.lora_rank_multiplier) + mask
    return total


def activation_bytes(job: Job) -> float:
    """Activations at the memory peak, beyond the loss's tensors, where as many parameters are gathered at both
    moments (see step_peak)."""
    return step_peak(job, 0.0)[0]


def step_peak(job: Job, gathered_gap: float) -> tuple[float, bool]:
    """Activations at the memory peak beyond the loss's tensors (see logit_bytes), and which moment peaks.

    Without checkpointing every layer's activations are alive when the loss backward runs.
    With checkpointing each layer keeps only its input; one layer is recomputed at a time,
    after the loss's vocabulary-sized tensors are freed but beside what the training loop still holds of them
    (kept_logit_bytes). The peak is the larger of the two moments:
      loss      the kept activations, the loss's tensors and, when lm_head is 4-bit, its dequantized weight
      layer     the kept activations, the loss's kept tensors, the recomputed layer and the backward's working set,
                with `gathered_gap` more parameters gathered than at the loss (FSDP prefetches the next layer only
                once the gradient reaches the logits: memory_train.gathered_bytes)
    so the layer's moment adds only what exceeds the loss's moment. Returns (the activations beyond the loss's
    tensors, whether the layer's moment is the peak: then the larger gathered term counts).
    """
    arch, a, t = job.arch, job.act_bytes, job.tokens
    per_layer = _per_layer_activation_bytes(job) * t
    final_norm = (4 + 2 * a + job.software.norm_mean_input_bytes) * arch.hidden_size * t
    # Backward working set: gradients of the widest intermediate and of the hidden state.
    working = a * (2 * arch.intermediate_size * (arch.num_experts_per_tok or 1) + 2 * arch.hidden_size) * t
    if job.bits:  # bitsandbytes dequantizes one weight for each matmul
        working += dequant_bytes_per_param(job) * largest_linear_params(job)
    if job.sequence_parallel > 1:
        # Ulysses: job.tokens is already this GPU's slice of the sequence, so every term above is 1/N of the
        # row's. Its all-to-alls add one layer's send and receive copies of q, k, v (and of the attention
        # output on the way back): about 2 x (q + 2 kv) values per local token, some 5-10% of the rest.
        working += 2 * a * (arch.q_size + 2 * arch.kv_size) * t
    at_loss = head_dequant_bytes(job)
    if job.checkpointing:
        kept = arch.num_hidden_layers * a * arch.hidden_size * t
        at_layer = per_layer + working + kept_logit_bytes(job)
    else:
        kept = arch.num_hidden_layers * per_layer
        at_layer = working + kept_logit_bytes(job)
    beyond_loss = at_layer - logit_bytes(job)
    if beyond_loss + gathered_gap > at_loss:
        return max(0.0, kept + final_norm + beyond_loss), True
    return kept + final_norm + at_loss, False


def head_dequant_bytes(job: Job) -> float:
    """A 4-bit lm_head's dequantized weight while it computes the logits (LitGPT: memory_software.quantizes_head)."""
    if not (job.bits and job.software.quantizes_head):
        return 0.0
    return dequant_bytes_per_param(job) * job.arch.head_params


def kept_logit_bytes(job: Job) -> float:
    """What the training loop still holds of the loss's tensors while the backward goes through the layers: the
    fp32 logits the model returned where the loop keeps them (memory_software.LOSSES: float_logits), LitGPT's
    16-bit logit chunks (chunked16); nothing where only the loss is returned."""
    per_entry = {"float_logits": 4, "chunked16": job.act_bytes}.get(job.loss, 0)
    return job.tokens * job.arch.vocab_size * per_entry


def logit_bytes(job: Job) -> float:
    """The loss's tensors at the start of backward."""
    arch, a, t = job.arch, job.act_bytes, job.tokens
    if job.loss != "fused":
        # Bytes per token and vocabulary entry (memory_software.LOSSES): transformers' ForCausalLMLoss keeps the
        # 16-bit logits, the fp32 log-softmax of their upcast, and its backward adds two fp32 gradients.
        per_entry = {"materialized": a + 12, "float_logits": 16, "float_logits_freed": 12, "chunked16": 2 * a}[job.loss]
        softcap = 2 * a if arch.final_logit_softcapping else 0  # Gemma 2's tanh: one more 16-bit tensor, its input
        return t * arch.vocab_size * (per_entry + softcap)
    # TRL's ChunkedLogProbFunction (trl/kernels/chunked_logprob.py): one tile of at most
    # 4096 tokens x 32768 vocabulary entries in the compute dtype, an fp32 gradient of the
    # hidden states and its cast back; a trained lm_head also gets a whole fp32 gradient.
    tile = min(t, 4096) * min(arch.vocab_size, 32768) * a
    hidden_grad = t * arch.hidden_size * (4 + a)
    head_grad = arch.embedding_params * (4 + job.weight_bytes) if job.method == "full" else 0
    return tile + hidden_grad + head_grad
