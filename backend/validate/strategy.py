"""Validation rules of the strategy: offload, FSDP, and adapters on sharded strategies.

What each strategy kind can shard and offload comes from the strategy table (backend/recipe/vocabulary.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from tunedeck.backend.spec import JobSpec, catalog
from tunedeck.backend.spec.engine_facts import DEFAULT_NVME_BUFFER_SIZE, fsdp_layer_cls, nvme_param_buffer_size
from tunedeck.backend.spec.problem import Problem, error, warning

# Plain AdamW in either implementation: what DeepSpeed's CPU AdamW stands in for under optimizer offload.
ADAMW = ("adamw_torch", "adamw_torch_fused")


def offload(spec: JobSpec) -> Iterator[Problem]:
    s = spec.strategy
    kind, facts = s.kind, s.facts
    if s.offload_params != "none" and not facts.offload_params:
        yield error(
            "strategy.offload_params",
            f"{kind} keeps whole parameters on every GPU, so they cannot be offloaded: set strategy.kind=zero3 "
            "(or fsdp), or strategy.offload_params=none (offload the optimizer first: strategy.offload_optimizer=cpu).",
        )
    if s.offload_optimizer != "none" and not facts.offload_optimizer:
        yield error(
            "strategy.offload_optimizer",
            f"{facts.label} cannot offload optimizer states: set strategy.kind=zero2 (or zero1/zero3), "
            "or strategy.offload_optimizer=none.",
        )
    if facts.is_deepspeed and s.offload_optimizer not in ("none", *facts.offload_optimizer):
        yield error(
            "strategy.offload_optimizer",
            f"NVMe optimizer offload (ZeRO-Infinity) needs ZeRO-3; {kind} would silently offload to CPU RAM instead: "
            "set strategy.kind=zero3 or strategy.offload_optimizer=cpu.",
        )
    if spec.layout.is_fsdp:
        if "nvme" in (s.offload_params, s.offload_optimizer):
            yield error(
                "strategy.offload_params" if s.offload_params == "nvme" else "strategy.offload_optimizer",
                "FSDP offloads to CPU RAM only: use cpu, or strategy.kind=zero3 for NVMe offload.",
            )
        elif s.offload_optimizer == "cpu" and s.offload_params != "cpu":
            yield error(
                "strategy.offload_optimizer",
                "FSDP offloads parameters, gradients and the optimizer step together: set strategy.offload_params=cpu "
                "(or strategy.offload_optimizer=none, or strategy.kind=zero2 to offload the optimizer alone).",
            )
    if "nvme" in (s.offload_params, s.offload_optimizer) and s.is_deepspeed:
        if not s.nvme_path:
            yield error(
                "strategy.nvme_path",
                "NVMe offload needs a folder on a fast local disk: set strategy.nvme_path, e.g. /local_nvme.",
            )
        elif not s.nvme_path.startswith("/"):
            yield error(
                "strategy.nvme_path",
                f"{s.nvme_path!r} is relative; each rank needs the same absolute folder: give an absolute path "
                "such as /local_nvme.",
            )
    if s.offload_params == "nvme" and facts.is_deepspeed and nvme_param_buffer_size(spec) is None:
        yield warning(
            "strategy.offload_params",
            f"tunedeck does not know the shapes of {spec.model.name_or_path!r}, so ds_config.json keeps DeepSpeed's "
            f"NVMe buffer of {DEFAULT_NVME_BUFFER_SIZE:.0e} elements, and DeepSpeed stops if a parameter's share per "
            "GPU (vocab x hidden / processes) is larger: point model.name_or_path at a local folder with its "
            "config.json, or raise offload_param.buffer_size in ds_config.json.",
        )
    if s.offload_params != "none" and s.offload_optimizer == "none" and facts.is_deepspeed:
        yield warning(
            "strategy.offload_optimizer",
            "parameters are offloaded but optimizer states stay on the GPU: offload the optimizer first "
            "(strategy.offload_optimizer=cpu); parameter offload is the slow last resort.",
            {"strategy.offload_optimizer": "cpu"},
        )
    if s.offload_optimizer != "none" and s.is_deepspeed and spec.training.optim not in ADAMW:
        yield warning(
            "training.optim",
            f"with an offloaded optimizer DeepSpeed's CPU AdamW runs instead of {spec.training.optim}: "
            "set training.optim=adamw_torch_fused so the job says what runs.",
            {"training.optim": "adamw_torch_fused"},
        )


def fsdp(spec: JobSpec) -> Iterator[Problem]:
    s, layout = spec.strategy, spec.layout
    if not layout.is_fsdp:
        if s.fsdp_activation_checkpointing:  # a set-but-ignored field, with what to use instead
            yield warning(
                "strategy.fsdp_activation_checkpointing",
                f"ignored with strategy.kind={s.kind} (FSDP only): use training.gradient_checkpointing instead.",
                {"strategy.fsdp_activation_checkpointing": False, "training.gradient_checkpointing": True},
            )
        return
    if fsdp_layer_cls(spec) is None:
        yield error(
            "strategy.fsdp_transformer_layer_cls_to_wrap",
            f"tunedeck does not know the architecture of {spec.model.name_or_path!r}: set "
            "strategy.fsdp_transformer_layer_cls_to_wrap to its decoder layer class, e.g. LlamaDecoderLayer.",
        )
    if s.fsdp_activation_checkpointing and spec.training.gradient_checkpointing:
        yield error(
            "training.gradient_checkpointing",
            "FSDP activation checkpointing and training.gradient_checkpointing cannot both be on (the trainer refuses): "
            "set training.gradient_checkpointing=false and keep strategy.fsdp_activation_checkpointing.",
            {"training.gradient_checkpointing": False},
        )
    if spec.method == "full" and spec.training.gradient_checkpointing and not s.fsdp_activation_checkpointing:
        # transformers warns about the same: the Trainer's checkpointing re-runs each FSDP unit's forward,
        # all-gathering its sharded weights a second time in the backward pass (transformers#30404).
        yield warning(
            "strategy.fsdp_activation_checkpointing",
            "under FSDP the trainer's activation checkpointing all-gathers every layer's weights once more in the "
            "backward pass: set strategy.fsdp_activation_checkpointing=true and training.gradient_checkpointing=false.",
            {"strategy.fsdp_activation_checkpointing": True, "training.gradient_checkpointing": False},
        )
    if spec.quantization.bits == 4 and s.fsdp_cpu_ram_efficient_loading:
        # accelerate's fsdp2_prepare_model skips the rank-0 load and broadcast when the model has
        # Params4bit, and transformers loads quantized weights on every rank (modeling_utils: "not is_quantized").
        yield warning(
            "strategy.fsdp_cpu_ram_efficient_loading",
            "ignored for 4-bit models: accelerate and transformers load the whole quantized model on every rank, "
            "so host RAM is not saved: set strategy.fsdp_cpu_ram_efficient_loading=false so the job says what runs.",
            {"strategy.fsdp_cpu_ram_efficient_loading": False},
        )
    if layout.hybrid and layout.machines == 1:
        yield warning(
            "strategy.fsdp_sharding_strategy",
            "HYBRID_SHARD replicates across machines; on one machine it is FULL_SHARD: set FULL_SHARD.",
            {"strategy.fsdp_sharding_strategy": "FULL_SHARD"},
        )


def adapter_strategy(spec: JobSpec) -> Iterator[Problem]:
    t, kind, layout = spec.training, spec.strategy.kind, spec.layout
    if spec.uses_adapter and layout.is_ddp and t.ddp_find_unused_parameters:
        yield warning(
            "training.ddp_find_unused_parameters",
            "with LoRA the frozen base has no gradients by design; searching for unused parameters every step "
            "only slows DDP: set training.ddp_find_unused_parameters=false.",
            {"training.ddp_find_unused_parameters": False},
        )
    if spec.method == "lora" and layout.shards_parameters and layout.sequence_parallel == 1:  # DDP splits no sequence
        arch = catalog.lookup(spec.model.name_or_path)
        if arch is not None:
            base_gb = arch.num_parameters * 2 / 1e9
            if base_gb <= 16:
                size = f"about {base_gb:.0f} GB" if base_gb >= 1 else "under 1 GB"
                yield warning(
                    "strategy.kind",
                    f"the 16-bit base is {size} and only adapters train: if it fits on one GPU, "
                    f"DDP (strategy.kind=ddp) is faster than {kind}, which gathers the sharded weights every step.",
                )
