"""The fields of a job the memory model reads, as one `Job` with the derived sizes.

Shared by both phases of the memory model (backend/estimate/memory_train.py, backend/estimate/memory_load.py).
Units: bytes here; backend/estimate/memory.py turns them into GB (GiB, 2**30 bytes, what nvidia-smi
and NVML report).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunedeck.backend.estimate.memory_software import Software, software_for
from tunedeck.backend.recipe.layout import Layout
from tunedeck.backend.recipe.vocabulary import Strategy
from tunedeck.backend.spec import JobSpec, catalog, get_path
from tunedeck.backend.spec.flops import REFERENCE_OBJECTIVES, sequences_per_row

GIB = 2**30

# What nvidia-smi counts beyond PyTorch's allocator: the CUDA context (about 300 MB since
# CUDA 11.7's lazy module loading, pytorch/pytorch#107667) with library handles and kernel
# images, and, when ranks talk, NCCL's communicator buffers: 0.54-0.69 GB per communicator
# on 4x A100 (NVIDIA/nccl#964), about 1.6 GB on another setup (NVIDIA/nccl#864).
CUDA_CONTEXT_BYTES = 0.5 * GIB
NCCL_BYTES = 1.0 * GIB

# The fields of the spec the estimate reads. A variant is these values with `changes` applied.
INPUT_PATHS = (
    "model.name_or_path", "model.dtype", "model.attn_implementation", "method", "objective",
    "preference.precompute_ref_log_probs",
    "lora.r", "lora.lora_dropout", "lora.target_modules", "lora.use_dora",
    "quantization.bits", "quantization.bnb_4bit_quant_type", "quantization.bnb_4bit_use_double_quant",
    "quantization.bnb_4bit_compute_dtype",
    "quantization.bnb_4bit_quant_storage", "dataset.max_seq_length",
    "training.per_device_train_batch_size", "training.gradient_checkpointing", "training.precision",
    "training.optim", "training.learning_rate", "training.gradient_accumulation_steps",
    "grpo.num_generations", "grpo.max_prompt_length", "grpo.max_completion_length", "grpo.beta",
    "strategy.kind", "strategy.offload_optimizer", "strategy.offload_params", "strategy.nvme_path",
    "strategy.overlap_comm", "strategy.reduce_bucket_size", "strategy.stage3_prefetch_bucket_size",
    "strategy.stage3_max_reuse_distance",
    "strategy.fsdp_sharding_strategy", "strategy.fsdp_activation_checkpointing", "strategy.sequence_parallel",
    "strategy.fsdp_version", "strategy.fsdp_state_dict_type", "strategy.stage3_gather_16bit_weights_on_model_save",
    "dataset.packing", "launch.num_processes", "launch.num_machines", "launch.use_cpu",
)  # fmt: skip

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1}


class EstimateError(ValueError):
    """The job cannot be estimated; `field` names the spec field to change."""

    def __init__(self, field_path: str, message: str):
        self.field = field_path
        super().__init__(message)


def input_values(spec: JobSpec, loss: str | None = None, software: str = "tunedeck") -> dict[str, Any]:
    """{dotted path: value} of every field the estimate reads, plus the software that trains (tunedeck's own
    unless a published run's is compared: backend/estimate/memory_software.py) and, optionally, another loss."""
    values = {path: get_path(spec, path) for path in INPUT_PATHS}
    values["software"] = software_for(software, loss)
    if catalog.lookup(values["model.name_or_path"]) is None:
        raise EstimateError(
            "model.name_or_path",
            f"tunedeck does not know the architecture of {values['model.name_or_path']!r}: use a model from the "
            "catalog (e.g. Qwen/Qwen2.5-7B-Instruct), a local folder with its config.json, or download it once "
            "(`hf download ORG/NAME config.json` puts it in the Hugging Face cache, where tunedeck reads it)",
        )
    return values


def variant(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The job of `values` (input_values) with some fields changed, e.g. into an advisor option: the one way
    the estimate builds a variant. A change to a field the estimate does not read would change nothing:
    ValueError naming it."""
    unread = sorted(set(changes) - set(INPUT_PATHS))
    if unread:
        raise ValueError(f"the estimate does not read {', '.join(unread)}: add it to INPUT_PATHS")
    return {**values, **changes}


@dataclass
class Job:
    arch: catalog.ModelArch
    method: str
    objective: str  # sft; dpo: two sequences (chosen, rejected) per row; dpo, kto: a reference; grpo: writes answers
    precomputed_reference: bool  # the reference's scores computed before training: no copy kept, no pass a step
    layout: Layout  # engine, what is sharded and offloaded, processes and machines (backend/recipe/layout.py)
    use_cpu: bool
    tokens: int  # per micro batch per GPU: with sequence parallelism, this GPU's share of the sequence
    seq_len: int
    act_bytes: int  # bytes per activation element
    weight_bytes: int  # bytes per base weight as loaded (model.dtype)
    precision: str
    optim: str
    checkpointing: bool
    attn: str
    bits: int | None
    double_quant: bool
    quant_storage: str
    lora_r: int
    lora_dropout: float
    lora_targets: Any
    use_dora: bool
    overlap_comm: bool
    reduce_bucket: int
    prefetch_bucket: int
    software: Software
    model_dtype: str = "bfloat16"  # model.dtype: the weights as loaded
    compute_dtype: str = "bfloat16"  # the activations' dtype (act_bytes)
    reuse_distance: int = 1_000_000_000  # ZeRO-3: parameters reused within this many elements stay gathered
    grad_accum: int = 1
    # GRPO (objective=grpo): the answers' tokens (grpo.max_completion_length; 0 for the other objectives), the
    # answers per prompt and the KL weight (grpo.beta; above 0 the model is scored against a reference)
    completion_len: int = 0
    num_generations: int = 1
    kl_weight: float = 0.0
    # GPUs sharing each sequence (DeepSpeed Ulysses): the layout's, for SFT only (the validation refuses the others)
    sequence_parallel: int = 1
    packing: bool = True  # SFT rows packed into sequences of max_seq_length tokens
    # How checkpoints are saved (backend/estimate/memory_save.py): FSDP's checkpoint layout, ZeRO-3's 16-bit gather
    state_dict_type: str = "SHARDED_STATE_DICT"
    gather_16bit: bool = True

    @property
    def varying_shapes(self) -> bool:
        """Whether a step's tensors change shape from step to step: rows padded per batch (SFT without packing; the
        other objectives pad their pairs, prompts and answers per batch)."""
        return self.objective != "sft" or not self.packing

    @property
    def root_unit_bytes(self) -> float:
        """FSDP's root unit gathered whole: the embeddings, lm_head and final norm, in the dtype they compute in."""
        arch = self.arch
        element = self.compute_bytes if self.method == "full" or not self.bits else self.weight_bytes
        return (arch.embedding_params + arch.head_params + arch.hidden_size) * element

    @property
    def kl_reference(self) -> bool:
        """GRPO with a KL weight: TRL's GRPOTrainer scores the answers with a reference too (beta > 0)."""
        return self.objective == "grpo" and self.kl_weight > 0

    @property
    def full_reference(self) -> bool:
        """A full DPO or KTO, or a full GRPO with a KL weight: TRL scores the answers against a frozen copy of the base
        (with adapters, the base with the adapters off is the reference: no copy)."""
        return (self.objective in REFERENCE_OBJECTIVES or self.kl_reference) and self.method == "full"

    @property
    def prompt_len(self) -> int:
        """Tokens of a prompt (GRPO: grpo.max_prompt_length) or of a whole row: dataset.max_seq_length."""
        return self.seq_len - self.completion_len

    @property
    def generation_rows(self) -> int:
        """Answers one GPU writes at once per optimizer step (GRPO): TRL's generation batch per GPU is
        per_device_train_batch_size x steps_per_generation, which defaults to gradient_accumulation_steps."""
        return (self.tokens // self.seq_len) * self.grad_accum if self.objective == "grpo" else 0

    @classmethod
    def from_values(cls, v: dict) -> Job:
        arch = catalog.lookup(v["model.name_or_path"])
        if arch is None:  # only reachable through a variant naming another model
            raise EstimateError("model.name_or_path", f"unknown model {v['model.name_or_path']!r}")
        layout = Layout.of_values(v)
        precision = v["training.precision"]
        bits = v["quantization.bits"] if v["method"] != "full" else None
        weight_bytes = _DTYPE_BYTES[v["model.dtype"]]
        # Activations live in the compute dtype: the autocast dtype, else the weights' dtype.
        if bits == 4:
            compute_dtype = v["quantization.bnb_4bit_compute_dtype"]
        elif precision in ("bf16", "fp16"):
            compute_dtype = {"bf16": "bfloat16", "fp16": "float16"}[precision]
        else:
            compute_dtype = v["model.dtype"]
        act_bytes = _DTYPE_BYTES[compute_dtype]
        h = arch.hidden_size
        # GRPO trains on prompt + answer: grpo.max_prompt_length is the longest prompt (train.py leaves longer ones
        # out), grpo.max_completion_length the longest answer.
        grpo = v["objective"] == "grpo"
        completion = v["grpo.max_completion_length"] if grpo else 0
        seq_len = (v["grpo.max_prompt_length"] if grpo else v["dataset.max_seq_length"]) + completion
        reduce_bucket = v["strategy.reduce_bucket_size"]
        prefetch = v["strategy.stage3_prefetch_bucket_size"]
        # Ulysses (DeepSpeed, SFT only) shards every tensor outside attention along the sequence: each of the N
        # GPUs of a sequence holds and computes seq_len / N of its tokens (attention: all of them, heads / N).
        sp = layout.sequence_parallel if v["objective"] == "sft" else 1
        rows_tokens = v["training.per_device_train_batch_size"] * seq_len * sequences_per_row(v["objective"])
        return cls(
            arch=arch,
            method=v["method"],
            objective=v["objective"],
            precomputed_reference=v["preference.precompute_ref_log_probs"] and v["objective"] in REFERENCE_OBJECTIVES,
            layout=layout,
            use_cpu=v["launch.use_cpu"],
            # DPOTrainer runs each pair's chosen and rejected answers as one batch of twice the rows (both keep
            # activations); KTO's KL answer is scored without gradients.
            tokens=-(-rows_tokens // sp),
            seq_len=seq_len,
            act_bytes=act_bytes,
            weight_bytes=weight_bytes,
            precision=precision,
            optim=v["training.optim"],
            checkpointing=v["training.gradient_checkpointing"]
            or (layout.is_fsdp and v["strategy.fsdp_activation_checkpointing"]),
            attn=v["model.attn_implementation"],
            bits=bits,
            double_quant=v["quantization.bnb_4bit_use_double_quant"],
            quant_storage=v["quantization.bnb_4bit_quant_storage"],
            lora_r=v["lora.r"],
            lora_dropout=v["lora.lora_dropout"],
            lora_targets=v["lora.target_modules"],
            use_dora=v["lora.use_dora"],
            overlap_comm=v["strategy.overlap_comm"],
            # "auto" is what the transformers DeepSpeed integration fills in: hidden_size**2
            # and 0.9 * hidden_size**2 (HfDeepSpeedConfig / trainer_config_finalize).
            reduce_bucket=h * h if reduce_bucket == "auto" else reduce_bucket,
            prefetch_bucket=int(0.9 * h * h) if prefetch == "auto" else prefetch,
            software=v.get("software") or software_for("tunedeck"),
            model_dtype=v["model.dtype"],
            compute_dtype=compute_dtype,
            reuse_distance=v["strategy.stage3_max_reuse_distance"],
            grad_accum=v["training.gradient_accumulation_steps"],
            completion_len=completion,
            num_generations=v["grpo.num_generations"] if v["objective"] == "grpo" else 1,
            kl_weight=v["grpo.beta"] if v["objective"] == "grpo" else 0.0,
            sequence_parallel=sp,
            packing=v["dataset.packing"],
            state_dict_type=v["strategy.fsdp_state_dict_type"],
            gather_16bit=v["strategy.stage3_gather_16bit_weights_on_model_save"],
        )

    @property
    def loss(self) -> str:
        """How the loss is computed: one of memory_software.LOSSES."""
        return self.software.loss

    @property
    def world(self) -> int:
        return self.layout.world_size

    @property
    def machines(self) -> int:
        return self.layout.machines

    @property
    def per_machine(self) -> int:
        return self.layout.processes_per_machine

    @property
    def shards(self) -> int:
        """Ranks a sharded tensor is split over (HYBRID_SHARD: a machine's; it replicates across machines)."""
        return self.layout.shard_group_size

    @property
    def offload_optimizer(self) -> str:
        return self.layout.offload_optimizer

    @property
    def offload_params(self) -> str:
        return self.layout.offload_params

    @property
    def trainable_params(self) -> int:
        if self.method == "full":
            return self.arch.num_parameters
        return self.arch.lora_trainable(self.lora_r, self.lora_targets, self.use_dora)

    @property
    def strategy(self) -> Strategy:
        """The strategy table's row of the job's kind (backend/recipe/vocabulary.py)."""
        return self.layout.strategy

    @property
    def compute_bytes(self) -> int:
        """Bytes per weight element as the forward pass computes with it."""
        return 2 if self.precision in ("bf16", "fp16") else self.weight_bytes

    @property
    def device_overhead(self) -> float:
        """CUDA context, plus NCCL's buffers once ranks talk; nothing for a CPU run."""
        if self.use_cpu:
            return 0.0
        return CUDA_CONTEXT_BYTES + (NCCL_BYTES if self.world > 1 else 0.0)


def dequant_bytes_per_param(job: Job) -> int:
    """Bytes per weight a 4-bit matmul holds while it runs: the weight dequantized to its quant state's dtype and,
    where that is not the compute dtype, its cast (memory_software: quant_state_dtype)."""
    state = job.software.quant_state_dtype or job.model_dtype
    return _DTYPE_BYTES[state] + (job.act_bytes if state != job.compute_dtype else 0)


def quantized_bytes_per_param(job: Job) -> float:
    """Bytes per quantized weight held as a parameter (the packed values only)."""
    packed = {4: 0.5, 8: 1.0}.get(job.bits) if job.bits else None
    return float(job.weight_bytes) if packed is None else packed


def quant_stats_bytes(job: Job) -> float:
    """Quantization statistics of the whole base; bitsandbytes keeps them in each module's
    quant state, not in a parameter, so ZeRO-3 and FSDP neither shard nor offload them."""
    arch = job.arch
    if job.bits == 4:
        # NF4: one fp32 absmax per 64-weight block; double quantization stores the absmax in 8
        # bits with one fp32 constant per 256 blocks: 32/64 -> 8/64 + 32/(64*256) bits (QLoRA §3).
        return quantized_params(job) * ((1 / 64 + 4 / (64 * 256)) if job.double_quant else 4 / 64)
    if job.bits == 8:  # LLM.int8: one fp32 scale per output row
        return 4 * arch.num_hidden_layers * sum(w.out_features for w in arch.layer_weights if w.is_linear)
    return 0.0


def frozen_base_params(job: Job) -> float:
    """Bytes of the base's parameters: quantized nn.Linear weights, the rest in model.dtype."""
    linear = quantized_params(job)
    rest = job.arch.num_parameters - linear  # embeddings, lm_head, norms, experts stored as tensors
    return linear * quantized_bytes_per_param(job) + rest * job.weight_bytes


def quantized_params(job: Job) -> int:
    """Weights bitsandbytes quantizes: the decoder layers' nn.Linear weights, and lm_head where the software that
    trains quantizes it too (memory_software: quantizes_head); with 16-bit weights, the same ones."""
    head = job.arch.head_params if job.bits and job.software.quantizes_head else 0
    return job.arch.linear_params + head


def largest_linear_params(job: Job) -> int:
    """The biggest nn.Linear weight of a decoder layer (what bitsandbytes handles one at a time)."""
    return max(w.in_features * w.out_features for w in job.arch.layer_weights if w.is_linear)
