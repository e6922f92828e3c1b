"""Validation rules of what is trained: method and quantization, LoRA, precision, training and data."""

from __future__ import annotations

from collections.abc import Iterator

from tunedeck.backend.recipe.objectives_table import OBJECTIVES, REFERENCE_OBJECTIVES, objectives_said
from tunedeck.backend.recipe.vocabulary import DATASET_FORMATS
from tunedeck.backend.spec import JobSpec, catalog
from tunedeck.backend.spec.problem import Problem, error, warning

# ---------------------------------------------------------------- method and quantization


def method_and_quantization(spec: JobSpec) -> Iterator[Problem]:
    bits, q = spec.quantization.bits, spec.quantization
    if spec.method == "qlora" and bits != 4:
        yield error(
            "quantization.bits",
            "QLoRA trains adapters on a 4-bit base: set quantization.bits=4 (or method=lora for a 16-bit base).",
            {"quantization.bits": 4},
        )
    if spec.method == "full" and bits is not None:
        yield error(
            "quantization.bits",
            "full fine-tuning cannot update quantized weights: clear quantization.bits, or use method=lora/qlora.",
            {"quantization.bits": None},
        )
    if spec.method == "lora" and bits == 4:
        yield warning(
            "method",
            "a 4-bit base with LoRA adapters is QLoRA: set method=qlora so the job says what it does.",
            {"method": "qlora"},
        )
    sharded = spec.strategy.facts.shards_parameters
    if bits == 4 and sharded and q.bnb_4bit_quant_storage != q.bnb_4bit_compute_dtype:
        yield error(
            "quantization.bnb_4bit_quant_storage",
            f"{spec.strategy.kind} can only shard 4-bit weights stored in a float dtype equal to the compute dtype: "
            f"set quantization.bnb_4bit_quant_storage={q.bnb_4bit_compute_dtype}.",
            {"quantization.bnb_4bit_quant_storage": q.bnb_4bit_compute_dtype},
        )
    if bits == 4 and sharded and spec.model.dtype != q.bnb_4bit_compute_dtype:
        # The sharded recipes load the model in the storage dtype (PEFT's docs, "QLoRA and FSDP": dtype
        # = bnb_4bit_quant_storage), so the 4-bit and the 16-bit weights (norms, embeddings) shard
        # as one dtype; FSDP1 refuses mixed dtypes in a flat parameter.
        yield error(
            "model.dtype",
            f"{spec.strategy.kind} shards the 4-bit weights and the rest of the model together, so the model must "
            f"load in the 4-bit storage and compute dtype: set model.dtype={q.bnb_4bit_compute_dtype}.",
            {"model.dtype": q.bnb_4bit_compute_dtype},
        )
    if bits == 8 and sharded:
        yield error(
            "quantization.bits",
            f"8-bit bitsandbytes weights cannot be sharded by {spec.strategy.kind}: use quantization.bits=4 "
            "(QLoRA, with quant storage = compute dtype) or strategy.kind=ddp/zero2.",
        )
    if bits == 4 and spec.training.precision == "fp16" and q.bnb_4bit_compute_dtype == "bfloat16":
        yield warning(
            "quantization.bnb_4bit_compute_dtype",
            "training in fp16 while 4-bit matmuls compute in bfloat16: set quantization.bnb_4bit_compute_dtype=float16.",
            {"quantization.bnb_4bit_compute_dtype": "float16"},
        )


# ---------------------------------------------------------------- LoRA


# Older module names PEFT still accepts and maps onto transformers 5's fused expert tensors
# (peft/utils/transformers_weight_conversion.py, _MOE_TARGET_MODULE_MAPPING).
_PEFT_RENAMED_TARGETS = {"mixtral": ("w1", "w2", "w3")}


