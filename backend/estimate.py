"""Per-GPU memory of a fine-tuning job, for every strategy, and which strategy to use.

Pure: depends only on the spec and the catalog (no torch), and one estimate takes well
under a millisecond, so the panel recomputes it on every form change.

Units: "GB" here is GiB (2**30 bytes), the unit nvidia-smi and NVML report.

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
  buckets                        gradient communication buffers (DDP, DeepSpeed)
  cuda_context, allocator        CUDA/NCCL context and caching-allocator overhead
The peak sits at the start of the backward pass: all activations and the loss's
tensors alive at once, on top of the model states.

tests/data/measured_peaks.yaml holds published measured peaks; bench/estimate_accuracy.py
prints how close the model comes to each (tests require every run within 20%).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from backend import catalog
from backend.spec import JobSpec, get_path

GIB = 2**30

TERMS: dict[str, str] = {
    "weights": "Weights",
    "gradients": "Gradients",
    "optimizer": "Optimizer states",
    "adapter": "LoRA adapter",
    "activations": "Activations",
    "logits": "Logits and loss",
    "gathered": "Gathered parameters",
    "buckets": "Communication buckets",
    "cuda_context": "CUDA context",
    "allocator": "Allocator overhead",
}
# Terms that are real tensors (what torch.cuda.max_memory_allocated sees).
TENSOR_TERMS = ("weights", "gradients", "optimizer", "adapter", "activations", "logits", "gathered", "buckets")

# A strategy "fits" when its peak stays below this share of the GPU: the rest is headroom
# for sequence-length outliers and fragmentation spikes.
FIT_FRACTION = 0.9

# What nvidia-smi counts beyond PyTorch's allocator: the CUDA context (about 300 MB since
# CUDA 11.7's lazy module loading, pytorch/pytorch#107667) with library handles and kernel
# images, and, when ranks talk, NCCL's communicator buffers: 0.54-0.69 GB per communicator
# on 4x A100 (NVIDIA/nccl#964), about 1.6 GB on another setup (NVIDIA/nccl#864).
CUDA_CONTEXT_BYTES = 0.5 * GIB
NCCL_BYTES = 1.0 * GIB
# PyTorch's caching allocator reserves more than it hands out (2 MiB segment rounding, freed
# activation blocks that fragment). Answer.AI's FSDP LoRA run on Llama-2 7B published both:
# 9.16 GiB allocated, 10.22 GiB reserved, a gap of 0.4 x the memory that changes within a step.
ALLOCATOR_FRACTION = 0.4

# The fields of the spec the estimate reads. A variant is these values with `changes` applied.
INPUT_PATHS = (
    "model.name_or_path", "model.dtype", "model.attn_implementation", "method",
    "lora.r", "lora.lora_dropout", "lora.target_modules", "lora.use_dora",
    "quantization.bits", "quantization.bnb_4bit_quant_type", "quantization.bnb_4bit_use_double_quant",
    "quantization.bnb_4bit_compute_dtype",
    "quantization.bnb_4bit_quant_storage", "dataset.max_seq_length",
    "training.per_device_train_batch_size", "training.gradient_checkpointing", "training.precision",
    "training.optim", "training.learning_rate",
    "strategy.kind", "strategy.offload_optimizer", "strategy.offload_params", "strategy.nvme_path",
    "strategy.overlap_comm", "strategy.reduce_bucket_size", "strategy.stage3_prefetch_bucket_size",
    "strategy.fsdp_sharding_strategy", "strategy.fsdp_activation_checkpointing",
    "launch.num_processes", "launch.num_machines", "launch.use_cpu",
)  # fmt: skip

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "uint8": 1}


class EstimateError(ValueError):
    """The job cannot be estimated; `field` names the spec field to change."""

    def __init__(self, field_path: str, message: str):
        self.field = field_path
        super().__init__(message)


@dataclass(frozen=True)
class Estimate:
    per_gpu_gb: float  # peak on one GPU as nvidia-smi shows it
    cpu_gb: float  # host RAM per machine for offloaded states
    nvme_gb: float  # NVMe space per machine for offloaded states
    breakdown: dict[str, float]  # GB per term (TERMS), per GPU
    params: int
    trainable_params: int
    notes: tuple[str, ...] = ()

    @property
    def allocated_gb(self) -> float:
        """The tensors alone: what torch.cuda.max_memory_allocated reports."""
        return sum(self.breakdown[t] for t in TENSOR_TERMS)

    @property
    def reserved_gb(self) -> float:
        """Tensors plus the caching allocator's overhead: torch.cuda.max_memory_reserved."""
        return self.allocated_gb + self.breakdown["allocator"]

    def to_dict(self) -> dict:
        return {
            "per_gpu_gb": round(self.per_gpu_gb, 2),
            "cpu_gb": round(self.cpu_gb, 2),
            "nvme_gb": round(self.nvme_gb, 2),
            "breakdown": {k: round(v, 3) for k, v in self.breakdown.items()},
            "params": self.params,
            "trainable_params": self.trainable_params,
            "notes": list(self.notes),
        }


