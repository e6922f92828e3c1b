"""The strategy options the advisor compares for a job: each as the field changes that turn the job into it.

Fastest first, in the seed guides' order (backend/estimate/advisor.py predicts and picks among them). Each
option carries the fields its strategy implies: 4-bit storage that shards under ZeRO-3/FSDP and the
activation checkpointing switch that belongs to FSDP.
"""

from __future__ import annotations

from tunedeck.backend.estimate.memory_job import variant
from tunedeck.backend.recipe.layout import Layout
from tunedeck.backend.recipe.vocabulary import STRATEGIES


def strategy_key(v: dict) -> tuple:
    """What makes two jobs the same option: the fields that apply to their strategy (backend/spec/applies.py)."""
    layout = Layout.of_values(v)
    return (
        layout.kind,
        layout.offload_optimizer,
        layout.offload_params,
        layout.fsdp_sharding,
        v["method"],
        sequence_parallel(v),
    )


def sequence_parallel(v: dict) -> int:
    """GPUs per sequence where they apply (DeepSpeed, SFT: backend/estimate/memory_job.py reads them the same way), else 1."""
    return Layout.of_values(v).sequence_parallel if v["objective"] == "sft" else 1


def _option(kind: str, opt: str = "none", params: str = "none", sharding: str | None = None) -> tuple[str, dict]:
    """(label, changes) of one strategy option; the label from the strategy table's name."""
    facts = STRATEGIES[kind]
    changes = {"strategy.kind": kind, "strategy.offload_optimizer": opt, "strategy.offload_params": params}
    if facts.is_fsdp:
        changes["strategy.fsdp_sharding_strategy"] = sharding or "FULL_SHARD"
    label = facts.label + (f" {sharding}" if sharding else "")
    if opt != "none":
        if facts.is_fsdp:  # FSDP offloads parameters, gradients and the optimizer step together
            label += " + CPU offload"
        elif "nvme" in (opt, params):
            label += " + NVMe offload"
        else:
            label += " + CPU optimizer" + (" & weights" if params != "none" else "")
    return label, changes


def candidates(v: dict) -> list[tuple[str, dict]]:
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
        plain = [_option("zero2")]
        if not cpu_run:
            plain.append(_option("fsdp", sharding="SHARD_GRAD_OP"))
        plain += [_option("zero1"), _option("ddp")]
    else:
        plain = [_option("ddp")]
    if not cpu_run:
        if multi_node:
            plain.append(_option("fsdp", sharding="HYBRID_SHARD"))
        plain.append(_option("fsdp", sharding="FULL_SHARD"))
    plain.append(_option("zero3"))
    if not cpu_run:
        if v["method"] == "full":
            plain.append(_option("zero2", "cpu"))
        plain += [
            _option("zero3", "cpu"),
            _option("fsdp", "cpu", "cpu"),
            _option("zero3", "cpu", "cpu"),
            _option("zero3", "nvme", "nvme"),
        ]
    out = [
        _at_sequence_parallel(v, label, {**changes, **_keep_4bit_sharded(v, changes), **_checkpointing_for(v, changes)})
        for label, changes in plain
    ]
    if v["method"] != "qlora":
        quant = _qlora_changes(v)
        label, ddp = _option("ddp")
        out.append(_at_sequence_parallel(v, f"QLoRA + {label}", {**quant, **ddp, **_checkpointing_for(v, ddp)}))
        sharded = [_option("zero3")] if cpu_run else [_option("fsdp"), _option("zero3"), _option("fsdp", "cpu", "cpu")]
        for label, changes in sharded:
            extra = {**_sharded_4bit_dtypes(quant), **changes, **_checkpointing_for(v, changes)}
            out.append(_at_sequence_parallel(v, f"QLoRA + {label}", {**quant, **extra}))
    return out


def _at_sequence_parallel(v: dict, label: str, changes: dict) -> tuple[str, dict]:
    """An option at the job's GPUs per sequence: a DeepSpeed option keeps them and says so, the others set 1."""
    n = v.get("strategy.sequence_parallel", 1)
    if n == 1:
        return label, changes
    if sequence_parallel(variant(v, changes)) > 1:
        return f"{label} + {n} GPUs/sequence", {**changes, "strategy.sequence_parallel": n}
    return label, {**changes, "strategy.sequence_parallel": 1}


def _keep_4bit_sharded(v: dict, changes: dict) -> dict:
    """A QLoRA job moved to ZeRO-3 or FSDP stores its 4-bit weights so that they shard (else every GPU keeps them)."""
    if v["method"] != "qlora" or not STRATEGIES[changes["strategy.kind"]].shards_parameters:
        return {}
    return _sharded_4bit_dtypes(v)


def _sharded_4bit_dtypes(quant: dict) -> dict:
    """ZeRO-3 and FSDP shard 4-bit weights only when model dtype = storage = compute dtype (validate.py)."""
    compute = quant["quantization.bnb_4bit_compute_dtype"]
    return {"quantization.bnb_4bit_quant_storage": compute, "model.dtype": compute}


def _checkpointing_for(v: dict, changes: dict) -> dict:
    """Keep activation checkpointing on when moving to or from FSDP's own switch for it.

    A full fine-tune moved to FSDP takes FSDP's checkpointing: the Trainer's would all-gather
    every layer's weights again in the backward pass (validate.py warns about it).
    """
    was_fsdp = Layout.of_values(v).is_fsdp
    to_fsdp = Layout.of_values(variant(v, changes)).is_fsdp
    if was_fsdp and v["strategy.fsdp_activation_checkpointing"] and not to_fsdp:
        return {"training.gradient_checkpointing": True, "strategy.fsdp_activation_checkpointing": False}
    if v["method"] == "full" and v["training.gradient_checkpointing"] and to_fsdp:
        return {"training.gradient_checkpointing": False, "strategy.fsdp_activation_checkpointing": True}
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
