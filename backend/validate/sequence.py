"""Validation rules of sequence parallelism (strategy.sequence_parallel: DeepSpeed Ulysses through accelerate).

What the libraries refuse late (after the model loaded) or accept while computing something
else: DeepSpeed's Ulysses splits the attention heads across the GPUs of a sequence
(ulysses_sp.py refuses head counts it cannot split), accelerate refuses eager attention, and
with SDPA the packed rows would attend to each other (transformers' deepspeed_alst guide).
"""

from __future__ import annotations

from collections.abc import Iterator

from tunedeck.backend.spec import JobSpec, catalog
from tunedeck.backend.spec.problem import Problem, error, warning

FIELD = "strategy.sequence_parallel"


def divisors(count: int) -> list[int]:
    return [d for d in range(1, count + 1) if count % d == 0]


def sequence_parallel(spec: JobSpec) -> Iterator[Problem]:
    s, launch = spec.strategy, spec.launch
    n = s.sequence_parallel
    if n == 1:
        return
    if not s.is_deepspeed:
        yield error(
            FIELD,
            f"sequence parallelism is DeepSpeed's Ulysses; {s.facts.label} cannot split a sequence: "
            "set strategy.kind=zero3 (or zero1, zero2), or strategy.sequence_parallel=1.",
        )
        return
    if spec.objective != "sft":
        yield error(
            FIELD,
            f"sequence parallelism trains with SFT only (TRL's {spec.objective.upper()} trainer does not split "
            "sequences): set strategy.sequence_parallel=1.",
            {FIELD: 1},
        )
    if launch.num_processes % n:
        fits = ", ".join(str(d) for d in divisors(launch.num_processes) if d > 1) or "none above 1"
        yield error(
            FIELD,
            f"{launch.num_processes} processes do not split into groups of {n} GPUs per sequence: set "
            f"strategy.sequence_parallel to a divisor of {launch.num_processes} ({fits}), or "
            f"launch.num_processes to a multiple of {n}.",
        )
    elif launch.num_machines > 1 and launch.processes_per_machine % n:
        yield warning(
            FIELD,
            f"groups of {n} GPUs per sequence span machines ({launch.processes_per_machine} per machine): every "
            "layer's all-to-all then crosses the network; use a divisor of the processes per machine.",
        )
    yield from _heads(spec, n)
    yield from _attention(spec, n)
    if spec.dataset.eval_split:
        yield warning(
            "dataset.eval_split",
            f"evaluation runs without sequence parallelism (DeepSpeed turns Ulysses off outside training), so each "
            f"GPU scores whole rows of up to {spec.dataset.max_seq_length:,} tokens: keep "
            "training.per_device_eval_batch_size at 1, or evaluate shorter rows.",
        )


def _heads(spec: JobSpec, n: int) -> Iterator[Problem]:
    arch = catalog.lookup(spec.model.name_or_path)
    if arch is None:
        yield warning(
            FIELD,
            f"tunedeck does not know the attention heads of {spec.model.name_or_path!r}: Ulysses needs them (and "
            f"the key/value heads, or {n} a multiple of those) divisible by {n}, and stops at load otherwise.",
        )
        return
    heads, kv = arch.num_attention_heads, arch.num_key_value_heads
    if heads % n:
        fits = ", ".join(str(d) for d in divisors(heads) if d > 1 and spec.launch.num_processes % d == 0)
        yield error(
            FIELD,
            f"the model's {heads} attention heads do not split over {n} GPUs: set strategy.sequence_parallel to "
            f"a divisor of {heads}" + (f" ({fits})." if fits else "."),
        )
    elif kv % n and n % kv:
        yield error(
            FIELD,
            f"the model's {kv} key/value heads neither split over {n} GPUs nor divide {n}: set "
            f"strategy.sequence_parallel to a divisor or multiple of {kv}.",
        )


def _attention(spec: JobSpec, n: int) -> Iterator[Problem]:
    attention = spec.model.attn_implementation
    if attention == "eager":
        yield error(
            "model.attn_implementation",
            "eager attention cannot run under sequence parallelism (accelerate refuses it: Ulysses drops the "
            "4D mask): set model.attn_implementation=sdpa (or flash_attention_2).",
            {"model.attn_implementation": "sdpa"},
        )
    elif attention == "sdpa" and spec.dataset.packing:
        yield error(
            "dataset.packing",
            "packed rows under sequence parallelism with SDPA attend to each other (Ulysses drops the mask that "
            "keeps them apart): set dataset.packing=false, or model.attn_implementation=flash_attention_2 on GPUs.",
            {"dataset.packing": False},
        )