@dataclass(frozen=True)
class StrategyEstimate:
    strategy: str  # label, e.g. "ZeRO-3 + CPU offload"
    changes: dict[str, Any]  # dotted path -> value that turns the current job into this strategy
    estimate: Estimate
    fits: bool
    current: bool = False  # the job as given already uses this strategy

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "changes": self.changes, "fits": self.fits, "current": self.current,
                **self.estimate.to_dict()}  # fmt: skip


@dataclass(frozen=True)
class Recommendation:
    strategy: str | None  # None when nothing fits
    changes: dict[str, Any]  # only the values that differ from the current job
    reason: str  # one sentence
    estimate: Estimate | None
    fits: bool

    def to_dict(self) -> dict:
        out = {"strategy": self.strategy, "changes": self.changes, "reason": self.reason, "fits": self.fits}
        if self.estimate is not None:
            out.update(self.estimate.to_dict())
        return out


# ---------------------------------------------------------------- public API


# How the loss is computed. tunedeck trains with TRL's SFTTrainer, whose fused LM head scores
# the vocabulary in tiles and never holds the (tokens x vocab) logits ("fused"). Plain
# transformers losses, older TRL releases and most custom loops materialize them.
LOSS_IMPLEMENTATIONS = ("fused", "materialized")


def estimate(spec: JobSpec, *, loss: str = "fused") -> Estimate:
    """Peak memory per GPU of the job exactly as given."""
    return _estimate(_inputs(spec, loss))


def compare_strategies(
    spec: JobSpec, gpu_mem_gb: float, *, cpu_mem_gb: float | None = None, loss: str = "fused"
) -> list[StrategyEstimate]:
    """Every sensible strategy for this job, fastest first, with whether it fits `gpu_mem_gb`
    per GPU (and, when given, `cpu_mem_gb` of host RAM per machine for offloaded states)."""
    values = _inputs(spec, loss)
    current = _strategy_key(values)
    out = []
    for label, changes in _candidates(values):
        variant = {**values, **changes}
        est = _estimate(variant)
        out.append(
            StrategyEstimate(
                strategy=label,
                changes=changes,
                estimate=est,
                fits=fits(est, gpu_mem_gb, cpu_mem_gb),
                current=_strategy_key(variant) == current,
            )
        )
    return out


