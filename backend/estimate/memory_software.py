"""What the software that trains does to memory, beyond what the job spec says.

tunedeck's jobs run one stack (backend/recipe/train.py: TRL 1.16's SFTTrainer, transformers 5.24, PEFT 0.21,
bitsandbytes 0.50); the page and the CLI estimate that stack alone. The published peaks that judge the estimate
(tests/data/measured_peaks.yaml) were measured with other software, whose differences are facts of its code, not
constants to fit. Each entry names the code it was read from; bench/memory_probe.py measures the per-layer ones
on CPU at toy scale.

  loss                  how the loss is computed (see LOSSES)
  adapter_bytes         bytes per LoRA weight, gradient and Adam moment: PEFT keeps adapters in fp32 since 0.12
                        (autocast_adapter_dtype=True, huggingface/peft#1706, July 2024); before, it cast them to the
                        base weight's dtype (bf16), as pure-bf16 stacks do
  pure_bf16             a full fine-tune trains its bf16 weights in place, with bf16 Adam moments (LitGPT's
                        bf16-true, torchtune's dtype=bf16); tunedeck keeps fp32 master weights (DeepSpeed) or
                        fp32 parameters under FSDP's mixed precision
  norm_input_bytes      bytes per element an RMSNorm keeps of its input: transformers and torchtune upcast to
                        fp32 and keep that; LitGPT's 2023 norm computed in bf16
  norm_mean_input_bytes bytes per element an RMSNorm's mean keeps of the squared input: torch before 2.2 saved
                        mean(dim)'s input for a backward that needs only its size (pytorch/pytorch#109876, fixed by
                        #109935 in 2.2; torch 2.1.0's derivatives.yaml: mean_backward(..., self.sym_numel(), ...)),
                        so LitGPT's RMSNorm on torch 2.1.0 kept x * x in bf16 beside x. bench/memory_probe.py
                        --litgpt counts a LitGPT layer at 44.3h bytes per token under torch 2.1.0, 40.3h under 2.13
  quantizes_head        the lm_head is 4-bit too: Lightning's BitsandbytesPrecision replaces every nn.Linear built
                        in its init context (lightning/fabric/plugins/precision/bitsandbytes.py), while transformers
                        and Answer.AI's loader skip lm_head
  quant_state_dtype     the dtype bitsandbytes dequantizes a 4-bit weight to for each matmul: the dtype it was
                        quantized from (its quant state's), then cast to the input's (MatMul4Bit.forward:
                        dequantize_4bit(B).to(A.dtype)); both copies are alive during the cast when the dtypes
                        differ. transformers and Answer.AI quantize from the model's dtype ("" here); Lightning
                        quantizes from fp16 (`weight.half()` in _Linear4bit._quantize_weight), so a bf16 run holds
                        2 + 2 bytes per weight
  builds_extra_layer    the load holds one decoder layer more than the model: torchtune's builders build a layer on
                        the device and deepcopy it num_layers times (torchtune/modules/transformer.py: _get_clones,
                        April 2024), the template living until the builder returns; by November 2024 they built
                        each layer in a loop
  wraps_from_cpu        FSDP 1 moves, broadcasts, flattens and shards rank 0's CPU copy on the GPU unit by unit,
                        and the peak statistics are reset after that (Answer.AI's train.py: low_memory,
                        sync_module_states; reset_peak_memory_stats before the first step): the wrap's cached blocks
                        are a floor under the reserved peak (backend/estimate/memory_allocator.py)
  keeps_4bit_inputs     bitsandbytes before 0.43.2 kept every 4-bit linear's input for a backward that never used
                        it ("fix QLoRA mem bug: delete useless buffered activation",
                        bitsandbytes-foundation/bitsandbytes#1270, July 2024)
  fused_qkv_lora        LitGPT's fused attention projection (lit_gpt/model.py and lora.py, 2023): v is a view of
                        the whole qkv output, so attention keeps all of it, and LoRAQKVLinear's zero_pad keeps a
                        16-bit copy of the adapters' qkv-sized update (index_copy's source); one dropout serves q
                        and v. Its layer, run on CPU from lit_gpt/ at 8641822 (bench/memory_probe.py --litgpt),
                        keeps 40.3h bytes per token under torch 2.13 (LoRA on q and v, dropout 0.05, the CPU's
                        2-byte mask) and 44.3h under torch 2.1.0; litgpt-2023 counts 43.2h with CUDA's 1-byte mask
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# How the loss is computed, by its tensors alive when the backward pass starts, per token and vocabulary entry:
#   fused          TRL 1.x's ChunkedLogProbFunction (trl/kernels/chunked_logprob.py): vocabulary tiles, never
#                  the whole (tokens x vocab) logits; what tunedeck trains with (memory_activations.logit_bytes)
#   materialized   transformers' ForCausalLMLoss (loss/loss_utils.py, since 4.46): the 16-bit logits, the fp32
#                  log-softmax of their upcast, and the backward's two fp32 gradients (of the log-softmax and of
#                  the logits): a + 12 bytes
#   float_logits   the model itself returns fp32 logits (transformers' Llama before 4.46: `logits.float()`;
#                  torchtune's TransformerDecoder in 2024: `.float()`) and the training loop keeps them through
#                  backward (Answer.AI's train.py keeps `output`; torchtune's recipe its shifted copy): 16 bytes
#   float_logits_freed  the same fp32 logits, freed before backward (transformers' Trainer returns the loss
#                  alone; torchtune in November 2024: "free logits otherwise it peaks backward memory"): 12 bytes
#   chunked16      LitGPT (2023, bf16-true): the LM head in 128-token chunks and cross-entropy per chunk in
#                  16 bits, no upcast: the logits and their log-softmax, 2a bytes (a chunk's backward is small)
LOSSES = ("fused", "materialized", "float_logits", "float_logits_freed", "chunked16")


@dataclass(frozen=True)
class Software:
    loss: str
    adapter_bytes: int = 4
    pure_bf16: bool = False
    norm_input_bytes: int = 4
    norm_mean_input_bytes: int = 0
    quantizes_head: bool = False
    quant_state_dtype: str = ""
    builds_extra_layer: bool = False
    wraps_from_cpu: bool = False
    keeps_4bit_inputs: bool = False
    fused_qkv_lora: bool = False
    source: str = ""


SOFTWARE: dict[str, Software] = {
    "tunedeck": Software(
        "fused", source="backend/recipe/train.py: TRL 1.16, transformers 5.24, PEFT 0.21, bitsandbytes 0.50"
    ),
    "transformers": Software(
        "materialized", source="transformers' Trainer and loss, PEFT fp32 adapters, current bitsandbytes"
    ),
    # PEFT's accelerate docs and Philipp Schmid's FSDP+QLoRA post (TRL's SFTTrainer), early 2024: transformers
    # 4.38-4.40, PEFT < 0.12 (bf16 adapters on a bf16 base), bitsandbytes 0.43.0/0.43.1.
    "transformers-2024": Software(
        "float_logits_freed",
        adapter_bytes=2,
        keeps_4bit_inputs=True,
        source="TRL SFTTrainer, PEFT < 0.12, bitsandbytes < 0.43.2 (early 2024)",
    ),
    # fsdp_qlora/train.py: precision bf16 casts the whole model, adapters included (FSDP's flat parameters take one
    # dtype per unit), trains without autocast and keeps the model's output through backward; transformers 4.38,
    # bitsandbytes 0.43.0 (Feb-Mar 2024).
    "answerai-fsdp-qlora": Software(
        "float_logits",
        adapter_bytes=2,
        wraps_from_cpu=True,
        keeps_4bit_inputs=True,
        source="AnswerDotAI/fsdp_qlora train.py, March 2024",
    ),
    "litgpt-2023": Software(
        "chunked16",
        adapter_bytes=2,
        pure_bf16=True,
        norm_input_bytes=2,
        norm_mean_input_bytes=2,
        quantizes_head=True,
        quant_state_dtype="float16",
        keeps_4bit_inputs=True,
        fused_qkv_lora=True,
        source="Lightning-AI/lit-gpt 8641822 (October 2023): bf16-true, torch 2.1.0, Lightning 2.1, bitsandbytes 0.41.1",
    ),
    # torchtune's LoRA recipes in April 2024 (ff594c231): bf16 adapters and AdamW states, torchao's NF4 (whose
    # LinearNF4 keeps only the quantized weight).
    "torchtune-2024": Software(
        "float_logits",
        adapter_bytes=2,
        pure_bf16=True,
        builds_extra_layer=True,
        source="pytorch/torchtune ff594c231 (April 2024)",
    ),
    "torchtune-2024-11": Software(
        "float_logits_freed", adapter_bytes=2, pure_bf16=True, source="pytorch/torchtune 1814feb17 (November 2024)"
    ),
}


def software_for(name: str, loss: str | None = None) -> Software:
    """The named software, with another loss implementation when `loss` is given."""
    if name not in SOFTWARE:
        raise ValueError(f"software is one of {sorted(SOFTWARE)}, not {name!r}")
    chosen = SOFTWARE[name]
    if loss is None or loss == chosen.loss:
        return chosen
    if loss not in LOSSES:
        raise ValueError(f"loss is one of {LOSSES}, not {loss!r}")
    return replace(chosen, loss=loss, source=f"{chosen.source}, loss {loss}")
