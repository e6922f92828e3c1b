"""Rules across fields: a list of problems, each naming the field and saying the fix.

spec.py checks what one field alone can check (types, ranges, choices). Here are the
combinations that the libraries reject late (after minutes of model loading), reject
with an unhelpful message, or, worse, accept while silently doing something else
(see docs/notes/cpu-distributed.md). Errors block export and launch; warnings are advice
from the seed guides and the libraries' documentation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Iterator, Literal

import psutil

from tunedeck.backend import catalog
from tunedeck.backend.engine_facts import DEFAULT_NVME_BUFFER_SIZE, fsdp_layer_cls, nvme_param_buffer_size
from tunedeck.backend.spec import JobSpec


@dataclass(frozen=True)
class Problem:
    level: Literal["error", "warning"]
    field: str  # dotted path, e.g. "strategy.offload_params"
    message: str  # says the fix


def has_errors(problems: list[Problem]) -> bool:
    return any(p.level == "error" for p in problems)


def describe_global_batch(spec: JobSpec) -> str:
    t, launch = spec.training, spec.launch
    return (
        f"global batch {spec.global_batch_size} = {t.per_device_train_batch_size} per device "
        f"x {launch.num_processes} processes x {t.gradient_accumulation_steps} accumulation steps"
    )


def validate(spec: JobSpec) -> list[Problem]:
    """Every problem of the spec, errors first, in the order of the rules below."""
    problems = [problem for rule in RULES for problem in rule(spec)]
    return sorted(problems, key=lambda p: p.level != "error")


Rule = Callable[[JobSpec], Iterator[Problem]]


def _error(field: str, message: str) -> Problem:
    return Problem("error", field, message)


def _warning(field: str, message: str) -> Problem:
    return Problem("warning", field, message)


# ---------------------------------------------------------------- method and quantization


def _method_and_quantization(spec: JobSpec) -> Iterator[Problem]:
    bits, q = spec.quantization.bits, spec.quantization
    if spec.method == "qlora" and bits != 4:
        yield _error("quantization.bits", "QLoRA trains adapters on a 4-bit base: set quantization.bits=4 (or method=lora for a 16-bit base).")
    if spec.method == "full" and bits is not None:
        yield _error(
            "quantization.bits",
            "full fine-tuning cannot update quantized weights: clear quantization.bits, or use method=lora/qlora.",
        )
    if spec.method == "lora" and bits == 4:
        yield _warning("method", "a 4-bit base with LoRA adapters is QLoRA: set method=qlora so the job says what it does.")
    sharded = spec.strategy.kind in ("zero3", "fsdp")
    if bits == 4 and sharded and q.bnb_4bit_quant_storage != q.bnb_4bit_compute_dtype:
        yield _error(
            "quantization.bnb_4bit_quant_storage",
            f"{spec.strategy.kind} can only shard 4-bit weights stored in a float dtype equal to the compute dtype: "
            f"set quantization.bnb_4bit_quant_storage={q.bnb_4bit_compute_dtype}.",
        )
    if bits == 4 and sharded and spec.model.dtype != q.bnb_4bit_compute_dtype:
        # The sharded recipes load the model in the storage dtype (PEFT's docs, "QLoRA and FSDP": dtype
        # = bnb_4bit_quant_storage), so the 4-bit and the 16-bit weights (norms, embeddings) shard
        # as one dtype; FSDP1 refuses mixed dtypes in a flat parameter.
        yield _error(
            "model.dtype",
            f"{spec.strategy.kind} shards the 4-bit weights and the rest of the model together, so the model must "
            f"load in the 4-bit storage and compute dtype: set model.dtype={q.bnb_4bit_compute_dtype}.",
        )
    if bits == 8 and sharded:
        yield _error(
            "quantization.bits",
            f"8-bit bitsandbytes weights cannot be sharded by {spec.strategy.kind}: use quantization.bits=4 "
            "(QLoRA, with quant storage = compute dtype) or strategy.kind=ddp/zero2.",
        )
    if bits == 4 and spec.training.precision == "fp16" and q.bnb_4bit_compute_dtype == "bfloat16":
        yield _warning(
            "quantization.bnb_4bit_compute_dtype",
            "training in fp16 while 4-bit matmuls compute in bfloat16: set quantization.bnb_4bit_compute_dtype=float16.",
        )


# ---------------------------------------------------------------- LoRA


# Older module names PEFT still accepts and maps onto transformers 5's fused expert tensors
# (peft/utils/transformers_weight_conversion.py, _MOE_TARGET_MODULE_MAPPING).
_PEFT_RENAMED_TARGETS = {"mixtral": ("w1", "w2", "w3")}


def _lora(spec: JobSpec) -> Iterator[Problem]:
    if not spec.uses_adapter:
        return
    lora = spec.lora
    if isinstance(lora.target_modules, list) and not lora.target_modules:
        yield _error("lora.target_modules", "no modules get adapters: set lora.target_modules=all-linear or names such as q_proj,v_proj.")
    if lora.r > 256:
        yield _warning("lora.r", f"rank {lora.r} is unusually large (8-64 is typical); it costs memory with little gain.")
    ratio = lora.lora_alpha / lora.r
    if not 0.25 <= ratio <= 8:
        yield _warning(
            "lora.lora_alpha",
            f"lora_alpha/r = {ratio:g} scales the update oddly; the usual choice is lora_alpha = 2 x r = {2 * lora.r}.",
        )
    arch = catalog.lookup(spec.model.name_or_path)
    if arch is not None and isinstance(lora.target_modules, list) and lora.target_modules:
        # PEFT matches a target by the module name's last part, and stops (after the model has
        # loaded) when none matches: e.g. q_proj on Phi-3, whose attention projection is fused.
        layer_names = [w.name.rsplit(".", 1)[-1] for w in arch.layer_weights]
        known = {*layer_names, "lm_head", "embed_tokens", *_PEFT_RENAMED_TARGETS.get(arch.model_type, ())}
        if not any(t.rsplit(".", 1)[-1] in known for t in lora.target_modules):
            yield _error(
                "lora.target_modules",
                f"{spec.model.name_or_path} ({arch.model_type}) has no module named {', '.join(lora.target_modules)}, "
                f"so PEFT would refuse it after loading the model: set lora.target_modules=all-linear or names from "
                f"{', '.join(layer_names)}.",
            )
    if arch is not None and arch.num_local_experts and lora.target_modules == "all-linear" and lora.lora_dropout > 0:
        # PEFT 0.21 adapts the stacked expert weights as parameters, and those refuse dropout.
        yield _error(
            "lora.lora_dropout",
            "a mixture-of-experts model with target_modules=all-linear adapts its expert weights, which PEFT "
            "only allows without dropout: set lora.lora_dropout=0 (or list attention modules only).",
        )
    if lora.lora_dropout > 0.3:
        yield _warning("lora.lora_dropout", f"dropout {lora.lora_dropout:g} is high for adapters; 0.0-0.1 is usual.")


# ---------------------------------------------------------------- precision


def _precision(spec: JobSpec) -> Iterator[Problem]:
    precision, dtype = spec.training.precision, spec.model.dtype
    if precision == "fp16" and dtype == "bfloat16":
        yield _error("training.precision", "fp16 training on bfloat16 weights mixes two 16-bit formats: set training.precision=bf16 (or model.dtype=float16).")
    if precision == "bf16" and dtype == "float16":
        yield _error("training.precision", "bf16 training on float16 weights mixes two 16-bit formats: set model.dtype=bfloat16 (or training.precision=fp16).")
    if (
        spec.method == "full"
        and precision == "fp16"
        and dtype == "float16"
        and not spec.strategy.is_deepspeed
    ):
        yield _error(
            "model.dtype",
            "fp16 mixed precision needs float32 master weights to train all weights (else 'Attempting to unscale "
            "FP16 gradients'): set model.dtype=float32, or training.precision=bf16, or a DeepSpeed strategy.",
        )
    # DeepSpeed keeps fp32 master weights, and accelerate upcasts FSDP's trainable weights to fp32
    # under mixed precision; otherwise the optimizer steps the 16-bit weights themselves.
    has_master_copy = spec.strategy.is_deepspeed or (spec.strategy.kind == "fsdp" and precision != "fp32")
    already_refused = precision == "fp16" and dtype == "float16"
    if spec.method == "full" and dtype != "float32" and not has_master_copy and not already_refused:
        yield _warning(
            "model.dtype",
            f"full fine-tuning under {spec.strategy.kind} steps the {dtype} weights themselves (no fp32 master copy): "
            "updates from a learning rate near 1e-5 mostly round away in 16 bits. Set model.dtype=float32 "
            "(training.precision=bf16 still computes in 16 bits), or strategy.kind=zero2, which keeps an fp32 copy.",
        )
    attn = spec.model.attn_implementation
    if attn == "flash_attention_2" and dtype == "float32":
        yield _warning(
            "model.attn_implementation",
            "flash_attention_2 runs only in float16/bfloat16; with float32 weights use attn_implementation=sdpa or model.dtype=bfloat16.",
        )
    if attn == "flash_attention_2" and spec.launch.use_cpu:
        yield _error("model.attn_implementation", "flash_attention_2 needs an NVIDIA GPU: set model.attn_implementation=sdpa.")
    if spec.method == "full" and spec.training.learning_rate > 1e-4:
        yield _warning(
            "training.learning_rate",
            f"{spec.training.learning_rate:g} is high for full fine-tuning (1e-5 to 2e-5 is usual; 1e-4+ suits adapters).",
        )


# ---------------------------------------------------------------- strategy and offload


def _offload(spec: JobSpec) -> Iterator[Problem]:
    s = spec.strategy
    kind = s.kind
    if s.offload_params != "none" and kind not in ("zero3", "fsdp"):
        yield _error(
            "strategy.offload_params",
            f"{kind} keeps whole parameters on every GPU, so they cannot be offloaded: set strategy.kind=zero3 "
            "(or fsdp), or strategy.offload_params=none (offload the optimizer first: strategy.offload_optimizer=cpu).",
        )
    if kind == "ddp" and s.offload_optimizer != "none":
        yield _error(
            "strategy.offload_optimizer",
            "DDP cannot offload optimizer states: set strategy.kind=zero2 (or zero1/zero3), or strategy.offload_optimizer=none.",
        )
    if kind in ("zero1", "zero2") and s.offload_optimizer == "nvme":
        yield _error(
            "strategy.offload_optimizer",
            f"NVMe optimizer offload (ZeRO-Infinity) needs ZeRO-3; {kind} would silently offload to CPU RAM instead: "
            "set strategy.kind=zero3 or strategy.offload_optimizer=cpu.",
        )
    if kind == "fsdp":
        if "nvme" in (s.offload_params, s.offload_optimizer):
            yield _error(
                "strategy.offload_params" if s.offload_params == "nvme" else "strategy.offload_optimizer",
                "FSDP offloads to CPU RAM only: use cpu, or strategy.kind=zero3 for NVMe offload.",
            )
        elif s.offload_optimizer == "cpu" and s.offload_params != "cpu":
            yield _error(
                "strategy.offload_optimizer",
                "FSDP offloads parameters, gradients and the optimizer step together: set strategy.offload_params=cpu "
                "(or strategy.offload_optimizer=none, or strategy.kind=zero2 to offload the optimizer alone).",
            )
    if "nvme" in (s.offload_params, s.offload_optimizer) and s.is_deepspeed:
        if not s.nvme_path:
            yield _error("strategy.nvme_path", "NVMe offload needs a folder on a fast local disk: set strategy.nvme_path, e.g. /local_nvme.")
        elif not s.nvme_path.startswith("/"):
            yield _error("strategy.nvme_path", f"{s.nvme_path!r} is relative; each rank needs the same absolute folder: give an absolute path such as /local_nvme.")
    if s.offload_params == "nvme" and kind == "zero3" and nvme_param_buffer_size(spec) is None:
        yield _warning(
            "strategy.offload_params",
            f"tunedeck does not know the shapes of {spec.model.name_or_path!r}, so ds_config.json keeps DeepSpeed's "
            f"NVMe buffer of {DEFAULT_NVME_BUFFER_SIZE:.0e} elements, and DeepSpeed stops if a parameter's share per "
            "GPU (vocab x hidden / processes) is larger: point model.name_or_path at a local folder with its "
            "config.json, or raise offload_param.buffer_size in ds_config.json.",
        )
    if s.offload_params != "none" and s.offload_optimizer == "none" and kind == "zero3":
        yield _warning(
            "strategy.offload_optimizer",
            "parameters are offloaded but optimizer states stay on the GPU: offload the optimizer first "
            "(strategy.offload_optimizer=cpu); parameter offload is the slow last resort.",
        )
    if s.offload_optimizer != "none" and s.is_deepspeed and spec.training.optim != "adamw_torch":
        yield _warning(
            "training.optim",
            f"with an offloaded optimizer DeepSpeed's CPU AdamW runs instead of {spec.training.optim}: "
            "set training.optim=adamw_torch so the job says what runs.",
        )


def _fsdp(spec: JobSpec) -> Iterator[Problem]:
    s = spec.strategy
    if s.kind != "fsdp":
        if s.fsdp_activation_checkpointing:
            yield _warning(
                "strategy.fsdp_activation_checkpointing",
                f"ignored with strategy.kind={s.kind} (FSDP only): use training.gradient_checkpointing instead.",
            )
        return
    if fsdp_layer_cls(spec) is None:
        yield _error(
            "strategy.fsdp_transformer_layer_cls_to_wrap",
            f"tunedeck does not know the architecture of {spec.model.name_or_path!r}: set "
            "strategy.fsdp_transformer_layer_cls_to_wrap to its decoder layer class, e.g. LlamaDecoderLayer.",
        )
    if s.fsdp_activation_checkpointing and spec.training.gradient_checkpointing:
        yield _error(
            "training.gradient_checkpointing",
            "FSDP activation checkpointing and training.gradient_checkpointing cannot both be on (the trainer refuses): "
            "set training.gradient_checkpointing=false and keep strategy.fsdp_activation_checkpointing.",
        )
    if spec.method == "full" and spec.training.gradient_checkpointing and not s.fsdp_activation_checkpointing:
        # transformers warns about the same: the Trainer's checkpointing re-runs each FSDP unit's forward,
        # all-gathering its sharded weights a second time in the backward pass (transformers#30404).
        yield _warning(
            "strategy.fsdp_activation_checkpointing",
            "under FSDP the trainer's activation checkpointing all-gathers every layer's weights once more in the "
            "backward pass: set strategy.fsdp_activation_checkpointing=true and training.gradient_checkpointing=false.",
        )
    if spec.quantization.bits == 4 and s.fsdp_cpu_ram_efficient_loading:
        # accelerate's fsdp2_prepare_model skips the rank-0 load and broadcast when the model has
        # Params4bit, and transformers loads quantized weights on every rank (modeling_utils: "not is_quantized").
        yield _warning(
            "strategy.fsdp_cpu_ram_efficient_loading",
            "ignored for 4-bit models: accelerate and transformers load the whole quantized model on every rank, "
            "so host RAM is not saved: set strategy.fsdp_cpu_ram_efficient_loading=false so the job says what runs.",
        )
    if s.fsdp_sharding_strategy == "HYBRID_SHARD" and spec.launch.num_machines == 1:
        yield _warning(
            "strategy.fsdp_sharding_strategy",
            "HYBRID_SHARD replicates across machines; on one machine it is FULL_SHARD: set FULL_SHARD.",
        )


def _adapter_strategy(spec: JobSpec) -> Iterator[Problem]:
    t, kind = spec.training, spec.strategy.kind
    if spec.uses_adapter and kind == "ddp" and t.ddp_find_unused_parameters:
        yield _warning(
            "training.ddp_find_unused_parameters",
            "with LoRA the frozen base has no gradients by design; searching for unused parameters every step "
            "only slows DDP: set training.ddp_find_unused_parameters=false.",
        )
    if spec.method == "lora" and kind in ("zero3", "fsdp"):
        arch = catalog.lookup(spec.model.name_or_path)
        if arch is not None:
            base_gb = arch.num_parameters * 2 / 1e9
            if base_gb <= 16:
                size = f"about {base_gb:.0f} GB" if base_gb >= 1 else "under 1 GB"
                yield _warning(
                    "strategy.kind",
                    f"the 16-bit base is {size} and only adapters train: if it fits on one GPU, "
                    f"DDP (strategy.kind=ddp) is faster than {kind}, which gathers the sharded weights every step.",
                )


# ---------------------------------------------------------------- CPU traps (measured)


def _cpu(spec: JobSpec) -> Iterator[Problem]:
    if not spec.launch.use_cpu:
        return
    kind, precision = spec.strategy.kind, spec.training.precision
    if kind == "fsdp" and spec.strategy.fsdp_version == 1:
        # FSDP2 runs on CPU ranks: train_sft.py hands accelerate's FSDP2 path the gloo ranks (accelerate
        # alone would fall back to DDP). FSDP1 cannot: PyTorch needs an accelerator device for it.
        yield _error(
            "strategy.fsdp_version",
            "FSDP1 cannot run on CPU (PyTorch: 'FSDP needs a non-CPU accelerator device'; accelerate silently "
            "falls back to plain DDP): set strategy.fsdp_version=2, which runs on CPU processes, or use GPUs.",
        )
    if kind == "fsdp" and spec.strategy.offload_params == "cpu":
        # Measured: FSDP2's CPUOffloadPolicy pins host memory, which torch refuses without an accelerator.
        yield _error(
            "strategy.offload_params",
            "FSDP's CPU offload pins host memory, which needs a GPU ('Cannot access accelerator device when none is "
            "available'): set strategy.offload_params=none and strategy.offload_optimizer=none on CPU processes, "
            "whose weights are in host memory already.",
        )
    if spec.strategy.is_deepspeed and precision != "fp32":
        yield _error(
            "training.precision",
            f"DeepSpeed on CPU refuses {precision} ('Your setup doesn't support bf16/gpu'): set training.precision=fp32.",
        )
    elif precision == "fp16":
        yield _error("training.precision", "fp16 mixed precision needs a GPU: set training.precision=fp32 (or bf16) on CPU.")
    if spec.training.optim in ("adamw_bnb_8bit", "paged_adamw_8bit", "paged_adamw_32bit"):
        yield _error("training.optim", f"{spec.training.optim} is a bitsandbytes GPU optimizer: set training.optim=adamw_torch on CPU.")
    if spec.launch.gpu_ids != "all":
        yield _warning("launch.gpu_ids", "ignored with launch.use_cpu: set it back to all.")


# ---------------------------------------------------------------- CPU processes on this machine

# Every CPU rank is a whole Python process with the training stack imported: 530 MiB of RSS
# measured on this project's machine (torch, transformers, trl, peft, accelerate, datasets),
# before the model and the data.
CPU_RANK_BYTES = 530 * 2**20


def _cpu_processes(spec: JobSpec) -> Iterator[Problem]:
    """A CPU job is checked against the machine it is set up on, where it most likely runs.

    Up to one rank per core the ranks run side by side (launch.sh gives each cores/ranks
    threads), so the demo's 2 processes on 2 cores pass. More ranks than cores only take
    turns: a warning. More ranks than the RAM can hold cannot start at all (65,536 processes
    on a 2-core machine would exhaust it): an error.
    """
    launch = spec.launch
    if not launch.use_cpu:
        return
    ranks, ram = launch.processes_per_machine, psutil.virtual_memory().total
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # as nproc
    if ranks * CPU_RANK_BYTES > ram:
        most = max(1, ram // CPU_RANK_BYTES)
        yield _error(
            "launch.num_processes",
            f"{ranks:,} CPU processes per machine need over {ranks * CPU_RANK_BYTES / 2**30:,.0f} GiB of RAM (each "
            f"imports the training stack, about 530 MiB) and this machine has {ram / 2**30:.0f} GiB: set "
            f"launch.num_processes to at most {most * launch.num_machines}; {cores * launch.num_machines} "
            f"(one per core) trains fastest.",
        )
    elif ranks > cores:
        yield _warning(
            "launch.num_processes",
            f"{ranks} CPU processes per machine take turns on this machine's {cores} cores rather than run side by "
            f"side: launch.num_processes={cores * launch.num_machines} (one per core) uses the cores as well with less "
            "memory (raise training.gradient_accumulation_steps to keep the global batch).",
        )


# ---------------------------------------------------------------- launch


def _launch(spec: JobSpec) -> Iterator[Problem]:
    launch = spec.launch
    if launch.num_processes % launch.num_machines:
        yield _error(
            "launch.num_processes",
            f"{launch.num_processes} processes cannot be spread evenly over {launch.num_machines} machines: "
            f"make launch.num_processes (the total) a multiple of launch.num_machines, e.g. "
            f"{launch.num_machines * max(1, launch.num_processes // launch.num_machines)}.",
        )
    if launch.machine_rank >= launch.num_machines:
        yield _error(
            "launch.machine_rank",
            f"machine ranks run from 0 to {launch.num_machines - 1}: set launch.machine_rank below launch.num_machines.",
        )
    if launch.num_machines > 1 and not launch.main_process_ip:
        # Not an error: slurm.sbatch finds machine 0 itself, and launch.sh reads MAIN_PROCESS_IP at run time.
        yield _warning(
            "launch.main_process_ip",
            "no address of machine 0: slurm.sbatch finds it, but `bash launch.sh` on each machine needs "
            "MAIN_PROCESS_IP=<address of machine 0>; or set launch.main_process_ip (e.g. 10.0.0.1).",
        )
    if not launch.use_cpu and launch.gpu_ids != "all":
        ids = [part for part in launch.gpu_ids.split(",") if part]
        if not all(part.isdigit() for part in ids):
            yield _error("launch.gpu_ids", f"{launch.gpu_ids!r} is not a GPU list: use all, or numbers such as 0,1,2,3.")
        elif len(ids) < launch.processes_per_machine:
            yield _error(
                "launch.gpu_ids",
                f"{len(ids)} GPU(s) listed for {launch.processes_per_machine} processes per machine: list "
                f"{launch.processes_per_machine} GPUs, or set launch.gpu_ids=all, or lower launch.num_processes.",
            )
        elif len(ids) > launch.processes_per_machine:
            yield _warning(
                "launch.gpu_ids",
                f"{len(ids)} GPUs listed but only {launch.processes_per_machine} processes per machine: the first ones are used.",
            )


# ---------------------------------------------------------------- training and data


def _training(spec: JobSpec) -> Iterator[Problem]:
    t, d = spec.training, spec.dataset
    if t.per_device_train_batch_size >= 8 and t.gradient_accumulation_steps == 1 and not spec.launch.use_cpu:
        yield _warning(
            "training.per_device_train_batch_size",
            "a large micro batch without accumulation costs activation memory: keep the per-device batch at 1-4 and "
            "raise training.gradient_accumulation_steps for the same global batch.",
        )
    if t.eval_steps is not None and not d.eval_split:
        yield _warning("training.eval_steps", "there is no evaluation without dataset.eval_split: set an eval split, or clear eval_steps.")
    field_by_format = {
        "text": ("dataset.text_field", d.text_field),
        "prompt-completion": ("dataset.prompt_field", d.prompt_field),
        "messages": ("dataset.messages_field", d.messages_field),
        "alpaca": ("dataset.instruction_field", d.instruction_field),
    }
    path, value = field_by_format[d.format]
    if not value.strip():
        yield _error(path, f"format {d.format} reads this column: give its name.")
    if d.format == "prompt-completion" and not d.completion_field.strip():
        yield _error("dataset.completion_field", "format prompt-completion reads this column: give its name.")
    if d.format == "alpaca" and not d.output_field.strip():
        yield _error("dataset.output_field", "format alpaca reads this column: give its name.")


RULES: list[Rule] = [
    _method_and_quantization,
    _lora,
    _precision,
    _offload,
    _fsdp,
    _adapter_strategy,
    _cpu,
    _cpu_processes,
    _launch,
    _training,
]