def lora(spec: JobSpec) -> Iterator[Problem]:
    if not spec.uses_adapter:
        return
    lora = spec.lora
    if isinstance(lora.target_modules, list) and not lora.target_modules:
        yield error(
            "lora.target_modules",
            "no modules get adapters: set lora.target_modules=all-linear or names such as q_proj,v_proj.",
            {"lora.target_modules": "all-linear"},
        )
    if lora.r > 256:
        yield warning(
            "lora.r", f"rank {lora.r} is unusually large (8-64 is typical); it costs memory with little gain."
        )
    if lora.use_rslora:  # the update is scaled by lora_alpha / sqrt(r)
        scale, usual = lora.lora_alpha / lora.r**0.5, ("lora_alpha/sqrt(r)", "2 x sqrt(r)", round(2 * lora.r**0.5))
    else:
        scale, usual = lora.lora_alpha / lora.r, ("lora_alpha/r", "2 x r", 2 * lora.r)
    if not 0.25 <= scale <= 8:
        yield warning(
            "lora.lora_alpha",
            f"{usual[0]} = {scale:.3g} scales the update oddly; the usual choice is lora_alpha = {usual[1]} = "
            f"{usual[2]}.",
            {"lora.lora_alpha": max(1, min(usual[2], 4096))},
        )
    arch = catalog.lookup(spec.model.name_or_path)
    if arch is not None and isinstance(lora.target_modules, list) and lora.target_modules:
        # PEFT matches a target by the module name's last part, and stops (after the model has
        # loaded) when none matches: e.g. q_proj on Phi-3, whose attention projection is fused.
        layer_names = [w.name.rsplit(".", 1)[-1] for w in arch.layer_weights]
        known = {*layer_names, "lm_head", "embed_tokens", *_PEFT_RENAMED_TARGETS.get(arch.model_type, ())}
        if not any(t.rsplit(".", 1)[-1] in known for t in lora.target_modules):
            yield error(
                "lora.target_modules",
                f"{spec.model.name_or_path} ({arch.model_type}) has no module named {', '.join(lora.target_modules)}, "
                f"so PEFT would refuse it after loading the model: set lora.target_modules=all-linear or names from "
                f"{', '.join(layer_names)}.",
            )
    if arch is not None and arch.num_local_experts and lora.target_modules == "all-linear" and lora.lora_dropout > 0:
        # PEFT 0.21 adapts the stacked expert weights as parameters, and those refuse dropout.
        yield error(
            "lora.lora_dropout",
            "a mixture-of-experts model with target_modules=all-linear adapts its expert weights, which PEFT "
            "only allows without dropout: set lora.lora_dropout=0 (or list attention modules only).",
        )
    if lora.lora_dropout > 0.3:
        yield warning("lora.lora_dropout", f"dropout {lora.lora_dropout:g} is high for adapters; 0.0-0.1 is usual.")


# ---------------------------------------------------------------- precision


def precision(spec: JobSpec) -> Iterator[Problem]:
    precision, dtype = spec.training.precision, spec.model.dtype
    if precision == "fp16" and dtype == "bfloat16":
        yield error(
            "training.precision",
            "fp16 training on bfloat16 weights mixes two 16-bit formats: set training.precision=bf16 (or model.dtype=float16).",
        )
    if precision == "bf16" and dtype == "float16":
        yield error(
            "training.precision",
            "bf16 training on float16 weights mixes two 16-bit formats: set model.dtype=bfloat16 (or training.precision=fp16).",
        )
    if spec.method == "full" and precision == "fp16" and dtype == "float16" and not spec.strategy.is_deepspeed:
        yield error(
            "model.dtype",
            "fp16 mixed precision needs float32 master weights to train all weights (else 'Attempting to unscale "
            "FP16 gradients'): set model.dtype=float32, or training.precision=bf16, or a DeepSpeed strategy.",
        )
    # DeepSpeed keeps fp32 master weights, and accelerate upcasts FSDP's trainable weights to fp32
    # under mixed precision; otherwise the optimizer steps the 16-bit weights themselves.
    has_master_copy = spec.layout.is_deepspeed or (spec.layout.is_fsdp and precision != "fp32")
    already_refused = precision == "fp16" and dtype == "float16"
    if spec.method == "full" and dtype != "float32" and not has_master_copy and not already_refused:
        yield warning(
            "model.dtype",
            f"full fine-tuning under {spec.strategy.kind} steps the {dtype} weights themselves (no fp32 master copy): "
            "updates from a learning rate near 1e-5 mostly round away in 16 bits. Set model.dtype=float32 "
            "(training.precision=bf16 still computes in 16 bits), or strategy.kind=zero2, which keeps an fp32 copy.",
        )
    attn = spec.model.attn_implementation
    if attn == "flash_attention_2" and dtype == "float32":
        yield warning(
            "model.attn_implementation",
            "flash_attention_2 runs only in float16/bfloat16; with float32 weights use attn_implementation=sdpa or model.dtype=bfloat16.",
        )
    if attn == "flash_attention_2" and spec.launch.use_cpu:
        yield error(
            "model.attn_implementation",
            "flash_attention_2 needs an NVIDIA GPU: set model.attn_implementation=sdpa.",
            {"model.attn_implementation": "sdpa"},
        )
    if spec.method == "full" and spec.training.learning_rate > 1e-4:
        yield warning(
            "training.learning_rate",
            f"{spec.training.learning_rate:g} is high for full fine-tuning (1e-5 to 2e-5 is usual; 1e-4+ suits adapters).",
        )


