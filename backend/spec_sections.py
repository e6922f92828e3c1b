"""The job spec's sections on what is trained: model, LoRA, quantization, dataset, training.

A JobSpec (backend/spec_job.py, with the sections on how it runs: strategy and launch) is
one typed, validated description of a fine-tuning job; presets, forms, uploaded YAML and the
CLI all produce one, and every generated file is a pure function of one. Field names follow
the Hugging Face name wherever one exists (PEFT's LoraConfig, bitsandbytes'
BitsAndBytesConfig, TRL's SFTConfig, accelerate's launch options), so a reader of either
side recognises the other.

A field says where it goes: an `SftField` is a TRL SFTConfig argument, which
training_args.yaml copies by name whenever the field applies (backend/applies.py). The
dataset formats and their column fields come from backend/vocabulary.py.

These modules check what one field alone can check (types, ranges, choices, one line of
visible text); rules across fields live in validate.py, reading and naming fields in
spec_parse.py, untrusted YAML in untrusted.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from tunedeck.backend.untrusted import describe_char, unsafe_char
from tunedeck.backend.vocabulary import DATASET_FORMATS, column_fields

Dtype = Literal["bfloat16", "float16", "float32"]
DatasetFormatName = Literal[tuple(DATASET_FORMATS)]  # type: ignore[valid-type]

# Upper bounds that no real job reaches, so that a form cannot ask for the absurd (an ETA of
# 10^24 hours, a 5,000-digit seed the trainer refuses only after loading the model).
MAX_STEPS = 10_000_000  # optimizer steps; Llama 2's pretraining took 500,000
MAX_ELEMENTS = 10**12  # DeepSpeed bucket and parameter counts: more than any model's parameters
MAX_TEXT = 4096  # characters in one text field: PATH_MAX on Linux, longer than any name or path
Steps = Annotated[int, Field(ge=1, le=MAX_STEPS)]
Elements = Annotated[int, Field(ge=1, le=MAX_ELEMENTS)]
SFT_CONFIG = "sft_config"  # the json_schema_extra key that holds a field's SFTConfig argument name


def SftField(default: Any, *, sft: str | None = None, **kwargs: Any) -> Any:
    """A Field that is also TRL SFTConfig's argument `sft` (default: the field's own name).

    training_args.yaml copies it there by that name whenever the field applies (render/training_args.py).
    """
    return Field(default, json_schema_extra={SFT_CONFIG: sft or True}, **kwargs)


class SpecSection(BaseModel):
    # Unknown keys are typos: refuse them rather than silently ignore them. inf/nan pass the
    # range checks of some fields, then crash the trainer (math.ceil(inf epochs)): refuse them too.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _one_line_of_text(cls, value: Any) -> Any:
        """Every text of the spec (str fields and list items): one line of visible characters.

        Spec values reach shell scripts, YAML files and terminals; a newline in one ended a
        comment of launch.sh and ran the next line (issue 8). One check here covers every
        field, including ones added later.
        """
        items = value if isinstance(value, list) else [value]
        for number, text in enumerate(items, start=1):
            if not isinstance(text, str):
                continue
            which = f"item {number} " if isinstance(value, list) else ""
            if len(text) > MAX_TEXT:
                raise ValueError(f"{which}is {len(text):,} characters long; no name or path is longer than {MAX_TEXT}")
            index = unsafe_char(text)
            if index is not None:
                raise ValueError(
                    f"{which}contains {describe_char(text[index])} at character {index + 1}: "
                    "a text field is one line of visible characters; remove it"
                )
        return value


class ModelSpec(SpecSection):
    name_or_path: str = Field(
        "meta-llama/Llama-2-7b-hf",
        min_length=1,
        description="Hugging Face hub id or local folder of the base model (config.json, weights, tokenizer).",
    )
    dtype: Dtype = Field(
        "bfloat16",
        description="dtype the base weights are loaded in (from_pretrained dtype). bfloat16 needs an Ampere or newer GPU.",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa",
        description="Attention kernel: sdpa (PyTorch built-in, works everywhere), flash_attention_2 (needs the flash-attn package and a 16-bit dtype), eager.",
    )
    trust_remote_code: bool = Field(
        False, description="Run Python code shipped with the model repository. Only for repositories you trust."
    )
    revision: str | None = Field(
        None, description="Hub branch, tag or commit of the model; empty for the default branch."
    )


class LoraSpec(SpecSection):
    r: int = Field(16, ge=1, le=1024, description="LoRA rank: size of the low-rank update. 8-64 is typical.")
    lora_alpha: int = Field(
        32, ge=1, le=4096, description="LoRA scaling numerator (update scaled by lora_alpha / r). Usually 2 x r."
    )
    lora_dropout: float = Field(
        0.05, ge=0.0, lt=1.0, description="Dropout on the LoRA input, 0 to <1. 0.05 is typical."
    )
    target_modules: Literal["all-linear"] | Annotated[list[str], Field(max_length=1000)] = Field(
        "all-linear",
        description="Modules that get adapters: 'all-linear' or module names such as q_proj,k_proj,v_proj,o_proj.",
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="Which biases are trained.")
    use_dora: bool = Field(False, description="Weight-decomposed LoRA (DoRA): a little better, slower per step.")

    @field_validator("target_modules", mode="before")
    @classmethod
    def _split_comma_list(cls, value: Any) -> Any:
        # Forms and --set give "q_proj, v_proj"; PEFT wants a list (or the "all-linear" shortcut).
        if isinstance(value, str) and value.strip() != "all-linear":
            return [part.strip() for part in value.split(",") if part.strip()]
        return value.strip() if isinstance(value, str) else value


class QuantizationSpec(SpecSection):
    bits: Literal[4, 8] | None = Field(
        None, description="Load the base model quantized with bitsandbytes: 4 (QLoRA), 8, or empty for no quantization."
    )
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field(
        "nf4", description="4-bit data type. NF4 suits normally distributed weights (QLoRA paper)."
    )
    bnb_4bit_use_double_quant: bool = Field(
        True, description="Quantize the quantization constants too: saves about 0.37 bits per parameter."
    )
    bnb_4bit_compute_dtype: Dtype = Field("bfloat16", description="dtype of the matmuls on dequantized 4-bit weights.")
    bnb_4bit_quant_storage: Literal["uint8", "bfloat16", "float16", "float32"] = Field(
        "uint8",
        description="Storage dtype of packed 4-bit weights. ZeRO-3 and FSDP need it equal to the compute dtype so they can shard it.",
    )


class _DatasetSource(SpecSection):
    path: str = Field(
        "timdettmers/openassistant-guanaco",
        min_length=1,
        description="Local JSON/JSONL/CSV/Parquet file or folder, or a Hugging Face hub dataset id.",
    )
    name: str | None = Field(None, description="Dataset configuration name on the hub, if it has several.")
    split: str = Field("train", min_length=1, description="Training split; slices work, e.g. train[:95%].")
    eval_split: str | None = Field(
        None, description="Evaluation split, e.g. test or train[95%:]; empty for no evaluation."
    )
    format: DatasetFormatName = Field(
        "text",
        description="Record layout: " + "; ".join(f"{f.name}: {f.summary}" for f in DATASET_FORMATS.values()) + ".",
    )


# The column fields (text_field, prompt_field, ...) come from the dataset-format table, one per
# column a format reads. create_model puts them after the source fields and DatasetSpec's own after
# them: the form, job.yaml and the docs list fields in declaration order.
_DatasetColumns = create_model(
    "_DatasetColumns",
    __base__=_DatasetSource,
    **{
        name: (
            str,
            Field(
                column.default,
                description=f"Column holding {column.holds} (format {' or '.join(formats)}).",
                json_schema_extra={SFT_CONFIG: column.sft} if column.sft else None,
            ),
        )
        for name, (column, formats) in column_fields().items()
    },
)  # type: ignore[call-overload]


class DatasetSpec(_DatasetColumns):  # type: ignore[misc, valid-type]
    max_seq_length: int = SftField(
        2048,
        sft="max_length",
        ge=8,
        le=1_048_576,
        description="Longest sequence in tokens; longer examples are truncated.",
    )
    # On by default: bench/bench_recipe.py measures it (README "Fast defaults"); tests/runs/test_packing.py
    # proves the packed loss equals the unpacked one (rows never attend across each other).
    packing: bool = SftField(
        True,
        description="Pack several rows into each max_seq_length sequence (TRL best-fit decreasing; rows stay whole "
        "and never attend to each other; the loss covers the same tokens as without packing): no padding, "
        "3.5x the useful tokens/s of rows padded to max_length on chat-like data (bench/bench_recipe.py).",
    )
    assistant_only_loss: bool = SftField(
        False,
        description="Train on the assistant turns only (the chat template must mark them with {% generation %}); "
        "false trains on the whole chat.",
    )


class TrainingSpec(SpecSection):
    num_train_epochs: float = SftField(
        1.0, gt=0, le=10_000, description="Passes over the training data (ignored when max_steps > 0)."
    )
    max_steps: int = SftField(
        -1, ge=-1, le=MAX_STEPS, description="Stop after this many optimizer steps; -1 trains for num_train_epochs."
    )
    learning_rate: float = SftField(
        2e-4, gt=0, lt=1, description="Peak learning rate. LoRA: 1e-4 to 3e-4; full fine-tuning: 1e-5 to 2e-5."
    )
    lr_scheduler_type: Literal[
        "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"
    ] = SftField("cosine", description="Learning-rate schedule after warmup.")
    warmup_steps: float = SftField(
        0.03,
        ge=0,
        le=MAX_STEPS,
        description="Warmup: whole steps, or a fraction of all steps when below 1 (0.03 = 3%).",
    )
    per_device_train_batch_size: int = SftField(
        1,
        ge=1,
        le=4096,
        description="Micro batch per GPU per forward pass. Keep small; raise gradient accumulation instead.",
    )
    per_device_eval_batch_size: int = SftField(1, ge=1, le=4096, description="Micro batch per GPU for evaluation.")
    gradient_accumulation_steps: int = SftField(
        8, ge=1, le=4096, description="Micro batches summed before each optimizer step."
    )
    gradient_checkpointing: bool = SftField(
        True,
        sft="activation_checkpointing",  # SFTConfig's name since transformers 5.23: see render/requirements.py
        description="Recompute activations in the backward pass: much less memory, about 30% slower.",
    )
    precision: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16",
        description="Mixed precision of training: bf16 (Ampere or newer), fp16 (older GPUs, loss scaling), fp32 (CPU).",
    )
    optim: Literal[
        "adamw_torch",
        "adamw_torch_fused",
        "adamw_bnb_8bit",
        "paged_adamw_8bit",
        "paged_adamw_32bit",
        "adafactor",
        "sgd",
    ] = SftField(
        "adamw_torch_fused",
        description="Optimizer (transformers name). adamw_torch_fused (transformers' default on torch 2.8+) updates "
        "all weights in one kernel per step; 8-bit and paged variants need bitsandbytes.",
    )
    weight_decay: float = SftField(0.0, ge=0, le=1, description="Decoupled weight decay.")
    max_grad_norm: float = SftField(1.0, ge=0, le=1e6, description="Gradient clipping norm; 0 disables clipping.")
    # numpy (seeded by transformers.set_seed) takes 0 to 2**32-1, and says so only after the model loaded.
    seed: int = SftField(42, ge=0, le=2**32 - 1, description="Random seed for data order and adapter initialisation.")
    logging_steps: Steps = SftField(10, description="Log loss and learning rate every this many steps.")
    save_steps: Steps = SftField(500, description="Save a checkpoint every this many steps.")
    save_total_limit: int | None = SftField(
        2, ge=1, le=100_000, description="Keep at most this many checkpoints; empty keeps all."
    )
    eval_steps: Steps | None = Field(
        None, description="Evaluate every this many steps (needs an eval split); empty uses logging_steps."
    )
    report_to: Literal["none", "tensorboard", "wandb", "mlflow", "trackio"] = SftField(
        "none", description="Extra experiment tracker; tunedeck's own metrics are always written."
    )
    ddp_find_unused_parameters: bool = SftField(
        False, description="Let DDP search for parameters without gradients. False for LoRA (frozen base), faster."
    )
    group_by_length: bool = Field(
        True,
        description="Without packing: batch rows of similar length together (transformers' "
        "train_sampling_strategy=group_by_length), so a batch pads to less.",
    )
    dataloader_num_workers: int = SftField(
        2,
        ge=0,
        le=64,
        description="Processes that collate batches beside each GPU rank, so the GPU does not wait for the next batch.",
    )
    use_liger_kernel: bool = SftField(
        False,
        description="Liger's Triton kernels for RMSNorm, RoPE and SwiGLU: less memory and faster steps on NVIDIA GPUs; "
        "needs the liger-kernel package and a Llama, Mistral, Mixtral, Gemma, Qwen2/3 or Phi-3 model.",
    )
    torch_compile: bool = SftField(
        False,
        description="Compile the model with torch.compile: faster steps after a compile of a few minutes at the start.",
    )
    resume_from_checkpoint: bool = Field(
        False, description="Continue from the newest checkpoint in the output folder, if there is one."
    )