def recommend(
    spec: JobSpec, gpu_mem_gb: float, *, cpu_mem_gb: float | None = None, loss: str = "fused"
) -> Recommendation:
    """The fastest strategy that fits, in the seed guides' order, with a one-sentence reason."""
    values = _inputs(spec, loss)
    options = compare_strategies(spec, gpu_mem_gb, cpu_mem_gb=cpu_mem_gb, loss=loss)
    # NVMe offload needs a fast local disk the job names; without one it is shown, not advised.
    usable = [o for o in options if values["strategy.nvme_path"] or "nvme" not in o.changes.values()]
    chosen = next((o for o in usable if o.fits), None)
    if chosen is None:
        smallest = min(options, key=lambda o: o.estimate.per_gpu_gb)
        host = f" and {cpu_mem_gb:g} GB of CPU RAM" if cpu_mem_gb is not None else ""
        reason = (
            f"Nothing fits in {gpu_mem_gb:g} GB per GPU{host}: even {smallest.strategy} needs "
            f"{format_gb(smallest.estimate.per_gpu_gb)}"
            + (f" and {smallest.estimate.cpu_gb:.0f} GB of CPU RAM" if smallest.estimate.cpu_gb else "")
            + ", so add GPUs, lower dataset.max_seq_length "
            f"or training.per_device_train_batch_size"
            + ("" if values["training.gradient_checkpointing"] else ", or turn on training.gradient_checkpointing")
            + "."
        )
        return Recommendation(None, {}, reason, smallest.estimate, False)
    changes = {k: v for k, v in chosen.changes.items() if values.get(k) != v}
    faster = [o for o in usable[: usable.index(chosen)] if not o.fits]
    return Recommendation(chosen.strategy, changes, _reason(values, chosen, faster, gpu_mem_gb), chosen.estimate, True)


def fits(est: Estimate, gpu_mem_gb: float, cpu_mem_gb: float | None = None) -> bool:
    """Below FIT_FRACTION of the GPU, and of the host RAM when it is known."""
    if cpu_mem_gb is not None and est.cpu_gb > FIT_FRACTION * cpu_mem_gb:
        return False
    return est.per_gpu_gb <= FIT_FRACTION * gpu_mem_gb


def format_gb(value: float) -> str:
    """'12.3 GB', or MB below a tenth of a GB (the demo model)."""
    return f"{value:.1f} GB" if value >= 0.1 else f"{value * 1024:.0f} MB"


# Published memory of common GPUs (GB), so a GPU can be named instead of sized.
GPU_MEMORY_GB = {
    "T4": 16, "V100-16GB": 16, "V100-32GB": 32, "V100": 32, "A10": 24, "A10G": 24, "L4": 24,
    "RTX3090": 24, "RTX4090": 24, "RTX5090": 32, "A5000": 24, "A6000": 48, "L40S": 48, "L40": 48,
    "A100-40GB": 40, "A100-80GB": 80, "A100": 80, "H100": 80, "H800": 80, "H20": 96, "H200": 141,
    "B200": 180, "MI300X": 192,
}  # fmt: skip