# ---------------------------------------------------------------- objective


def objective_and_format(spec: JobSpec) -> Iterator[Problem]:
    """Each objective reads its own formats (objectives_table.OBJECTIVES): the data's format names the fix. Rows
    only other objectives read (pairs, labelled answers, prompts) ask for an objective that reads them; rows of
    demonstrations ask for the objective's own format."""
    fmt, objective = spec.dataset.format, OBJECTIVES[spec.objective]
    if fmt in objective.formats:
        return
    readers = [o for o in OBJECTIVES.values() if fmt in o.formats]
    if "sft" not in (o.name for o in readers):
        titles = objectives_said([o.title for o in readers])
        yield error(
            "objective",
            f"{fmt} rows ({DATASET_FORMATS[fmt].summary.rsplit(', for ', 1)[0]}) train with {titles}: set "
            f"objective={readers[0].name}, or pick the format of your data.",
            {"objective": readers[0].name},
        )
    else:
        yield error(
            "dataset.format",
            f"objective={objective.name} learns from {objective.reads}, not {fmt} rows: set "
            f"dataset.format={objective.formats[0]} and name its columns, or set objective=sft.",
            {"dataset.format": objective.formats[0]},
        )


def kto_batch(spec: JobSpec) -> Iterator[Problem]:
    """KTO estimates its KL term from the other answers of each micro-batch: TRL refuses a batch of one."""
    if spec.objective == "kto" and spec.training.per_device_train_batch_size < 2:
        yield error(
            "training.per_device_train_batch_size",
            "KTO compares each answer with the others of its micro-batch (its KL estimate), so it needs 2 or more "
            "rows per GPU: set 2 (lower training.gradient_accumulation_steps to keep the global batch).",
            {"training.per_device_train_batch_size": 2},
        )


def precomputed_reference(spec: JobSpec) -> Iterator[Problem]:
    """TRL keeps the reference's precomputed scores in the datasets cache, written by rank 0 and read by every rank."""
    reference = spec.objective in REFERENCE_OBJECTIVES
    if reference and spec.preference.precompute_ref_log_probs and spec.launch.num_machines > 1:
        yield warning(
            "preference.precompute_ref_log_probs",
            "the reference's scores are written once, by the first machine, into the datasets cache, and every "
            "machine reads them there: set HF_DATASETS_CACHE to a folder all machines share (or turn this off).",
        )


# ---------------------------------------------------------------- training and data


def training(spec: JobSpec) -> Iterator[Problem]:
    t, d = spec.training, spec.dataset
    if t.neftune_noise_alpha and d.packing and spec.objective == "sft":
        # transformers' hook scales the noise by the length of the row it sees: a packed row of many examples
        # (or, padding-free, the whole micro-batch) gets less noise a token than each example would alone.
        yield warning(
            "training.neftune_noise_alpha",
            "NEFTune scales its noise by the length of the row it sees, and packed rows hold several examples, so "
            "each gets less noise than alone: raise the value, or set dataset.packing=false for the paper's scale.",
        )
    if t.per_device_train_batch_size >= 8 and t.gradient_accumulation_steps == 1 and not spec.launch.use_cpu:
        yield warning(
            "training.per_device_train_batch_size",
            "a large micro batch without accumulation costs activation memory: keep the per-device batch at 1-4 and "
            "raise training.gradient_accumulation_steps for the same global batch.",
        )
    if t.health.policy == "rollback" and 0 < t.max_steps <= t.save_steps:
        yield warning(
            "training.health.policy",
            f"a roll-back resumes from a checkpoint saved before the blow-up, and with training.save_steps "
            f"{t.save_steps} none is saved within {t.max_steps} steps: lower save_steps (a run without one stops "
            "instead).",
        )
    for column in DATASET_FORMATS[d.format].columns:
        if column.required and not getattr(d, column.field).strip():
            yield error(f"dataset.{column.field}", f"format {d.format} reads this column: give its name.")
