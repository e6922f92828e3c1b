"""Choices that imply others: when a person changes one field, the form sets the fields it implies.

QLoRA is adapters on a 4-bit NF4 base, so choosing it sets quantization.bits=4 (and leaving it
clears the 4 bits again); a sharded QLoRA job (ZeRO-3, FSDP) shards the 4-bit weights and the
rest of the model together, so the storage, compute and model dtypes are made one; a full
fine-tune under FSDP checkpoints activations with FSDP's own wrapper rather than the Trainer's
(which would all-gather every layer once more in the backward pass), and leaves RAM-efficient loading off
for a 4-bit base (accelerate and transformers load it on every rank anyway); sequences split over GPUs
(Ulysses, DeepSpeed and SFT only) are not packed under SDPA. Each rule here mirrors
a validation rule (backend/validate/method.py, validate_strategy.py): after the form applies
the implication, that problem does not arise.

A rule fires only when one of its trigger fields is among the fields just changed, so a
person who then sets an implied field by hand keeps their value (validation says what it
costs). Pure: {path: value} in, the changes and a sentence saying each out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunedeck.backend.recipe.vocabulary import STRATEGIES
from tunedeck.backend.spec.applies import Values
from tunedeck.backend.spec.problem import spelled


@dataclass(frozen=True)
class Implied:
    changes: dict[str, Any]  # {dotted path: new value}
    says: str  # why, for the notice: "QLoRA loads the base in 4-bit NF4"


Rule = Callable[[Values], Implied | None]


def _sharded(values: Values) -> bool:
    strategy = STRATEGIES.get(values.get("strategy.kind", ""))
    return bool(strategy and strategy.shards_parameters)


def _qlora_is_4bit(values: Values) -> Implied | None:
    if values.get("method") == "qlora" and values.get("quantization.bits") != 4:
        return Implied(
            {"quantization.bits": 4, "quantization.bnb_4bit_quant_type": "nf4"}, "QLoRA loads the base in 4-bit NF4"
        )
    if values.get("method") != "qlora" and values.get("quantization.bits") == 4:
        return Implied({"quantization.bits": None}, "only QLoRA loads a 4-bit base")
    return None


def _sharded_4bit_dtypes(values: Values) -> Implied | None:
    if values.get("method") != "qlora" or not _sharded(values):
        return None
    dtype = values.get("model.dtype")
    if dtype == "float32":  # 4-bit storage in fp32 would shard 8 bytes per pair of weights: keep 16 bits
        return None
    want = {"quantization.bnb_4bit_compute_dtype": dtype, "quantization.bnb_4bit_quant_storage": dtype}
    changes = {path: value for path, value in want.items() if values.get(path) != value}
    if not changes:
        return None
    return Implied(
        changes, f"{values.get('strategy.kind')} shards the 4-bit weights with the rest of the {dtype} model"
    )


def _fsdp_activation_checkpointing(values: Values) -> Implied | None:
    strategy = STRATEGIES.get(values.get("strategy.kind", ""))
    on_fsdp = bool(strategy and strategy.is_fsdp)
    if on_fsdp and values.get("method") == "full" and values.get("training.gradient_checkpointing"):
        return Implied(
            {"strategy.fsdp_activation_checkpointing": True, "training.gradient_checkpointing": False},
            "a full fine-tune under FSDP checkpoints activations with FSDP's own wrapper",
        )
    if not on_fsdp and values.get("strategy.fsdp_activation_checkpointing"):
        return Implied(
            {"strategy.fsdp_activation_checkpointing": False, "training.gradient_checkpointing": True},
            "without FSDP the Trainer checkpoints activations",
        )
    return None


def _fsdp_4bit_loads_on_every_rank(values: Values) -> Implied | None:
    strategy = STRATEGIES.get(values.get("strategy.kind", ""))
    on_fsdp = bool(strategy and strategy.is_fsdp)
    if on_fsdp and values.get("quantization.bits") == 4 and values.get("strategy.fsdp_cpu_ram_efficient_loading"):
        return Implied(
            {"strategy.fsdp_cpu_ram_efficient_loading": False},
            "accelerate and transformers load a 4-bit base on every rank (no rank-0 broadcast)",
        )
    return None


def _ulysses_without_packing(values: Values) -> Implied | None:
    strategy = STRATEGIES.get(values.get("strategy.kind", ""))
    splits = bool(strategy and strategy.is_deepspeed) and (values.get("strategy.sequence_parallel") or 1) > 1
    if splits and values.get("model.attn_implementation") == "sdpa" and values.get("dataset.packing"):
        return Implied({"dataset.packing": False}, "under Ulysses, SDPA cannot keep packed rows apart")
    return None


def _ulysses_off(values: Values) -> Implied | None:
    strategy = STRATEGIES.get(values.get("strategy.kind", ""))
    if (values.get("strategy.sequence_parallel") or 1) == 1:
        return None
    if not (strategy and strategy.is_deepspeed):
        return Implied({"strategy.sequence_parallel": 1}, "only DeepSpeed splits sequences (Ulysses)")
    if values.get("objective", "sft") != "sft":
        return Implied({"strategy.sequence_parallel": 1}, "only SFT splits sequences (Ulysses)")
    return None


# (trigger fields, rule): the rule runs when one of its triggers was just changed, in this order
# (the dtype rule reads the 4 bits the QLoRA rule sets).
RULES: list[tuple[frozenset[str], Rule]] = [
    (frozenset({"method"}), _qlora_is_4bit),
    (frozenset({"method", "strategy.kind", "model.dtype", "quantization.bits"}), _sharded_4bit_dtypes),
    (frozenset({"method", "strategy.kind"}), _fsdp_activation_checkpointing),
    (frozenset({"method", "strategy.kind", "quantization.bits"}), _fsdp_4bit_loads_on_every_rank),
    (frozenset({"strategy.kind", "objective"}), _ulysses_off),
    (frozenset({"strategy.sequence_parallel", "strategy.kind", "model.attn_implementation"}), _ulysses_without_packing),
]


def implied(values: Values, changed: set[str]) -> tuple[Values, list[Implied]]:
    """The values with what the `changed` fields imply applied, and what was applied (empty: nothing)."""
    values, applied = dict(values), []
    for triggers, rule in RULES:
        if not triggers & changed:
            continue
        found = rule(values)
        if found is not None:
            values.update(found.changes)
            applied.append(found)
    return values, applied


def describe(applied: list[Implied], code: bool = True) -> str:
    """One line: what was set and why (`code`: paths and values as Markdown code, for the page's notice)."""
    quote = "`" if code else ""
    parts = [
        f"{i.says}: "
        + ", ".join(f"{quote}{path}{quote} → {quote}{spelled(value)}{quote}" for path, value in i.changes.items())
        for i in applied
    ]
    return "Set for you: " + "; ".join(parts) + "."