def gpu_memory_gb(text: str | float) -> float:
    """'80', '80GB', 'A100-80GB' or 'RTX 4090' -> GB. Raises ValueError saying what is accepted."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        cleaned = text.strip().upper().replace(" ", "")
        number = re.fullmatch(r"(\d+(?:\.\d+)?)(GB|G|GIB)?", cleaned)
        if number:
            value = float(number.group(1))
        else:
            key = cleaned.removeprefix("NVIDIA").removeprefix("GEFORCE")
            value = GPU_MEMORY_GB.get(key) or GPU_MEMORY_GB.get(key.replace("-", ""))
            if value is None:
                raise ValueError(
                    f"unknown GPU {text!r}: give its memory in GB (e.g. 80) or one of {', '.join(GPU_MEMORY_GB)}"
                )
    if not 0 < value <= 4096:
        raise ValueError(f"GPU memory {value:g} GB is out of range: give the memory of one GPU, e.g. 24 or 80")
    return float(value)


# ---------------------------------------------------------------- ZeRO model states


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
        return {"weights": weights * params, "gradients": grads * params, "optimizer": (k if stage == 0 else k / n) * params}
    if implementation != "deepspeed":
        raise ValueError(f"implementation is 'paper' or 'deepspeed', not {implementation!r}")
    if stage == 1:  # whole 16-bit gradients, then an fp32 copy of this rank's partition
        return {"weights": 2 * params, "gradients": (2 + 4 / n) * params, "optimizer": k / n * params}
    if stage == 2:  # 16-bit gradient partition + its fp32 copy
        return {"weights": 2 * params, "gradients": 6 / n * params, "optimizer": k / n * params}
    # Stage 3: DeepSpeed's estimator counts 18 bytes/N (2 weights + 4 gradients + 12 optimizer).
    return {"weights": 2 / n * params, "gradients": 4 / n * params, "optimizer": k / n * params}


# ---------------------------------------------------------------- inputs and variants


def _inputs(spec: JobSpec, loss: str = "fused") -> dict[str, Any]:
    if loss not in LOSS_IMPLEMENTATIONS:
        raise ValueError(f"loss is one of {LOSS_IMPLEMENTATIONS}, not {loss!r}")
    values = {path: get_path(spec, path) for path in INPUT_PATHS}
    values["loss"] = loss
    if catalog.lookup(values["model.name_or_path"]) is None:
        raise EstimateError(
            "model.name_or_path",
            f"tunedeck does not know the architecture of {values['model.name_or_path']!r}: use a model from the "
            "catalog (e.g. meta-llama/Llama-2-7b-hf) or a local folder with its config.json",
        )
    return values


def _strategy_key(v: dict) -> tuple:
    kind = v["strategy.kind"]
    return (
        kind,
        v["strategy.offload_optimizer"] if kind != "ddp" else "none",
        v["strategy.offload_params"] if kind in ("zero3", "fsdp") else "none",
        v["strategy.fsdp_sharding_strategy"] if kind == "fsdp" else None,
        v["method"],
    )


def _strategy(kind: str, opt: str = "none", params: str = "none", sharding: str = "FULL_SHARD") -> dict:
    out = {"strategy.kind": kind, "strategy.offload_optimizer": opt, "strategy.offload_params": params}
    if kind == "fsdp":
        out["strategy.fsdp_sharding_strategy"] = sharding
    return out


def _candidates(v: dict) -> list[tuple[str, dict]]:
    """(label, changes) fastest first, in the order the seed guides give.

    LoRA: DDP first (only the adapter's gradients cross the network), sharding the frozen
    base only when it does not fit. Full fine-tuning: ZeRO-2 or FSDP SHARD_GRAD_OP (7-13B),
    then weight sharding (ZeRO-3, FSDP FULL_SHARD) for more, then CPU/NVMe offload.
    QLoRA when nothing else fits.
    """
    cpu_run = v["launch.use_cpu"]
    multi_node = v["launch.num_machines"] > 1
    if v["method"] == "full":
        # ZeRO-2 moves as many bytes per step as DDP's all-reduce (ZeRO paper §7) and keeps fp32
        # master weights, so it comes first; ZeRO-1 and DDP only need more memory.
        plain: list[tuple[str, dict]] = [("ZeRO-2", _strategy("zero2"))]
        if not cpu_run:
            plain.append(("FSDP SHARD_GRAD_OP", _strategy("fsdp", sharding="SHARD_GRAD_OP")))
        plain += [("ZeRO-1", _strategy("zero1")), ("DDP", _strategy("ddp"))]
    else:
        plain = [("DDP", _strategy("ddp"))]
    if not cpu_run:
        if multi_node:
            plain.append(("FSDP HYBRID_SHARD", _strategy("fsdp", sharding="HYBRID_SHARD")))
        plain.append(("FSDP FULL_SHARD", _strategy("fsdp")))
    plain.append(("ZeRO-3", _strategy("zero3")))
    if not cpu_run:
        if v["method"] == "full":
            plain.append(("ZeRO-2 + CPU optimizer", _strategy("zero2", "cpu")))
        plain += [
            ("ZeRO-3 + CPU optimizer", _strategy("zero3", "cpu")),
            ("FSDP + CPU offload", _strategy("fsdp", "cpu", "cpu")),
            ("ZeRO-3 + CPU optimizer & weights", _strategy("zero3", "cpu", "cpu")),
            ("ZeRO-3 + NVMe offload", _strategy("zero3", "nvme", "nvme")),
        ]
    out = [(label, {**changes, **_checkpointing_for(v, changes)}) for label, changes in plain]
    if v["method"] != "qlora":
        quant = _qlora_changes(v)
        out.append(("QLoRA + DDP", {**quant, **_strategy("ddp"), **_checkpointing_for(v, _strategy("ddp"))}))
        for label, changes in (("QLoRA + FSDP", _strategy("fsdp")), ("QLoRA + ZeRO-3", _strategy("zero3"))):
            if cpu_run and changes["strategy.kind"] == "fsdp":
                continue
            storage = {"quantization.bnb_4bit_quant_storage": quant["quantization.bnb_4bit_compute_dtype"]}
            out.append((label, {**quant, **storage, **changes, **_checkpointing_for(v, changes)}))
        if not cpu_run:
            changes = _strategy("fsdp", "cpu", "cpu")
            storage = {"quantization.bnb_4bit_quant_storage": quant["quantization.bnb_4bit_compute_dtype"]}
            out.append(("QLoRA + FSDP + CPU offload", {**quant, **storage, **changes, **_checkpointing_for(v, changes)}))
    return out


def _checkpointing_for(v: dict, changes: dict) -> dict:
    """Keep activation checkpointing on when moving to or from FSDP's own switch for it."""
    if v["strategy.kind"] == "fsdp" and v["strategy.fsdp_activation_checkpointing"] and changes["strategy.kind"] != "fsdp":
        return {"training.gradient_checkpointing": True, "strategy.fsdp_activation_checkpointing": False}
    return {}


def _qlora_changes(v: dict) -> dict:
    compute = "float16" if v["training.precision"] == "fp16" else "bfloat16"
    changes = {
        "method": "qlora",
        "quantization.bits": 4,
        "quantization.bnb_4bit_quant_type": "nf4",
        "quantization.bnb_4bit_use_double_quant": True,
        "quantization.bnb_4bit_compute_dtype": compute,
        "quantization.bnb_4bit_quant_storage": "uint8",
    }
    if v["method"] == "full":
        changes["training.learning_rate"] = 2e-4  # adapters train with a higher rate than full weights
    return changes


# ---------------------------------------------------------------- the model


def _estimate(v: dict) -> Estimate:
    arch = catalog.lookup(v["model.name_or_path"])
    if arch is None:  # only reachable through a variant naming another model
        raise EstimateError("model.name_or_path", f"unknown model {v['model.name_or_path']!r}")
    job = _Job.from_values(v, arch)
    terms: dict[str, float] = dict.fromkeys(TERMS, 0.0)
    notes: list[str] = []

    states, (cpu, nvme) = _trained_states(job, job.trainable_params)
    if job.method == "full":
        terms.update(states)
    else:
        terms["adapter"] = sum(states.values())
        base, stats = _frozen_base_bytes(job, notes)
        if job.offload_params != "none":  # the frozen shards live in host memory (or on NVMe)
            moved = base * job.per_machine
            base = 0.0
            cpu, nvme = (cpu + moved, nvme) if job.offload_params == "cpu" else (cpu, nvme + moved)
        terms["weights"] = base + stats
    if "nvme" in (job.offload_optimizer, job.offload_params):
        cpu += 2 * GIB  # pinned staging buffers of DeepSpeed's asynchronous I/O swapper

    terms["activations"] = _activation_bytes(job)
    terms["logits"] = _logit_bytes(job)
    terms["gathered"] = _gathered_bytes(job)
    terms["buckets"] = _bucket_bytes(job)
    if job.use_cpu:
        notes.append("CPU run: the figures are RAM per process, not GPU memory")
    else:
        terms["cuda_context"] = CUDA_CONTEXT_BYTES + (NCCL_BYTES if job.world > 1 else 0.0)
    terms["allocator"] = ALLOCATOR_FRACTION * (
        terms["activations"] + terms["logits"] + terms["gathered"] + terms["buckets"]
    )
    breakdown = {k: val / GIB for k, val in terms.items()}
    return Estimate(
        per_gpu_gb=sum(breakdown.values()),
        cpu_gb=cpu / GIB,
        nvme_gb=nvme / GIB,
        breakdown=breakdown,
        params=arch.num_parameters,
        trainable_params=job.trainable_params,
        notes=tuple(notes),
    )


@dataclass
class _Job:
    arch: catalog.ModelArch
    method: str
    kind: str
    offload_optimizer: str
    offload_params: str
    world: int
    machines: int
    use_cpu: bool
    tokens: int  # per micro batch per GPU
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
    fsdp_sharding: str
    overlap_comm: bool
    reduce_bucket: int
    prefetch_bucket: int
    loss: str

    @classmethod
    def from_values(cls, v: dict, arch: catalog.ModelArch) -> _Job:
        kind = v["strategy.kind"]
        precision = v["training.precision"]
        bits = v["quantization.bits"] if v["method"] != "full" else None
        weight_bytes = _DTYPE_BYTES[v["model.dtype"]]
        # Activations live in the compute dtype: the autocast dtype, else the weights' dtype.
        if bits == 4:
            act_bytes = _DTYPE_BYTES[v["quantization.bnb_4bit_compute_dtype"]]
        elif precision in ("bf16", "fp16"):
            act_bytes = 2
        else:
            act_bytes = weight_bytes
        h = arch.hidden_size
        reduce_bucket = v["strategy.reduce_bucket_size"]
        prefetch = v["strategy.stage3_prefetch_bucket_size"]
        return cls(
            arch=arch,
            method=v["method"],
            kind=kind,
            offload_optimizer=v["strategy.offload_optimizer"] if kind != "ddp" else "none",
            offload_params=v["strategy.offload_params"] if kind in ("zero3", "fsdp") else "none",
            world=v["launch.num_processes"],
            machines=v["launch.num_machines"],
            use_cpu=v["launch.use_cpu"],
            tokens=v["training.per_device_train_batch_size"] * v["dataset.max_seq_length"],
            seq_len=v["dataset.max_seq_length"],
            act_bytes=act_bytes,
            weight_bytes=weight_bytes,
            precision=precision,
            optim=v["training.optim"],
            checkpointing=v["training.gradient_checkpointing"]
            or (kind == "fsdp" and v["strategy.fsdp_activation_checkpointing"]),
            attn=v["model.attn_implementation"],
            bits=bits,
            double_quant=v["quantization.bnb_4bit_use_double_quant"],
            quant_storage=v["quantization.bnb_4bit_quant_storage"],
            lora_r=v["lora.r"],
            lora_dropout=v["lora.lora_dropout"],
            lora_targets=v["lora.target_modules"],
            use_dora=v["lora.use_dora"],
            fsdp_sharding=v["strategy.fsdp_sharding_strategy"],
            overlap_comm=v["strategy.overlap_comm"],
            # "auto" is what the transformers DeepSpeed integration fills in: hidden_size**2
            # and 0.9 * hidden_size**2 (HfDeepSpeedConfig / trainer_config_finalize).
            reduce_bucket=h * h if reduce_bucket == "auto" else reduce_bucket,
            prefetch_bucket=int(0.9 * h * h) if prefetch == "auto" else prefetch,
            loss=v["loss"],
        )

    @property
    def per_machine(self) -> int:
        return max(1, self.world // self.machines)

    @property
    def shards(self) -> int:
        """Ranks a sharded tensor is split over."""
        if self.kind == "fsdp" and self.fsdp_sharding == "HYBRID_SHARD":
            return self.per_machine  # shard inside a node, replicate across nodes
        return self.world

    @property
    def trainable_params(self) -> int:
        if self.method == "full":
            return self.arch.num_parameters
        return self.arch.lora_trainable(self.lora_r, self.lora_targets, self.use_dora)

    @property
    def deepspeed(self) -> bool:
        return self.kind in ("zero1", "zero2", "zero3")


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


def _trained_states(job: _Job, params: int) -> tuple[dict[str, float], tuple[float, float]]:
    """weights/gradients/optimizer bytes per GPU of the trained parameters, and the
    (CPU RAM, NVMe) bytes per machine that offloading moves off the GPUs."""
    n = job.world
    if job.deepspeed:
        stage = int(job.kind[-1])
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
    elif job.kind == "fsdp" and job.precision in ("bf16", "fp16"):
        pbytes = 4  # accelerate upcasts trainable parameters to fp32 under FSDP mixed precision
    else:
        pbytes = job.weight_bytes
    shards = job.shards if job.kind == "fsdp" else 1
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


def _quantized_bytes_per_param(job: _Job) -> float:
    """Bytes per quantized weight held as a parameter (the packed values only)."""
    return {4: 0.5, 8: 1.0}.get(job.bits, float(job.weight_bytes))


def _quant_stats_bytes(job: _Job) -> float:
    """Quantization statistics of the whole base; bitsandbytes keeps them in each module's
    quant state, not in a parameter, so ZeRO-3 and FSDP neither shard nor offload them."""
    arch = job.arch
    if job.bits == 4:
        # NF4: one fp32 absmax per 64-weight block; double quantization stores the absmax in 8
        # bits with one fp32 constant per 256 blocks: 32/64 -> 8/64 + 32/(64*256) bits (QLoRA §3).
        return arch.linear_params * ((1 / 64 + 4 / (64 * 256)) if job.double_quant else 4 / 64)
    if job.bits == 8:  # LLM.int8: one fp32 scale per output row
        return 4 * arch.num_hidden_layers * sum(w.out_features for w in arch.layer_weights if w.is_linear)
    return 0.0


def _frozen_base_params(job: _Job) -> float:
    """Bytes of the base's parameters: quantized nn.Linear weights, the rest in model.dtype."""
    arch = job.arch
    linear = arch.linear_params
    rest = arch.num_parameters - linear  # embeddings, lm_head, norms, experts stored as tensors
    return linear * _quantized_bytes_per_param(job) + rest * job.weight_bytes


def _frozen_base_bytes(job: _Job, notes: list) -> tuple[float, float]:
    """(parameter bytes that sharding and offload act on, replicated statistics) per GPU."""
    params, stats = _frozen_base_params(job), _quant_stats_bytes(job)
    if job.kind == "zero3" or (job.kind == "fsdp" and job.fsdp_sharding != "SHARD_GRAD_OP"):
        if job.bits and job.quant_storage == "uint8":
            notes.append("quantized weights stored as uint8 cannot be sharded: every GPU holds the whole base")
            return params, stats
        return params / job.shards, stats
    return params, stats  # DDP/ZeRO-1/2 replicate it; SHARD_GRAD_OP holds it whole from forward to backward


def _per_layer_activation_bytes(job: _Job) -> float:
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


def _activation_bytes(job: _Job) -> float:
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
        working += a * max(w.in_features * w.out_features for w in arch.layer_weights if w.is_linear)
    if not job.checkpointing:
        return arch.num_hidden_layers * per_layer + final_norm + max(0.0, working - _logit_bytes(job))
    inputs = arch.num_hidden_layers * a * arch.hidden_size * t
    return inputs + final_norm + max(0.0, per_layer + working - _logit_bytes(job))


def _logit_bytes(job: _Job) -> float:
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


def _unit_bytes(job: _Job) -> float:
    """One decoder layer's weights as all-gathered for compute (16-bit, or still 4-bit)."""
    arch = job.arch
    linear = sum(w.numel for w in arch.layer_weights if w.is_linear)
    other = arch.layer_params - linear
    compute = 2 if job.precision in ("bf16", "fp16") else job.weight_bytes
    per_linear = _quantized_bytes_per_param(job) if job.bits else compute
    adapter = job.trainable_params / arch.num_hidden_layers * compute if job.method != "full" else 0
    return linear * per_linear + other * compute + adapter


def _gathered_bytes(job: _Job) -> float:
    arch = job.arch
    compute = 2 if job.precision in ("bf16", "fp16") else job.weight_bytes
    if job.kind == "zero3":
        # DeepSpeed's estimator: the largest layer lives gathered in 16 bits, with its 16-bit
        # gradient when it trains (4 bytes per parameter).
        return (4 if job.method == "full" else 2) * arch.largest_layer_params
    if job.kind != "fsdp":
        return 0.0
    root = (arch.embedding_params + arch.head_params + arch.hidden_size) * (
        compute if job.method == "full" or not job.bits else job.weight_bytes
    )
    trained_grad = 4 * (job.trainable_params / arch.num_hidden_layers)  # one unit's unsharded fp32 gradient
    if job.method == "full" and job.fsdp_sharding == "SHARD_GRAD_OP":
        # Weights are not resharded after forward: every layer stays gathered until its backward.
        return arch.num_hidden_layers * _unit_bytes(job) + root + trained_grad
    if job.method != "full" and job.fsdp_sharding == "SHARD_GRAD_OP":
        return root + trained_grad  # the frozen base is already counted whole under weights
    # FULL_SHARD / HYBRID_SHARD: the layer being computed and the prefetched next one; the root
    # unit (embeddings, lm_head) stays gathered through forward and backward.
    return 2 * _unit_bytes(job) + root + trained_grad


def _bucket_bytes(job: _Job) -> float:
    if job.world == 1 and job.kind == "ddp":
        return 0.0
    if job.kind == "ddp":
        # DDP's reducer copies gradients into flat buckets as large as all trained gradients
        # (gradient_as_bucket_view is off in accelerate).
        grad_bytes = 4 if job.method != "full" else job.weight_bytes
        return job.trainable_params * grad_bytes
    if job.deepspeed:
        # The reduce bucket in 16-bit, doubled when communication overlaps the backward pass;
        # ZeRO-3 also prefetches the next parameters into a bucket.
        prefetch = 2 * job.prefetch_bucket if job.kind == "zero3" else 0
        return (2 if job.overlap_comm else 1) * job.reduce_bucket * 2 + prefetch
    return 0.0


# ---------------------------------------------------------------- the reason sentence


def _reason(v: dict, chosen: StrategyEstimate, skipped: list[StrategyEstimate], gpu_mem_gb: float) -> str:
    """One sentence: what fits, what the faster option would need, and why this one."""
    est = chosen.estimate
    kind = chosen.changes.get("strategy.kind", v["strategy.kind"])
    method = chosen.changes.get("method", v["method"])
    sharding = chosen.changes.get("strategy.fsdp_sharding_strategy")
    if method == "qlora" and v["method"] != "qlora":
        why = "storing the frozen base in 4-bit NF4 (QLoRA) is what makes this job fit"
        if v["method"] == "full":
            why += ", with adapters trained at learning rate 2e-4 instead of every weight"
    elif chosen.changes.get("strategy.offload_optimizer", "none") != "none":
        where = f"{est.cpu_gb:.0f} GB of CPU RAM" + (f" and {est.nvme_gb:.0f} GB of NVMe" if est.nvme_gb else "")
        why = f"offloading moves states to host memory ({where} per machine): slower steps, the last resort before quantizing"
    elif kind == "ddp" and method != "full":
        why = "only the adapter's gradients cross the network, so plain data parallelism is fastest"
    elif kind == "ddp":
        why = "every GPU keeps everything and only gradients are all-reduced, the fastest setup"
    elif kind in ("zero1", "zero2") or sharding == "SHARD_GRAD_OP":
        why = (
            "it shards optimizer states and gradients while every GPU keeps whole weights, "
            "the usual choice for full fine-tuning of 7-13B models"
        )
    else:
        why = "it shards the weights as well and gathers each layer just in time: more communication, but it fits"
    skipped_text = ""
    if skipped:
        first = skipped[0].estimate
        need = format_gb(first.per_gpu_gb) if not fits(first, gpu_mem_gb) else f"{first.cpu_gb:.0f} GB of CPU RAM"
        skipped_text = f" ({skipped[0].strategy} would need {need})"
    kept = " (as set)" if chosen.current else ""
    return (
        f"{chosen.strategy}{kept} is the fastest option that fits: {format_gb(est.per_gpu_gb)} of {gpu_mem_gb:g} GB "
        f"per GPU{skipped_text}; {why}."
    )
